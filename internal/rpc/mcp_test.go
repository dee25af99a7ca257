package rpc_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

type bearer struct {
	key  string
	base http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return b.base.RoundTrip(r)
}

// TestMCPEndToEnd drives sandboxes through /mcp with the official Go MCP
// client, authenticated, and checks a scoped key stays in its namespace.
func TestMCPEndToEnd(t *testing.T) {
	e := newFakeEnv(t, false, nil)
	e.mountMCP()
	connect := func(key string) (*sdk.ClientSession, error) { return e.mcpConnect(key) }
	if _, err := connect("msb_bad"); err == nil {
		t.Fatal("MCP without a valid key connected")
	}
	cs, err := connect(e.admin)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cs.Close() }()
	call := mcpCall(t)
	if out, isErr := call(cs, "sandbox_start", map[string]any{"sandbox": "m1"}); isErr || !strings.Contains(out, "started successfully") {
		t.Fatalf("start: %s", out)
	}
	if out, isErr := call(cs, "sandbox_run_code", map[string]any{"sandbox": "m1", "language": "python", "code": "n = 1024\nprint(n)"}); isErr || !strings.Contains(out, `"text":"1024"`) {
		t.Fatalf("run_code: %s", out)
	}
	if out, isErr := call(cs, "sandbox_run_command", map[string]any{"sandbox": "m1", "command": "no-such-cmd"}); !isErr || !strings.Contains(out, "no-such-cmd") {
		t.Fatalf("failing command: %v %s", isErr, out)
	}
	if out, isErr := call(cs, "sandbox_write_file", map[string]any{"sandbox": "m1", "path": "/tmp/f.txt", "content": "from mcp"}); isErr {
		t.Fatalf("write: %s", out)
	}
	if out, isErr := call(cs, "sandbox_read_file", map[string]any{"sandbox": "m1", "path": "/tmp/f.txt"}); isErr || !strings.Contains(out, "from mcp") {
		t.Fatalf("read: %s", out)
	}
	if out, isErr := call(cs, "sandbox_get_metrics", map[string]any{"sandbox": "m1"}); isErr || !strings.Contains(out, `"running":true`) {
		t.Fatalf("metrics: %s", out)
	}
	// A key for another namespace cannot reach m1 (namespace default).
	keyB, _, err := e.keys.Create(t.Context(), "team-b", time.Hour, "")
	if err != nil {
		t.Fatal(err)
	}
	csB, err := connect(keyB)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = csB.Close() }()
	if out, isErr := call(csB, "sandbox_stop", map[string]any{"sandbox": "m1", "namespace": "default"}); !isErr || !strings.Contains(out, "team-b") {
		t.Fatalf("cross-namespace stop: %v %s", isErr, out)
	}
	// Without a namespace, team-b's key means team-b, which has no m1.
	if out, isErr := call(csB, "sandbox_stop", map[string]any{"sandbox": "m1"}); !isErr || !strings.Contains(out, `namespace "team-b" does not exist`) {
		t.Fatalf("stop in the key's namespace: %v %s", isErr, out)
	}
	if out, isErr := call(cs, "sandbox_stop", map[string]any{"sandbox": "m1"}); isErr {
		t.Fatalf("stop: %s", out)
	}
}

// mcpConnect connects an MCP client to e's /mcp with key.
func (e *env) mcpConnect(key string) (*sdk.ClientSession, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := sdk.NewClient(&sdk.Implementation{Name: "warren-e2e", Version: "1"}, nil)
	return client.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: e.url + "/mcp",
		HTTPClient: &http.Client{Transport: bearer{key, http.DefaultTransport}}}, nil)
}

// mcpCall returns a function that calls a tool and answers its text and
// whether it is an error; a failed call fails t.
func mcpCall(t *testing.T) func(cs *sdk.ClientSession, name string, args map[string]any) (string, bool) {
	return func(cs *sdk.ClientSession, name string, args map[string]any) (string, bool) {
		t.Helper()
		res, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return res.Content[0].(*sdk.TextContent).Text, res.IsError
	}
}

// TestNamespaceDefaultsToKey: a request that names no namespace uses the
// key's namespace when the key is for one (over MCP, as the tools'
// schemas and the server's instructions say, over JSON-RPC and the tar
// route's "-" alike), and "default" with a key for every namespace.
func TestNamespaceDefaultsToKey(t *testing.T) {
	e := newFakeEnv(t, false, nil)
	e.mountMCP()
	keyA, _, err := e.keys.Create(t.Context(), "team-a", time.Hour, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	client := sdk.NewClient(&sdk.Implementation{Name: "warren-ns", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: e.url + "/mcp",
		HTTPClient: &http.Client{Transport: bearer{keyA, http.DefaultTransport}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cs.Close() }()
	// What the tools promise.
	tools, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		b, _ := json.Marshal(tool.InputSchema)
		if strings.Contains(string(b), `"namespace"`) && !strings.Contains(string(b), "default: the API key's") {
			t.Errorf("%s: namespace schema %s", tool.Name, b)
		}
	}
	call := func(name string, args map[string]any) string {
		t.Helper()
		res, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out := res.Content[0].(*sdk.TextContent).Text
		if res.IsError {
			t.Fatalf("%s %v: %s", name, args, out)
		}
		return out
	}
	call("sandbox_start", map[string]any{"sandbox": "na"})
	if out := call("sandbox_run_command", map[string]any{"sandbox": "na", "command": "echo", "args": []string{"mcp"}}); !strings.Contains(out, `"text":"mcp"`) {
		t.Fatalf("run_command: %s", out)
	}
	if out := call("sandbox_list", map[string]any{}); !strings.Contains(out, `"namespace":"team-a"`) {
		t.Fatalf("list: %s", out)
	}
	if out := call("sandbox_get_metrics", map[string]any{"sandbox": "na"}); !strings.Contains(out, `"namespace":"team-a"`) {
		t.Fatalf("metrics: %s", out)
	}
	// The sandbox is in team-a, not default.
	var info struct {
		Namespace string `json:"namespace"`
	}
	e.must("sandbox.get", map[string]any{"sandbox": "na", "namespace": "team-a"}, &info)
	if r := e.call("sandbox.get", map[string]any{"sandbox": "na"}); r.Status != 404 {
		t.Fatalf("with a key for every namespace, no namespace means default: %s", r.Raw)
	}
	// JSON-RPC alike, generation B (no namespace) with the team-a key.
	if r := e.callAs(keyA, "sandbox.command.run", map[string]any{"sandbox": "na", "command": "true"}); r.Status != 200 {
		t.Fatalf("command.run without a namespace, team-a key: %s", r.Raw)
	}
	// The tar route's "-" alike.
	req, _ := http.NewRequest("GET", e.url+"/api/v1/sandboxes/-/na/tar?path=/etc", nil)
	req.Header.Set("Authorization", "Bearer "+keyA)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("tar route with namespace -, team-a key: %d", resp.StatusCode)
	}
	if r := e.callAs(keyA, "sandbox.stop", map[string]any{"sandbox": "na"}); r.Status != 200 {
		t.Fatalf("stop without a namespace, team-a key: %s", r.Raw)
	}
}
