package rpc_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The request forms of microsandbox's clients that Warren once refused or
// answered differently (docs/compat.md), each sent as those clients send
// it.

// TestGoSDKCommandTimeout: the Go SDK sends its HTTP client's timeout in
// nanoseconds as the command's timeout (60 s is 60000000000); the command
// runs, its timeout held to Warren's maximum. A timeout that is not a
// non-negative number is still refused, naming it.
func TestGoSDKCommandTimeout(t *testing.T) {
	e := newFakeEnv(t, true, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "g"}, nil)
	r := e.post("", []byte(`{"jsonrpc":"2.0","method":"sandbox.command.run","params":{"namespace":"default","sandbox":"g","command":"echo","args":["hi"],"timeout":60000000000},"id":"c1"}`))
	var res struct {
		ExitCode int `json:"exit_code"`
		Output   []struct{ Stream, Text string }
	}
	if r.Status != 200 || json.Unmarshal(r.Result, &res) != nil || res.ExitCode != 0 || len(res.Output) != 1 || res.Output[0].Text != "hi" {
		t.Fatalf("Go SDK command with a 60 s (in ns) timeout: %d %s", r.Status, r.Raw)
	}
	for _, bad := range []string{`"60"`, `-1`, `true`} {
		r := e.post("", []byte(`{"jsonrpc":"2.0","method":"sandbox.command.run","params":{"sandbox":"g","command":"echo","timeout":`+bad+`},"id":"c2"}`))
		if r.Status != 400 || r.kind() != "invalid_params" || !strings.Contains(r.Error.Message, "timeout") {
			t.Errorf("timeout %s: %d %s, want invalid_params naming the timeout", bad, r.Status, r.Raw)
		}
	}
}

// TestRequestWithoutID: an answer to a request without an id has no "id"
// member, as microsandbox answers (the SDKs that post sandbox.start to
// /api/v1/sandbox/start send none); an id of null is echoed as null, and
// an answer to a body whose id could not be read carries null.
func TestRequestWithoutID(t *testing.T) {
	e := newFakeEnv(t, true, nil)
	hasID := func(raw []byte) (json.RawMessage, bool) {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("answer %q: %v", raw, err)
		}
		id, ok := m["id"]
		return id, ok
	}
	cases := []struct {
		name, body string
		status     int
		id         string // "" = no id member
	}{
		{"success", `{"jsonrpc":"2.0","method":"sandbox.start","params":{"sandbox":"n","config":{"image":"microsandbox/python","memory":512,"cpus":1}}}`, 200, ""},
		{"error", `{"jsonrpc":"2.0","method":"sandbox.nope","params":{}}`, 404, ""},
		{"invalid params", `{"jsonrpc":"2.0","method":"sandbox.stop","params":{"sandbox":"../x"}}`, 400, ""},
		{"null id", `{"jsonrpc":"2.0","method":"sandbox.stop","params":{"sandbox":"n"},"id":null}`, 200, "null"},
		{"string id", `{"jsonrpc":"2.0","method":"sandbox.stop","params":{"sandbox":"n"},"id":"a"}`, 200, `"a"`},
		{"unreadable", `{"jsonrpc":`, 400, "null"},
	}
	for _, c := range cases {
		r := e.post("", []byte(c.body))
		id, ok := hasID(r.Raw)
		switch {
		case r.Status != c.status:
			t.Errorf("%s: status %d, want %d: %s", c.name, r.Status, c.status, r.Raw)
		case c.id == "" && ok:
			t.Errorf("%s: answer has an id (%s), the request had none: %s", c.name, id, r.Raw)
		case c.id != "" && string(id) != c.id:
			t.Errorf("%s: id %s, want %s: %s", c.name, id, c.id, r.Raw)
		}
	}
}

// TestStartPorts: sandbox.start reads microsandbox's published ports
// ("HOST:GUEST" or "PORT"). An empty list (or null) starts the sandbox;
// ports are refused, naming them, while sandboxes have no network to
// publish them from (never silently dropped), and nothing starts; a port
// not in the form is invalid_params showing the form.
func TestStartPorts(t *testing.T) {
	e := newFakeEnv(t, true, nil)
	start := func(name string, ports any) *rpcReply {
		return e.call("sandbox.start", map[string]any{"sandbox": name, "config": map[string]any{"image": "microsandbox/python", "memory": 512, "cpus": 1, "ports": ports}})
	}
	for name, ports := range map[string]any{"empty": []string{}, "null": nil} {
		if r := start(name, ports); r.Status != 200 {
			t.Errorf("ports %v: %d %s", ports, r.Status, r.Raw)
		}
	}
	cases := []struct {
		ports []string
		want  []string
	}{
		{[]string{"8080:80"}, []string{"8080:80", "network"}},
		{[]string{"3000", "9000:90"}, []string{"3000:3000", "9000:90", "network"}},
		{[]string{"80/tcp"}, []string{"80/tcp", "HOST:GUEST"}},
		{[]string{"0:80"}, []string{"HOST:GUEST"}},
		{[]string{"8080:80", "8080:81"}, []string{"8080", "twice"}},
	}
	for _, c := range cases {
		r := start("p", c.ports)
		if r.Status != 400 || r.kind() != "invalid_params" {
			t.Errorf("ports %q: %d %s, want invalid_params", c.ports, r.Status, r.Raw)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(r.Error.Message, w) {
				t.Errorf("ports %q: message %q does not say %q", c.ports, r.Error.Message, w)
			}
		}
	}
	if r := e.call("sandbox.get", map[string]any{"sandbox": "p"}); r.Status != 404 {
		t.Errorf("a start refused for its ports left a sandbox: %d %s", r.Status, r.Raw)
	}
}

// TestRESTRoutes: the Python and JavaScript SDKs of the generation without
// namespace post sandbox.start, sandbox.stop and (JavaScript)
// sandbox.command.run to routes of their own, with the JSON-RPC request
// they would post to /api/v1/rpc (sandbox.start without an id), and read
// the same answer: 200 with a JSON object, "result", and no "error". The
// routes take the same key; each serves its one method.
func TestRESTRoutes(t *testing.T) {
	e := newFakeEnv(t, false, nil)
	post := func(route, key, body string) (int, map[string]json.RawMessage, []byte) {
		t.Helper()
		req, err := http.NewRequest("POST", e.url+route, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp := e.do(t, req, key)
		defer func() { _ = resp.Body.Close() }()
		raw, _ := io.ReadAll(resp.Body)
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("%s: answer is not a JSON object (%d): %q", route, resp.StatusCode, raw)
		}
		return resp.StatusCode, m, raw
	}
	// As the SDKs send them (sandbox names as they make them).
	const name = "sandbox-1a2b3c4d"
	startBody := `{"jsonrpc":"2.0","method":"sandbox.start","params":{"sandbox":"` + name + `","config":{"image":"microsandbox/python","memory":512,"cpus":1}}}`
	pyStartBody := `{"jsonrpc":"2.0","method":"sandbox.start","params":{"sandbox":"` + name + `","config":{"image":"microsandbox/python","memory":512,"cpus":1,"volumes":[],"ports":[],"envs":["A=1"]}}}`
	commandBody := `{"jsonrpc":"2.0","method":"sandbox.command.run","params":{"sandbox":"` + name + `","command":"echo","args":["hello","world"],"timeout":30},"id":"0b8e5a8c-6f7e-4c1e-9f43-2d1f8a3b5c7d"}`
	stopBody := `{"jsonrpc":"2.0","method":"sandbox.stop","params":{"sandbox":"` + name + `"},"id":"5f0c7c9e-2b1d-4e8a-a1f6-93c2d4b7e8f0"}`

	for _, start := range []string{startBody, pyStartBody} {
		st, m, raw := post("/api/v1/sandbox/start", e.admin, start)
		if _, hasErr := m["error"]; st != 200 || hasErr || string(m["result"]) != `"Sandbox `+name+` started successfully"` {
			t.Fatalf("start: %d %s", st, raw)
		}
	}
	st, m, raw := post("/api/v1/sandbox/command/run", e.admin, commandBody)
	var res struct {
		Command  string   `json:"command"`
		Args     []string `json:"args"`
		ExitCode int      `json:"exit_code"`
		Success  bool     `json:"success"`
		Output   []struct{ Stream, Text string }
	}
	if _, hasErr := m["error"]; st != 200 || hasErr || json.Unmarshal(m["result"], &res) != nil ||
		!res.Success || len(res.Output) != 1 || res.Output[0].Stream != "stdout" || res.Output[0].Text != "hello world" {
		t.Fatalf("command: %d %s", st, raw)
	}
	if string(m["id"]) != `"0b8e5a8c-6f7e-4c1e-9f43-2d1f8a3b5c7d"` {
		t.Errorf("command: id not echoed: %s", raw)
	}
	st, m, raw = post("/api/v1/sandbox/stop", e.admin, stopBody)
	if _, hasErr := m["error"]; st != 200 || hasErr || string(m["result"]) != `"Sandbox `+name+` stopped successfully"` {
		t.Fatalf("stop: %d %s", st, raw)
	}
	if got := e.get("", name).State; got != "stopped" {
		t.Errorf("after the stop route: %s", got)
	}

	// The same front door: no key, or a key for another namespace, is
	// refused; a body for another method is an invalid request.
	if st, _, raw := post("/api/v1/sandbox/start", "", startBody); st != 401 {
		t.Errorf("start without a key: %d %s", st, raw)
	}
	other, _, err := e.keys.Create(t.Context(), "team-b", time.Hour, "")
	if err != nil {
		t.Fatal(err)
	}
	if st, _, raw := post("/api/v1/sandbox/stop", other, strings.Replace(stopBody, `"sandbox":`, `"namespace":"default","sandbox":`, 1)); st != 403 {
		t.Errorf("stop in another namespace: %d %s", st, raw)
	}
	if st, m, raw := post("/api/v1/sandbox/stop", e.admin, startBody); st != 400 || !strings.Contains(string(m["error"]), "invalid_request") ||
		!strings.Contains(string(m["error"]), "/api/v1/rpc") {
		t.Errorf("start posted to the stop route: %d %s", st, raw)
	}
	if e.get("", name).State != "stopped" {
		t.Error("a refused request started the sandbox")
	}
	resp, err := http.Get(e.url + "/api/v1/sandbox/start")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ = io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" || !strings.Contains(string(raw), "invalid_request") {
		t.Errorf("GET of a route: %d %s", resp.StatusCode, raw)
	}
}

// TestMCPStartConfig: sandbox_start takes microsandbox's config.volumes
// and config.ports with sandbox.start's meaning: empty lists start the
// sandbox, a port is refused saying why, as a tool error.
func TestMCPStartConfig(t *testing.T) {
	e := newFakeEnv(t, false, nil)
	e.mountMCP()
	cs, err := e.mcpConnect(e.admin)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cs.Close() }()
	call := mcpCall(t)
	cfg := map[string]any{"image": "microsandbox/python", "memory": 512, "cpus": 1, "volumes": []string{}, "ports": []string{}, "envs": []string{}}
	if out, isErr := call(cs, "sandbox_start", map[string]any{"sandbox": "m", "namespace": "default", "config": cfg}); isErr || !strings.Contains(out, "started successfully") {
		t.Fatalf("start with empty volumes and ports: %s", out)
	}
	cfg["ports"] = []string{"8080:80"}
	if out, isErr := call(cs, "sandbox_start", map[string]any{"sandbox": "m2", "config": cfg}); !isErr || !strings.Contains(out, "8080:80") || !strings.Contains(out, "network") {
		t.Fatalf("start with a port: %v %s", isErr, out)
	}
}

// TestStartWithoutConfig: a sandbox.start without a config starts a new
// sandbox with the server's defaults (microsandbox refuses it: it has no
// default image), and starts a stopped one again as it last ran, as
// microsandbox restarts one from its stored config; a config given
// replaces the stored one.
func TestStartWithoutConfig(t *testing.T) {
	e := newFakeEnv(t, true, nil)
	type info struct {
		State     string  `json:"state"`
		Image     string  `json:"image"`
		MemoryMiB int64   `json:"memory_mib"`
		CPUs      float64 `json:"cpus"`
	}
	get := func(name string) (in info) {
		e.must("sandbox.get", map[string]any{"sandbox": name}, &in)
		return in
	}
	e.must("sandbox.start", map[string]any{"sandbox": "fresh"}, nil)
	if in := get("fresh"); in.State != "running" || in.MemoryMiB != 512 {
		t.Fatalf("new sandbox without a config: %+v", in)
	}
	e.must("sandbox.start", map[string]any{"sandbox": "s", "config": map[string]any{"image": "microsandbox/python", "memory": 256, "cpus": 2}}, nil)
	for _, params := range []map[string]any{{"sandbox": "s"}, {"sandbox": "s", "config": nil}} {
		e.must("sandbox.stop", map[string]any{"sandbox": "s"}, nil)
		e.must("sandbox.start", params, nil)
		if in := get("s"); in.State != "running" || in.MemoryMiB != 256 || in.CPUs != 2 || in.Image != "microsandbox/python" {
			t.Errorf("restart with %v: %+v, want the config it last ran with", params, in)
		}
	}
	e.must("sandbox.stop", map[string]any{"sandbox": "s"}, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "s", "config": map[string]any{"image": "microsandbox/python", "memory": 128}}, nil)
	if in := get("s"); in.MemoryMiB != 128 || in.CPUs != 1 {
		t.Errorf("restart with a new config: %+v", in)
	}
}

// TestReplLanguageAnyCase: microsandbox takes a REPL language in any case.
func TestReplLanguageAnyCase(t *testing.T) {
	e := newFakeEnv(t, true, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "lc"}, nil)
	for _, lang := range []string{"Python", "PYTHON", "NodeJS", "JavaScript"} {
		var res struct {
			Language string `json:"language"`
			Status   string `json:"status"`
		}
		e.must("sandbox.repl.run", map[string]any{"sandbox": "lc", "language": lang, "code": "print('x')"}, &res)
		if res.Language != lang || res.Status != "success" {
			t.Errorf("%s: %+v", lang, res)
		}
	}
	if r := e.call("sandbox.repl.run", map[string]any{"sandbox": "lc", "language": "Cobol", "code": "1"}); r.kind() != "invalid_params" {
		t.Errorf("an unknown language: %s", r.Raw)
	}
}
