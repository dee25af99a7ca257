// The Processes group: background processes. Start, list and get; output
// read by long poll, keeping the newest when it overflows; signals, wait,
// timeouts, stdin, a PTY, removal, unknown ids, start errors, and no
// descriptors leaked by failed starts.

package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/agent"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/wire"
)

func (h *Harness) agentProcesses(t *testing.T) {
	s := h.newAgentSuite(t, backend.Config{})
	t.Run("StartListGet", s.procStartListGet)
	t.Run("LongPoll", s.procLongPoll)
	t.Run("OutputDropsOldest", s.procDropped)
	t.Run("Signals", s.procSignals)
	t.Run("Wait", s.procWait)
	t.Run("Timeout", s.procTimeout)
	t.Run("Stdin", s.procStdin)
	t.Run("TTY", s.procTTY)
	t.Run("Remove", s.procRemove)
	t.Run("UnknownID", s.procUnknown)
	t.Run("StartErrors", s.procStartErrors)
	t.Run("FailedStartsLeakNoFDs", s.procFDLeak)
	t.Run("StillHealthy", s.healthy)
}

func (s *agentSuite) start(t testing.TB, req *wire.ExecRequest) wire.ProcessInfo {
	t.Helper()
	info, err := s.c.StartProcess(ctxFor(t, 30*time.Second), req)
	if err != nil {
		t.Fatalf("start %q: %s", req.Argv, errInfo(err))
	}
	return info
}

func (s *agentSuite) remove(t testing.TB, id string) {
	if err := s.c.RemoveProcess(ctxFor(t, 30*time.Second), id); err != nil && !agent.IsKind(err, wire.ErrNotFound) {
		t.Errorf("remove %s: %s", id, errInfo(err))
	}
}

// waitExit waits for a process to exit.
func (s *agentSuite) waitExit(t testing.TB, id string) wire.ProcessInfo {
	t.Helper()
	info, err := s.c.Wait(ctxFor(t, 30*time.Second), id, 25*time.Second)
	if err != nil {
		t.Fatalf("wait %s: %s", id, errInfo(err))
	}
	if info.Running || info.Exit == nil {
		t.Fatalf("process %s still running after 25s: %+v", id, info)
	}
	return info
}

// collect reads a stream from offset 0 until until(data) holds or EOF.
func (s *agentSuite) collect(t testing.TB, id, stream string, until func([]byte) bool) ([]byte, wire.OutputChunk) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var buf []byte
	var off int64
	for {
		ch, err := s.c.Output(ctxFor(t, 30*time.Second), id, stream, off, 500*time.Millisecond)
		if err != nil {
			t.Fatalf("output %s %s@%d: %s", id, stream, off, errInfo(err))
		}
		if ch.Dropped != 0 || ch.Offset != off {
			t.Fatalf("output %s %s@%d: unexpected drop %+v", id, stream, off, ch)
		}
		buf = append(buf, ch.Data...)
		off = ch.NextOffset
		if (until != nil && until(buf)) || ch.EOF {
			return buf, ch
		}
		if time.Now().After(deadline) {
			t.Fatalf("output %s %s: gave up after 20s with %s", id, stream, clip(buf))
		}
	}
}

func (s *agentSuite) procStartListGet(t *testing.T) {
	argv := []string{"/bin/sh", "-c", "echo hello; echo oops >&2; exec sleep 100"}
	before := time.Now()
	info := s.start(t, &wire.ExecRequest{Argv: argv})
	defer s.remove(t, info.ID)
	if info.ID == "" || info.Pid <= 0 || !info.Running || info.Exit != nil || !slices.Equal(info.Argv, argv) {
		t.Errorf("start answered %+v", info)
	}
	if d := info.StartedAt.Sub(before); d < -time.Minute || d > time.Minute {
		t.Errorf("started_at %v, test started at %v", info.StartedAt, before)
	}
	list, err := s.c.Processes(ctxFor(t, 10*time.Second))
	if err != nil {
		t.Fatal(errInfo(err))
	}
	found := false
	for _, p := range list {
		found = found || (p.ID == info.ID && p.Pid == info.Pid)
	}
	if !found {
		t.Errorf("process %s missing from the list %+v", info.ID, list)
	}
	got, err := s.c.Process(ctxFor(t, 10*time.Second), info.ID)
	if err != nil || got.ID != info.ID || got.Pid != info.Pid || !got.Running {
		t.Errorf("get %s: %+v %s", info.ID, got, errInfo(err))
	}

	s.collect(t, info.ID, wire.Stdout, func(b []byte) bool { return len(b) >= 6 })
	s.collect(t, info.ID, wire.Stderr, func(b []byte) bool { return len(b) >= 5 })
	for _, tc := range []struct {
		name       string
		stream     string
		off        int64
		data       string
		offset     int64
		nextOffset int64
	}{
		{"from 0", wire.Stdout, 0, "hello\n", 0, 6},
		{"from the middle", wire.Stdout, 2, "llo\n", 2, 6},
		{"at the end", wire.Stdout, 6, "", 6, 6},
		{"beyond the end", wire.Stdout, 1000, "", 6, 6},
		{"negative", wire.Stdout, -5, "hello\n", 0, 6},
		{"stderr", wire.Stderr, 0, "oops\n", 0, 5},
		{"stderr middle", wire.Stderr, 4, "\n", 4, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch, err := s.c.Output(ctxFor(t, 10*time.Second), info.ID, tc.stream, tc.off, 0)
			if err != nil {
				t.Fatal(errInfo(err))
			}
			if string(ch.Data) != tc.data || ch.Offset != tc.offset || ch.NextOffset != tc.nextOffset || ch.Dropped != 0 || ch.EOF {
				t.Errorf("%s@%d: %+v (data %q); want data %q offset %d next %d, no EOF (still running)", tc.stream, tc.off, ch, ch.Data, tc.data, tc.offset, tc.nextOffset)
			}
		})
	}
	t.Run("bad stream", func(t *testing.T) {
		_, err := s.c.Output(ctxFor(t, 10*time.Second), info.ID, "stdin", 0, 0)
		wantKind(t, err, wire.ErrInvalid, "output of stream stdin")
	})
}

func (s *agentSuite) procLongPoll(t *testing.T) {
	info := s.start(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", `read x; echo "got-$x"; read y; echo "bye-$y"`}})
	defer s.remove(t, info.ID)

	t.Run("nothing new returns at the wait", func(t *testing.T) {
		start := time.Now()
		ch, err := s.c.Output(ctxFor(t, 20*time.Second), info.ID, wire.Stdout, 0, 300*time.Millisecond)
		took := time.Since(start)
		if err != nil || len(ch.Data) != 0 || ch.EOF {
			t.Errorf("%+v %s", ch, errInfo(err))
		}
		if took < 250*time.Millisecond || took > 10*time.Second {
			t.Errorf("a 300 ms long poll with nothing new took %v", took)
		}
	})
	t.Run("returns when data arrives", func(t *testing.T) {
		type res struct {
			ch   wire.OutputChunk
			err  error
			took time.Duration
		}
		resc := make(chan res, 1)
		start := time.Now()
		go func() {
			ch, err := s.c.Output(context.Background(), info.ID, wire.Stdout, 0, 30*time.Second)
			resc <- res{ch, err, time.Since(start)}
		}()
		time.Sleep(400 * time.Millisecond)
		if err := s.c.WriteStdin(ctxFor(t, 10*time.Second), info.ID, []byte("ping\n"), false); err != nil {
			t.Fatal(errInfo(err))
		}
		var r res
		select {
		case r = <-resc:
		case <-time.After(25 * time.Second):
			t.Fatal("long poll did not return when data arrived")
		}
		if r.err != nil || !strings.HasPrefix("got-ping\n", string(r.ch.Data)) || len(r.ch.Data) == 0 {
			t.Errorf("long poll answered %+v (%q) %s", r.ch, r.ch.Data, errInfo(r.err))
		}
		if r.took < 300*time.Millisecond || r.took > 10*time.Second {
			t.Errorf("long poll returned after %v; data was written after 400ms", r.took)
		}
	})
	t.Run("EOF after exit", func(t *testing.T) {
		if err := s.c.WriteStdin(ctxFor(t, 10*time.Second), info.ID, []byte("now\n"), true); err != nil {
			t.Fatal(errInfo(err))
		}
		ex := s.waitExit(t, info.ID)
		if ex.Exit.Code != 0 {
			t.Errorf("exit %+v", ex.Exit)
		}
		all, last := s.collect(t, info.ID, wire.Stdout, nil)
		if string(all) != "got-ping\nbye-now\n" || !last.EOF {
			t.Errorf("stdout %q last chunk %+v; want got-ping, bye-now and EOF", all, last)
		}
		// A long poll at the end of an exited stream returns at once.
		start := time.Now()
		ch, err := s.c.Output(ctxFor(t, 20*time.Second), info.ID, wire.Stdout, int64(len(all)), 10*time.Second)
		if err != nil || !ch.EOF || len(ch.Data) != 0 || time.Since(start) > 5*time.Second {
			t.Errorf("poll at the end after exit: %+v %s after %v", ch, errInfo(err), time.Since(start))
		}
	})
}

func (s *agentSuite) procDropped(t *testing.T) {
	// Byte i of stdout is i % 251, so any chunk can be checked against its
	// absolute offset.
	const total = 3 << 20
	prog := fmt.Sprintf("import sys\nb = bytes(i %% 251 for i in range(%d))\nsys.stdout.buffer.write(b)\n", total)
	info := s.start(t, &wire.ExecRequest{Argv: []string{"python3", "-c", prog}})
	defer s.remove(t, info.ID)
	if ex := s.waitExit(t, info.ID); ex.Exit.Code != 0 {
		t.Fatalf("writer: %+v", ex.Exit)
	}
	check := func(ch wire.OutputChunk) {
		t.Helper()
		for k, b := range ch.Data {
			if want := byte((ch.Offset + int64(k)) % 251); b != want {
				t.Fatalf("byte at absolute offset %d is %d, want %d (offsets are not absolute)", ch.Offset+int64(k), b, want)
			}
		}
		if ch.NextOffset != ch.Offset+int64(len(ch.Data)) {
			t.Fatalf("chunk %d+%d bytes but next_offset %d", ch.Offset, len(ch.Data), ch.NextOffset)
		}
	}
	ch, err := s.c.Output(ctxFor(t, 20*time.Second), info.ID, wire.Stdout, 0, 0)
	if err != nil {
		t.Fatal(errInfo(err))
	}
	if ch.Dropped <= 0 || ch.Offset != ch.Dropped || ch.Offset > total-wire.ProcessOutputKeep {
		t.Fatalf("read from 0 of %d bytes: offset %d dropped %d; want the oldest bytes dropped and at least the last %d kept", total, ch.Offset, ch.Dropped, wire.ProcessOutputKeep)
	}
	check(ch)
	kept := int64(len(ch.Data))
	for !ch.EOF {
		ch, err = s.c.Output(ctxFor(t, 20*time.Second), info.ID, wire.Stdout, ch.NextOffset, 0)
		if err != nil {
			t.Fatal(errInfo(err))
		}
		if ch.Dropped != 0 {
			t.Fatalf("dropped %d bytes while reading forward: %+v", ch.Dropped, ch)
		}
		if len(ch.Data) == 0 && !ch.EOF {
			t.Fatalf("empty chunk without EOF at %d", ch.Offset)
		}
		check(ch)
		kept += int64(len(ch.Data))
	}
	if ch.NextOffset != total || kept < wire.ProcessOutputKeep {
		t.Errorf("read up to %d (kept %d); want up to %d with at least %d kept", ch.NextOffset, kept, total, wire.ProcessOutputKeep)
	}
	t.Run("mid offset in the kept window", func(t *testing.T) {
		ch, err := s.c.Output(ctxFor(t, 20*time.Second), info.ID, wire.Stdout, total-100, 0)
		if err != nil || ch.Offset != total-100 || len(ch.Data) != 100 || ch.Dropped != 0 || !ch.EOF {
			t.Fatalf("%+v %s", ch, errInfo(err))
		}
		check(ch)
	})
	t.Run("mid offset already dropped", func(t *testing.T) {
		ch, err := s.c.Output(ctxFor(t, 20*time.Second), info.ID, wire.Stdout, 12345, 0)
		if err != nil || ch.Dropped <= 0 || ch.Offset != 12345+ch.Dropped {
			t.Fatalf("%+v %s", ch, errInfo(err))
		}
		check(ch)
	})
}

func (s *agentSuite) procSignals(t *testing.T) {
	for _, tc := range []struct {
		sig, want string
		code      int
	}{
		{"SIGTERM", "SIGTERM", 143},
		{"15", "SIGTERM", 143},
		{"TERM", "SIGTERM", 143},
		{"term", "SIGTERM", 143},
		{"9", "SIGKILL", 137},
		{"SIGKILL", "SIGKILL", 137},
		{"HUP", "SIGHUP", 129},
		{"SIGUSR1", "SIGUSR1", 138},
	} {
		t.Run(tc.sig, func(t *testing.T) {
			info := s.start(t, &wire.ExecRequest{Argv: []string{"sleep", "100"}})
			defer s.remove(t, info.ID)
			if err := s.c.Signal(ctxFor(t, 10*time.Second), info.ID, tc.sig); err != nil {
				t.Fatalf("signal %q: %s", tc.sig, errInfo(err))
			}
			ex := s.waitExit(t, info.ID)
			if ex.Exit.Signal != tc.want || ex.Exit.Code != tc.code {
				t.Errorf("after %q: exit %+v; want %s, code %d", tc.sig, ex.Exit, tc.want, tc.code)
			}
		})
	}
	info := s.start(t, &wire.ExecRequest{Argv: []string{"sleep", "100"}})
	defer s.remove(t, info.ID)
	for _, sig := range []string{"SIGFOO", "FOO", "0", "65", "-1", "", "9x", "SIG", "SIGTERM\x00", " 15"} {
		t.Run("bad "+strconv.Quote(sig), func(t *testing.T) {
			err := s.c.Signal(ctxFor(t, 10*time.Second), info.ID, sig)
			wantKind(t, err, wire.ErrInvalid, fmt.Sprintf("signal %q", sig))
		})
	}
	if got, err := s.c.Process(ctxFor(t, 10*time.Second), info.ID); err != nil || !got.Running {
		t.Errorf("bad signals affected the process: %+v %s", got, errInfo(err))
	}
	t.Run("exited process", func(t *testing.T) {
		ex := s.start(t, &wire.ExecRequest{Argv: []string{"true"}})
		defer s.remove(t, ex.ID)
		s.waitExit(t, ex.ID)
		err := s.c.Signal(ctxFor(t, 10*time.Second), ex.ID, "TERM")
		wantKind(t, err, wire.ErrInvalid, "signal to an exited process")
	})
	t.Run("reaches the whole group", func(t *testing.T) {
		p := s.start(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "sleep 100 & echo $!; wait"}})
		defer s.remove(t, p.ID)
		out, _ := s.collect(t, p.ID, wire.Stdout, func(b []byte) bool { return bytes.HasSuffix(b, []byte("\n")) })
		child := strings.TrimSpace(string(out))
		if err := s.c.Signal(ctxFor(t, 10*time.Second), p.ID, "KILL"); err != nil {
			t.Fatal(errInfo(err))
		}
		s.waitExit(t, p.ID)
		s.waitGone(t, child)
	})
}

// waitGone waits until pid no longer exists in the sandbox.
func (s *agentSuite) waitGone(t testing.TB, pid string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "kill -0 " + pid + " 2>/dev/null"}})
		if r.Code != 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %s still exists", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *agentSuite) procWait(t *testing.T) {
	info := s.start(t, &wire.ExecRequest{Argv: []string{"sleep", "1.5"}})
	defer s.remove(t, info.ID)
	start := time.Now()
	w, err := s.c.Wait(ctxFor(t, 20*time.Second), info.ID, 300*time.Millisecond)
	took := time.Since(start)
	if err != nil || !w.Running || w.Exit != nil {
		t.Errorf("wait with 300 ms timeout on sleep 1.5: %+v %s; want running", w, errInfo(err))
	}
	if took < 250*time.Millisecond || took > 10*time.Second {
		t.Errorf("wait with 300 ms timeout took %v", took)
	}
	ex := s.waitExit(t, info.ID)
	if ex.Exit.Code != 0 || ex.Exit.Signal != "" || ex.Exit.DurationMs < 1000 || ex.Running {
		t.Errorf("exit %+v; want code 0 after ~1.5s", ex.Exit)
	}
	// Waiting again on an exited process answers at once.
	start = time.Now()
	w, err = s.c.Wait(ctxFor(t, 20*time.Second), info.ID, 10*time.Second)
	if err != nil || w.Running || w.Exit == nil || time.Since(start) > 5*time.Second {
		t.Errorf("second wait: %+v %s after %v", w, errInfo(err), time.Since(start))
	}
}

func (s *agentSuite) procTimeout(t *testing.T) {
	info := s.start(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "sleep 100 & sleep 100"}, TimeoutMs: 300})
	defer s.remove(t, info.ID)
	ex := s.waitExit(t, info.ID)
	if !ex.Exit.TimedOut || ex.Exit.Signal != "SIGKILL" || ex.Exit.DurationMs > 10000 {
		t.Errorf("exit %+v; want timed out by SIGKILL after ~300ms", ex.Exit)
	}
}

func (s *agentSuite) procStdin(t *testing.T) {
	info := s.start(t, &wire.ExecRequest{Argv: []string{"cat"}})
	defer s.remove(t, info.ID)
	part1 := append([]byte("first\x00\xff\xfe"), randBytes(200000)...)
	part2 := []byte("second, then EOF")
	if err := s.c.WriteStdin(ctxFor(t, 20*time.Second), info.ID, part1, false); err != nil {
		t.Fatal(errInfo(err))
	}
	if err := s.c.WriteStdin(ctxFor(t, 20*time.Second), info.ID, part2, true); err != nil {
		t.Fatal(errInfo(err))
	}
	ex := s.waitExit(t, info.ID)
	if ex.Exit.Code != 0 {
		t.Errorf("cat: %+v", ex.Exit)
	}
	out, _ := s.collect(t, info.ID, wire.Stdout, nil)
	if want := append(part1, part2...); !bytes.Equal(out, want) {
		t.Errorf("cat echoed %d bytes %s; want the %d bytes written", len(out), clip(out), len(want))
	}
	err := s.c.WriteStdin(ctxFor(t, 10*time.Second), info.ID, []byte("late"), false)
	s.fresh()
	wantKind(t, err, wire.ErrInvalid, "write to closed stdin")
}

func (s *agentSuite) procTTY(t *testing.T) {
	t.Run("resize and stty size", func(t *testing.T) {
		info := s.start(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "read line; stty size; tty; test -t 0 && test -t 1 && echo is-a-tty"}, TTY: true})
		defer s.remove(t, info.ID)
		if err := s.c.Resize(ctxFor(t, 10*time.Second), info.ID, 40, 100); err != nil {
			t.Fatalf("resize: %s", errInfo(err))
		}
		if err := s.c.WriteStdin(ctxFor(t, 10*time.Second), info.ID, []byte("go\n"), false); err != nil {
			t.Fatal(errInfo(err))
		}
		ex := s.waitExit(t, info.ID)
		out, _ := s.collect(t, info.ID, wire.Stdout, nil)
		for _, want := range []string{"40 100\r\n", "/dev/pts/", "is-a-tty\r\n"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("terminal output %q lacks %q (exit %+v)", out, want, ex.Exit)
			}
		}
	})
	t.Run("interactive shell", func(t *testing.T) {
		info := s.start(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-i"}, TTY: true})
		defer s.remove(t, info.ID)
		if err := s.c.WriteStdin(ctxFor(t, 10*time.Second), info.ID, []byte("echo $((40+2))\nexit 7\n"), false); err != nil {
			t.Fatal(errInfo(err))
		}
		ex := s.waitExit(t, info.ID)
		out, _ := s.collect(t, info.ID, wire.Stdout, nil)
		if !strings.Contains(string(out), "42\r\n") || ex.Exit.Code != 7 {
			t.Errorf("sh -i: output %q exit %+v; want 42 and code 7", out, ex.Exit)
		}
	})
	t.Run("resize without a terminal", func(t *testing.T) {
		info := s.start(t, &wire.ExecRequest{Argv: []string{"sleep", "100"}})
		defer s.remove(t, info.ID)
		err := s.c.Resize(ctxFor(t, 10*time.Second), info.ID, 40, 100)
		wantKind(t, err, wire.ErrInvalid, "resize of a process without a terminal")
	})
}

func (s *agentSuite) procRemove(t *testing.T) {
	info := s.start(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "trap '' TERM HUP INT; sleep 100 & wait"}})
	if err := s.c.RemoveProcess(ctxFor(t, 20*time.Second), info.ID); err != nil {
		t.Fatalf("remove: %s", errInfo(err))
	}
	_, err := s.c.Process(ctxFor(t, 10*time.Second), info.ID)
	wantKind(t, err, wire.ErrNotFound, "get after remove")
	list, err := s.c.Processes(ctxFor(t, 10*time.Second))
	if err != nil {
		t.Fatal(errInfo(err))
	}
	for _, p := range list {
		if p.ID == info.ID {
			t.Errorf("removed process %s still listed", info.ID)
		}
	}
	s.waitGone(t, strconv.Itoa(info.Pid))
	err = s.c.RemoveProcess(ctxFor(t, 10*time.Second), info.ID)
	wantKind(t, err, wire.ErrNotFound, "second remove")
}

func (s *agentSuite) procUnknown(t *testing.T) {
	for _, id := range []string{"proc-999999", "no/such", "..", "%2e%2e", "proc-1\x00", strings.Repeat("x", 5000)} {
		ops := []struct {
			name string
			do   func(ctx context.Context) error
		}{
			{"get", func(ctx context.Context) error { _, err := s.c.Process(ctx, id); return err }},
			{"output", func(ctx context.Context) error { _, err := s.c.Output(ctx, id, wire.Stdout, 0, 0); return err }},
			{"wait", func(ctx context.Context) error { _, err := s.c.Wait(ctx, id, time.Second); return err }},
			{"signal", func(ctx context.Context) error { return s.c.Signal(ctx, id, "TERM") }},
			{"stdin", func(ctx context.Context) error { return s.c.WriteStdin(ctx, id, []byte("x"), true) }},
			{"resize", func(ctx context.Context) error { return s.c.Resize(ctx, id, 10, 10) }},
			{"remove", func(ctx context.Context) error { return s.c.RemoveProcess(ctx, id) }},
		}
		for _, op := range ops {
			name := id
			if len(name) > 20 {
				name = name[:20] + "..."
			}
			t.Run(strconv.Quote(name)+"/"+op.name, func(t *testing.T) {
				err := op.do(ctxFor(t, 10*time.Second))
				s.fresh()
				wantKind(t, err, wire.ErrNotFound, op.name+" of unknown process "+strconv.Quote(name))
			})
		}
	}
}

func (s *agentSuite) procStartErrors(t *testing.T) {
	s.sh(t, fmt.Sprintf("printf 'no program\\n' > %[1]s/junk && printf '#!/warren/no/such/interpreter\\n' > %[1]s/badinterp && chmod 755 %[1]s/junk %[1]s/badinterp", s.tmp))
	for _, tc := range []struct {
		name  string
		req   wire.ExecRequest
		kind  string
		cause string // why the program did not start, for a client's 127 or 126
	}{
		{"empty argv", wire.ExecRequest{}, wire.ErrInvalid, ""},
		{"NUL in argv", wire.ExecRequest{Argv: []string{"sleep", "1\x00"}}, wire.ErrInvalid, ""},
		{"missing binary", wire.ExecRequest{Argv: []string{"warren-no-such-command"}}, wire.ErrNotFound, wire.CauseNotFound},
		{"missing interpreter", wire.ExecRequest{Argv: []string{s.tmp + "/badinterp"}}, wire.ErrNotFound, wire.CauseNotFound},
		{"not executable", wire.ExecRequest{Argv: []string{"/etc/passwd"}}, wire.ErrNotFound, wire.CauseNotExecutable},
		{"no program", wire.ExecRequest{Argv: []string{s.tmp + "/junk"}}, wire.ErrNotFound, wire.CauseNotExecutable},
		{"missing cwd", wire.ExecRequest{Argv: []string{"true"}, Cwd: "/warren/no/such/dir"}, wire.ErrNotFound, wire.CauseNotExecutable},
		{"unknown user", wire.ExecRequest{Argv: []string{"true"}, User: "warren-no-such-user"}, wire.ErrNotFound, ""},
		{"stdin too large", wire.ExecRequest{Argv: []string{"cat"}, Stdin: make([]byte, wire.MaxStdin+1)}, wire.ErrTooLarge, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info, err := s.c.StartProcess(ctxFor(t, 30*time.Second), &tc.req)
			if err == nil {
				s.remove(t, info.ID)
			}
			wantKind(t, err, tc.kind, "start "+tc.name)
			if ae := (*agent.Error)(nil); errors.As(err, &ae) && ae.Cause != tc.cause {
				t.Errorf("start %s: cause %q, want %q (%s)", tc.name, ae.Cause, tc.cause, ae.Message)
			}
		})
	}
}

// procFDLeak starts processes that fail at execve and checks the agent
// (PID 1) does not keep descriptors for them.
func (s *agentSuite) procFDLeak(t *testing.T) {
	count := func() int {
		r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "ls /proc/1/fd | wc -l"}})
		n, err := strconv.Atoi(strings.TrimSpace(string(r.Stdout)))
		if r.Code != 0 || err != nil {
			t.Fatalf("cannot count the agent's descriptors: %+v", r)
		}
		return n
	}
	s.sh(t, fmt.Sprintf("printf '#!/warren/no/such/interpreter\\n' > %[1]s/badinterp && chmod 755 %[1]s/badinterp", s.tmp))
	before := count()
	const n = 40
	for range n {
		info, err := s.c.StartProcess(ctxFor(t, 10*time.Second), &wire.ExecRequest{Argv: []string{s.tmp + "/badinterp"}})
		if err == nil {
			s.remove(t, info.ID)
			t.Fatalf("start of a script with a missing interpreter succeeded: %+v", info)
		}
	}
	after := count()
	if after-before > n/2 {
		t.Errorf("agent descriptors grew from %d to %d over %d failed starts (leak of the output pipes)", before, after, n)
	}
}
