package rpc_test

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/audit"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/fake"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/image/layer"
	"github.com/warren-sandbox/warren/internal/rpc"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

const auditSecret = "sk-live-7f3a9c" // must never reach the audit log

// auditedEnv is a server on the fake backend writing its audit log to
// the returned directory, a checkpoint every 5 records.
func auditedEnv(t *testing.T, tweak func(*sandbox.Options)) (*env, *audit.Log, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "audit")
	log, err := audit.Open(audit.Options{Dir: dir, CheckpointEvery: 5, CheckpointInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = log.Close() })
	// newFakeEnv, with the log in the server's options from its start.
	e := newBareEnv(t, false)
	e.rpcOptions = func(o *rpc.Options) { o.Audit = log }
	e.fake = fake.New()
	e.backend = e.fake
	host := &image.Image{Layers: []string{"/"}}
	e.open(layer.IDMap{}, func() (*image.Image, error) { return host, nil }, func(o *sandbox.Options) {
		o.Audit = log
		if tweak != nil {
			tweak(o)
		}
	})
	return e, log, dir
}

// auditScenario drives a server through the kinds of records: calls
// with secret-looking params, runs of each kind, refusals, a key change,
// HTTP routes beside the RPC endpoint.
func auditScenario(t *testing.T, e *env) {
	t.Helper()
	e.must("sandbox.create", map[string]any{"name": "web", "namespace": "team-a", "labels": map[string]string{"team": "billing"},
		"env": []string{"OPENAI_API_KEY=" + auditSecret}}, nil)
	e.must("sandbox.exec", map[string]any{"sandbox": "web", "namespace": "team-a", "argv": []string{"echo", "hi"},
		"env": []string{"TOKEN=" + auditSecret}}, nil)
	e.must("sandbox.shell", map[string]any{"sandbox": "web", "namespace": "team-a", "script": "exit 3"}, nil)
	e.must("sandbox.repl.run", map[string]any{"sandbox": "web", "namespace": "team-a", "language": "python", "code": "print(1)"}, nil)
	// Refused: forbidden (a key for team-b) and limit (the server's
	// maximum of sandboxes).
	keyB, _, err := e.keys.Create(t.Context(), "team-b", time.Hour, "")
	if err != nil {
		t.Fatal(err)
	}
	if r := e.callAs(keyB, "sandbox.get", map[string]any{"sandbox": "web", "namespace": "team-a"}); r.kind() != "forbidden" {
		t.Fatalf("cross-namespace get: %s", r.Raw)
	}
	if r := e.call("sandbox.create", map[string]any{"name": "two", "namespace": "team-a"}); r.kind() != "limit" {
		t.Fatalf("create past the maximum: %s", r.Raw)
	}
	e.must("key.create", map[string]any{"namespace": "team-c"}, nil)
	// A WebSocket session and a tar download.
	c, err := e.wsDial(t, "sandbox=web&namespace=team-a", e.admin)
	if err != nil {
		t.Fatal(err)
	}
	if _, code := wsRun(t, c, map[string]any{"argv": []string{"echo", "over ws"}}, nil); code != 0 {
		t.Fatalf("ws exit %d", code)
	}
	_ = c.Close()
	req, _ := http.NewRequest("GET", e.url+"/api/v1/sandboxes/team-a/web/tar?path=/", nil)
	resp := e.do(t, req, e.admin)
	_ = resp.Body.Close()
	e.must("sandbox.remove", map[string]any{"sandbox": "web", "namespace": "team-a"}, nil)
}

func TestAuditThroughServer(t *testing.T) {
	e, log, dir := auditedEnv(t, func(o *sandbox.Options) { o.MaxSandboxes = 1 })
	auditScenario(t, e)
	// The WebSocket route's record is written when its handler returns,
	// after the client saw the exit.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && !hasRecord(t, dir, audit.Filter{Methods: []string{"ws"}}) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := log.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := audit.Verify(dir, audit.VerifyOptions{})
	if err != nil || len(rep.Problems) != 0 || rep.Checkpoints < 2 {
		t.Fatalf("verify: %+v %v", rep, err)
	}
	raw := readAll(t, dir)
	if bytes.Contains(raw, []byte(auditSecret)) {
		t.Fatalf("a secret value in the audit log:\n%s", raw)
	}
	var calls, execs []*audit.Entry
	var refusals []string
	kinds := map[audit.Kind]int{}
	if err := audit.Scan(dir, audit.Filter{}, func(_ []byte, en *audit.Entry) error {
		kinds[en.Kind]++
		switch en.Kind {
		case audit.KindCall:
			calls = append(calls, en)
		case audit.KindExec:
			execs = append(execs, en)
		case audit.KindRefusal:
			refusals = append(refusals, en.Refusal.Kind+" "+en.Refusal.Method)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var methods []string
	for _, c := range calls {
		methods = append(methods, c.Call.Method+"="+c.Call.Outcome)
	}
	want := []string{"sandbox.create=ok", "sandbox.exec=ok", "sandbox.shell=ok", "sandbox.repl.run=ok", "sandbox.get=forbidden",
		"sandbox.create=limit", "key.create=ok", "ws=ok", "tar.download=ok", "sandbox.remove=ok"}
	// The WebSocket route's record is written when its handler returns:
	// after the client saw the exit, in any order with the next calls.
	slices.Sort(methods)
	slices.Sort(want)
	if !slices.Equal(methods, want) {
		t.Fatalf("calls recorded:\n%v\nwant\n%v", methods, want)
	}
	for _, c := range calls {
		if c.Sandbox == "web" && (c.Labels["team"] != "billing" || c.Namespace != "team-a") {
			t.Errorf("%s: namespace %q labels %v", c.Call.Method, c.Namespace, c.Labels)
		}
		if c.Call.Method != "sandbox.get" && c.KeyID == "" {
			t.Errorf("%s: no key id", c.Call.Method)
		}
	}
	if p := string(calls[1].Call.Params); !strings.Contains(p, `"TOKEN=[redacted]"`) || !strings.Contains(p, `"argv":["echo","hi"]`) {
		t.Errorf("exec params: %s", p)
	}
	var runs []string
	for _, x := range execs {
		code := "-"
		if x.Exec.ExitCode != nil {
			code = strings.Repeat("I", *x.Exec.ExitCode)
		}
		runs = append(runs, x.Exec.Via+":"+strings.Join(x.Exec.Argv, " ")+":"+code+":"+x.Exec.Outcome)
		if x.Labels["team"] != "billing" || x.KeyID == "" {
			t.Errorf("exec record without labels or key: %+v", x.Record)
		}
	}
	wantRuns := []string{"exec:echo hi::ok", "shell:/bin/sh -c exit 3:III:ok", "repl:" + ":-:ok", "ws:echo over ws::ok"}
	if !slices.Equal(runs, wantRuns) {
		t.Fatalf("runs recorded:\n%q\nwant\n%q", runs, wantRuns)
	}
	if execs[2].Exec.CodeSHA256 == "" || execs[2].Exec.CodeBytes != len("print(1)") {
		t.Errorf("repl record: %+v", execs[2].Exec)
	}
	if !slices.Equal(refusals, []string{"forbidden sandbox.get", "limit sandbox.create"}) || kinds[audit.KindKey] != 1 {
		t.Fatalf("refusals %v, key records %d", refusals, kinds[audit.KindKey])
	}
}

func hasRecord(t *testing.T, dir string, f audit.Filter) bool {
	found := false
	_ = audit.Scan(dir, f, func([]byte, *audit.Entry) error { found = true; return nil })
	return found
}

func readAll(t *testing.T, dir string) []byte {
	t.Helper()
	var all []byte
	ents, _ := os.ReadDir(dir)
	for _, en := range ents {
		b, err := os.ReadFile(filepath.Join(dir, en.Name()))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	return all
}

// TestAuditTamperOnServerLog edits, deletes, reorders and truncates the
// records and checkpoints of a log a server wrote, and expects each to be
// found where it was made.
func TestAuditTamperOnServerLog(t *testing.T) {
	e, log, dir := auditedEnv(t, func(o *sandbox.Options) { o.MaxSandboxes = 1 })
	auditScenario(t, e)
	e.http.Close() // no request is in flight: the log is complete
	if err := log.Close(); err != nil {
		t.Fatal(err)
	}
	seg := audit.SegmentPath(dir, 1)
	orig, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(orig, []byte("\n"))
	lines = lines[:len(lines)-1]
	// The line of the shell's exec record, a checkpoint's in the middle.
	find := func(sub string) int {
		for i, l := range lines {
			if bytes.Contains(l, []byte(sub)) {
				return i
			}
		}
		t.Fatalf("no line with %s", sub)
		return 0
	}
	shell := find(`"via":"shell"`)
	ck := find(`"reason":"count"`)
	n := len(lines)
	for _, tc := range []struct {
		name     string
		mutate   func([][]byte) [][]byte
		line     int // 1-based, of the first problem
		severity string
		what     string
	}{
		{"edit an exec's exit code", func(l [][]byte) [][]byte {
			l[shell] = bytes.Replace(l[shell], []byte(`"exit_code":3`), []byte(`"exit_code":0`), 1)
			return l
		}, shell + 1, audit.Tampered, "edited"},
		{"delete an exec record", func(l [][]byte) [][]byte { return slices.Delete(l, shell, shell+1) }, shell + 1, audit.Tampered, "missing"},
		{"reorder two records", func(l [][]byte) [][]byte { l[shell], l[shell+1] = l[shell+1], l[shell]; return l }, shell + 2, audit.Tampered, "out of order"},
		{"delete a checkpoint", func(l [][]byte) [][]byte { return slices.Delete(l, ck, ck+1) }, ck + 1, audit.Tampered, "missing"},
		{"truncate the end", func(l [][]byte) [][]byte { return l[:n-2] }, n - 2, audit.Unanchored, "after its last checkpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := slices.Clone(lines)
			l[shell] = slices.Clone(l[shell])
			if err := os.WriteFile(seg, bytes.Join(tc.mutate(l), nil), 0o600); err != nil {
				t.Fatal(err)
			}
			rep, err := audit.Verify(dir, audit.VerifyOptions{})
			if err != nil || len(rep.Problems) == 0 {
				t.Fatalf("not detected: %+v %v", rep, err)
			}
			p := rep.Problems[0]
			if p.Line != tc.line || p.Severity != tc.severity || !strings.Contains(p.What, tc.what) || p.File != filepath.Base(seg) {
				t.Fatalf("found %v; want line %d %s ...%s...", rep.Problems, tc.line, tc.severity, tc.what)
			}
		})
	}
	if err := os.WriteFile(seg, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	if rep, err := audit.Verify(dir, audit.VerifyOptions{}); err != nil || len(rep.Problems) != 0 {
		t.Fatalf("restored log: %v %v", rep.Problems, err)
	}
}

// A server whose log fails refuses work it cannot record.
func TestAuditFailureRefuses(t *testing.T) {
	e, log, _ := auditedEnv(t, nil)
	e.must("sandbox.list", map[string]any{}, nil)
	_ = log.Close()
	if r := e.call("sandbox.list", map[string]any{}); r.kind() != "unavailable" || !strings.Contains(r.Error.Message, "audit") {
		t.Fatalf("call with a closed log: %s", r.Raw)
	}
}

// Usage records cover a sandbox's run without gaps or overlaps, carry its
// labels, and add up to what it used.
func TestAuditUsage(t *testing.T) {
	e, log, dir := auditedEnv(t, func(o *sandbox.Options) { o.UsageEvery = 250 * time.Millisecond })
	e.must("sandbox.create", map[string]any{"name": "meter", "namespace": "team-a", "labels": map[string]string{"project": "p1"}}, nil)
	in, err := e.mgr.Get("team-a", "meter")
	if err != nil {
		t.Fatal(err)
	}
	e.fake.Sandbox(in.ID).SetStats(backend.Stats{CPUUsage: 3 * time.Second, MemoryBytes: 100 << 20})
	time.Sleep(time.Second) // a few periodic records
	e.must("sandbox.stop", map[string]any{"sandbox": "meter", "namespace": "team-a"}, nil)
	_ = log.Close()
	var us []*audit.Usage
	if err := audit.Scan(dir, audit.Filter{Kinds: []audit.Kind{audit.KindUsage}, Labels: map[string]string{"project": "p1"}}, func(_ []byte, en *audit.Entry) error {
		us = append(us, en.Usage)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(us) < 3 || us[len(us)-1].Reason != "stop" || us[0].Reason != "periodic" {
		t.Fatalf("usage records: %d %+v", len(us), us)
	}
	var cpu, mem float64
	for i, u := range us {
		cpu += u.CPUSeconds
		mem += u.MemorySeconds
		if i > 0 && !u.From.Equal(us[i-1].To) {
			t.Errorf("record %d starts at %v, the one before ends at %v", i, u.From, us[i-1].To)
		}
	}
	span := us[len(us)-1].To.Sub(us[0].From).Seconds()
	if cpu != 3 || mem <= 0 || mem > float64(100<<20)*span {
		t.Fatalf("cpu %g s, memory %g byte-s over %g s", cpu, mem, span)
	}
}
