package sandbox

import (
	"context"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
)

// janitor enforces idle timeouts, maximum lifetimes and the retention of
// stopped sandboxes, and samples resource usage.
func (m *Manager) janitor() {
	defer m.wg.Done()
	t := time.NewTicker(m.opts.Tick)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case now := <-t.C:
			m.sweep(now)
		}
	}
}

type action struct {
	ns, name, why string
	remove        bool
	pause         bool // an idle pause (Options.IdleAction)
}

func (m *Manager) sweep(now time.Time) {
	var todo []action
	type pair struct {
		e    *entry
		sb   backend.Sandbox
		cpus float64
	}
	var sample []pair
	m.mu.Lock()
	for k, e := range m.entries {
		switch e.state {
		case Running:
			sample = append(sample, pair{e, e.sb, e.spec.CPUs})
			idle := e.spec.IdleTimeout
			if idle == 0 {
				idle = m.opts.IdleTimeout
			}
			life := e.spec.MaxLifetime
			if life == 0 {
				life = m.opts.MaxLifetime
			}
			switch {
			case life > 0 && now.Sub(e.started) > life:
				todo = append(todo, action{k.ns, k.name, "maximum lifetime " + life.String() + " reached", false, false})
			case idle > 0 && !e.paused && e.busy.Load() == 0 && now.Sub(time.Unix(0, e.lastActive.Load())) > idle:
				_, canPause := e.sb.(backend.Pauser)
				pause := m.idleAction(e.spec) == IdlePause && canPause
				todo = append(todo, action{k.ns, k.name, "idle for " + idle.String(), false, pause})
			}
		case Stopped, Error:
			ret := m.opts.StoppedRetention
			end := e.stopped
			if end.IsZero() {
				end = e.created
			}
			if ret > 0 && now.Sub(end) > ret {
				todo = append(todo, action{k.ns, k.name, "removed: stopped for longer than " + ret.String(), true, false})
			}
		}
	}
	m.mu.Unlock()
	for _, p := range sample {
		p.e.usage.sample(p.sb, now, p.cpus)
		if m.opts.Audit != nil && p.e.usage.due(now, m.opts.UsageEvery) {
			m.auditUsage(p.e, p.sb, "periodic")
		}
	}
	for _, a := range todo {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var err error
		switch {
		case a.remove:
			_, err = m.Remove(ctx, a.ns, a.name)
		case a.pause:
			err = m.pause(ctx, a.ns, a.name, a.why, true)
		default:
			err = m.stopWhy(ctx, a.ns, a.name, a.why)
		}
		cancel()
		m.log.Info("janitor", "namespace", a.ns, "name", a.name, "action", a.why, "pause", a.pause, "err", err)
	}
}
