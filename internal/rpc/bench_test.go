package rpc_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/audit"
	"github.com/warren-sandbox/warren/internal/rpc"
)

// benchClient posts JSON-RPC over one keep-alive connection pool, with a
// key, as an SDK would.
type benchClient struct {
	url, key string
	hc       *http.Client
}

func (e *env) benchClient() *benchClient {
	return &benchClient{url: e.url + "/api/v1/rpc", key: e.admin,
		hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
}

func (c *benchClient) call(b testing.TB, method string, params map[string]any) {
	if err := c.try(method, params); err != nil {
		b.Fatal(err)
	}
}

func (c *benchClient) try(method string, params map[string]any) error {
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method, "params": params, "id": "1"})
	req, _ := http.NewRequest("POST", c.url, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	out, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s: %d %s", method, resp.StatusCode, out)
	}
	return nil
}

// BenchmarkHTTPStartRunStop: sandbox.start + command.run true +
// sandbox.stop, the microsandbox client's whole cycle (one name, as a
// client reusing its sandbox name does; files are kept between cycles).
func BenchmarkHTTPStartRunStop(b *testing.B) {
	e := newEnv(b, false, nil)
	c := e.benchClient()
	p := map[string]any{"sandbox": "bench"}
	run := map[string]any{"sandbox": "bench", "command": "true"}
	var tStart, tRun, tStop time.Duration
	for b.Loop() {
		t0 := time.Now()
		c.call(b, "sandbox.start", p)
		t1 := time.Now()
		c.call(b, "sandbox.command.run", run)
		t2 := time.Now()
		c.call(b, "sandbox.stop", p)
		tStart, tRun, tStop = tStart+t1.Sub(t0), tRun+t2.Sub(t1), tStop+time.Since(t2)
	}
	n := float64(b.N) * float64(time.Millisecond)
	b.ReportMetric(float64(tStart)/n, "start-ms")
	b.ReportMetric(float64(tRun)/n, "run-ms")
	b.ReportMetric(float64(tStop)/n, "stop-ms")
}

// BenchmarkHTTPCreateRunRemove: a fresh sandbox every time, removed after.
func BenchmarkHTTPCreateRunRemove(b *testing.B) {
	e := newEnv(b, false, nil)
	c := e.benchClient()
	i := 0
	for b.Loop() {
		i++
		name := fmt.Sprintf("b%d", i)
		c.call(b, "sandbox.start", map[string]any{"sandbox": name})
		c.call(b, "sandbox.command.run", map[string]any{"sandbox": name, "command": "true"})
		c.call(b, "sandbox.remove", map[string]any{"sandbox": name})
	}
}

// BenchmarkHTTPCommandRun: command.run true in a running sandbox.
func BenchmarkHTTPCommandRun(b *testing.B) {
	e := newEnv(b, false, nil)
	c := e.benchClient()
	c.call(b, "sandbox.start", map[string]any{"sandbox": "cmd"})
	p := map[string]any{"sandbox": "cmd", "command": "true"}
	c.call(b, "sandbox.command.run", p)
	for b.Loop() {
		c.call(b, "sandbox.command.run", p)
	}
}

// BenchmarkHTTPCommandRunAudit: command.run true in a running sandbox on
// a server writing its audit log as `warren serve` does by default (two
// records a call: the call's and the run's, each written before the
// answer), alternating call by call with the same on a server without
// one; reports both medians and their difference.
func BenchmarkHTTPCommandRunAudit(b *testing.B) {
	dir := filepath.Join(b.TempDir(), "audit")
	log, err := audit.Open(audit.Options{Dir: dir})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = log.Close() })
	on := newNativeEnv(b, false, func(o *rpc.Options) { o.Audit = log }, nil)
	off := newEnv(b, false, nil)
	var clients [2]*benchClient
	p := map[string]any{"sandbox": "cmd", "command": "true"}
	for i, e := range []*env{on, off} {
		clients[i] = e.benchClient()
		clients[i].call(b, "sandbox.start", map[string]any{"sandbox": "cmd"})
		clients[i].call(b, "sandbox.command.run", p)
	}
	seq0, _ := log.Head()
	var times [2][]time.Duration
	var cpu [2]time.Duration // this process's: both servers and clients
	for i := 0; b.Loop(); i++ {
		for j := range 2 {
			k := (i + j) % 2 // which goes first alternates
			c0, t0 := processCPU(), time.Now()
			clients[k].call(b, "sandbox.command.run", p)
			times[k] = append(times[k], time.Since(t0))
			cpu[k] += processCPU() - c0
		}
	}
	n := len(times[0])
	if seq, _ := log.Head(); seq-seq0 < uint64(2*n) {
		b.Fatalf("%d records for %d calls", seq-seq0, n)
	}
	mOn, mOff := medianDuration(times[0]), medianDuration(times[1])
	b.ReportMetric(float64(mOn.Microseconds())/1000, "audit-ms")
	b.ReportMetric(float64(mOff.Microseconds())/1000, "no-audit-ms")
	b.ReportMetric(float64(mOn-mOff)/float64(time.Microsecond), "added-us")
	b.ReportMetric(float64(cpu[0])/float64(n)/float64(time.Microsecond), "audit-cpu-us")
	b.ReportMetric(float64(cpu[1])/float64(n)/float64(time.Microsecond), "no-audit-cpu-us")
}

// processCPU is the user and system time of this process (the server
// and its client; the sandboxes' agents are processes of their own).
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func medianDuration(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkHTTPReplRun: repl.run 1+1 in a running sandbox.
func BenchmarkHTTPReplRun(b *testing.B) {
	e := newEnv(b, false, nil)
	c := e.benchClient()
	c.call(b, "sandbox.start", map[string]any{"sandbox": "repl"})
	p := map[string]any{"sandbox": "repl", "language": "python", "code": "1+1"}
	c.call(b, "sandbox.repl.run", p)
	for b.Loop() {
		c.call(b, "sandbox.repl.run", p)
	}
}

// BenchmarkHTTPParallelCycles: 8 clients each running start/run/stop
// cycles on their own sandbox; reports complete cycles per second.
func BenchmarkHTTPParallelCycles(b *testing.B) { parallelCycles(b, newEnv(b, false, nil)) }

func parallelCycles(b *testing.B, e *env) {
	const clients = 8
	// One cycle first: the server's one-time work (the host image's
	// skeleton, built on first use) is not what the rate measures, and it
	// takes a varying 0.1-0.5 s that the 8 clients would all wait for.
	warm := e.benchClient()
	for _, m := range []string{"sandbox.start", "sandbox.stop"} {
		if err := warm.try(m, map[string]any{"sandbox": "warm"}); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	t0 := time.Now()
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := e.benchClient()
			p := map[string]any{"sandbox": fmt.Sprintf("par%d", i)}
			run := map[string]any{"sandbox": p["sandbox"], "command": "true"}
			for next.Add(1) <= int64(b.N) {
				for _, step := range []struct {
					m string
					p map[string]any
				}{{"sandbox.start", p}, {"sandbox.command.run", run}, {"sandbox.stop", p}} {
					if err := c.try(step.m, step.p); err != nil {
						b.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(t0).Seconds(), "cycles/s")
}
