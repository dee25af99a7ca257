package rpc_test

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/sdk/msb"
	"github.com/warren-sandbox/warren/sdk/warren"
)

// TestGoSDK drives a server through the Go SDK's microsandbox API
// (generation B: no namespace), with a key.
func TestGoSDK(t *testing.T) {
	e := newFakeEnv(t, false, nil)
	sb := msb.NewPythonSandbox(msb.WithName("gosdk"), msb.WithServerUrl(e.url), msb.WithApiKey(e.admin))
	if _, err := sb.Code().Run("1"); !errors.Is(err, msb.ErrSandboxNotStarted) {
		t.Fatalf("run before start: %v", err)
	}
	if err := sb.Start(msb.StartConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := sb.Start(msb.StartConfig{}); !errors.Is(err, msb.ErrSandboxAlreadyStarted) {
		t.Fatalf("second start: %v", err)
	}
	cmd, err := sb.Command().Run("echo", []string{"hi"})
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := cmd.GetOutput(); o != "hi" || cmd.GetExitCode() != 0 || !cmd.IsSuccess() {
		t.Fatalf("command: %q %d", o, cmd.GetExitCode())
	}
	if cmd, err = sb.Command().Run("exit", []string{"5"}); err != nil || cmd.GetExitCode() != 5 || cmd.IsSuccess() {
		t.Fatalf("exit 5: %v", err)
	}
	cmd, err = sb.Command().Run("sh", []string{"-c", "echo hi; exit 5"})
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := cmd.GetOutput(); o != "hi" || cmd.GetExitCode() != 5 || cmd.IsSuccess() {
		t.Fatalf("command: %q %d", o, cmd.GetExitCode())
	}
	ex, err := sb.Code().RunContext(context.Background(), "import sys\nprint('out')\nprint('err', file=sys.stderr)")
	if err != nil {
		t.Fatal(err)
	}
	out, _ := ex.GetOutput()
	errOut, _ := ex.GetError()
	if out != "out" || errOut != "err" || !ex.HasError() {
		t.Fatalf("code: %q %q %v", out, errOut, ex.HasError())
	}
	// nil args: the SDK sends null.
	if cmd, err = sb.Command().Run("true", nil); err != nil || !cmd.IsSuccess() {
		t.Fatalf("nil args: %v", err)
	}
	if _, err := sb.Command().Run("no-such-command", nil); err == nil || !strings.Contains(err.Error(), "no-such-command") {
		t.Fatalf("not found: %v", err)
	}
	m, err := sb.Metrics().All()
	if err != nil || !m.IsRunning || m.MemoryMiB <= 0 {
		t.Fatalf("metrics: %+v %v", m, err)
	}
	if running, err := sb.Metrics().IsRunning(); err != nil || !running {
		t.Fatalf("is running: %v %v", running, err)
	}
	if err := sb.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := sb.Stop(); !errors.Is(err, msb.ErrSandboxNotStarted) {
		t.Fatalf("second stop: %v", err)
	}
	// A wrong key is a clear error, not a panic.
	bad := msb.NewNodeSandbox(msb.WithName("x"), msb.WithServerUrl(e.url), msb.WithApiKey("msb_wrong"))
	if err := bad.Start(msb.StartConfig{}); err == nil || !strings.Contains(err.Error(), "API key") {
		t.Fatalf("bad key: %v", err)
	}
}

// TestGoSDKExtended drives the extended API through the SDK's warren
// client: create, exec, shell, files, processes, logs, one-shot runs that
// leave nothing behind.
func TestGoSDKExtended(t *testing.T) {
	e := newFakeEnv(t, false, nil)
	ctx := t.Context()
	c := warren.New(warren.WithServerURL(e.url), warren.WithAPIKey(e.admin), warren.WithNamespace("agents"))
	sb, err := c.Create(ctx, warren.Spec{Name: "ext", Labels: map[string]string{"run": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, warren.Spec{Name: "ext"}); !warren.IsConflict(err) {
		t.Fatalf("create twice: %v", err)
	}
	res, err := sb.Exec(ctx, "cat", nil, warren.ExecStdin("piped"))
	if err != nil || res.Stdout != "piped" || !res.OK() {
		t.Fatalf("exec: %+v %v", res, err)
	}
	res, err = sb.Shell(ctx, "echo a; echo b >&2; exit 2")
	if err != nil || res.Output() != "a\nb\n" || res.ExitCode != 2 {
		t.Fatalf("shell: %+v %v", res, err)
	}
	res, err = sb.Shell(ctx, "sleep 5", warren.ExecTimeout(200*time.Millisecond))
	if err != nil || !res.TimedOut || res.OK() {
		t.Fatalf("timeout: %+v %v", res, err)
	}
	if err := sb.WriteFile(ctx, "/tmp/x", []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := sb.ReadFile(ctx, "/tmp/x"); err != nil || string(b) != "data" {
		t.Fatalf("read: %q %v", b, err)
	}
	if _, err := sb.ReadFile(ctx, "/nope"); !warren.IsNotFound(err) {
		t.Fatalf("missing file: %v", err)
	}
	p, err := sb.StartProcess(ctx, "sh", []string{"-c", "exit 9"})
	if err != nil {
		t.Fatal(err)
	}
	if info, err := p.Wait(ctx, 10*time.Second); err != nil || info.Exit == nil || info.Exit.Code != 9 {
		t.Fatalf("process: %+v %v", info, err)
	}
	if logs, err := sb.Logs(ctx, 0); err != nil || !strings.Contains(logs, "exec cat") {
		t.Fatalf("logs: %q %v", logs, err)
	}
	list, err := c.List(ctx, warren.ListOptions{Labels: map[string]string{"run": "1"}})
	if err != nil || len(list) != 1 {
		t.Fatalf("list: %+v %v", list, err)
	}
	if err := c.Remove(ctx, "ext"); err != nil {
		t.Fatal(err)
	}
	out, err := c.RunPython(ctx, "n = 45\nprint(n)")
	if err != nil || out.Stdout != "45\n" {
		t.Fatalf("RunPython: %+v %v", out, err)
	}
	out, err = c.RunShell(ctx, "echo 5")
	if err != nil || out.Stdout != "5\n" {
		t.Fatalf("RunShell: %+v %v", out, err)
	}
	if list, _ := c.List(ctx, warren.ListOptions{}); len(list) != 0 {
		t.Fatalf("one-shot runs left sandboxes: %+v", list)
	}
}

// The upstream microsandbox Go SDK (generation B; PROTOCOL.md, the seed
// go-sdk-msb.txt and its rpc_client.go) decodes sandbox.metrics.get into
// these structs, copied as they are: memory_usage and disk_usage are ints
// there, so a fractional number fails the whole call.
type (
	upstreamMetrics struct {
		Name      string  // Sandbox name
		IsRunning bool    // Whether the sandbox is currently running
		CPU       float64 // CPU usage percentage (0-100)
		MemoryMiB int     // Memory usage in mebibytes
		DiskBytes int     // Disk usage in bytes
	}
	upstreamMetricsResult struct {
		Sandboxes []upstreamSandboxMetrics `json:"sandboxes"`
	}
	upstreamSandboxMetrics struct {
		Name        string  `json:"name"`
		Namespace   string  `json:"namespace"`
		Running     bool    `json:"running"`
		CPUUsage    float64 `json:"cpu_usage"`
		MemoryUsage int     `json:"memory_usage"`
		DiskUsage   int     `json:"disk_usage"`
	}
)

// TestUpstreamGoSDKMetrics decodes the server's metrics, running and
// stopped, one sandbox and all, into the upstream SDK's own shapes.
func TestUpstreamGoSDKMetrics(t *testing.T) {
	e := newFakeEnv(t, false, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "up"}, nil)
	// Memory in use that is not a whole number of MiB.
	up, err := e.mgr.Get("default", "up")
	if err != nil {
		t.Fatal(err)
	}
	e.fake.Sandbox(up.ID).SetStats(backend.Stats{MemoryBytes: 3<<20 + 12345, CPUUsage: time.Second})
	e.must("sandbox.start", map[string]any{"sandbox": "down"}, nil)
	e.must("sandbox.stop", map[string]any{"sandbox": "down"}, nil)
	memRE := regexp.MustCompile(`"memory_usage":(null|[0-9]+)[,}]`)
	for _, params := range []map[string]any{{"sandbox": "up"}, {"sandbox": "down"}, {}, {"namespace": "*"}} {
		r := e.call("sandbox.metrics.get", params)
		if r.Status != 200 {
			t.Fatalf("metrics %v: %s", params, r.Raw)
		}
		if n := len(memRE.FindAll(r.Result, -1)); n != strings.Count(string(r.Result), `"memory_usage"`) {
			t.Errorf("metrics %v: memory_usage not a whole number or null: %s", params, r.Result)
		}
		var res upstreamMetricsResult
		if err := json.Unmarshal(r.Result, &res); err != nil {
			t.Fatalf("metrics %v: the upstream SDK cannot decode %s: %v", params, r.Result, err)
		}
		for _, m := range res.Sandboxes {
			// What the upstream SDK's Metrics().All() returns.
			got := upstreamMetrics{Name: m.Name, IsRunning: m.Running, CPU: m.CPUUsage, MemoryMiB: m.MemoryUsage, DiskBytes: m.DiskUsage}
			switch m.Name {
			case "up":
				// Rounded up: 3 MiB and a bit is 4, never 3.
				if !got.IsRunning || got.MemoryMiB != 4 || got.CPU < 0 || got.DiskBytes < 0 {
					t.Errorf("running sandbox: %+v", got)
				}
			case "down":
				if got.IsRunning || got.MemoryMiB != 0 || got.CPU != 0 {
					t.Errorf("stopped sandbox: %+v", got)
				}
			}
		}
	}
}

// TestRunOnceCleansUpServerFailures: a one-shot run whose create failed on
// the server (a host failure keeps the errored sandbox's record) leaves
// nothing behind either.
func TestRunOnceCleansUpServerFailures(t *testing.T) {
	e := newFakeEnv(t, false, nil)
	ctx := t.Context()
	c := warren.New(warren.WithServerURL(e.url), warren.WithAPIKey(e.admin), warren.WithNamespace("oneshot"))
	if _, err := c.RunPython(ctx, "print(1)", warren.RunImage(brokenImage)); !warren.IsInternal(err) || !strings.Contains(err.Error(), "image store") {
		t.Fatalf("RunPython from an unreadable image: %v", err)
	}
	if _, err := c.RunShell(ctx, "true", warren.RunImage("nope:latest")); !warren.IsInvalidParams(err) {
		t.Fatalf("RunShell from a missing image: %v", err)
	}
	if list, err := c.List(ctx, warren.ListOptions{}); err != nil || len(list) != 0 {
		t.Fatalf("failed one-shot runs left sandboxes: %+v %v", list, err)
	}
}
