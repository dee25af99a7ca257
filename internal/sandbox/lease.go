package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/agent"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/wire"
)

// A Lease is one operation's use of a running sandbox: the only way to
// reach its agent. While a lease is held the sandbox is busy (no idle
// stop); its idle time counts from the last release. What runs through a
// lease is written to the sandbox's log, and an operation that a stop
// cut short fails with an error that says so, not with the bare
// transport error (EOF, connection reset) the broken connection gave.
type Lease struct {
	m        *Manager
	e        *entry
	sb       backend.Sandbox
	ns, name string
	once     sync.Once
}

// Lease leases the running sandbox ns/name; Release must follow. A
// sandbox that is not running is a conflict that says its state (and,
// after a failure, why).
func (m *Manager) Lease(ns, name string) (*Lease, error) {
	m.mu.Lock()
	e := m.entries[key{ns, name}]
	if e == nil {
		m.mu.Unlock()
		return nil, notFound(ns, name)
	}
	if e.state == Running && e.paused {
		m.mu.Unlock()
		return nil, errPaused(ns, name)
	}
	if e.state != Running {
		st, why := e.state, e.err
		m.mu.Unlock()
		msg := fmt.Sprintf("sandbox %q in namespace %q is %s", name, ns, st)
		if why != "" {
			msg += " (" + why + ")"
		}
		return nil, errdefs.Errorf(errdefs.ErrConflict, "%s: start it first", msg)
	}
	sb := e.sb
	e.busy.Add(1)
	m.mu.Unlock()
	e.touch()
	return &Lease{m: m, e: e, sb: sb, ns: ns, name: name}, nil
}

// Release ends the lease; the sandbox's idle time counts from now.
// Releasing twice is harmless.
func (l *Lease) Release() {
	l.once.Do(func() {
		l.e.touch()
		l.e.busy.Add(-1)
	})
}

// Agent is the connection to the sandbox's agent, for the services the
// lease does not run itself (files, processes, tar, terminals). An error
// from it goes through Explain.
func (l *Lease) Agent() *agent.Client { return l.sb.Agent() }

// ID returns the namespace and name of the leased sandbox.
func (l *Lease) ID() (ns, name string) { return l.e.ns, l.e.name }

// Logf appends a line to the sandbox's log.
func (l *Lease) Logf(format string, args ...any) { l.e.logf(format, args...) }

// Exec runs req to its end, with the host enforcing its timeout
// (backend.Exec), and logs it as kind ("command", "exec", "shell"). An
// agent that missed the host's deadline is a timeout (the sandbox was
// stopped); a stop that cut the command short is a conflict that says so.
func (l *Lease) Exec(ctx context.Context, kind string, req *wire.ExecRequest, onOutput func(stream string, data []byte)) (backend.ExecResult, error) {
	res, err := backend.Exec(ctx, l.sb, req, onOutput)
	argv := strings.Join(req.Argv, " ")
	if err != nil {
		l.Logf("%s %.200s: %v", kind, argv, err)
		if errors.Is(err, backend.ErrAgentUnresponsive) {
			return res, errdefs.Errorf(errdefs.ErrTimeout, "%w", err)
		}
		return res, l.Explain(ctx, "the command ran", err)
	}
	what := fmt.Sprintf("exit %d", res.Code)
	switch {
	case res.Error != "":
		what = "could not start: " + res.Error
	case res.TimedOut:
		what = "timed out"
	case res.OOMKilled:
		what = "killed: out of memory"
	}
	l.Logf("%s %.200s: %s (%.1f ms)", kind, argv, what, res.DurationMs)
	return res, nil
}

// replGrace is how long past a run's own timeout the host waits for the
// REPL's answer.
const replGrace = 30 * time.Second

// Repl runs code in the sandbox's REPL, with the host's deadline on top
// of the agent's, and logs it. The run's output lines go to onLine as they
// arrive (the result's Output is nil).
func (l *Lease) Repl(ctx context.Context, req wire.ReplRequest, onLine func(wire.OutputLine)) (wire.ReplResult, error) {
	if req.TimeoutMs > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutMs)*time.Millisecond+replGrace)
		defer cancel()
	}
	res, err := l.sb.Agent().ReplStream(ctx, req, onLine)
	if err != nil {
		l.Logf("repl %s: %v", req.Language, err)
		return res, l.Explain(ctx, "the code ran", err)
	}
	l.Logf("repl %s: %s (%d bytes of code, %.1f ms)", req.Language, res.Status, len(req.Code), res.DurationMs)
	return res, nil
}

// stopSettle bounds how long after an agent connection broke the sandbox's
// init may take to be seen exiting, when a stop broke it.
const stopSettle = time.Second

// Explain turns the error of an operation on the leased sandbox into a
// conflict saying the sandbox was stopped while the operation (what: "the
// command ran") was under way, when that is what broke it: the agent's
// connection then ends with a bare transport error that says nothing to
// the caller. Errors of a known kind, errors of a cancelled ctx, and
// errors while the sandbox still runs, are returned as they are.
func (l *Lease) Explain(ctx context.Context, what string, err error) error {
	if errdefs.Kind(err) != errdefs.Internal || ctx.Err() != nil {
		return err
	}
	why, stopped := l.interrupted(stopSettle)
	if !stopped {
		return err
	}
	return errdefs.Errorf(errdefs.ErrConflict, "sandbox %q in namespace %q was stopped while %s (%s); start it again to go on", l.name, l.ns, what, why)
}

// interrupted reports whether the leased sandbox has stopped (or is being
// stopped or removed) and why. A stop kills the agent before the
// sandbox's init is seen to exit, so it waits up to wait for the init to
// end; a sandbox whose init still runs then was not stopped.
func (l *Lease) interrupted(wait time.Duration) (string, bool) {
	// A stop or removal is marked before it kills anything: no wait.
	if why, ok := l.stopReason(); ok {
		return why, true
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-l.sb.Done():
	case <-t.C:
		return "", false
	}
	if why, ok := l.stopReason(); ok {
		return why, true
	}
	// The init died on its own and the watcher has not marked it yet.
	return "its init exited unexpectedly", true
}

func (l *Lease) stopReason() (string, bool) {
	m := l.m
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[key{l.ns, l.name}]
	switch {
	case e == nil || e.removed:
		return "it was removed", true
	case e.state == Stopping || e.state == Stopped:
		if e.why == "" {
			return "it was stopped", true
		}
		return e.why, true
	case e.state == Error && e.err != "":
		return e.err, true
	}
	return "", false
}
