package gvisor_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/gvisor"
	"github.com/warren-sandbox/warren/internal/conformance"
	"github.com/warren-sandbox/warren/internal/testenv"
	"github.com/warren-sandbox/warren/internal/wire"
)

// TestCrash kills each part of a running gVisor sandbox from the host:
// its sentry (the sandbox process), its gofer, and its agent (the
// container's init, through runsc). Each leaves the sandbox running and
// reachable, or ended (Done closed) with every request, the one in flight
// included, failing within bounds rather than hanging; a stop then leaves
// nothing behind and the next start brings it back with its files.
func TestCrash(t *testing.T) {
	h := harness(t)
	runsc := testenv.RunscBinary(t)
	for _, c := range []struct {
		name string
		kill func(t *testing.T, sb *gvisor.Sandbox)
	}{
		{"sentry", func(t *testing.T, sb *gvisor.Sandbox) {
			if err := syscall.Kill(sb.Pid(), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}},
		{"gofer", func(t *testing.T, sb *gvisor.Sandbox) {
			pid := goferPid(t, sb.ID())
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}},
		{"agent", func(t *testing.T, sb *gvisor.Sandbox) {
			out, err := exec.Command(runsc, "--root="+filepath.Join(sharedBase, "run", ".runsc"), "kill", sb.ID(), "KILL").CombinedOutput() //nolint:gosec // the test's runsc
			if err != nil {
				t.Fatalf("runsc kill: %v: %s", err, out)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			sb := h.Sandbox(t, backend.Config{})
			if r := conformance.Exec(t, sb, 10*time.Second, "/bin/sh", "-c", "echo kept > /root/f"); r.Code != 0 {
				t.Fatalf("write: %+v %q", r.ExitStatus, r.Stderr)
			}
			ctx := context.Background()
			// A request in flight when it dies.
			inflight := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
				defer cancel()
				_, err := sb.Agent().Exec(ctx, &wire.ExecRequest{Argv: []string{"/bin/sleep", "30"}}, nil)
				inflight <- err
			}()
			time.Sleep(300 * time.Millisecond)
			t0 := time.Now()
			c.kill(t, sb.(*gvisor.Sandbox))
			select {
			case <-sb.Done():
				t.Logf("ended %v after the kill", time.Since(t0))
				select {
				case err := <-inflight:
					if err == nil {
						t.Error("the request in flight succeeded in a dead sandbox")
					}
					t.Logf("the request in flight: %v", err)
				case <-time.After(10 * time.Second):
					t.Fatal("the request in flight hangs 10 s after the sandbox ended")
				}
				rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				_, err := sb.Agent().Health(rctx)
				cancel()
				if err == nil || errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("a request to the ended sandbox: %v, want a prompt error", err)
				}
			case <-time.After(10 * time.Second):
				// Still running: it must answer.
				if r := conformance.Exec(t, sb, 10*time.Second, "/bin/cat", "/root/f"); r.Stdout != "kept\n" {
					t.Fatalf("still running 10 s after the kill but not serving: %+v %q %q", r.ExitStatus, r.Stdout, r.Stderr)
				}
				t.Log("still running and reachable")
			}
			if err := sb.Stop(ctx); err != nil {
				t.Fatalf("stop after the kill: %v", err)
			}
			if err := sb.Start(ctx); err != nil {
				t.Fatalf("start after the kill: %v", err)
			}
			if r := conformance.Exec(t, sb, 10*time.Second, "/bin/cat", "/root/f"); r.Stdout != "kept\n" {
				t.Errorf("after a restart: %+v %q %q", r.ExitStatus, r.Stdout, r.Stderr)
			}
		})
	}
}

// goferPid finds the gofer of sandbox id: the runsc process serving its
// bundle's files.
func goferPid(t *testing.T, id string) int {
	t.Helper()
	bundle := "--bundle=" + filepath.Join(sharedBase, "run", id)
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		isGofer, ours := false, false
		for _, a := range args {
			isGofer = isGofer || a == "gofer"
			ours = ours || a == bundle || a == filepath.Join(sharedBase, "run", id)
		}
		if isGofer && ours {
			pid, _ := strconv.Atoi(e.Name())
			return pid
		}
	}
	t.Fatalf("no gofer of %s found", id)
	return 0
}

// TestResumeNotPaused: Resume of a running sandbox runsc does not hold
// paused (never paused, or resumed behind the backend's back) succeeds,
// as a thaw of a cgroup that is not frozen does on native, rather than
// leave the sandbox paused for good in the caller's eyes.
func TestResumeNotPaused(t *testing.T) {
	sb := harness(t).Sandbox(t, backend.Config{})
	if err := sb.(backend.Pauser).Resume(context.Background()); err != nil {
		t.Fatalf("resume of a running sandbox: %v", err)
	}
	if r := conformance.Exec(t, sb, 10*time.Second, "/bin/echo", "ok"); r.Stdout != "ok\n" {
		t.Fatalf("exec after: %+v %q", r.ExitStatus, r.Stderr)
	}
}
