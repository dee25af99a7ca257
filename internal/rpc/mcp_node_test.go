package rpc_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// npmMCPSDK is the official TypeScript MCP SDK the Node client test
// installs: pinned, so that a new release cannot change what is tested.
const npmMCPSDK = "@modelcontextprotocol/sdk@1.32.2"

// nodeMCPClient drives a server's /mcp with the TypeScript SDK's client:
// argv is the endpoint and an API key. It prints one JSON object.
const nodeMCPClient = `
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, key] = process.argv.slice(2);
async function connect(k) {
  const client = new Client({ name: "warren-node-e2e", version: "1" });
  await client.connect(new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: "Bearer " + k } },
  }));
  return client;
}
let badKey = "connected";
try {
  const c = await connect("msb_not-a-key");
  await c.close();
} catch (e) {
  badKey = String(e && e.message ? e.message : e);
}
const client = await connect(key);
const call = (name, args) => client.callTool({ name, arguments: args });
const tools = await client.listTools();
const start = await call("sandbox_start", { sandbox: "node1" });
const command = await call("sandbox_run_command", {
  sandbox: "node1", command: "sh", args: ["-c", "echo from node > /tmp/from-node && cat /tmp/from-node && id -u"],
});
const code = await call("sandbox_run_code", { sandbox: "node1", language: "python", code: "print(6*7)" });
const missing = await call("sandbox_run_command", { sandbox: "no-such-sandbox", command: "true" });
console.log(JSON.stringify({ badKey, tools: tools.tools.map((t) => t.name), start, command, code, missing }));
await client.close();
`

// installNodeMCPSDK installs npmMCPSDK into a new directory and returns
// it. It needs node, npm and the npm registry: without them the test
// fails under WARREN_TEST_PRIVILEGED=1 (CI) and skips otherwise.
func installNodeMCPSDK(t *testing.T) (node, dir string) {
	t.Helper()
	node, err := exec.LookPath("node")
	testenv.Require(t, err == nil, "node (Debian package nodejs)")
	npm, err := exec.LookPath("npm")
	testenv.Require(t, err == nil, "npm, to install the MCP SDK (Debian package npm)")
	dir = t.TempDir()
	// A package.json of its own keeps npm from installing into a project
	// above the directory.
	if err := os.WriteFile(filepath.Join(dir, "package.json"), []byte(`{"private": true, "type": "module"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	// Retries stay, shorter than npm's own (a minute and more when the
	// registry cannot be reached at all).
	install := exec.CommandContext(ctx, npm, "install", "--no-audit", "--no-fund", "--loglevel=error",
		"--fetch-retries=2", "--fetch-retry-mintimeout=2000", "--fetch-retry-maxtimeout=10000", npmMCPSDK)
	install.Dir = dir
	install.Env = append(os.Environ(), "npm_config_update_notifier=false")
	if out, err := install.CombinedOutput(); err != nil {
		msg := "npm install " + npmMCPSDK + " failed (is the npm registry reachable?): " + err.Error() + "\n" + string(out)
		if testenv.Strict() {
			t.Fatal(msg)
		}
		t.Skip("skipping: " + msg + "(set WARREN_TEST_PRIVILEGED=1 to fail instead)")
	}
	return node, dir
}

// TestMCPNodeClient drives a real server's /mcp, with an API key, from the
// official npm MCP client: a bad key is refused, the tools are listed, and
// a command and code run in a real sandbox, in the key's namespace.
func TestMCPNodeClient(t *testing.T) {
	e := newEnv(t, false, nil)
	e.mountMCP()
	node, dir := installNodeMCPSDK(t)
	script := filepath.Join(dir, "client.mjs")
	if err := os.WriteFile(script, []byte(nodeMCPClient), 0o644); err != nil {
		t.Fatal(err)
	}
	key, _, err := e.keys.Create(t.Context(), "team-n", time.Hour, "node client")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	run := exec.CommandContext(ctx, node, script, e.url+"/mcp", key)
	run.Dir = dir
	var stderr strings.Builder
	run.Stderr = &stderr
	out, err := run.Output()
	if err != nil {
		t.Fatalf("node client: %v\nstdout: %s\nstderr: %s", err, out, stderr.String())
	}
	type toolResult struct {
		Content []struct{ Type, Text string }
		IsError bool
	}
	var got struct {
		BadKey                        string
		Tools                         []string
		Start, Command, Code, Missing toolResult
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("node output %s: %v", out, err)
	}
	if !strings.Contains(got.BadKey, `"kind":"unauthorized"`) {
		t.Errorf("a bad key: %q, want a refusal (unauthorized)", got.BadKey)
	}
	for _, name := range []string{"sandbox_start", "sandbox_stop", "sandbox_run_code", "sandbox_run_command", "sandbox_get_metrics",
		"sandbox_list", "sandbox_remove", "sandbox_shell", "sandbox_read_file", "sandbox_write_file", "sandbox_list_files"} {
		if !slices.Contains(got.Tools, name) {
			t.Errorf("the node client sees no %s in %v", name, got.Tools)
		}
	}
	text := func(what string, r toolResult) string {
		t.Helper()
		if r.IsError || len(r.Content) != 1 || r.Content[0].Type != "text" {
			t.Fatalf("%s: %+v", what, r)
		}
		return r.Content[0].Text
	}
	if s := text("sandbox_start", got.Start); !strings.Contains(s, "Sandbox node1 started successfully") {
		t.Errorf("sandbox_start: %s", s)
	}
	var cmd struct {
		ExitCode int `json:"exit_code"`
		Output   []struct {
			Stream, Text string
		} `json:"output"`
	}
	if err := json.Unmarshal([]byte(text("sandbox_run_command", got.Command)), &cmd); err != nil {
		t.Fatal(err)
	}
	if cmd.ExitCode != 0 || len(cmd.Output) != 2 || cmd.Output[0].Text != "from node" || cmd.Output[1].Text != "0" {
		t.Errorf("sandbox_run_command: %+v", cmd)
	}
	if s := text("sandbox_run_code", got.Code); !strings.Contains(s, `"text":"42"`) {
		t.Errorf("sandbox_run_code: %s", s)
	}
	if !got.Missing.IsError || len(got.Missing.Content) != 1 || !strings.Contains(got.Missing.Content[0].Text, `"no-such-sandbox" in namespace "team-n" does not exist`) {
		t.Errorf("a command in a missing sandbox: %+v", got.Missing)
	}
	// It ran in a real sandbox, in the key's namespace.
	var res struct {
		Stdout string `json:"stdout"`
	}
	e.must("sandbox.exec", map[string]any{"sandbox": "node1", "namespace": "team-n", "argv": []string{"cat", "/tmp/from-node"}}, &res)
	if res.Stdout != "from node\n" {
		t.Fatalf("the file the node client's command wrote: %q", res.Stdout)
	}
}
