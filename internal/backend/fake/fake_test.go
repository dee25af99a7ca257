package fake_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warren-sandbox/warren/internal/agent"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/fake"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/wire"
)

func started(t *testing.T, b *fake.Backend, id string) backend.Sandbox {
	t.Helper()
	sb, err := b.Create(t.Context(), backend.Config{ID: id, Image: &image.Image{Layers: []string{"/"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	return sb
}

// TestExec: the fake's commands through the real client and backend.Exec,
// exit statuses and OOM kills included.
func TestExec(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := fake.New()
		defer b.Close()
		sb := started(t, b, "x")
		if h, err := sb.Agent().Health(t.Context()); err != nil || h.Version != wire.Version {
			t.Fatalf("health: %+v %v", h, err)
		}
		for _, tc := range []struct {
			argv   []string
			stdin  string
			out    string
			code   int
			signal string
			oom    bool
		}{
			{argv: []string{"echo", "a", "b"}, out: "a b\n"},
			{argv: []string{"true"}},
			{argv: []string{"false"}, code: 1},
			{argv: []string{"exit", "3"}, code: 3},
			{argv: []string{"cat"}, stdin: "in", out: "in"},
			{argv: []string{"sleep", "1"}},
			{argv: []string{"oom"}, code: 137, signal: "SIGKILL", oom: true},
			{argv: []string{"nonesuch"}, code: 127},
		} {
			var out bytes.Buffer
			res, err := backend.Exec(t.Context(), sb, &wire.ExecRequest{Argv: tc.argv, Stdin: []byte(tc.stdin)},
				func(_ string, b []byte) { out.Write(b) })
			if err != nil || res.Code != tc.code || res.Signal != tc.signal || res.OOMKilled != tc.oom || out.String() != tc.out {
				t.Errorf("%v: %+v %q %v", tc.argv, res, out.String(), err)
			}
		}
		res, err := backend.Exec(t.Context(), sb, &wire.ExecRequest{Argv: []string{"sleep", "10"}, TimeoutMs: 1000}, nil)
		if err != nil || !res.TimedOut || res.Signal != "SIGKILL" {
			t.Errorf("sleep past its timeout: %+v %v", res, err)
		}
	})
}

// TestUnresponsiveAgent: an agent that misses the host's deadline gets its
// sandbox stopped, as backend.Exec promises.
func TestUnresponsiveAgent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := fake.New()
		defer b.Close()
		sb := started(t, b, "x")
		res, err := backend.Exec(t.Context(), sb, &wire.ExecRequest{Argv: []string{"hang"}, TimeoutMs: 100}, nil)
		if !errors.Is(err, backend.ErrAgentUnresponsive) || !res.TimedOut {
			t.Fatalf("%+v %v", res, err)
		}
		select {
		case <-sb.Done():
		default:
			t.Error("the sandbox still runs")
		}
		if got := b.Calls(); got[len(got)-1] != (fake.Call{Op: "stop", ID: "x"}) {
			t.Errorf("calls %v", got)
		}
	})
}

// TestDie: an init that dies closes Done and breaks a command in flight.
func TestDie(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := fake.New()
		defer b.Close()
		sb := started(t, b, "x")
		errc := make(chan error, 1)
		go func() {
			_, err := backend.Exec(context.Background(), sb, &wire.ExecRequest{Argv: []string{"sleep", "60"}}, nil)
			errc <- err
		}()
		synctest.Wait()
		b.Sandbox("x").Die()
		<-sb.Done()
		if err := <-errc; err == nil || !strings.Contains(err.Error(), "stopped while the command ran") {
			t.Errorf("exec across the death: %v", err)
		}
		if _, err := sb.Stats(); err == nil {
			t.Error("stats of a dead sandbox")
		}
		// It starts again.
		if err := sb.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		if _, err := sb.Agent().Health(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
}

// TestFilesKeptAcrossStops: the in-memory files behave as a writable
// layer: kept by Stop, gone with Remove.
func TestFilesKeptAcrossStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := fake.New()
		defer b.Close()
		sb := started(t, b, "x")
		if err := sb.Agent().WriteFile(t.Context(), "/f", strings.NewReader("data"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := sb.Stop(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := sb.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		if got, err := sb.Agent().ReadFile(t.Context(), "/f"); err != nil || string(got) != "data" {
			t.Fatalf("after a restart: %q %v", got, err)
		}
		if _, err := sb.Agent().ReadFile(t.Context(), "/none"); !agent.IsKind(err, wire.ErrNotFound) {
			t.Errorf("missing file: %v", err)
		}
		if err := sb.Remove(t.Context()); err != nil {
			t.Fatal(err)
		}
		if ids, _ := b.IDs(); len(ids) != 0 {
			t.Errorf("ids after remove: %v", ids)
		}
		if err := sb.Start(t.Context()); err == nil {
			t.Error("a removed sandbox started")
		}
	})
}

// TestStartHook: a failing hook fails the start with nothing running; the
// next start succeeds.
func TestStartHook(t *testing.T) {
	b := fake.New()
	defer b.Close()
	boom := errors.New("boom")
	b.SetStartHook(func(string) error { return boom })
	sb, err := b.Create(t.Context(), backend.Config{ID: "x", Image: &image.Image{Layers: []string{"/"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Start(t.Context()); !errors.Is(err, boom) {
		t.Fatalf("start: %v", err)
	}
	if r := b.Running(); len(r) != 0 {
		t.Fatalf("running after a failed start: %v", r)
	}
	b.SetStartHook(nil)
	if err := sb.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if r := b.Running(); len(r) != 1 {
		t.Fatalf("running: %v", r)
	}
	if _, err := b.Create(t.Context(), backend.Config{ID: "x", Image: &image.Image{Layers: []string{"/"}}}); err == nil {
		t.Error("created twice")
	}
	if _, err := b.Create(t.Context(), backend.Config{ID: "BAD"}); err == nil {
		t.Error("an invalid config was accepted")
	}
}

// TestExecLimits: output is cut at the request's limit, the command runs
// on; a shell script is one of the fake's commands; a NUL in argv is
// refused as the real agent refuses it.
func TestExecLimits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := fake.New()
		defer b.Close()
		sb := started(t, b, "x")
		var out bytes.Buffer
		res, err := backend.Exec(t.Context(), sb, &wire.ExecRequest{Argv: []string{"spew", "100000"}, OutputLimit: 1000},
			func(_ string, b []byte) { out.Write(b) })
		if err != nil || !res.Truncated || res.Code != 0 || out.Len() != 1000 {
			t.Errorf("spew past the limit: %+v, %d bytes, %v", res, out.Len(), err)
		}
		var stdout, stderr bytes.Buffer
		res, err = backend.Exec(t.Context(), sb, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo  hi there; echo b >&2;nope; exit 3; echo never"}},
			func(stream string, b []byte) {
				if stream == wire.Stderr {
					stderr.Write(b)
				} else {
					stdout.Write(b)
				}
			})
		if err != nil || res.Code != 3 || stdout.String() != "hi there\n" || stderr.String() != "b\nsh: executable not found: nope\n" {
			t.Errorf("sh -c: %+v %q %q %v", res, stdout.String(), stderr.String(), err)
		}
		if _, err := sb.Agent().Exec(t.Context(), &wire.ExecRequest{Argv: []string{"echo", "a\x00b"}}, nil); !agent.IsKind(err, wire.ErrInvalid) {
			t.Errorf("NUL in argv: %v", err)
		}
	})
}

// TestProcesses: background processes as the real agent keeps them:
// output by offset, stdin, signals, wait, the table's limit.
func TestProcesses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := fake.New()
		defer b.Close()
		c := started(t, b, "x").Agent()
		ctx := t.Context()
		cat, err := c.StartProcess(ctx, &wire.ExecRequest{Argv: []string{"cat"}})
		if err != nil || !cat.Running || cat.ID == "" {
			t.Fatalf("start: %+v %v", cat, err)
		}
		if err := c.WriteStdin(ctx, cat.ID, []byte("one\n"), false); err != nil {
			t.Fatal(err)
		}
		ch, err := c.Output(ctx, cat.ID, wire.Stdout, 0, time.Second)
		if err != nil || string(ch.Data) != "one\n" || ch.NextOffset != 4 || ch.EOF {
			t.Fatalf("output: %+v %v", ch, err)
		}
		if err := c.WriteStdin(ctx, cat.ID, []byte("two\n"), true); err != nil {
			t.Fatal(err)
		}
		info, err := c.Wait(ctx, cat.ID, time.Minute)
		if err != nil || info.Running || info.Exit == nil || info.Exit.Code != 0 {
			t.Fatalf("wait: %+v %v", info, err)
		}
		if ch, _ := c.Output(ctx, cat.ID, wire.Stdout, 4, 0); string(ch.Data) != "two\n" || !ch.EOF {
			t.Errorf("output from an offset: %+v", ch)
		}
		if err := c.WriteStdin(ctx, cat.ID, []byte("late"), false); !agent.IsKind(err, wire.ErrInvalid) {
			t.Errorf("stdin after close: %v", err)
		}
		if err := c.Signal(ctx, cat.ID, "TERM"); !agent.IsKind(err, wire.ErrInvalid) {
			t.Errorf("signal to an exited process: %v", err)
		}
		if _, err := c.Output(ctx, cat.ID, "stdin", 0, 0); !agent.IsKind(err, wire.ErrInvalid) {
			t.Errorf("output of stream stdin: %v", err)
		}

		sleeper, err := c.StartProcess(ctx, &wire.ExecRequest{Argv: []string{"sleep", "60"}})
		if err != nil {
			t.Fatal(err)
		}
		if info, _ := c.Wait(ctx, sleeper.ID, time.Second); !info.Running {
			t.Errorf("a wait shorter than the sleep: %+v", info)
		}
		if err := c.Resize(ctx, sleeper.ID, 10, 10); !agent.IsKind(err, wire.ErrInvalid) {
			t.Errorf("resize without a terminal: %v", err)
		}
		if err := c.Signal(ctx, sleeper.ID, "SIGNOPE"); !agent.IsKind(err, wire.ErrInvalid) {
			t.Errorf("unknown signal: %v", err)
		}
		if err := c.Signal(ctx, sleeper.ID, "SIGTERM"); err != nil {
			t.Fatal(err)
		}
		info, _ = c.Wait(ctx, sleeper.ID, 0)
		if info.Exit == nil || info.Exit.Code != 143 || info.Exit.Signal != "SIGTERM" {
			t.Errorf("after SIGTERM: %+v", info)
		}
		if ps, _ := c.Processes(ctx); len(ps) != 2 || ps[0].ID != cat.ID || ps[1].ID != sleeper.ID {
			t.Errorf("list: %+v", ps)
		}
		if err := c.RemoveProcess(ctx, cat.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Process(ctx, cat.ID); !agent.IsKind(err, wire.ErrNotFound) {
			t.Errorf("a removed process: %v", err)
		}
		if _, err := c.StartProcess(ctx, &wire.ExecRequest{Argv: []string{"nonesuch"}}); !agent.IsKind(err, wire.ErrNotFound) {
			t.Errorf("unknown command: %v", err)
		}

		// A process's timeout kills it; a process deaf to signals is
		// forgotten anyway by a remove, after a grace.
		timed, _ := c.StartProcess(ctx, &wire.ExecRequest{Argv: []string{"sleep", "60"}, TimeoutMs: 500})
		if info, _ := c.Wait(ctx, timed.ID, 0); info.Exit == nil || !info.Exit.TimedOut || info.Exit.Signal != "SIGKILL" {
			t.Errorf("a process past its timeout: %+v", info)
		}
		deaf, _ := c.StartProcess(ctx, &wire.ExecRequest{Argv: []string{"hang"}})
		if err := c.RemoveProcess(ctx, deaf.ID); err != nil {
			t.Errorf("remove a process deaf to signals: %v", err)
		}
		_ = c.RemoveProcess(ctx, timed.ID)

		// More than is kept: the oldest is dropped, and said to be.
		spew, _ := c.StartProcess(ctx, &wire.ExecRequest{Argv: []string{"spew", "3000000"}})
		_, _ = c.Wait(ctx, spew.ID, 0)
		ch, err = c.Output(ctx, spew.ID, wire.Stdout, 0, 0)
		if err != nil || ch.Dropped == 0 || ch.Offset != ch.Dropped || len(ch.Data) != wire.ProcessOutputKeep {
			t.Errorf("output past what is kept: offset %d dropped %d, %d bytes, %v", ch.Offset, ch.Dropped, len(ch.Data), err)
		}
		if ch, _ = c.Output(ctx, spew.ID, wire.Stdout, ch.NextOffset, 0); ch.NextOffset != 3000000 || !ch.EOF || ch.Dropped != 0 {
			t.Errorf("the rest: %+v", ch.NextOffset)
		}

		// A terminal: resizable, everything on stdout.
		tty, _ := c.StartProcess(ctx, &wire.ExecRequest{Argv: []string{"cat"}, TTY: true, Rows: 24, Cols: 80})
		if err := c.Resize(ctx, tty.ID, 50, 132); err != nil {
			t.Errorf("resize a terminal: %v", err)
		}

		// The table's limit: full of running processes, a start is refused.
		ps, _ := c.Processes(ctx)
		for range wire.MaxProcesses - len(ps) {
			if _, err := c.StartProcess(ctx, &wire.ExecRequest{Argv: []string{"hang"}}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := c.StartProcess(ctx, &wire.ExecRequest{Argv: []string{"true"}}); err != nil {
			t.Errorf("a start that evicts an exited process: %v", err)
		}
		for range 4 { // the exited ones are gone; then only running ones are left
			_, err = c.StartProcess(ctx, &wire.ExecRequest{Argv: []string{"hang"}})
		}
		if !agent.IsKind(err, wire.ErrLimit) {
			t.Errorf("a start past the limit: %v", err)
		}
	})
}

// TestFileAPI: the in-memory tree answers as the real file API does,
// error kinds included.
func TestFileAPI(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := fake.New()
		defer b.Close()
		c := started(t, b, "x").Agent()
		ctx := t.Context()
		if err := c.Mkdir(ctx, wire.MkdirRequest{Path: "/w/sub", Parents: true}); err != nil {
			t.Fatal(err)
		}
		if err := c.Mkdir(ctx, wire.MkdirRequest{Path: "/w/sub"}); !agent.IsKind(err, wire.ErrExists) {
			t.Errorf("mkdir of an existing directory: %v", err)
		}
		if err := c.Mkdir(ctx, wire.MkdirRequest{Path: "/none/d"}); !agent.IsKind(err, wire.ErrNotFound) {
			t.Errorf("mkdir in a missing directory: %v", err)
		}
		if err := c.WriteFile(ctx, "w/sub/a", strings.NewReader("abc"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := c.WriteFile(ctx, "/none/a", strings.NewReader("abc"), 0o600); !agent.IsKind(err, wire.ErrNotFound) {
			t.Errorf("write in a missing directory: %v", err)
		}
		if err := c.WriteFile(ctx, "/w", strings.NewReader("abc"), 0o600); !agent.IsKind(err, wire.ErrInvalid) {
			t.Errorf("write onto a directory: %v", err)
		}
		ents, err := c.List(ctx, "/w/sub")
		if err != nil || len(ents) != 1 || ents[0].Name != "a" || ents[0].Path != "/w/sub/a" || ents[0].Size != 3 || ents[0].Type != "file" || ents[0].Mode != 0o600 {
			t.Fatalf("list: %+v %v", ents, err)
		}
		if _, err := c.List(ctx, "/w/sub/a"); !agent.IsKind(err, wire.ErrInvalid) {
			t.Errorf("list of a file: %v", err)
		}
		if _, err := c.ReadFile(ctx, "/w"); !agent.IsKind(err, wire.ErrInvalid) {
			t.Errorf("read of a directory: %v", err)
		}
		if err := c.Move(ctx, "/w/sub", "/v"); err != nil {
			t.Fatal(err)
		}
		if fi, err := c.Stat(ctx, "/v/a"); err != nil || fi.Size != 3 {
			t.Fatalf("stat after a move: %+v %v", fi, err)
		}
		if _, err := c.Stat(ctx, "/w/sub/a"); !agent.IsKind(err, wire.ErrNotFound) {
			t.Errorf("stat of the moved-away file: %v", err)
		}
		if err := c.Remove(ctx, wire.RemoveRequest{Path: "/v"}); !agent.IsKind(err, wire.ErrInvalid) {
			t.Errorf("remove a non-empty directory: %v", err)
		}
		if err := c.Remove(ctx, wire.RemoveRequest{Path: "/v", Recursive: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Stat(ctx, "/v/a"); !agent.IsKind(err, wire.ErrNotFound) {
			t.Errorf("stat below a removed directory: %v", err)
		}
		if err := c.Remove(ctx, wire.RemoveRequest{Path: "/", Recursive: true}); !agent.IsKind(err, wire.ErrPermission) {
			t.Errorf("remove the root: %v", err)
		}
		for _, p := range []string{"../etc", "/tmp/../etc", "a\x00b", strings.Repeat("n", 256)} {
			if _, err := c.Stat(ctx, p); !agent.IsKind(err, wire.ErrInvalid) {
				t.Errorf("stat %.20q: %v", p, err)
			}
		}
	})
}

// TestTar: an upload lands where the real agent puts it; the download of
// a directory is its contents, of a file the file.
func TestTar(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := fake.New()
		defer b.Close()
		c := started(t, b, "x").Agent()
		ctx := t.Context()
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		_ = tw.WriteHeader(&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755})
		_ = tw.WriteHeader(&tar.Header{Name: "d/f", Typeflag: tar.TypeReg, Mode: 0o644, Size: 5})
		_, _ = tw.Write([]byte("hello"))
		_ = tw.Close()
		if err := c.UploadTar(ctx, "/up", &buf); err != nil {
			t.Fatal(err)
		}
		if got, err := c.ReadFile(ctx, "/up/d/f"); err != nil || string(got) != "hello" {
			t.Fatalf("uploaded file: %q %v", got, err)
		}
		names := func(p string) []string {
			rc, err := c.DownloadTar(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = rc.Close() }()
			var out []string
			tr := tar.NewReader(rc)
			for {
				h, err := tr.Next()
				if err == io.EOF {
					return out
				}
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, h.Name)
			}
		}
		if got := strings.Join(names("/up"), " "); got != "d/ d/f" {
			t.Errorf("download of a directory: %s", got)
		}
		if got := strings.Join(names("/up/d/f"), " "); got != "f" {
			t.Errorf("download of a file: %s", got)
		}
		if _, err := c.DownloadTar(ctx, "/none"); !agent.IsKind(err, wire.ErrNotFound) {
			t.Errorf("download of a missing path: %v", err)
		}
		buf.Reset()
		tw = tar.NewWriter(&buf)
		_ = tw.WriteHeader(&tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Size: 0})
		_ = tw.Close()
		if err := c.UploadTar(ctx, "/up", &buf); !agent.IsKind(err, wire.ErrInvalid) {
			t.Errorf("an entry with \"..\": %v", err)
		}
	})
}

// TestRepl: the tiny language keeps state per language until the agent
// ends; a timeout interrupts it and keeps the state.
func TestRepl(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := fake.New()
		defer b.Close()
		sb := started(t, b, "x")
		ctx := t.Context()
		repl := func(lang, code string, timeout time.Duration) wire.ReplResult {
			t.Helper()
			res, err := sb.Agent().Repl(ctx, wire.ReplRequest{Language: lang, Code: code, TimeoutMs: timeout.Milliseconds()})
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		res := repl("python", "import time\nx = 'kept'\nprint(x)\nprint(42, file=sys.stderr)", 0)
		if res.Status != wire.ReplSuccess || len(res.Output) != 2 || res.Output[0] != (wire.OutputLine{Stream: wire.Stdout, Text: "kept"}) ||
			res.Output[1] != (wire.OutputLine{Stream: wire.Stderr, Text: "42"}) || res.Result != nil {
			t.Errorf("assign and print: %+v", res)
		}
		if res := repl("python", "x", 0); res.Result == nil || *res.Result != "'kept'" {
			t.Errorf("state: %+v", res)
		}
		if res := repl("node", "x", 0); res.Status != wire.ReplError || res.Error != "ReferenceError: x is not defined" {
			t.Errorf("another language's state: %+v", res)
		}
		if res := repl("python", "time.sleep(30)", time.Second); res.Status != wire.ReplTimeout {
			t.Errorf("timeout: %+v", res)
		}
		if res := repl("python", "raise ValueError: bad", 0); res.Status != wire.ReplError || res.Error != "ValueError: bad" {
			t.Errorf("raise: %+v", res)
		}
		if res := repl("python", "2**10", 0); res.Status != wire.ReplError || !strings.HasPrefix(res.Error, "SyntaxError") {
			t.Errorf("what the fake does not understand: %+v", res)
		}
		if _, err := sb.Agent().Repl(ctx, wire.ReplRequest{Language: "cobol", Code: "1"}); !agent.IsKind(err, wire.ErrInvalid) {
			t.Errorf("unknown language: %v", err)
		}
		// python3 -c runs the language in an interpreter of its own.
		var stdout, stderr bytes.Buffer
		st, err := backend.Exec(ctx, sb, &wire.ExecRequest{Argv: []string{"/usr/bin/python3", "-c", "print(x)"}}, nil)
		if err != nil || st.Code != 1 {
			t.Errorf("python3 -c sees the REPL's state: %+v %v", st, err)
		}
		st, err = backend.Exec(ctx, sb, &wire.ExecRequest{Argv: []string{"node", "-e", "let y = 2\nconsole.log(y)\nthrow Error: no"}},
			func(stream string, b []byte) {
				if stream == wire.Stderr {
					stderr.Write(b)
				} else {
					stdout.Write(b)
				}
			})
		if err != nil || st.Code != 1 || stdout.String() != "2\n" || stderr.String() != "Error: no\n" {
			t.Errorf("node -e: %+v %q %q %v", st, stdout.String(), stderr.String(), err)
		}
		// A new agent has new interpreters.
		if err := sb.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if err := sb.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if res := repl("python", "x", 0); res.Status != wire.ReplError {
			t.Errorf("state after a restart: %+v", res)
		}
	})
}
