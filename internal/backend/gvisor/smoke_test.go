package gvisor_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/gvisor"
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

// TestReapOrphans: a sandbox whose server is gone (here: one the reaper
// is not told to keep) has its sentry killed, its runsc state deleted
// and its root unmounted; one it keeps is left running.
func TestReapOrphans(t *testing.T) {
	h := harness(t)
	b := h.Backend.(*gvisor.Backend)
	orphan := h.Sandbox(t, backend.Config{})
	kept := h.Sandbox(t, backend.Config{})
	pid := orphan.(*gvisor.Sandbox).Pid()
	removed, err := b.ReapOrphans(func(id string) bool { return id != orphan.ID() })
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != orphan.ID() {
		t.Fatalf("reaped %v, want [%s]", removed, orphan.ID())
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && !strings.Contains(string(b), ") Z ") {
		t.Errorf("the orphan's sentry %d still runs", pid)
	}
	if r := conformance.Exec(t, kept, 10*time.Second, "/bin/true"); r.Code != 0 {
		t.Errorf("the kept sandbox: %+v", r.ExitStatus)
	}
}
