package rpc_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// The SDKs at their generations (msbcompat_client_test.go says where each
// wire form was read).
var wireSDKs = []wireSDK{
	{SDK: "python", Gen: "A", Commit: "ef8a9e554fb6"},
	{SDK: "python", Gen: "B", Commit: "2837007cb662"},
	{SDK: "javascript", Gen: "A", Commit: "ef8a9e554fb6"},
	{SDK: "javascript", Gen: "B", Commit: "2837007cb662"},
	{SDK: "go", Gen: "A", Commit: "0f2c5b3bdd6b", goNoID: true},
	{SDK: "go", Gen: "A", Commit: "ef8a9e554fb6"},
	{SDK: "go", Gen: "B", Commit: "2837007cb662"},
	{SDK: "rust", Gen: "A", Commit: "ef8a9e554fb6"},
	{SDK: "rust", Gen: "B", Commit: "2837007cb662"},
}

// TestMicrosandboxSDKWire plays what microsandbox's SDKs send, generation
// by generation — every shipped example's sequence of calls and the basic
// operations — against a real server with real sandboxes, with a key and
// in dev mode, and checks each answer the way that SDK reads it. A call
// whose check waits for a fix names its issue-17 finding.
func TestMicrosandboxSDKWire(t *testing.T) {
	t.Run("keys", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, false, nil)
		e.mountMCP()
		t.Run("sdk", func(t *testing.T) { playAll(t, e) })
		// A key that expires in a second, used after it has: microsandbox
		// allows 60 s of clock skew (finding 10).
		skewKey, _, err := e.keys.Create(t.Context(), "*", time.Second, "clock skew")
		if err != nil {
			t.Fatal(err)
		}
		skewFrom := time.Now()
		// The Go SDK with WithHTTPClient(&http.Client{Timeout: 60 s}): every
		// command carries timeout 60000000000 (finding 4).
		t.Run("go-B-http-timeout-60s", func(t *testing.T) {
			s := wireSDK{SDK: "go", Gen: "B", Commit: "2837007cb662", goTimeout: int64(60 * time.Second)}
			play(t, e, s, e.admin, with("go-timeout", "python", 512, 1,
				finding("4", command("", "echo", []string{"hi"}, want{Stdout: ptr("hi"), ExitCode: ptr(0), Success: ptr(true)}))))
		})
		t.Run("mcp", func(t *testing.T) { mcpChecks(t, e) })
		t.Run("raw", func(t *testing.T) {
			rawChecks(t, e)
			if d := 2*time.Second - time.Since(skewFrom); d > 0 {
				time.Sleep(d)
			}
			t.Run("key-expired-within-skew", func(t *testing.T) {
				r := e.callAs(skewKey, "sandbox.metrics.get", map[string]any{})
				if r.Status != 200 || r.Error != nil {
					t.Errorf("a key expired a second ago is refused (microsandbox allows 60 s of skew; finding 10): %d %s", r.Status, r.Raw)
				}
			})
		})
	})
	t.Run("dev", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, true, nil)
		for _, s := range wireSDKs {
			t.Run(s.String(), func(t *testing.T) {
				play(t, e, s, "", basicOps(s))
			})
		}
	})
}

// playAll plays every SDK at once, each in a namespace of its own with a
// key for it: generation A names it, generation B lands in the key's.
func playAll(t *testing.T, e *env) {
	for i, s := range wireSDKs {
		s.Namespace = "sdk-" + strings.ReplaceAll(s.String(), "-0f2c5b3", "0")
		key, _, err := e.keys.Create(t.Context(), s.Namespace, time.Hour, s.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Run(s.String(), func(t *testing.T) {
			t.Parallel()
			// The Go examples' calls are the same at both generations,
			// whose requests differ only in namespace, which the basic
			// operations cover: they play once, at the newer one.
			playSDK(t, e, s, key, 18760+i, !s.goNoID && (s.SDK != "go" || s.Gen == "B"))
		})
	}
}

// playSDK plays s's basic operations, a start with ports (publishing a
// port on the host), and its examples.
func playSDK(t *testing.T, e *env, s wireSDK, key string, port int, examples bool) {
	t.Run("basic", func(t *testing.T) { play(t, e, s, key, basicOps(s)) })
	if s.SDK != "javascript" && !s.goNoID {
		// ports in the start config reach the server in the SDK's form
		// and, until sandboxes have a network to publish them on (the
		// network issue), are refused clearly rather than dropped: the
		// SDK raises (docs/compat.md). Empty ports start (basicOps).
		st := start("ports-ops", "python", 0, 0)
		st.Ports, st.Want = []string{fmt.Sprintf("%d:8000", port)}, want{Fail: true}
		t.Run("ports", func(t *testing.T) { play(t, e, s, key, []call{st}) })
	}
	if !examples {
		return
	}
	list := pyExamples
	if s.SDK == "go" {
		list = goExamples
	}
	for _, sc := range list {
		t.Run(sc.Name, func(t *testing.T) { play(t, e, s, key, sc.Calls) })
	}
}

// play runs calls in order as s, each a subtest.
func play(t *testing.T, e *env, s wireSDK, key string, calls []call) {
	started := &startLog{m: map[string]string{}}
	for i, c := range calls {
		t.Run(fmt.Sprintf("%02d_%s", i, c.label()), func(t *testing.T) {
			if c.Op == opSleep {
				time.Sleep(c.Pause)
				return
			}
			if c.Parallel != nil {
				var wg sync.WaitGroup
				errs := make([]string, len(c.Parallel))
				for j, pc := range c.Parallel {
					wg.Add(1)
					go func() {
						defer wg.Done()
						errs[j] = playCall(e, s, key, pc, started)
					}()
				}
				wg.Wait()
				for j, msg := range errs {
					if msg != "" {
						t.Errorf("parallel call %d (%s): %s", j, c.Parallel[j].label(), msg)
					}
				}
				return
			}
			if msg := playCall(e, s, key, c, started); msg != "" {
				t.Error(msg)
			}
			if why, _ := started.get(c.Sandbox); c.Op == opStart && why != "" {
				t.Logf("the calls on %s that follow fail with it", c.Sandbox)
			}
		})
	}
	// Requests without an id (the REST routes' starts, the Go SDK before
	// its default ids) get answers without one from microsandbox.
	t.Run("no-id-answers", func(t *testing.T) {
		if len(started.ids) > 0 {
			t.Errorf("%d answers to requests without an id carry one (microsandbox omits it; waits for finding 10): %s",
				len(started.ids), strings.Join(started.ids, "; "))
		}
	})
}

// startLog records each sandbox's start: "" when it started, else why not.
type startLog struct {
	mu sync.Mutex
	m  map[string]string
	// ids: answers to requests without an id that carried one anyway.
	ids []string
}

func (l *startLog) noteID(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ids = append(l.ids, s)
}

func (l *startLog) get(name string) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	why, ok := l.m[name]
	return why, ok
}

func (l *startLog) set(name, why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.m[name] = why
}

func (c call) label() string {
	switch c.Op {
	case opStart, opStop, opMetrics:
		return c.Op + "_" + c.Sandbox
	case opRepl:
		return "repl_" + c.Lang + "_" + firstLine(c.Code)
	case opCommand:
		return "command_" + c.Command
	case opSleep:
		return "pause"
	}
	return "parallel"
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 24 {
		s = s[:24]
	}
	return s
}

// playCall sends c as s and checks the answer; it returns what went wrong
// ("" when nothing), naming the finding a failure waits for.
func playCall(e *env, s wireSDK, key string, c call, started *startLog) (msg string) {
	req := s.request(c, key, newUUID())
	if c.Finding == "" && req.Path != "/api/v1/rpc" {
		c.Finding = "7" // the newer generation's REST routes
	}
	if c.Finding == "" && c.Op == opCommand && s.goTimeout != 0 {
		c.Finding = "4"
	}
	defer func() {
		if msg != "" && c.Finding != "" {
			msg += " (waits for finding " + c.Finding + ")"
		}
	}()
	if c.Op != opStart {
		// The SDKs refuse calls on a sandbox they did not start.
		if why, ok := started.get(c.Sandbox); ok && why != "" {
			c.Finding = ""
			return "not started, as its start failed: " + why
		}
	}
	ctx := context.Background()
	timeout := 120 * time.Second
	if c.Cancel > 0 {
		timeout = c.Cancel
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url+req.Path, bytes.NewReader(req.Body))
	if err != nil {
		return err.Error()
	}
	hr.Header = req.Header
	resp, err := http.DefaultClient.Do(hr)
	var body []byte
	if err == nil {
		body, err = io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		_ = resp.Body.Close()
	}
	if err != nil {
		if c.Cancel > 0 && errors.Is(err, context.DeadlineExceeded) && c.Want.Fail {
			return ""
		}
		return fmt.Sprintf("POST %s: %v", req.Path, err)
	}
	problems := envelopeProblems(req, resp.StatusCode, resp.Header, body)
	if req.ID == "" {
		if id, ok := answerID(body); ok {
			started.noteID(fmt.Sprintf("%s answered with \"id\": %s", c.label(), id))
		}
	}
	v, readErr := s.read(c, resp.StatusCode, resp.Header, body)
	if c.Op == opStart {
		why := ""
		if readErr != nil {
			why = shortErr(readErr)
			if c.Finding != "" {
				why += " (waits for finding " + c.Finding + ")"
			}
		}
		started.set(c.Sandbox, why)
	}
	switch {
	case c.Want.Fail && readErr == nil:
		problems = append(problems, fmt.Sprintf("the SDK raises nothing; microsandbox fails this call: %s", short(body)))
	case !c.Want.Fail && readErr != nil:
		problems = append(problems, fmt.Sprintf("the SDK raises: %v", shortErr(readErr)))
	case readErr == nil:
		problems = append(problems, c.Want.check(v, s)...)
	}
	if len(problems) == 0 {
		return ""
	}
	return fmt.Sprintf("%s POST %s %s: %s", s, req.Path, short(req.Body), strings.Join(problems, "; "))
}

// envelopeProblems are what any SDK user, or a raw client, would notice in
// the envelope: success is 200 with a result and no error member (Python,
// JavaScript and Rust treat any "error" member, even null, as a failure);
// a JSON content type (aiohttp refuses another); the request's id echoed,
// (play checks that an answer to a request without one has none).
func envelopeProblems(req request, status int, hdr http.Header, body []byte) []string {
	var p []string
	if ct := hdr.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		p = append(p, fmt.Sprintf("content type %q", ct))
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		return append(p, fmt.Sprintf("answer is not a JSON object: %s", short(body)))
	}
	if status == 200 {
		if _, ok := obj["error"]; ok {
			p = append(p, "a 200 answer carries an error member")
		}
		if _, ok := obj["result"]; !ok {
			p = append(p, "a 200 answer has no result")
		}
	}
	if id := obj["id"]; req.ID != "" && string(id) != `"`+req.ID+`"` {
		p = append(p, fmt.Sprintf("id %s, sent %q", id, req.ID))
	}
	return p
}

// answerID is the answer's id member, if it has one.
func answerID(body []byte) (json.RawMessage, bool) {
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) != nil {
		return nil, false
	}
	id, ok := obj["id"]
	return id, ok
}

// check compares what the SDK read with what the example's user must get.
func (w want) check(v view, s wireSDK) []string {
	var p []string
	if w.Stdout != nil && v.Stdout != *w.Stdout {
		p = append(p, fmt.Sprintf("output() = %q, want %q", short([]byte(v.Stdout)), *w.Stdout))
	}
	for _, h := range w.StdoutHas {
		if !strings.Contains(v.Stdout, h) {
			p = append(p, fmt.Sprintf("output() = %q lacks %q", short([]byte(v.Stdout)), h))
		}
	}
	if w.StdoutNotEmpty && strings.TrimSpace(v.Stdout) == "" {
		p = append(p, "output() is empty")
	}
	if w.StdoutLines > 0 && v.StdoutLines != w.StdoutLines {
		p = append(p, fmt.Sprintf("%d stdout lines, want %d (microsandbox does not cut output; finding 3)", v.StdoutLines, w.StdoutLines))
	}
	for _, h := range w.StderrHas {
		if !strings.Contains(v.Stderr, h) {
			p = append(p, fmt.Sprintf("error() = %q lacks %q", short([]byte(v.Stderr)), h))
		}
	}
	if w.HasError != nil && v.HasError != *w.HasError {
		p = append(p, fmt.Sprintf("has_error() = %v, want %v (stderr %q)", v.HasError, *w.HasError, short([]byte(v.Stderr))))
	}
	if w.Status != "" && v.Status != w.Status {
		p = append(p, fmt.Sprintf("status %q, want %q", v.Status, w.Status))
	}
	if w.ExitCode != nil && v.ExitCode != *w.ExitCode {
		p = append(p, fmt.Sprintf("exit_code %d, want %d (stderr %q)", v.ExitCode, *w.ExitCode, short([]byte(v.Stderr))))
	}
	if w.Success != nil && v.Success != *w.Success {
		p = append(p, fmt.Sprintf("success %v, want %v", v.Success, *w.Success))
	}
	if w.Running {
		if !v.Running {
			p = append(p, "is_running() is false")
		}
		if v.CPU != nil && (*v.CPU < 0 || *v.CPU > float64(100*w.CPUs)) {
			p = append(p, fmt.Sprintf("cpu_usage %s out of [0, %d] (finding 8)", fmtNum(v.CPU), 100*w.CPUs))
		}
		if v.Memory == nil || *v.Memory <= 0 {
			p = append(p, fmt.Sprintf("memory() = %s, want MiB > 0", fmtNum(v.Memory)))
		}
		if v.Disk == nil && s.SDK == "rust" {
			p = append(p, "disk() is None (disk_usage not an unsigned integer)")
		}
	}
	return p
}

func short(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}

func shortErr(err error) string { return short([]byte(err.Error())) }

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// rawChecks: what a raw client of microsandbox's server notices beyond the
// SDKs (finding 10).
func rawChecks(t *testing.T, e *env) {
	// microsandbox refuses a new sandbox without config (it has no default
	// image); Warren starts it from its defaults, on purpose
	// (docs/compat.md): no SDK sends a start without one.
	t.Run("start-without-config", func(t *testing.T) {
		r := e.call("sandbox.start", map[string]any{"sandbox": "no-config"})
		if r.Status != 200 || r.Error != nil {
			t.Errorf("a new sandbox started with no config: %d %s, want it started from the defaults", r.Status, r.Raw)
		}
		e.call("sandbox.stop", map[string]any{"sandbox": "no-config"})
	})
	t.Run("no-id", func(t *testing.T) {
		r := e.post(e.admin, []byte(`{"jsonrpc":"2.0","method":"sandbox.metrics.get","params":{}}`))
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(r.Raw, &obj); err != nil {
			t.Fatal(err)
		}
		if id, ok := obj["id"]; ok {
			t.Errorf("a request without id is answered with \"id\": %s (microsandbox omits it; finding 10)", id)
		}
	})
}

// mcpChecks: what an MCP client written for microsandbox's server sends
// and expects (finding 9).
func mcpChecks(t *testing.T, e *env) {
	t.Run("accept-json-only", func(t *testing.T) {
		body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
		req, err := http.NewRequest(http.MethodPost, e.url+"/mcp", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json")
		resp := e.do(t, req, e.admin)
		raw, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("initialize with Accept: application/json alone: %d %s (microsandbox answers; finding 9)", resp.StatusCode, short(raw))
		}
	})
	cs, err := e.mcpConnect(e.admin)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cs.Close() }()
	t.Run("prompts", func(t *testing.T) {
		res, err := cs.ListPrompts(t.Context(), nil)
		names := map[string]bool{}
		if err == nil {
			for _, p := range res.Prompts {
				names[p.Name] = true
			}
		}
		if !names["create_python_sandbox"] || !names["create_node_sandbox"] {
			t.Errorf("prompts %v (%v): microsandbox offers create_python_sandbox and create_node_sandbox (finding 9)", names, err)
		}
	})
	t.Run("start-with-volumes-and-ports", func(t *testing.T) {
		res, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: "sandbox_start", Arguments: map[string]any{
			"sandbox": "mcp-config", "config": map[string]any{"image": "microsandbox/python", "memory": 512, "cpus": 1, "volumes": []string{}, "ports": []string{}}}})
		if err != nil || res.IsError {
			var text string
			if err == nil && len(res.Content) > 0 {
				if tc, ok := res.Content[0].(*sdk.TextContent); ok {
					text = tc.Text
				}
			}
			t.Errorf("sandbox_start with empty volumes and ports (in microsandbox's tool schema): %v %s (finding 9)", err, text)
			return
		}
		_, _ = cs.CallTool(t.Context(), &sdk.CallToolParams{Name: "sandbox_stop", Arguments: map[string]any{"sandbox": "mcp-config"}})
	})
}
