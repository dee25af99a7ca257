package mcp_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// nodeClient is a tiny MCP client on the official TypeScript SDK.
const nodeClient = `
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const client = new Client({ name: "warren-node-test", version: "1" });
await client.connect(new StreamableHTTPClientTransport(new URL(process.argv[2])));
const tools = await client.listTools();
const ok = await client.callTool({ name: "sandbox_run_command", arguments: { sandbox: "s", command: "ls", args: ["-la"] } });
const failed = await client.callTool({ name: "sandbox_stop", arguments: { sandbox: "s" } });
console.log(JSON.stringify({ tools: tools.tools.map((t) => t.name), ok, failed }));
await client.close();
`

// TestNodeClient runs the TypeScript SDK's client against Handler. It needs
// node, npm and the network, so it runs only with WARREN_TEST_NPM_MCP=1,
// and skips when npm cannot install the SDK.
func TestNodeClient(t *testing.T) {
	if os.Getenv("WARREN_TEST_NPM_MCP") != "1" {
		t.Skip("set WARREN_TEST_NPM_MCP=1 to run the Node MCP client (needs npm and the network)")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("no node")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Skip("no npm")
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	install := exec.CommandContext(ctx, npm, "install", "--no-audit", "--no-fund", "--loglevel=error", "@modelcontextprotocol/sdk")
	install.Dir = dir
	if out, err := install.CombinedOutput(); err != nil {
		t.Skipf("npm install @modelcontextprotocol/sdk failed (%v): %s", err, out)
	}
	script := filepath.Join(dir, "client.mjs")
	if err := os.WriteFile(script, []byte(nodeClient), 0o644); err != nil {
		t.Fatal(err)
	}

	e := newEnv(t)
	e.caller.setResult("sandbox.command.run", map[string]any{"exit_code": 0, "success": true})
	e.caller.setErr("sandbox.stop", errors.New("not_found: no such sandbox"))

	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run := exec.CommandContext(ctx, node, script, e.srv.URL+"/mcp")
	run.Dir = dir
	run.Stderr = &testWriter{t}
	out, err := run.Output()
	if err != nil {
		t.Fatalf("node client: %v: %s", err, out)
	}
	type result struct {
		Content []struct{ Type, Text string }
		IsError bool
	}
	var got struct {
		Tools      []string
		OK, Failed result
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("node output %s: %v", out, err)
	}
	for _, name := range []string{"sandbox_start", "sandbox_stop", "sandbox_run_code", "sandbox_run_command", "sandbox_get_metrics"} {
		if !slices.Contains(got.Tools, name) {
			t.Errorf("node client sees no %s in %v", name, got.Tools)
		}
	}
	if got.OK.IsError || len(got.OK.Content) != 1 || got.OK.Content[0].Text != `{"exit_code":0,"success":true}` {
		t.Errorf("sandbox_run_command result %+v", got.OK)
	}
	if !got.Failed.IsError || len(got.Failed.Content) != 1 || got.Failed.Content[0].Text != "not_found: no such sandbox" {
		t.Errorf("sandbox_stop result %+v", got.Failed)
	}
	calls := e.caller.take()
	if len(calls) != 2 || calls[0].method != "sandbox.command.run" || calls[0].params != `{"sandbox":"s","command":"ls","args":["-la"]}` {
		t.Errorf("calls %+v", calls)
	}
	for _, c := range calls {
		if e.requestOf(c.marker) != "tools/call "+map[string]string{"sandbox.command.run": "sandbox_run_command", "sandbox.stop": "sandbox_stop"}[c.method] {
			t.Errorf("%s ran with the context of %v", c.method, c.marker)
		}
	}
}

type testWriter struct{ t *testing.T }

func (w *testWriter) Write(p []byte) (int, error) {
	w.t.Logf("node: %s", p)
	return len(p), nil
}
