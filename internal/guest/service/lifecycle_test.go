package service

import (
	"context"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/guest/setup"
	"github.com/warren-sandbox/warren/internal/wire"
)

// These run without privileges and outside a sandbox: the agent's process
// lifecycle only needs processes. Under -race they check that a timeout's
// kill, the output still arriving and the wait for the exit share nothing
// unsynchronised.

// chatty writes to both streams without end, so output is in flight when
// the timeout kills it.
var chatty = []string{"/bin/sh", "-c", "while :; do echo out; echo err >&2; done"}

func testRunner() *Runner {
	return &Runner{Starter: setup.NewReaper(nil), Env: []string{"PATH=/usr/bin:/bin"}, Cwd: "/"}
}

// TestExecTimeoutWithOutput: an exec that outlives its timeout while
// writing is killed and reported timed out, with the output it wrote.
func TestExecTimeoutWithOutput(t *testing.T) {
	r := testRunner()
	var mu sync.Mutex
	got := map[string]int{}
	for range 5 {
		st, err := r.Exec(context.Background(), &wire.ExecRequest{Argv: chatty, TimeoutMs: 200}, func(ev wire.ExecEvent) {
			mu.Lock()
			got[ev.Stream] += len(ev.Data)
			mu.Unlock()
		})
		if err != nil {
			t.Fatal(err)
		}
		if !st.TimedOut || st.Signal != "SIGKILL" || st.Code != 137 {
			t.Fatalf("exit %+v, want timed out by SIGKILL (137)", st)
		}
	}
	// Across the runs (one may be slow to start on a loaded machine).
	mu.Lock()
	defer mu.Unlock()
	if got[wire.Stdout] == 0 || got[wire.Stderr] == 0 {
		t.Errorf("output %v, want some of both streams", got)
	}
}

// TestExecCancelIsNotTimeout: a kill because the client went away is not
// a timeout, and a process that exits in time is neither.
func TestExecCancelIsNotTimeout(t *testing.T) {
	r := testRunner()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	st, err := r.Exec(ctx, &wire.ExecRequest{Argv: chatty, TimeoutMs: 60_000}, func(wire.ExecEvent) {})
	if err != nil {
		t.Fatal(err)
	}
	if st.TimedOut || st.Signal != "SIGKILL" {
		t.Errorf("cancelled: exit %+v, want killed and not timed out", st)
	}
	st, err = r.Exec(context.Background(), &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "exit 3"}, TimeoutMs: 60_000}, func(wire.ExecEvent) {})
	if err != nil {
		t.Fatal(err)
	}
	if st.TimedOut || st.Code != 3 {
		t.Errorf("in time: exit %+v, want code 3, not timed out", st)
	}
}

// TestExecDrainsDescendants: output a descendant still writes after the
// process exited is cut after a grace, so exec returns even though the
// pipe stays open.
func TestExecDrainsDescendants(t *testing.T) {
	r := testRunner()
	t0 := time.Now()
	st, err := r.Exec(context.Background(), &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo hi; sleep 5 &"}}, func(wire.ExecEvent) {})
	if err != nil {
		t.Fatal(err)
	}
	if st.Code != 0 || st.TimedOut {
		t.Errorf("exit %+v, want 0", st)
	}
	if d := time.Since(t0); d > 3*time.Second {
		t.Errorf("exec took %v: it waited for the descendant holding its output", d)
	}
}

// TestProcessTimeoutWithOutput: the same for a background process, with
// its output read while it runs and is killed.
func TestProcessTimeoutWithOutput(t *testing.T) {
	ps := NewProcs(testRunner())
	defer ps.KillAll()
	for _, tty := range []bool{false, true} {
		info, err := ps.Start(&wire.ExecRequest{Argv: chatty, TimeoutMs: 200, TTY: tty})
		if err != nil {
			if tty {
				t.Skipf("no pseudo-terminal here: %v", err)
			}
			t.Fatal(err)
		}
		p, err := ps.get(info.ID)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var readers sync.WaitGroup
		var read [2]int64 // bytes read of stdout, stderr
		for i, stream := range []string{wire.Stdout, wire.Stderr} {
			readers.Add(1)
			go func() {
				defer readers.Done()
				var off int64
				for ctx.Err() == nil {
					ch, err := p.output(ctx, stream, off, 1<<20, time.Second)
					if err != nil {
						t.Error(err)
						return
					}
					off = ch.NextOffset
					if ch.EOF {
						break
					}
				}
				read[i] = off
			}()
		}
		end := p.wait(ctx)
		readers.Wait()
		cancel()
		if end.Running || end.Exit == nil || !end.Exit.TimedOut || end.Exit.Signal != "SIGKILL" {
			t.Fatalf("tty %v: %+v, want exited, timed out by SIGKILL", tty, end)
		}
		if read[0] == 0 {
			t.Errorf("tty %v: no output read", tty)
		}
	}
}

// TestProcessDrainsDescendants: a background process whose descendant keeps
// its output open is reported exited after a grace, with what it wrote, on
// pipes and on a terminal.
func TestProcessDrainsDescendants(t *testing.T) {
	// On a terminal the shell's exit hangs the background sleep up. A
	// test run under nohup has SIGHUP ignored, which its children would
	// inherit (the agent's do not: warren-spawner resets every signal):
	// handled here, it is the default in them again.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	ps := NewProcs(testRunner())
	defer ps.KillAll()
	for _, tty := range []bool{false, true} {
		info, err := ps.Start(&wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo hi; sleep 5 &"}, TTY: tty})
		if err != nil {
			if tty {
				t.Skipf("no pseudo-terminal here: %v", err)
			}
			t.Fatal(err)
		}
		p, err := ps.get(info.ID)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		end := p.wait(ctx)
		cancel()
		if end.Running || end.Exit == nil || end.Exit.Code != 0 || end.Exit.TimedOut {
			t.Fatalf("tty %v: %+v, want exited 0 within the grace", tty, end)
		}
		ch, _ := p.output(context.Background(), wire.Stdout, 0, 100, 0)
		if !strings.HasPrefix(string(ch.Data), "hi") || !ch.EOF {
			t.Errorf("tty %v: output %+v, want hi and the end", tty, ch)
		}
		if err := ps.Remove(info.ID); err != nil {
			t.Error(err)
		}
	}
}

// TestExecKeepsUnreadOutput: output written before the process exited is
// all returned even when its reader falls behind the grace (a loaded
// sandbox may not schedule it in time): the grace cuts streams held open,
// not bytes already in the pipe.
func TestExecKeepsUnreadOutput(t *testing.T) {
	r := testRunner()
	var got []byte
	first := true
	st, err := r.Exec(context.Background(), &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo first; sleep 0.05; echo second"}}, func(ev wire.ExecEvent) {
		if first {
			// The reader is busy past the process's exit and the grace
			// while "second" waits in the pipe.
			first = false
			time.Sleep(400 * time.Millisecond)
		}
		got = append(got, ev.Data...)
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Code != 0 || string(got) != "first\nsecond\n" {
		t.Errorf("exit %+v, output %q; want 0 and both lines", st, got)
	}
}

// TestAwaitExit: awaitExit returns for a child that exited before it was
// called (the poller's edge-triggered event then comes as the pidfd is
// registered, before the wait is armed) and for one that exits during it.
func TestAwaitExit(t *testing.T) {
	for i := range 20 {
		cmd := exec.Command("/bin/sh", "-c", "sleep 0.0$0", strconv.Itoa(i%2*5))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			time.Sleep(20 * time.Millisecond) // exited before the wait
		}
		done := make(chan struct{})
		go func() { awaitExit(cmd.Process.Pid); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("run %d: awaitExit still waits 10 s after its child exited", i)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
	}
}
