package rpc_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/buildinfo"
)

// TestMicrosandboxRuns sends the exact requests of both client
// generations that run something in a real sandbox (commands, code, the
// CPU it used) and checks the answers; TestMicrosandboxProtocol has the
// rest of the protocol.
func TestMicrosandboxRuns(t *testing.T) {
	e := newEnv(t, false, nil)
	clientGenerations(t, e, func(t *testing.T, p func(kv ...any) map[string]any, want string) {
		var started string
		var cmd struct {
			Command  string   `json:"command"`
			Args     []string `json:"args"`
			ExitCode int      `json:"exit_code"`
			Success  bool     `json:"success"`
			Output   []struct {
				Stream string `json:"stream"`
				Text   string `json:"text"`
			} `json:"output"`
		}
		e.must("sandbox.command.run", p("sandbox", "proto", "command", "/bin/sh", "args", []string{"-c", "echo one; sleep 0.1; echo two >&2; sleep 0.1; echo three; exit 3"}, "timeout", 10), &cmd)
		if cmd.ExitCode != 3 || cmd.Success || cmd.Command != "/bin/sh" || len(cmd.Args) != 2 {
			t.Fatalf("command result %+v", cmd)
		}
		var lines []string
		for _, o := range cmd.Output {
			lines = append(lines, o.Stream+":"+o.Text)
		}
		if strings.Join(lines, ",") != "stdout:one,stderr:two,stdout:three" {
			t.Fatalf("output %v", lines)
		}
		var repl struct {
			Status   string `json:"status"`
			Language string `json:"language"`
			Output   []struct {
				Stream string `json:"stream"`
				Text   string `json:"text"`
			} `json:"output"`
			HasError bool    `json:"has_error"`
			Result   *string `json:"result"`
		}
		e.must("sandbox.repl.run", p("sandbox", "proto", "language", "python", "code", "x = 40\nprint('hi')"), &repl)
		if repl.Status != "success" || repl.Language != "python" || len(repl.Output) != 1 || repl.Output[0].Text != "hi" || repl.HasError {
			t.Fatalf("repl %+v", repl)
		}
		e.must("sandbox.repl.run", p("sandbox", "proto", "language", "python", "code", "x + 2"), &repl)
		if repl.Result == nil || *repl.Result != "42" {
			t.Fatalf("state not kept: %+v", repl)
		}
		e.must("sandbox.repl.run", p("sandbox", "proto", "language", "python", "code", "1/0"), &repl)
		if repl.Status != "error" || !repl.HasError {
			t.Fatalf("exception: %+v", repl)
		}
		e.must("sandbox.repl.run", p("sandbox", "proto", "language", "python", "code", "import time\ntime.sleep(30)", "timeout", 0.5), &repl)
		if repl.Status != "error" || !repl.HasError {
			t.Fatalf("timeout: %+v", repl)
		}
		e.must("sandbox.repl.run", p("sandbox", "proto", "language", "python", "code", "x"), &repl)
		if repl.Result == nil || *repl.Result != "40" {
			t.Fatalf("interpreter lost its state after a timeout: %+v", repl)
		}
		e.must("sandbox.repl.run", p("sandbox", "proto", "language", "nodejs", "code", "console.log(6*7)"), &repl)
		if len(repl.Output) != 1 || repl.Output[0].Text != "42" {
			t.Fatalf("node: %+v", repl)
		}

		// CPU must be a real measurement: burn CPU, then look.
		e.must("sandbox.command.run", p("sandbox", "proto", "command", "/bin/sh", "args", []string{"-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"}), nil)
		var met struct {
			Sandboxes []struct {
				Namespace   string   `json:"namespace"`
				Name        string   `json:"name"`
				Running     bool     `json:"running"`
				CPUUsage    *float64 `json:"cpu_usage"`
				MemoryUsage *float64 `json:"memory_usage"`
				DiskUsage   *int64   `json:"disk_usage"`
			} `json:"sandboxes"`
		}
		e.must("sandbox.metrics.get", p("sandbox", "proto"), &met)
		if len(met.Sandboxes) != 1 {
			t.Fatalf("metrics %+v", met)
		}
		m := met.Sandboxes[0]
		if m.Namespace != want || m.Name != "proto" || !m.Running || m.CPUUsage == nil || *m.CPUUsage <= 0 || m.MemoryUsage == nil || *m.MemoryUsage <= 0 || m.DiskUsage == nil {
			t.Fatalf("metrics %+v (cpu %v)", m, deref(m.CPUUsage))
		}

		e.must("sandbox.stop", p("sandbox", "proto"), &started)
	})
}

// TestMicrosandboxProtocol sends the exact requests of both client
// generations and checks the answers have the shapes clients parse
// (TestMicrosandboxRuns: those that need a real sandbox).
func TestMicrosandboxProtocol(t *testing.T) {
	e := newFakeEnv(t, false, nil)
	clientGenerations(t, e, func(t *testing.T, p func(kv ...any) map[string]any, want string) {
		var started string
		// Starting again is fine for its owner.
		e.must("sandbox.start", p("sandbox", "proto", "config", map[string]any{"memory": 512, "cpus": 1}), &started)

		var cmd struct {
			Command  string   `json:"command"`
			Args     []string `json:"args"`
			ExitCode int      `json:"exit_code"`
			Success  bool     `json:"success"`
			Output   []struct {
				Stream string `json:"stream"`
				Text   string `json:"text"`
			} `json:"output"`
		}
		e.must("sandbox.command.run", p("sandbox", "proto", "command", "echo", "args", []string{"one"}, "timeout", 10), &cmd)
		if cmd.ExitCode != 0 || !cmd.Success || cmd.Command != "echo" || len(cmd.Args) != 1 ||
			len(cmd.Output) != 1 || cmd.Output[0].Stream != "stdout" || cmd.Output[0].Text != "one" {
			t.Fatalf("command result %+v", cmd)
		}
		e.must("sandbox.command.run", p("sandbox", "proto", "command", "exit", "args", []string{"3"}), &cmd)
		if cmd.ExitCode != 3 || cmd.Success {
			t.Fatalf("command result %+v", cmd)
		}
		// The Go SDK sends args: null for a nil slice.
		r := e.call("sandbox.command.run", p("sandbox", "proto", "command", "true", "args", nil))
		if r.Status != 200 || !strings.Contains(string(r.Result), `"args":[]`) {
			t.Fatalf("args null: %d %s", r.Status, r.Raw)
		}

		var met struct {
			Sandboxes []struct {
				Namespace string   `json:"namespace"`
				Name      string   `json:"name"`
				Running   bool     `json:"running"`
				CPUUsage  *float64 `json:"cpu_usage"`
			} `json:"sandboxes"`
		}
		e.must("sandbox.stop", p("sandbox", "proto"), &started)
		if started != "Sandbox proto stopped successfully" {
			t.Fatalf("stop result %q", started)
		}
		e.must("sandbox.stop", p("sandbox", "proto"), nil) // idempotent
		e.must("sandbox.metrics.get", p("sandbox", "proto"), &met)
		if len(met.Sandboxes) != 1 || met.Sandboxes[0].Namespace != want || met.Sandboxes[0].Name != "proto" ||
			met.Sandboxes[0].Running || met.Sandboxes[0].CPUUsage != nil {
			t.Fatalf("stopped metrics %+v", met.Sandboxes)
		}
		r = e.call("sandbox.command.run", p("sandbox", "proto", "command", "true"))
		if r.Status != http.StatusConflict || r.kind() != "conflict" || !strings.Contains(r.Error.Message, "stopped") {
			t.Fatalf("command in a stopped sandbox: %d %s", r.Status, r.Raw)
		}
	})
}

func deref(p *float64) float64 {
	if p == nil {
		return -1
	}
	return *p
}

// TestCommandErrors: not found and timeouts are JSON-RPC errors with useful
// messages; a non-zero exit is a result.
func TestCommandErrors(t *testing.T) {
	e := newFakeEnv(t, true, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "errs"}, nil)
	r := e.call("sandbox.command.run", map[string]any{"sandbox": "errs", "command": "no-such-command"})
	if r.Status != 422 || r.kind() != "exec_failed" || !strings.Contains(r.Error.Message, "no-such-command") {
		t.Fatalf("not found: %d %s", r.Status, r.Raw)
	}
	r = e.call("sandbox.command.run", map[string]any{"sandbox": "errs", "command": "sleep", "args": []string{"30"}, "timeout": 0.3})
	if r.Status != 504 || r.kind() != "timeout" || !strings.Contains(r.Error.Message, "timeout") {
		t.Fatalf("timeout: %d %s", r.Status, r.Raw)
	}
	r = e.call("sandbox.command.run", map[string]any{"sandbox": "nope", "command": "true"})
	if r.Status != 404 || r.kind() != "not_found" {
		t.Fatalf("unknown sandbox: %d %s", r.Status, r.Raw)
	}
	r = e.call("sandbox.start", map[string]any{"sandbox": "vol", "config": map[string]any{"volumes": []string{"/etc:/x"}}})
	if r.Status != 400 || !strings.Contains(r.Error.Message, "volumes") {
		t.Fatalf("volumes: %d %s", r.Status, r.Raw)
	}
}

// TestHostileRequests: malformed, oversized, deeply nested and mistyped
// requests get clear errors, never a crash, and the server keeps serving.
func TestHostileRequests(t *testing.T) {
	e := newFakeEnv(t, true, nil)
	deep := strings.Repeat(`{"a":`, 100000) + "1" + strings.Repeat("}", 100000)
	cases := []struct {
		name   string
		body   string
		status int
		kind   string
	}{
		{"empty", ``, 400, "parse_error"},
		{"not json", `{"jsonrpc":`, 400, "parse_error"},
		{"garbage", "\x00\xff", 400, "parse_error"},
		{"array", `[{"jsonrpc":"2.0","method":"sandbox.list","id":1}]`, 400, "invalid_request"},
		{"string", `"hello"`, 400, "invalid_request"},
		{"no version", `{"method":"sandbox.list","id":1}`, 400, "invalid_request"},
		{"no method", `{"jsonrpc":"2.0","id":1}`, 400, "invalid_request"},
		{"method number", `{"jsonrpc":"2.0","method":5,"id":1}`, 400, "invalid_request"},
		{"object id", `{"jsonrpc":"2.0","method":"sandbox.list","id":{}}`, 400, "invalid_request"},
		{"unknown method", `{"jsonrpc":"2.0","method":"sandbox.explode","id":1}`, 404, "method_not_found"},
		{"params array", `{"jsonrpc":"2.0","method":"sandbox.list","params":[1],"id":1}`, 400, "invalid_params"},
		{"wrong type", `{"jsonrpc":"2.0","method":"sandbox.start","params":{"sandbox":5},"id":1}`, 400, "invalid_params"},
		{"memory string", `{"jsonrpc":"2.0","method":"sandbox.start","params":{"sandbox":"x","config":{"memory":"lots"}},"id":1}`, 400, "invalid_params"},
		{"memory huge", `{"jsonrpc":"2.0","method":"sandbox.start","params":{"sandbox":"x","config":{"memory":1e18}},"id":1}`, 400, "invalid_params"},
		{"bad name", `{"jsonrpc":"2.0","method":"sandbox.start","params":{"sandbox":"../etc"},"id":1}`, 400, "invalid_params"},
		{"bad namespace", `{"jsonrpc":"2.0","method":"sandbox.stop","params":{"sandbox":"a","namespace":"a/b"},"id":1}`, 400, "invalid_params"},
		{"timeout negative", `{"jsonrpc":"2.0","method":"sandbox.command.run","params":{"sandbox":"a","command":"true","timeout":-1},"id":1}`, 400, "invalid_params"},
		{"strict unknown field", `{"jsonrpc":"2.0","method":"sandbox.create","params":{"name":"a","egres":["x"]},"id":1}`, 400, "invalid_params"},
		{"deep nesting", `{"jsonrpc":"2.0","method":"sandbox.list","params":` + deep + `,"id":1}`, 400, ""},
		{"oversized", `{"jsonrpc":"2.0","method":"sandbox.list","params":{"x":"` + strings.Repeat("a", 65<<20) + `"},"id":1}`, 413, "too_large"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := e.post("", []byte(c.body))
			if r.Status != c.status || r.Error == nil || (c.kind != "" && r.kind() != c.kind) || r.Error.Message == "" {
				t.Fatalf("status %d kind %q, want %d %q: %.300s", r.Status, r.kind(), c.status, c.kind, r.Raw)
			}
		})
	}
	// The id is echoed even on errors when it could be read.
	r := e.post("", []byte(`{"jsonrpc":"2.0","method":"nope","id":"abc-123"}`))
	if string(r.ID) != `"abc-123"` {
		t.Fatalf("id not echoed: %s", r.Raw)
	}
	resp, err := http.Get(e.url + "/api/v1/rpc")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Fatalf("GET rpc: %d", resp.StatusCode)
	}
	resp, err = http.Get(e.url + "/api/v1/health")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if want := `{"message":"Service is healthy","version":"` + buildinfo.Version() + `","commit":"` + buildinfo.Commit() + `"}`; resp.StatusCode != 200 || string(b) != want {
		t.Fatalf("health: %d %s", resp.StatusCode, b)
	}
}

// TestAuthMatrix checks every way a key can be wrong, and namespace
// isolation on each method family.
func TestAuthMatrix(t *testing.T) {
	e := newFakeEnv(t, false, nil)
	ctx := t.Context()
	keyA, _, err := e.keys.Create(ctx, "team-a", time.Hour, "")
	if err != nil {
		t.Fatal(err)
	}
	revoked, rec, err := e.keys.Create(ctx, "team-a", time.Hour, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.keys.Revoke(ctx, rec.ID); err != nil {
		t.Fatal(err)
	}
	expired, _, err := e.signer.Issue("team-a", time.Second, time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	other := make([]byte, 32)
	foreign, _, _ := mustSigner(t, other).Issue("team-a", time.Hour, time.Now())
	list := map[string]any{"namespace": "team-a"}
	for _, c := range []struct {
		name, key string
		status    int
	}{
		{"none", "", 401},
		{"malformed", "msb_not-a-jwt", 401},
		{"garbage", "hello", 401},
		{"expired", expired, 401},
		{"revoked", revoked, 401},
		{"other server's secret", foreign, 401},
		{"scoped key, own namespace", keyA, 200},
		{"admin key", e.admin, 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := e.callAs(c.key, "sandbox.list", list)
			if r.Status != c.status {
				t.Fatalf("status %d, want %d: %s", r.Status, c.status, r.Raw)
			}
			if c.status == 401 && (r.kind() != "unauthorized" || strings.Contains(r.Error.Message, c.key) && c.key != "") {
				t.Fatalf("answer %s", r.Raw)
			}
		})
	}
	// Raw key and Proxy-Authorization are accepted too.
	for _, h := range []struct{ name, value string }{{"Authorization", keyA}, {"Proxy-Authorization", "Bearer " + keyA}} {
		req, _ := http.NewRequest("POST", e.url+"/api/v1/rpc", strings.NewReader(`{"jsonrpc":"2.0","method":"sandbox.list","params":{"namespace":"team-a"},"id":1}`))
		req.Header.Set(h.name, h.value)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", h.name, resp.StatusCode)
		}
	}
	// Namespace isolation.
	e.must("sandbox.start", map[string]any{"sandbox": "b1", "namespace": "team-b"}, nil)
	for _, c := range []struct {
		method string
		params map[string]any
	}{
		{"sandbox.start", map[string]any{"sandbox": "x", "namespace": "team-b"}},
		{"sandbox.stop", map[string]any{"sandbox": "b1", "namespace": "team-b"}},
		{"sandbox.command.run", map[string]any{"sandbox": "b1", "namespace": "team-b", "command": "true"}},
		{"sandbox.repl.run", map[string]any{"sandbox": "b1", "namespace": "team-b", "language": "python", "code": "1"}},
		{"sandbox.metrics.get", map[string]any{"sandbox": "b1", "namespace": "team-b"}},
		{"sandbox.metrics.get", map[string]any{"namespace": "*"}},
		{"sandbox.list", map[string]any{"namespace": "*"}},
		{"sandbox.get", map[string]any{"sandbox": "b1", "namespace": "team-b"}},
		{"sandbox.remove", map[string]any{"sandbox": "b1", "namespace": "team-b"}},
		{"sandbox.file.read", map[string]any{"sandbox": "b1", "namespace": "team-b", "path": "/etc/hostname"}},
		{"sandbox.process.list", map[string]any{"sandbox": "b1", "namespace": "team-b"}},
		{"sandbox.logs", map[string]any{"sandbox": "b1", "namespace": "team-b"}},
		{"key.create", map[string]any{"namespace": "team-a"}},
		{"key.list", map[string]any{}},
		{"image.pull", map[string]any{"ref": "x"}},
	} {
		r := e.callAs(keyA, c.method, c.params)
		if r.Status != 403 || r.kind() != "forbidden" {
			t.Errorf("%s %v with a team-a key: %d %s", c.method, c.params, r.Status, r.Raw)
		}
	}
	// Naming "default" with a team-a key is forbidden too; naming none
	// means the key's own namespace (TestNamespaceDefaultsToKey).
	if r := e.callAs(keyA, "sandbox.start", map[string]any{"sandbox": "x", "namespace": "default"}); r.Status != 403 {
		t.Errorf("default namespace with a team-a key: %d", r.Status)
	}
	// The team-a key sees only team-a in metrics.
	e.must("sandbox.start", map[string]any{"sandbox": "a1", "namespace": "team-a"}, nil)
	req, _ := http.NewRequest("GET", e.url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+keyA)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 200 || strings.Contains(string(body), "team-b") || !strings.Contains(string(body), `namespace="team-a"`) {
		t.Fatalf("metrics for team-a: %d\n%s", resp.StatusCode, body)
	}
	// A revoked key stops working at once, also for a key that worked.
	var created struct {
		ID  string `json:"id"`
		Key string `json:"key"`
	}
	e.must("key.create", map[string]any{"namespace": "team-a", "expire": 60}, &created)
	if r := e.callAs(created.Key, "sandbox.list", list); r.Status != 200 {
		t.Fatalf("new key: %s", r.Raw)
	}
	e.must("key.revoke", map[string]any{"id": created.ID}, nil)
	if r := e.callAs(created.Key, "sandbox.list", list); r.Status != 401 || !strings.Contains(r.Error.Message, "revoked") {
		t.Fatalf("revoked key: %s", r.Raw)
	}
}

// TestConcurrentClients: 50 clients mixing methods at once
// (TestRacingStarts: starts of one name).
func TestConcurrentClients(t *testing.T) {
	e := newFakeEnv(t, true, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "shared"}, nil)
	var wg sync.WaitGroup
	errs := make(chan string, 1000)
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			own := fmt.Sprintf("c%d", i)
			steps := []struct {
				method string
				params map[string]any
			}{
				{"sandbox.command.run", map[string]any{"sandbox": "shared", "command": "echo", "args": []string{own}}},
				{"sandbox.repl.run", map[string]any{"sandbox": "shared", "language": "python", "code": "print(" + fmt.Sprint(i) + ")"}},
				{"sandbox.metrics.get", map[string]any{}},
				{"sandbox.list", map[string]any{}},
			}
			if i%5 == 0 {
				steps = append(steps,
					struct {
						method string
						params map[string]any
					}{"sandbox.start", map[string]any{"sandbox": own}},
					struct {
						method string
						params map[string]any
					}{"sandbox.command.run", map[string]any{"sandbox": own, "command": "true"}},
					struct {
						method string
						params map[string]any
					}{"sandbox.stop", map[string]any{"sandbox": own}},
				)
			}
			for _, s := range steps {
				body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": s.method, "params": s.params, "id": i})
				resp, err := http.Post(e.url+"/api/v1/rpc", "application/json", strings.NewReader(string(body)))
				if err != nil {
					errs <- err.Error()
					return
				}
				b, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != 200 {
					errs <- fmt.Sprintf("%s: %d %s", s.method, resp.StatusCode, b)
				}
				if s.method == "sandbox.command.run" && s.params["sandbox"] == "shared" && !strings.Contains(string(b), `"text":"`+own+`"`) {
					errs <- fmt.Sprintf("client %d got someone else's output: %s", i, b)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestRacingStarts: racing starts of one name each start it, find it
// running, or are told it is starting; exactly one sandbox results.
func TestRacingStarts(t *testing.T) {
	e := newFakeEnv(t, true, nil)
	var wg sync.WaitGroup
	var codes sync.Map
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": "sandbox.start", "params": map[string]any{"sandbox": "race"}, "id": i})
			resp, err := http.Post(e.url+"/api/v1/rpc", "application/json", strings.NewReader(string(body)))
			if err != nil {
				t.Error(err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			codes.Store(i, resp.StatusCode)
			if resp.StatusCode != 200 && (resp.StatusCode != 409 || !strings.Contains(string(b), "starting")) {
				t.Errorf("racing start: %d %s", resp.StatusCode, b)
			}
		}()
	}
	wg.Wait()
	ok := 0
	codes.Range(func(_, v any) bool {
		if v.(int) == 200 {
			ok++
		}
		return true
	})
	if ok == 0 {
		t.Fatal("no racing start won")
	}
	var list struct {
		Sandboxes []struct {
			Name  string `json:"name"`
			State string `json:"state"`
		} `json:"sandboxes"`
	}
	e.must("sandbox.list", map[string]any{}, &list)
	n := 0
	for _, s := range list.Sandboxes {
		if s.Name == "race" {
			n++
			if s.State != "running" {
				t.Fatalf("race sandbox %s", s.State)
			}
		}
	}
	if n != 1 {
		t.Fatalf("%d sandboxes named race", n)
	}
}

// TestPythonClient runs a stdlib-only Python client that sends what the
// microsandbox Python SDK sends, with a real key.
func TestPythonClient(t *testing.T) {
	e := newEnv(t, false, nil)
	out, err := exec.Command("/usr/bin/python3", "testdata/msb_client.py", e.url, e.admin).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("python client: %v\n%s", err, out)
	}
}

// clientGenerations runs f once per microsandbox client generation, after
// the Python SDK's start request (verbatim in shape) of sandbox "proto":
// p makes params carrying the generation's namespace (generation A) or
// none (B), and want is the namespace the sandbox lands in.
func clientGenerations(t *testing.T, e *env, f func(t *testing.T, p func(kv ...any) map[string]any, want string)) {
	for _, gen := range []struct {
		name string
		ns   map[string]any // extra params
		want string         // namespace the sandbox lands in
	}{
		{"generation A (namespace sent)", map[string]any{"namespace": "team-a"}, "team-a"},
		{"generation B (no namespace)", map[string]any{}, "default"},
	} {
		t.Run(gen.name, func(t *testing.T) {
			p := func(kv ...any) map[string]any {
				m := map[string]any{}
				for k, v := range gen.ns {
					m[k] = v
				}
				for i := 0; i < len(kv); i += 2 {
					m[kv[i].(string)] = kv[i+1]
				}
				return m
			}
			var started string
			e.must("sandbox.start", p("sandbox", "proto", "config", map[string]any{
				"image": "microsandbox/python", "memory": 512, "cpus": 1,
			}), &started)
			if started != "Sandbox proto started successfully" {
				t.Fatalf("start result %q", started)
			}
			f(t, p, gen.want)
		})
	}
}
