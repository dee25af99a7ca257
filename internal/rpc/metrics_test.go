package rpc_test

import (
	"bufio"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/buildinfo"
	"github.com/warren-sandbox/warren/internal/metrics"
)

// scrape reads /metrics with key into series -> value, the series as
// written ("name{label=\"v\",...}").
func (e *env) scrape(t *testing.T, key string) map[string]float64 {
	t.Helper()
	req, _ := http.NewRequest("GET", e.url+"/metrics", nil)
	resp := e.do(t, req, key)
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != metrics.ContentType {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("/metrics: %d %s %.300s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			t.Fatalf("/metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestMetricsSeries: /metrics has every series the README and docs/api.md
// promise, and each moves with what the server does: sandboxes by
// namespace and state, the start and exec latency histograms (a start of a
// sandbox that already runs is no start), requests by method and outcome,
// errors by kind. A key scoped to a namespace sees only its series.
// TestMetricsExecKinds has the shell and code kinds.
func TestMetricsSeries(t *testing.T) {
	e := newFakeEnv(t, false, nil)
	if r, err := http.Get(e.url + "/metrics"); err != nil || r.StatusCode != 401 {
		t.Fatalf("/metrics without a key: %v %v", r, err)
	} else {
		_ = r.Body.Close()
	}
	const (
		running      = `warren_sandboxes{namespace="met",state="running"}`
		stopped      = `warren_sandboxes{namespace="met",state="stopped"}`
		startCount   = `warren_sandbox_start_seconds_count{namespace="met"}`
		startSum     = `warren_sandbox_start_seconds_sum{namespace="met"}`
		startInf     = `warren_sandbox_start_seconds_bucket{namespace="met",le="+Inf"}`
		commandCount = `warren_exec_seconds_count{namespace="met",kind="command"}`
		commandSum   = `warren_exec_seconds_sum{namespace="met",kind="command"}`
		execCount    = `warren_exec_seconds_count{namespace="met",kind="exec"}`
		notFound     = `warren_errors_total{kind="not_found"}`
		getNotFound  = `warren_rpc_requests_total{method="sandbox.get",outcome="not_found"}`
		commandOK    = `warren_rpc_requests_total{method="sandbox.command.run",outcome="ok"}`
	)
	before := e.scrape(t, e.admin)
	for _, s := range []string{running, stopped, startCount, commandCount, execCount, notFound, getNotFound, commandOK} {
		if _, ok := before[s]; ok {
			t.Fatalf("%s before anything happened: %v", s, before[s])
		}
	}
	e.must("sandbox.start", map[string]any{"sandbox": "m", "namespace": "met"}, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "m", "namespace": "met"}, nil) // runs already: no start
	e.must("sandbox.start", map[string]any{"sandbox": "o", "namespace": "other"}, nil)
	e.must("sandbox.command.run", map[string]any{"sandbox": "m", "namespace": "met", "command": "echo", "args": []string{"hi"}}, nil)
	e.must("sandbox.exec", map[string]any{"sandbox": "m", "namespace": "met", "argv": []string{"true"}}, nil)
	if r := e.call("sandbox.get", map[string]any{"sandbox": "nope", "namespace": "met"}); r.Status != 404 {
		t.Fatalf("get of a missing sandbox: %s", r.Raw)
	}
	after := e.scrape(t, e.admin)
	for _, c := range []struct {
		series string
		want   float64
	}{
		{running, 1}, {startCount, 1}, {startInf, 1}, {commandCount, 1}, {execCount, 1},
		{notFound, 1}, {getNotFound, 1}, {commandOK, 1},
		{`warren_sandboxes{namespace="other",state="running"}`, 1},
		// Two running sandboxes of the default limits, on a server
		// without a capacity.
		{`warren_resource_granted{resource="pids"}`, 2 * (backend.DefaultPids + backend.AgentPids)},
		{`warren_resource_granted{resource="memory_bytes"}`, 2 * backend.DefaultMemoryBytes},
		{`warren_resource_granted{resource="cpus"}`, 2 * backend.DefaultCPUs},
		{`warren_resource_capacity{resource="pids"}`, 0},
	} {
		if got, ok := after[c.series]; !ok || got != c.want {
			t.Errorf("%s = %v (present %v), want %v", c.series, got, ok, c.want)
		}
	}
	build := `warren_build_info{version="` + buildinfo.Version() + `",commit="` + buildinfo.Commit() + `"}`
	for _, s := range []string{startSum, commandSum, "go_goroutines", build} {
		if after[s] <= 0 {
			t.Errorf("%s = %v, want more than 0", s, after[s])
		}
	}
	// A stop moves the sandbox to the stopped series.
	e.must("sandbox.stop", map[string]any{"sandbox": "m", "namespace": "met"}, nil)
	after = e.scrape(t, e.admin)
	if _, ok := after[running]; ok || after[stopped] != 1 {
		t.Errorf("after the stop: running %v, stopped %v", after[running], after[stopped])
	}
	if g := after[`warren_resource_granted{resource="pids"}`]; g != backend.DefaultPids+backend.AgentPids {
		t.Errorf("pids granted after the stop: %v, want one sandbox's %d", g, backend.DefaultPids+backend.AgentPids)
	}
	// A key for "met" sees met's series only.
	keyMet, _, err := e.keys.Create(t.Context(), "met", time.Hour, "")
	if err != nil {
		t.Fatal(err)
	}
	scoped := e.scrape(t, keyMet)
	if scoped[stopped] != 1 || scoped[startCount] != 1 {
		t.Errorf("the met key: %s %v, %s %v; want 1 and 1", stopped, scoped[stopped], startCount, scoped[startCount])
	}
	for s := range scoped {
		if !strings.Contains(s, `namespace="met"`) {
			t.Errorf("the met key sees %s", s)
		}
	}
}

// TestMetricsExecKinds: a shell script and a code run each count in the
// exec histogram under their own kind (TestMetricsSeries has the rest).
func TestMetricsExecKinds(t *testing.T) {
	e := newFakeEnv(t, false, nil)
	const (
		shellCount = `warren_exec_seconds_count{namespace="met",kind="shell"}`
		replCount  = `warren_exec_seconds_count{namespace="met",kind="repl"}`
	)
	before := e.scrape(t, e.admin)
	for _, s := range []string{shellCount, replCount} {
		if _, ok := before[s]; ok {
			t.Fatalf("%s before anything happened: %v", s, before[s])
		}
	}
	e.must("sandbox.start", map[string]any{"sandbox": "m", "namespace": "met"}, nil)
	e.must("sandbox.shell", map[string]any{"sandbox": "m", "namespace": "met", "script": "true"}, nil)
	e.must("sandbox.repl.run", map[string]any{"sandbox": "m", "namespace": "met", "language": "python", "code": "1"}, nil)
	after := e.scrape(t, e.admin)
	for _, s := range []string{shellCount, replCount} {
		if got, ok := after[s]; !ok || got != 1 {
			t.Errorf("%s = %v (present %v), want 1", s, got, ok)
		}
	}
}

// TestMetricsFirstCPUSample: right after a start, an idle 1-CPU sandbox's
// cpu_usage is a share of its one CPU. The sampler once started from a
// counter of 0, so the first sample counted all the CPU the cgroup had
// used before it (the start itself) over a few milliseconds: hundreds of
// percent.
func TestMetricsFirstCPUSample(t *testing.T) {
	e := newEnv(t, false, nil)
	for i := range 3 {
		name := "cpu" + strconv.Itoa(i)
		e.must("sandbox.start", map[string]any{"sandbox": name, "config": map[string]any{"image": "microsandbox/python", "cpus": 1}}, nil)
		var res struct {
			Sandboxes []struct {
				CPUUsage *float64 `json:"cpu_usage"`
			} `json:"sandboxes"`
		}
		e.must("sandbox.metrics.get", map[string]any{"sandbox": name}, &res)
		if len(res.Sandboxes) != 1 || res.Sandboxes[0].CPUUsage == nil {
			t.Fatalf("metrics of %s: %+v", name, res)
		}
		cpu := *res.Sandboxes[0].CPUUsage
		t.Logf("%s: first cpu_usage %.1f%%", name, cpu)
		if cpu < 0 || cpu > 100 {
			t.Errorf("first sample of idle 1-CPU sandbox %s: cpu_usage %.1f%%, want 0..100", name, cpu)
		}
	}
}

// TestMetricsPool: the warm pool's series, on the real backend keeping one
// agent warm: its size, what it spawned, and every start that could use it
// counted as taken or missed; a namespace key sees none of them.
func TestMetricsPool(t *testing.T) {
	e := newEnv(t, false, nil)
	const (
		size    = `warren_pool_size{isolation="native"}`
		ready   = `warren_pool_ready{isolation="native"}`
		spawned = `warren_pool_spawned_total{isolation="native"}`
		taken   = `warren_pool_taken_total{isolation="native"}`
		misses  = `warren_pool_misses_total{isolation="native"}`
	)
	// The pool fills in the background.
	var before map[string]float64
	for deadline := time.Now().Add(10 * time.Second); ; {
		if before = e.scrape(t, e.admin); before[ready] == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if before[size] != 1 || before[ready] != 1 || before[spawned] < 1 || before[taken] != 0 || before[misses] != 0 {
		t.Fatalf("pool before any start: size %v ready %v spawned %v taken %v misses %v", before[size], before[ready], before[spawned], before[taken], before[misses])
	}
	// Two starts at once: one takes the ready agent, the other the one
	// spawned ahead for the next slot, or finds the pool empty.
	var wg sync.WaitGroup
	for _, name := range []string{"p1", "p2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.must("sandbox.start", map[string]any{"sandbox": name, "namespace": "pool"}, nil)
		}()
	}
	wg.Wait()
	after := e.scrape(t, e.admin)
	if after[taken] < 1 || after[taken]+after[misses] != 2 || after[spawned] < before[spawned] {
		t.Errorf("pool after two starts: taken %v misses %v spawned %v (before %v)", after[taken], after[misses], after[spawned], before[spawned])
	}
	keyNS, _, err := e.keys.Create(t.Context(), "pool", time.Hour, "")
	if err != nil {
		t.Fatal(err)
	}
	for s := range e.scrape(t, keyNS) {
		if strings.HasPrefix(s, "warren_pool_") {
			t.Errorf("a namespace key sees %s", s)
		}
	}
}
