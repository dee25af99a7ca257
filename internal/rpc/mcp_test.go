package rpc_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/warren-sandbox/warren/internal/mcp"
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

// TestMCPEndToEnd drives real sandboxes through /mcp with the official Go
// MCP client, authenticated, and checks a scoped key stays in its namespace.
func TestMCPEndToEnd(t *testing.T) {
	e := newEnv(t, false, nil)
	e.srv.SetMCP(mcp.Handler(e.srv, nil))
	e.http.Config.Handler = e.srv.Handler()
	connect := func(key string) (*sdk.ClientSession, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		client := sdk.NewClient(&sdk.Implementation{Name: "warren-e2e", Version: "1"}, nil)
		return client.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: e.url + "/mcp",
			HTTPClient: &http.Client{Transport: bearer{key, http.DefaultTransport}}}, nil)
	}
	if _, err := connect("msb_bad"); err == nil {
		t.Fatal("MCP without a valid key connected")
	}
	cs, err := connect(e.admin)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	call := func(cs *sdk.ClientSession, name string, args map[string]any) (string, bool) {
		t.Helper()
		res, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return res.Content[0].(*sdk.TextContent).Text, res.IsError
	}
	if out, isErr := call(cs, "sandbox_start", map[string]any{"sandbox": "m1"}); isErr || !strings.Contains(out, "started successfully") {
		t.Fatalf("start: %s", out)
	}
	if out, isErr := call(cs, "sandbox_run_code", map[string]any{"sandbox": "m1", "language": "python", "code": "print(2**10)"}); isErr || !strings.Contains(out, `"text":"1024"`) {
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
	defer csB.Close()
	if out, isErr := call(csB, "sandbox_stop", map[string]any{"sandbox": "m1"}); !isErr || !strings.Contains(out, "team-b") {
		t.Fatalf("cross-namespace stop: %v %s", isErr, out)
	}
	if out, isErr := call(cs, "sandbox_stop", map[string]any{"sandbox": "m1"}); isErr {
		t.Fatalf("stop: %s", out)
	}
}
