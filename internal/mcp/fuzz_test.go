package mcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/mcp"
)

// toolMethods are the JSON-RPC methods the tools call.
var toolMethods = map[string]bool{
	"sandbox.start": true, "sandbox.stop": true, "sandbox.repl.run": true, "sandbox.command.run": true,
	"sandbox.metrics.get": true, "sandbox.list": true, "sandbox.remove": true, "sandbox.shell": true,
	"sandbox.file.read": true, "sandbox.file.write": true, "sandbox.file.list": true,
}

// FuzzHandler posts arbitrary bodies to /mcp. Whatever the body, the
// server answers without a 5xx, its JSON answers are valid JSON, and a
// tool call reaches the API only as one of the tools' methods with params
// that are a JSON object.
func FuzzHandler(f *testing.F) {
	call := func(tool, args string) string {
		return `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + args + `}}`
	}
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":1,"method":"prompts/list"}`,
		`{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"create_python_sandbox","arguments":{"sandbox_name":"py1","namespace":"team"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"ping"}`,
		call("sandbox_start", `{"sandbox":"s","namespace":"team","config":{"image":"python","memory":1024,"cpus":2,"envs":["A=1"],"workdir":"/w","volumes":["/a:/b:ro"],"ports":["8080:80"]}}`),
		call("sandbox_stop", `{"sandbox":"s"}`),
		call("sandbox_run_code", `{"sandbox":"s","language":"node","code":"1+1","timeout":2.5}`),
		call("sandbox_run_command", `{"sandbox":"s","command":"ls","args":["-la"],"timeout":30}`),
		call("sandbox_get_metrics", `{"sandbox":"s","namespace":"*"}`),
		call("sandbox_list", `{"state":"running"}`),
		call("sandbox_remove", `{"sandbox":"s"}`),
		call("sandbox_shell", `{"sandbox":"s","script":"echo hi | wc -c","timeout":5}`),
		call("sandbox_read_file", `{"sandbox":"s","path":"/tmp/a"}`),
		call("sandbox_write_file", `{"sandbox":"s","path":"/tmp/a.txt","content":"héllo\n"}`),
		call("sandbox_list_files", `{"sandbox":"s","path":"/tmp"}`),
		call("sandbox_shell", `{"sandbox":"s","script":1}`),
		call("nope", `{}`),
		`[` + call("sandbox_list", `{}`) + `,{"jsonrpc":"2.0","id":3,"method":"ping"}]`,
		`{"jsonrpc":"2.0","id":{},"method":"tools/call"}`,
		``,
	} {
		f.Add([]byte(s))
	}
	caller := &fakeCaller{results: map[string]any{"sandbox.file.read": map[string]any{"data": "/w==", "size": 1}}, errs: map[string]error{}}
	h := mcp.Handler(caller, nil)
	// The seeds' tool calls reach the caller (without an initialize: every
	// POST is its own session).
	w, req := httptest.NewRecorder(), httptest.NewRequest("POST", "/mcp", strings.NewReader(call("sandbox_list", `{"state":"running"}`)))
	req.Header.Set("Content-Type", "application/json")
	h.ServeHTTP(w, req)
	if c := caller.take(); len(c) != 1 || c[0].method != "sandbox.list" {
		f.Fatalf("a tools/call of sandbox_list made calls %v: %d %s", c, w.Code, w.Body.Bytes())
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequestWithContext(context.Background(), "POST", "/mcp", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code >= 500 {
			t.Fatalf("status %d: %.300q", w.Code, w.Body.Bytes())
		}
		if strings.HasPrefix(w.Header().Get("Content-Type"), "application/json") && w.Body.Len() > 0 && !json.Valid(w.Body.Bytes()) {
			t.Fatalf("answer is not JSON: %.300q", w.Body.Bytes())
		}
		for _, c := range caller.take() {
			if !toolMethods[c.method] {
				t.Fatalf("a tool called %q", c.method)
			}
			if !json.Valid([]byte(c.params)) || !strings.HasPrefix(c.params, "{") {
				t.Fatalf("%s called with params %q", c.method, c.params)
			}
		}
	})
}
