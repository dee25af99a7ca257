package mcp_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/warren-sandbox/warren/internal/buildinfo"
	"github.com/warren-sandbox/warren/internal/mcp"
)

// markerKey is the context key under which the test middleware stores a
// per-request marker, standing in for the claims the API server stores.
type markerKey struct{}

type recordedCall struct {
	method string
	params string
	marker any
}

// fakeCaller records calls and answers with canned results or errors.
type fakeCaller struct {
	mu      sync.Mutex
	calls   []recordedCall
	results map[string]any
	errs    map[string]error
}

func (f *fakeCaller) CallMCP(ctx context.Context, method string, params json.RawMessage) (any, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, recordedCall{method: method, params: string(params), marker: ctx.Value(markerKey{})})
	if err := f.errs[method]; err != nil {
		return nil, err
	}
	if r, ok := f.results[method]; ok {
		return r, nil
	}
	return map[string]any{"ok": true}, nil
}

func (f *fakeCaller) setResult(method string, v any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.results[method] = v
}

func (f *fakeCaller) setErr(method string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs[method] = err
}

func (f *fakeCaller) take() []recordedCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

// env is a running /mcp endpoint behind a middleware that gives each HTTP
// request a distinct marker and remembers which JSON-RPC message it carried.
type env struct {
	caller *fakeCaller
	srv    *httptest.Server

	mu      sync.Mutex
	markers map[string]string // marker -> JSON-RPC method + tool name of that POST
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{caller: &fakeCaller{results: map[string]any{}, errs: map[string]error{}}, markers: map[string]string{}}
	h := mcp.Handler(e.caller, nil)
	var n int
	mux := http.NewServeMux()
	mux.Handle("/mcp", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			Method string `json:"method"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		_ = json.Unmarshal(body, &msg)
		e.mu.Lock()
		n++
		marker := fmt.Sprintf("request-%d", n)
		e.markers[marker] = strings.TrimSpace(msg.Method + " " + msg.Params.Name)
		e.mu.Unlock()
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), markerKey{}, marker)))
	}))
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.srv.Close)
	return e
}

func (e *env) requestOf(marker any) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	s, _ := marker.(string)
	return e.markers[s]
}

func (e *env) connect(t *testing.T) *sdk.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := sdk.NewClient(&sdk.Implementation{Name: "warren-test", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: e.srv.URL + "/mcp"}, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func callTool(t *testing.T, cs *sdk.ClientSession, name string, args any) (text string, isError bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("CallTool %s: protocol error %v (tool failures must be results)", name, err)
	}
	if len(res.Content) != 1 {
		t.Fatalf("CallTool %s: %d content items, want 1", name, len(res.Content))
	}
	tc, ok := res.Content[0].(*sdk.TextContent)
	if !ok {
		t.Fatalf("CallTool %s: content %T, want text", name, res.Content[0])
	}
	return tc.Text, res.IsError
}

func TestListTools(t *testing.T) {
	e := newEnv(t)
	cs := e.connect(t)
	if info := cs.InitializeResult().ServerInfo; info.Name != mcp.ServerName || info.Version != buildinfo.Version() {
		t.Errorf("server info %+v, want %s %s", info, mcp.ServerName, buildinfo.Version())
	}
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	required := map[string][]string{
		"sandbox_start":       {"sandbox"},
		"sandbox_stop":        {"sandbox"},
		"sandbox_run_code":    {"sandbox", "language", "code"},
		"sandbox_run_command": {"sandbox", "command"},
		"sandbox_get_metrics": nil,
		"sandbox_list":        nil,
		"sandbox_remove":      {"sandbox"},
		"sandbox_shell":       {"sandbox", "script"},
		"sandbox_read_file":   {"sandbox", "path"},
		"sandbox_write_file":  {"sandbox", "path", "content"},
		"sandbox_list_files":  {"sandbox", "path"},
	}
	optional := map[string][]string{
		"sandbox_start":       {"namespace", "config"},
		"sandbox_run_code":    {"namespace", "timeout"},
		"sandbox_run_command": {"namespace", "args", "timeout"},
		"sandbox_get_metrics": {"sandbox", "namespace"},
		"sandbox_list":        {"namespace", "state"},
		"sandbox_shell":       {"timeout"},
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
		if tool.Description == "" {
			t.Errorf("%s: no description", tool.Name)
		}
		b, _ := json.Marshal(tool.InputSchema)
		var schema struct {
			Type       string                     `json:"type"`
			Required   []string                   `json:"required"`
			Properties map[string]json.RawMessage `json:"properties"`
		}
		if err := json.Unmarshal(b, &schema); err != nil {
			t.Fatalf("%s: schema %s: %v", tool.Name, b, err)
		}
		want, ok := required[tool.Name]
		if !ok {
			t.Errorf("unexpected tool %s", tool.Name)
			continue
		}
		if schema.Type != "object" {
			t.Errorf("%s: schema type %q", tool.Name, schema.Type)
		}
		got := slices.Clone(schema.Required)
		slices.Sort(got)
		want = slices.Clone(want)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: required %v, want %v (schema %s)", tool.Name, got, want, b)
		}
		for _, p := range append(want, optional[tool.Name]...) {
			if _, ok := schema.Properties[p]; !ok {
				t.Errorf("%s: no property %q in schema %s", tool.Name, p, b)
			}
		}
		if !strings.Contains(string(schema.Properties["sandbox"]), "description") && want != nil {
			t.Errorf("%s: sandbox property has no description: %s", tool.Name, b)
		}
	}
	slices.Sort(names)
	all := slices.Sorted(func(yield func(string) bool) {
		for n := range required {
			if !yield(n) {
				return
			}
		}
	})
	if !slices.Equal(names, all) {
		t.Errorf("tools %v, want %v", names, all)
	}
	if got := slices.Sorted(slices.Values(mcp.ToolNames)); !slices.Equal(got, all) {
		t.Errorf("ToolNames %v, want %v", got, all)
	}
}

func TestTools(t *testing.T) {
	e := newEnv(t)
	cs := e.connect(t)
	cmdResult := map[string]any{"command": "ls", "args": []string{"-la"}, "exit_code": 0, "success": true,
		"output": []map[string]string{{"stream": "stdout", "text": "total 0"}}}
	e.caller.setResult("sandbox.command.run", cmdResult)
	e.caller.setResult("sandbox.start", "Sandbox s started successfully")

	for _, tc := range []struct {
		tool       string
		args       map[string]any
		method     string
		params     string
		wantResult any // JSON-marshalled into the expected text; nil: {"ok":true}
	}{
		// No config reaches sandbox.start as none (a stopped sandbox
		// restarts as it last ran).
		{"sandbox_start", map[string]any{"sandbox": "s"}, "sandbox.start", `{"sandbox":"s"}`, "Sandbox s started successfully"},
		{"sandbox_start", map[string]any{"sandbox": "s", "config": map[string]any{"volumes": []string{}, "ports": []string{}}},
			"sandbox.start", `{"sandbox":"s","config":{}}`, "Sandbox s started successfully"},
		{"sandbox_start", map[string]any{"sandbox": "s", "config": map[string]any{"image": "microsandbox/python", "memory": 256,
			"volumes": []string{"/srv/data:/data:ro"}, "ports": []string{"8080:80"}}},
			"sandbox.start", `{"sandbox":"s","config":{"image":"microsandbox/python","memory":256,"volumes":["/srv/data:/data:ro"],"ports":["8080:80"]}}`,
			"Sandbox s started successfully"},
		{"sandbox_start", map[string]any{"sandbox": "s", "namespace": "team", "config": map[string]any{
			"image": "python", "memory": 1024, "cpus": 2, "envs": []string{"A=1"}, "workdir": "/w"}},
			"sandbox.start", `{"sandbox":"s","namespace":"team","config":{"image":"python","memory":1024,"cpus":2,"envs":["A=1"],"workdir":"/w"}}`,
			"Sandbox s started successfully"},
		{"sandbox_stop", map[string]any{"sandbox": "s"}, "sandbox.stop", `{"sandbox":"s"}`, nil},
		{"sandbox_stop", map[string]any{"sandbox": "s", "namespace": "n"}, "sandbox.stop", `{"sandbox":"s","namespace":"n"}`, nil},
		{"sandbox_run_code", map[string]any{"sandbox": "s", "language": "python", "code": "print(1)"},
			"sandbox.repl.run", `{"sandbox":"s","language":"python","code":"print(1)"}`, nil},
		{"sandbox_run_code", map[string]any{"sandbox": "s", "language": "node", "code": "1+1", "timeout": 2.5},
			"sandbox.repl.run", `{"sandbox":"s","language":"node","code":"1+1","timeout":2.5}`, nil},
		{"sandbox_run_command", map[string]any{"sandbox": "s", "command": "ls", "args": []string{"-la"}},
			"sandbox.command.run", `{"sandbox":"s","command":"ls","args":["-la"]}`, cmdResult},
		{"sandbox_run_command", map[string]any{"sandbox": "s", "command": "true", "timeout": 30},
			"sandbox.command.run", `{"sandbox":"s","command":"true","timeout":30}`, cmdResult},
		{"sandbox_get_metrics", map[string]any{}, "sandbox.metrics.get", `{}`, nil},
		{"sandbox_get_metrics", map[string]any{"sandbox": "s", "namespace": "*"}, "sandbox.metrics.get", `{"sandbox":"s","namespace":"*"}`, nil},
		{"sandbox_list", map[string]any{"state": "running"}, "sandbox.list", `{"state":"running"}`, nil},
		{"sandbox_remove", map[string]any{"sandbox": "s"}, "sandbox.remove", `{"sandbox":"s"}`, nil},
		{"sandbox_shell", map[string]any{"sandbox": "s", "script": "echo hi | wc -c", "timeout": 5},
			"sandbox.shell", `{"sandbox":"s","script":"echo hi | wc -c","timeout":5}`, nil},
		{"sandbox_list_files", map[string]any{"sandbox": "s", "path": "/tmp"}, "sandbox.file.list", `{"sandbox":"s","path":"/tmp"}`, nil},
		{"sandbox_write_file", map[string]any{"sandbox": "s", "path": "/tmp/a.txt", "content": "héllo\n"},
			"sandbox.file.write", `{"sandbox":"s","path":"/tmp/a.txt","data":"` + base64.StdEncoding.EncodeToString([]byte("héllo\n")) + `"}`, nil},
	} {
		t.Run(tc.tool, func(t *testing.T) {
			text, isErr := callTool(t, cs, tc.tool, tc.args)
			if isErr {
				t.Fatalf("isError: %s", text)
			}
			calls := e.caller.take()
			if len(calls) != 1 {
				t.Fatalf("%d calls, want 1", len(calls))
			}
			if calls[0].method != tc.method || calls[0].params != tc.params {
				t.Errorf("call %s %s, want %s %s", calls[0].method, calls[0].params, tc.method, tc.params)
			}
			want := tc.wantResult
			if want == nil {
				want = map[string]any{"ok": true}
			}
			wb, _ := json.Marshal(want)
			if text != string(wb) {
				t.Errorf("result text %s, want %s", text, wb)
			}
		})
	}
}

func TestReadFile(t *testing.T) {
	e := newEnv(t)
	cs := e.connect(t)
	args := map[string]any{"sandbox": "s", "path": "/etc/hostname"}

	e.caller.setResult("sandbox.file.read", map[string]any{"data": base64.StdEncoding.EncodeToString([]byte("héllo\n")), "size": 7})
	text, isErr := callTool(t, cs, "sandbox_read_file", args)
	if isErr || text != "héllo\n" {
		t.Errorf("text file: %q (isError %v), want the decoded text", text, isErr)
	}
	calls := e.caller.take()
	if len(calls) != 1 || calls[0].method != "sandbox.file.read" || calls[0].params != `{"sandbox":"s","path":"/etc/hostname"}` {
		t.Errorf("calls %+v", calls)
	}

	bin := base64.StdEncoding.EncodeToString([]byte{0xff, 0x00, 0xfe})
	e.caller.setResult("sandbox.file.read", struct {
		Data string `json:"data"`
		Size int    `json:"size"`
	}{bin, 3})
	text, isErr = callTool(t, cs, "sandbox_read_file", args)
	if want := `{"size":3,"encoding":"base64","data":"` + bin + `"}`; isErr || text != want {
		t.Errorf("binary file: %s (isError %v), want %s", text, isErr, want)
	}
}

func TestToolErrors(t *testing.T) {
	e := newEnv(t)
	cs := e.connect(t)
	e.caller.setErr("sandbox.stop", errors.New(`not_found: sandbox "default/s" does not exist`))
	text, isErr := callTool(t, cs, "sandbox_stop", map[string]any{"sandbox": "s"})
	if !isErr || text != `not_found: sandbox "default/s" does not exist` {
		t.Errorf("caller error: %q isError=%v", text, isErr)
	}

	// Arguments that do not fit the schema fail as a tool result too, and
	// never reach the caller.
	e.caller.take()
	for _, args := range []map[string]any{
		{"command": "ls"}, // sandbox missing
		{"sandbox": "s", "command": "ls", "args": "-la"},  // args not an array
		{"sandbox": "s", "command": "ls", "bogus": "yes"}, // unknown argument
	} {
		text, isErr := callTool(t, cs, "sandbox_run_command", args)
		if !isErr || text == "" {
			t.Errorf("args %v: %q isError=%v, want an error result", args, text, isErr)
		}
	}
	if calls := e.caller.take(); len(calls) != 0 {
		t.Errorf("invalid args reached the caller: %+v", calls)
	}

	// An unknown tool is the SDK's protocol error, not a crash.
	if _, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "sandbox_nope", Arguments: map[string]any{}}); err == nil {
		t.Error("unknown tool: no error")
	}
}

// TestRequestContext proves the context given to CallMCP carries the values
// of the HTTP request that carried that very tool call (where the API
// server puts the caller's claims), not those of an earlier request of the
// session such as initialize.
func TestRequestContext(t *testing.T) {
	e := newEnv(t)
	cs := e.connect(t)
	for i := range 3 {
		name := fmt.Sprintf("s%d", i)
		if text, isErr := callTool(t, cs, "sandbox_stop", map[string]any{"sandbox": name}); isErr {
			t.Fatal(text)
		}
		calls := e.caller.take()
		if len(calls) != 1 {
			t.Fatalf("%d calls", len(calls))
		}
		if calls[0].marker == nil {
			t.Fatal("the request context's marker did not reach CallMCP")
		}
		if got := e.requestOf(calls[0].marker); got != "tools/call sandbox_stop" {
			t.Errorf("CallMCP saw the context of request %v (%q), want the tools/call POST's", calls[0].marker, got)
		}
	}
}

func TestNilLogger(t *testing.T) {
	if mcp.Handler(&fakeCaller{}, nil) == nil || mcp.NewServer(&fakeCaller{}, nil) == nil {
		t.Fatal("nil")
	}
}

// TestStartSchema: sandbox_start's config takes microsandbox's volumes and
// ports (lists of strings).
func TestStartSchema(t *testing.T) {
	e := newEnv(t)
	cs := e.connect(t)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range res.Tools {
		if tool.Name != "sandbox_start" {
			continue
		}
		b, _ := json.Marshal(tool.InputSchema)
		var schema struct {
			Properties struct {
				Config struct {
					Properties map[string]struct {
						Type    any                    `json:"type"`
						Items   *struct{ Type string } `json:"items"`
						Default json.RawMessage        `json:"default"`
					} `json:"properties"`
				} `json:"config"`
			} `json:"properties"`
		}
		if err := json.Unmarshal(b, &schema); err != nil {
			t.Fatal(err)
		}
		props := schema.Properties.Config.Properties
		for _, list := range []string{"volumes", "ports", "envs"} {
			if p, ok := props[list]; !ok || p.Items == nil || p.Items.Type != "string" {
				t.Errorf("config.%s is not a list of strings: %s", list, b)
			}
		}
		return
	}
	t.Fatal("no sandbox_start tool")
}

// TestPrompts: microsandbox's two prompts, with its argument names; the
// text has the model start the sandbox with sandbox_start and the
// language's image. A name the API would refuse is refused here.
func TestPrompts(t *testing.T) {
	e := newEnv(t)
	cs := e.connect(t)
	ctx := context.Background()
	list, err := cs.ListPrompts(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range list.Prompts {
		names = append(names, p.Name)
		var args []string
		for _, a := range p.Arguments {
			args = append(args, a.Name)
		}
		if !slices.Equal(args, []string{"sandbox_name", "namespace"}) || p.Description == "" {
			t.Errorf("prompt %s: arguments %v, description %q", p.Name, args, p.Description)
		}
	}
	if !slices.Equal(names, slices.Sorted(slices.Values(mcp.PromptNames))) {
		t.Errorf("prompts %v, want %v", names, mcp.PromptNames)
	}
	for _, c := range []struct {
		prompt string
		args   map[string]string
		want   []string
		not    []string
	}{
		{"create_python_sandbox", map[string]string{"sandbox_name": "py1", "namespace": "team"},
			[]string{`"py1"`, `"team"`, "sandbox_start", `"image": "python"`, "sandbox_run_code", `"python"`, "sandbox_stop"}, nil},
		{"create_node_sandbox", map[string]string{"sandbox_name": "js1"},
			[]string{`"js1"`, "sandbox_start", `"image": "node"`, `"node"`}, []string{"namespace"}},
		{"create_python_sandbox", nil, []string{`"python-sandbox"`}, nil},
		{"create_node_sandbox", nil, []string{`"node-sandbox"`}, nil},
	} {
		res, err := cs.GetPrompt(ctx, &sdk.GetPromptParams{Name: c.prompt, Arguments: c.args})
		if err != nil {
			t.Errorf("%s %v: %v", c.prompt, c.args, err)
			continue
		}
		if len(res.Messages) != 1 || res.Messages[0].Role != "user" {
			t.Errorf("%s: messages %+v", c.prompt, res.Messages)
			continue
		}
		text := res.Messages[0].Content.(*sdk.TextContent).Text
		for _, w := range c.want {
			if !strings.Contains(text, w) {
				t.Errorf("%s %v: text does not say %s: %s", c.prompt, c.args, w, text)
			}
		}
		for _, w := range c.not {
			if strings.Contains(text, w) {
				t.Errorf("%s %v: text says %s: %s", c.prompt, c.args, w, text)
			}
		}
	}
	for _, bad := range []map[string]string{{"sandbox_name": "../x"}, {"sandbox_name": strings.Repeat("a", 64)}, {"sandbox_name": "a", "namespace": "a b"}} {
		if _, err := cs.GetPrompt(ctx, &sdk.GetPromptParams{Name: "create_python_sandbox", Arguments: bad}); err == nil {
			t.Errorf("arguments %v: accepted", bad)
		}
	}
	if _, err := cs.GetPrompt(ctx, &sdk.GetPromptParams{Name: "no_such_prompt"}); err == nil {
		t.Error("an unknown prompt: no error")
	}
}

// TestAcceptJSON: a POST that accepts only JSON, or says nothing of what
// it accepts, is answered (with JSON, as every answer is), as microsandbox
// answers it; one that accepts no JSON is still refused.
func TestAcceptJSON(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct {
		accept []string
		status int
	}{
		{[]string{"application/json"}, 200},
		{nil, 200},
		{[]string{"application/json; charset=utf-8"}, 200},
		{[]string{"*/*"}, 200},
		{[]string{"application/json, text/event-stream"}, 200},
		{[]string{"text/event-stream"}, 400},
		{[]string{"text/html"}, 400},
	} {
		req, err := http.NewRequest("POST", e.srv.URL+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		for _, a := range c.accept {
			req.Header.Add("Accept", a)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("Accept %q: %d %s, want %d", c.accept, resp.StatusCode, body, c.status)
			continue
		}
		if c.status == 200 && (!strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") || !strings.Contains(string(body), "sandbox_start")) {
			t.Errorf("Accept %q: %s %s", c.accept, resp.Header.Get("Content-Type"), body)
		}
	}
}
