package rpc_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/sdk/msb"
)

// TestGoSDK drives a real server through the Go SDK's microsandbox API
// (generation B: no namespace), with a key.
func TestGoSDK(t *testing.T) {
	e := newEnv(t, false, nil)
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
	ex, err := sb.Code().RunContext(context.Background(), "import sys\nprint('out')\nprint('err', file=sys.stderr)")
	if err != nil {
		t.Fatal(err)
	}
	out, _ := ex.GetOutput()
	errOut, _ := ex.GetError()
	if out != "out" || errOut != "err" || !ex.HasError() {
		t.Fatalf("code: %q %q %v", out, errOut, ex.HasError())
	}
	cmd, err := sb.Command().Run("sh", []string{"-c", "echo hi; exit 5"})
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := cmd.GetOutput(); o != "hi" || cmd.GetExitCode() != 5 || cmd.IsSuccess() {
		t.Fatalf("command: %q %d", o, cmd.GetExitCode())
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
