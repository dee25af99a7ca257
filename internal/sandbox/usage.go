package sandbox

import (
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
)

// diskEvery bounds how often a sandbox's disk usage is walked.
const diskEvery = 10 * time.Second

// usage keeps the samples a CPU percentage is computed from.
type usage struct {
	mu      sync.Mutex
	lastT   time.Time
	lastCPU time.Duration
	pct     float64
	have    bool
	disk    int64
	diskMax int64
	diskAt  time.Time
}

// reset starts the sampling over at t from sb's CPU counter as it reads
// now. The counter is the cgroup's: what it counted before t (the start
// itself, or a whole earlier life before a daemon restart) is no use over
// the first interval, and starting from 0 reported it as such (hundreds of
// percent for an idle sandbox). Without a reading there is no first
// interval: the first sample only seeds the next.
func (u *usage) reset(sb backend.Sandbox, t time.Time) {
	var cpu time.Duration
	if st, err := sb.Stats(); err == nil {
		cpu = st.CPUUsage
	} else {
		t = time.Time{}
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.lastT, u.lastCPU, u.pct, u.have = t, cpu, 0, false
}

// sample records CPU time consumed since the last sample, by a sandbox
// limited to cpus (0: unlimited). Over an interval that does not line up
// with the CPU quota's periods the counter can read up to a period more
// than the quota allows (a sandbox that ran a whole period just before the
// interval and was charged in it): the percentage is held to the limit,
// which is what the sandbox could use over any longer span.
func (u *usage) sample(sb backend.Sandbox, now time.Time, cpus float64) {
	st, err := sb.Stats()
	if err != nil {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if dt := now.Sub(u.lastT); dt > 0 && !u.lastT.IsZero() {
		u.pct = 100 * float64(st.CPUUsage-u.lastCPU) / float64(dt)
		if cpus > 0 {
			u.pct = min(u.pct, 100*cpus)
		}
		u.have = true
	}
	u.lastT, u.lastCPU = now, st.CPUUsage
}

// Usage is a sandbox's resource use as sandbox.metrics.get reports it.
// Nil fields were not measurable (the sandbox is not running).
type Usage struct {
	Namespace string
	Name      string
	Running   bool
	// CPUPercent is CPU use over the last sampling interval (up to one
	// second), 100 = one core.
	CPUPercent *float64
	// MemoryMiB is rounded up to a whole MiB: microsandbox clients decode
	// memory_usage into an integer (the Go SDK's MemoryMiB int), and
	// rounding up means a running sandbox never reports 0.
	MemoryMiB *int64
	DiskBytes *int64
	// DiskLimitBytes is the disk limit in force (nil: none).
	DiskLimitBytes *int64
}

// Usage measures one sandbox.
func (m *Manager) Usage(ns, name string) (Usage, error) {
	m.mu.Lock()
	e := m.entries[key{ns, name}]
	if e == nil {
		m.mu.Unlock()
		return Usage{}, notFound(ns, name)
	}
	running, sb, cpus := e.state == Running, e.sb, e.spec.CPUs
	m.mu.Unlock()
	u := Usage{Namespace: ns, Name: name, Running: running}
	now := time.Now()
	if d, ok := sb.(backend.DiskUser); ok {
		e.usage.mu.Lock()
		stale := now.Sub(e.usage.diskAt) > diskEvery
		e.usage.mu.Unlock()
		if stale {
			if n, err := d.DiskUsage(); err == nil {
				var lim int64
				if l, ok := sb.(backend.DiskLimiter); ok {
					lim = l.DiskLimit()
				}
				e.usage.mu.Lock()
				e.usage.disk, e.usage.diskMax, e.usage.diskAt = n, lim, now
				e.usage.mu.Unlock()
			}
		}
		e.usage.mu.Lock()
		if !e.usage.diskAt.IsZero() {
			disk, lim := e.usage.disk, e.usage.diskMax
			u.DiskBytes = &disk
			if lim > 0 {
				u.DiskLimitBytes = &lim
			}
		}
		e.usage.mu.Unlock()
	}
	if !running {
		return u, nil
	}
	st, err := sb.Stats()
	if err != nil {
		return u, nil //nolint:nilerr // it stopped meanwhile: report it without usage
	}
	mem := max(1, (st.MemoryBytes+(1<<20)-1)>>20)
	u.MemoryMiB = &mem
	e.usage.mu.Lock()
	pct := e.usage.pct
	if !e.usage.have {
		// No full interval yet: the average since the sandbox started.
		if dt := now.Sub(e.usage.lastT); dt > 0 && !e.usage.lastT.IsZero() {
			pct = 100 * float64(st.CPUUsage-e.usage.lastCPU) / float64(dt)
			if cpus > 0 {
				pct = min(pct, 100*cpus) // as sample holds it, for the same reason
			}
		}
	}
	e.usage.mu.Unlock()
	u.CPUPercent = &pct
	return u, nil
}
