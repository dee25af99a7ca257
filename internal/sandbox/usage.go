package sandbox

import (
	"maps"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/audit"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/egress"
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

	// The interval of use not yet recorded in the audit log: since
	// from (zero: none open, the sandbox is not running), the CPU
	// counter then, memory byte-seconds (the memory of each sample held
	// until the next), egress bytes.
	from        time.Time
	fromCPU     time.Duration
	memSec      float64
	memT        time.Time
	memB        int64
	egOut, egIn int64
}

// reset starts the sampling over at t from sb's CPU counter as it reads
// now. The counter is the cgroup's: what it counted before t (the start
// itself, or a whole earlier life before a daemon restart) is no use over
// the first interval, and starting from 0 reported it as such (hundreds of
// percent for an idle sandbox). Without a reading there is no first
// interval: the first sample only seeds the next.
func (u *usage) reset(sb backend.Sandbox, t time.Time) {
	var cpu time.Duration
	var mem int64
	if st, err := sb.Stats(); err == nil {
		cpu, mem = st.CPUUsage, st.MemoryBytes
	} else {
		t = time.Time{}
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.lastT, u.lastCPU, u.pct, u.have = t, cpu, 0, false
	now := time.Now()
	u.from, u.fromCPU, u.memSec, u.memT, u.memB, u.egOut, u.egIn = now, cpu, 0, now, mem, 0, 0
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
	u.meterMemory(now, st.MemoryBytes)
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
	// Paused: it runs, paused (pause.go).
	Paused bool
	// CPUPercent is CPU use over the last sampling interval (up to one
	// second), 100 = one core.
	CPUPercent *float64
	// MemoryMiB is rounded up to a whole MiB: microsandbox clients decode
	// memory_usage into an integer (the Go SDK's MemoryMiB int), and
	// rounding up means a running sandbox never reports 0.
	MemoryMiB *int64
	DiskBytes *int64
	// Labels are the sandbox's, so a usage record can be billed by
	// label (a copy).
	Labels map[string]string
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
	paused := running && e.paused
	labels := maps.Clone(e.spec.Labels)
	m.mu.Unlock()
	u := Usage{Namespace: ns, Name: name, Running: running, Paused: paused, Labels: labels}
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

// meterMemory adds the memory held since the last sample; holds u.mu.
func (u *usage) meterMemory(now time.Time, bytes int64) {
	if u.from.IsZero() {
		return
	}
	if dt := now.Sub(u.memT); dt > 0 {
		u.memSec += float64(u.memB) * dt.Seconds()
	}
	u.memT, u.memB = now, bytes
}

// due reports whether the open interval is older than every.
func (u *usage) due(now time.Time, every time.Duration) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return !u.from.IsZero() && now.Sub(u.from) >= every
}

// report closes the open interval at now and returns what sb used in it
// (nil when none is open); final leaves none open (the sandbox stops).
func (u *usage) report(sb backend.Sandbox, now time.Time, final bool) *audit.Usage {
	st, err := sb.Stats()
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.from.IsZero() {
		return nil
	}
	cpu := u.lastCPU // a sandbox that died has no counter left: its last sample's
	if err == nil {
		cpu = st.CPUUsage
		u.meterMemory(now, st.MemoryBytes)
	} else {
		u.meterMemory(now, u.memB)
	}
	out := &audit.Usage{From: u.from.UTC(), To: now.UTC(), CPUSeconds: max(0, (cpu - u.fromCPU).Seconds()),
		MemorySeconds: u.memSec, EgressBytesOut: u.egOut, EgressBytesIn: u.egIn}
	if !u.diskAt.IsZero() {
		d := u.disk
		out.DiskBytes = &d
	}
	u.from, u.fromCPU, u.memSec, u.egOut, u.egIn = now, cpu, 0, 0, 0
	if final {
		u.from = time.Time{}
	}
	return out
}

// auditUsage records what e (running as sb) used since its last usage
// record; reason is "periodic", "stop", "remove" or "exited".
func (m *Manager) auditUsage(e *entry, sb backend.Sandbox, reason string) {
	if m.opts.Audit == nil || sb == nil {
		return
	}
	if d, ok := sb.(backend.DiskUser); ok && reason != "periodic" {
		if n, err := d.DiskUsage(); err == nil { // the final figure, not the last sample's
			e.usage.mu.Lock()
			e.usage.disk, e.usage.diskAt = n, time.Now()
			e.usage.mu.Unlock()
		}
	}
	u := e.usage.report(sb, time.Now(), reason != "periodic")
	if u == nil {
		return
	}
	u.Reason = reason
	m.mu.Lock()
	labels := maps.Clone(e.spec.Labels)
	m.mu.Unlock()
	if err := m.opts.Audit.Append(&audit.Record{Kind: audit.KindUsage, Namespace: e.ns, Sandbox: e.name, Labels: labels, Usage: u}); err != nil {
		m.log.Error("audit usage record lost", "namespace", e.ns, "name", e.name, "err", err)
	}
}

// auditEgress records one entry of e's egress log, and counts its bytes
// into e's usage.
func (m *Manager) auditEgress(e *entry, r egress.Record) {
	e.usage.mu.Lock()
	e.usage.egOut += r.BytesOut
	e.usage.egIn += r.BytesIn
	e.usage.mu.Unlock()
	m.mu.Lock()
	labels := maps.Clone(e.spec.Labels)
	m.mu.Unlock()
	rec := &audit.Record{Kind: audit.KindEgress, Time: r.Time.UTC(), Namespace: r.Namespace, Sandbox: r.Sandbox, Labels: labels,
		Egress: &audit.Egress{Seq: r.Seq, Kind: r.Kind, Name: r.Name, Addr: r.Addr, Port: r.Port, Verdict: r.Verdict, Rule: r.Rule,
			Reason: r.Reason, BytesOut: r.BytesOut, BytesIn: r.BytesIn, DurationMs: r.Duration, Rules: r.Rules}}
	if err := m.opts.Audit.Append(rec); err != nil {
		m.log.Error("audit egress record lost", "namespace", e.ns, "name", e.name, "err", err)
	}
}
