package rpc

import (
	"context"
	"net/http"
	"runtime"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/buildinfo"
	"github.com/warren-sandbox/warren/internal/metrics"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

// serverMetrics are the server's Prometheus series.
type serverMetrics struct {
	reg      *metrics.Registry
	start    *metrics.HistogramVec
	execs    *metrics.HistogramVec
	calls    *metrics.CounterVec
	errCount *metrics.CounterVec
	known    map[string]bool
}

// newServerMetrics registers the series; methods names the RPC methods
// (other method names a client sends are counted as "unknown").
func newServerMetrics(reg *metrics.Registry, mgr *sandbox.Manager, methods map[string]method) *serverMetrics {
	m := &serverMetrics{reg: reg, known: map[string]bool{}}
	for name := range methods {
		m.known[name] = true
	}
	reg.GaugeFunc("warren_sandboxes", "Sandboxes by namespace and state.", []string{"namespace", "state"},
		func(emit func(float64, ...string)) {
			for k, n := range mgr.CountByState() {
				emit(float64(n), k[0], k[1])
			}
		})
	// Admission: what running sandboxes are granted of each resource, and
	// the server's capacity for it (0 = not limited). No namespace label:
	// a namespace key's scrape leaves them out.
	admission := func(capacity bool) func(emit func(float64, ...string)) {
		return func(emit func(float64, ...string)) {
			g, c := mgr.Admission()
			if capacity {
				g = sandbox.Grant(c)
			}
			emit(float64(g.MemoryBytes), "memory_bytes")
			emit(g.CPUs, "cpus")
			emit(float64(g.Pids), "pids")
			emit(float64(g.Ptys), "ptys")
			emit(float64(g.Files), "open_files")
		}
	}
	reg.GaugeFunc("warren_resource_granted", "What running sandboxes are granted together, by resource (their limits, not their use).", []string{"resource"}, admission(false))
	reg.GaugeFunc("warren_resource_capacity", "What the server grants running sandboxes at most, by resource (0 = not limited).", []string{"resource"}, admission(true))
	// The warm pools (--prewarm), per isolation tier: what is ready, and
	// how many starts found the pool empty and paid a cold start.
	pools := func(f func(backend.PoolStats) float64) func(emit func(float64, ...string)) {
		return func(emit func(float64, ...string)) {
			for tier, p := range mgr.Pools() {
				emit(f(p), tier)
			}
		}
	}
	reg.GaugeFunc("warren_pool_size", "Agents the warm pool keeps ready, by isolation tier.", []string{"isolation"}, pools(func(p backend.PoolStats) float64 { return float64(p.Size) }))
	reg.GaugeFunc("warren_pool_ready", "Agents ready in the warm pool now, by isolation tier.", []string{"isolation"}, pools(func(p backend.PoolStats) float64 { return float64(p.Ready) }))
	reg.CounterFunc("warren_pool_spawned_total", "Agents spawned for the warm pool, by isolation tier.", []string{"isolation"}, pools(func(p backend.PoolStats) float64 { return float64(p.Spawned) }))
	reg.CounterFunc("warren_pool_taken_total", "Agents starts took from the warm pool, by isolation tier.", []string{"isolation"}, pools(func(p backend.PoolStats) float64 { return float64(p.Taken) }))
	reg.CounterFunc("warren_pool_misses_total", "Starts that found the warm pool empty and paid a cold start, by isolation tier.", []string{"isolation"}, pools(func(p backend.PoolStats) float64 { return float64(p.Misses) }))
	reg.GaugeFunc("warren_build_info", "The server's build: always 1, with its version and commit as labels.", []string{"version", "commit"},
		func(emit func(float64, ...string)) { emit(1, buildinfo.Version(), buildinfo.Commit()) })
	// Without a namespace label: only a key for every namespace sees it.
	reg.GaugeFunc("go_goroutines", "Goroutines in the server process (a leak shows here first).", nil,
		func(emit func(float64, ...string)) { emit(float64(runtime.NumGoroutine())) })
	m.start = reg.Histogram("warren_sandbox_start_seconds", "Time to start a sandbox, as the API saw it.", nil, "namespace")
	m.execs = reg.Histogram("warren_exec_seconds", "Time to run a command or code in a sandbox (kind: command, exec, shell, repl).", nil, "namespace", "kind")
	m.calls = reg.Counter("warren_rpc_requests_total", "JSON-RPC calls by method and outcome (ok or the error kind).", "method", "outcome")
	m.errCount = reg.Counter("warren_errors_total", "Errors answered, by kind.", "kind")
	return m
}

func (m *serverMetrics) startLatency(ns string, d time.Duration) {
	m.start.With(ns).ObserveDuration(d)
}

func (m *serverMetrics) execLatency(ns, kind string, d time.Duration) {
	m.execs.With(ns, kind).ObserveDuration(d)
}

func (m *serverMetrics) errors(kind string) { m.errCount.With(kind).Inc() }

func (m *serverMetrics) observeCall(method string, err error) {
	if !m.known[method] {
		method = "unknown"
	}
	outcome := "ok"
	if err != nil {
		outcome = kindOf(err)
	}
	m.calls.With(method, outcome).Inc()
}

// serveMetrics serves Prometheus text: everything to a key for every
// namespace, only its own namespace's series to any other key.
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	claims, err := s.authenticate(r)
	if err != nil {
		s.writeError(w, r.Context(), nil, err, 0)
		return
	}
	w.Header().Set("Content-Type", metrics.ContentType)
	if claims.Namespace == "*" {
		_ = s.opts.Metrics.WriteText(w)
		return
	}
	_ = s.opts.Metrics.WriteTextFiltered(w, metrics.MatchLabel("namespace", claims.Namespace))
}

// metricsParams name one sandbox, or with no sandbox, a namespace ("*":
// every one) whose sandboxes are measured.
type metricsParams = sandboxRef

// SandboxMetrics is one sandbox's figures in sandbox.metrics.get's answer,
// which 'warren stats' reads with this type.
type SandboxMetrics struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Running   bool   `json:"running"`
	// Paused: running, paused (Warren's; absent when not).
	Paused      bool     `json:"paused,omitempty"`
	CPUUsage    *float64 `json:"cpu_usage"`
	MemoryUsage *int64   `json:"memory_usage"`
	DiskUsage   *int64   `json:"disk_usage"`
	// DiskLimit is the cap disk_usage counts against (absent: none).
	DiskLimit *int64 `json:"disk_limit,omitempty"`
	// Isolation is the sandbox's tier (Warren's).
	Isolation string `json:"isolation,omitempty"`
}

// State is the sandbox's state as ps shows it: running, paused or stopped.
func (m SandboxMetrics) State() string {
	switch {
	case m.Paused:
		return "paused"
	case m.Running:
		return "running"
	}
	return "stopped"
}

type metricsList struct {
	Sandboxes []SandboxMetrics `json:"sandboxes"`
}

func (s *Server) sandboxMetrics(_ context.Context, c *call, p *metricsParams) (any, error) {
	var infos []sandbox.Info
	if p.Sandbox != "" {
		ns, name, err := c.resolve(p.Namespace, p.Sandbox)
		if err != nil {
			return nil, err
		}
		info, err := s.mgr.Get(ns, name)
		if err != nil {
			return nil, err
		}
		infos = []sandbox.Info{info}
	} else {
		nss, err := c.namespaces(p.Namespace)
		if err != nil {
			return nil, err
		}
		infos = s.mgr.List(sandbox.Filter{Namespaces: nss})
	}
	out := make([]SandboxMetrics, 0, len(infos))
	for _, in := range infos {
		u, err := s.mgr.Usage(in.Namespace, in.Name)
		if err != nil {
			continue // removed meanwhile
		}
		out = append(out, SandboxMetrics{Namespace: u.Namespace, Name: u.Name, Running: u.Running, Paused: u.Paused,
			CPUUsage: u.CPUPercent, MemoryUsage: u.MemoryMiB, DiskUsage: u.DiskBytes, DiskLimit: u.DiskLimitBytes, Isolation: in.Spec.Isolation})
	}
	return metricsList{Sandboxes: out}, nil
}
