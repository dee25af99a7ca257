package gvisor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/conformance"
)

// TestStartExecStop: a sandbox starts with the agent as runsc's init,
// runs a command through it in gVisor's kernel, and stops.
func TestStartExecStop(t *testing.T) {
	h := harness(t)
	sb := h.Sandbox(t, backend.Config{})
	r := conformance.Exec(t, sb, 10*time.Second, "/bin/sh", "-c", "echo hi; cat /proc/version")
	if r.Code != 0 || !strings.HasPrefix(r.Stdout, "hi\n") {
		t.Fatalf("exec: %+v %q %q", r.ExitStatus, r.Stdout, r.Stderr)
	}
	t.Logf("%s", r.Stdout)
	if err := sb.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sb.Done():
	default:
		t.Fatal("Done open after Stop")
	}
}
