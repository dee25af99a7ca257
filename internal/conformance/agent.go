package conformance

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/agent"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/wire"
)

// RunAgent exercises every operation of the in-sandbox agent through
// sb.Agent(): the real agent in a real sandbox, fed hostile inputs. It uses
// only the backend interface, the agent client and programs of the image
// (sh, coreutils, python3 and node), so any backend can run it. Host-side
// checks only assert that nothing a sandbox wrote appeared on the host.
//
// Each group runs in a sandbox of its own, so an agent crash in one group
// (reported as such) does not cascade into the others; within a group,
// subtests share the sandbox. Every group ends by checking the agent still
// answers and still runs commands.
func RunAgent(t *testing.T, h *Harness) {
	t.Run("Exec", h.agentExec)
	t.Run("Shell", h.agentShell)
	t.Run("Processes", h.agentProcesses)
	t.Run("ProcessLimit", h.agentProcessLimit)
	t.Run("ProcessLateOutput", h.agentLateOutput)
	t.Run("Files", h.agentFiles)
	t.Run("Tar", h.agentTar)
	t.Run("Repl", h.agentRepl)
	t.Run("Connection", h.agentConnection)
}

// agentSuite is one sandbox shared by the subtests of a group.
type agentSuite struct {
	sb  backend.Sandbox
	c   *agent.Client
	tmp string // scratch directory inside the sandbox
}

func (h *Harness) newAgentSuite(t *testing.T, cfg backend.Config) *agentSuite {
	t.Helper()
	sb := h.Sandbox(t, cfg)
	s := &agentSuite{sb: sb, c: sb.Agent(), tmp: "/tmp/agentconf-" + randHex(4)}
	s.sh(t, "mkdir -p "+s.tmp)
	return s
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// ctxFor returns a context ending after d or with the test.
func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// errInfo renders an error with its agent kind, for failure messages.
func errInfo(err error) string {
	var ae *agent.Error
	if errors.As(err, &ae) {
		return fmt.Sprintf("agent error kind=%q status=%d: %s", ae.Kind, ae.Status, ae.Message)
	}
	if err == nil {
		return "no error"
	}
	return fmt.Sprintf("non-agent error %T: %v", err, err)
}

func wantKind(t testing.TB, err error, kind, what string) {
	t.Helper()
	if !agent.IsKind(err, kind) {
		t.Errorf("%s: got %s; want an agent error of kind %q", what, errInfo(err), kind)
	}
}

func clip(b []byte) string {
	if len(b) > 200 {
		return fmt.Sprintf("%q...(%d bytes)", b[:200], len(b))
	}
	return strconv.Quote(string(b))
}

type execResult struct {
	wire.ExitStatus
	Stdout, Stderr []byte
	Took           time.Duration
}

func (r execResult) String() string {
	return fmt.Sprintf("exit %+v stdout %s stderr %s after %v", r.ExitStatus, clip(r.Stdout), clip(r.Stderr), r.Took.Round(time.Millisecond))
}

func (s *agentSuite) exec(ctx context.Context, req *wire.ExecRequest) (execResult, error) {
	var r execResult
	var mu sync.Mutex
	start := time.Now()
	st, err := s.c.Exec(ctx, req, func(stream string, data []byte) {
		mu.Lock()
		defer mu.Unlock()
		switch stream {
		case wire.Stdout:
			r.Stdout = append(r.Stdout, data...)
		case wire.Stderr:
			r.Stderr = append(r.Stderr, data...)
		default:
			r.Stderr = append(r.Stderr, fmt.Sprintf("<unknown stream %q>", stream)...)
		}
	})
	r.Took = time.Since(start)
	r.ExitStatus = st
	return r, err
}

func (s *agentSuite) mustExec(t testing.TB, req *wire.ExecRequest) execResult {
	t.Helper()
	r, err := s.exec(ctxFor(t, 60*time.Second), req)
	if err != nil {
		t.Fatalf("exec %q: %s", req.Argv, errInfo(err))
	}
	return r
}

// sh runs a setup script in the sandbox and returns its stdout.
func (s *agentSuite) sh(t testing.TB, script string) string {
	t.Helper()
	r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", script}})
	if r.Code != 0 {
		t.Fatalf("sh -c %q: %v", script, r)
	}
	return string(r.Stdout)
}

// fresh drops the client's pooled connections, so the next request starts
// on a new one. It follows requests whose body the agent may reject unread,
// so that a connection-level defect (checked on its own by Connection) does
// not surface in unrelated tests.
func (s *agentSuite) fresh() { s.c.Close() }

// healthy checks the agent still answers and runs commands.
func (s *agentSuite) healthy(t *testing.T) {
	select {
	case <-s.sb.Done():
		t.Fatal("the sandbox's init (the agent) has exited")
	default:
	}
	hl, err := s.c.Health(ctxFor(t, 10*time.Second))
	if err != nil {
		t.Fatalf("agent no longer answers health: %s", errInfo(err))
	}
	if hl.Version != wire.Version || hl.Pid != 1 {
		t.Errorf("health %+v: want version %q and pid 1", hl, wire.Version)
	}
	r, err := s.exec(ctxFor(t, 10*time.Second), &wire.ExecRequest{Argv: []string{"/bin/true"}})
	if err != nil || r.Code != 0 || r.Error != "" {
		t.Errorf("/bin/true after the hostile calls: %v %s", r, errInfo(err))
	}
	if _, err := s.c.Processes(ctxFor(t, 10*time.Second)); err != nil {
		t.Errorf("list processes: %s", errInfo(err))
	}
}

// hostAbsent fails when a file of one of names appeared in a host directory
// a sandbox escape would most likely reach.
func hostAbsent(t testing.TB, names ...string) {
	t.Helper()
	wd, _ := os.Getwd()
	dirs := []string{"/", "/tmp", os.TempDir(), "/root", "/etc", "/var/tmp", wd, filepath.Dir(wd)}
	for _, n := range names {
		for _, d := range dirs {
			p := filepath.Join(d, n)
			if _, err := os.Lstat(p); err == nil {
				t.Errorf("%s appeared on the host", p)
			}
		}
	}
}

// ---------------------------------------------------------------------------
// Exec

func (h *Harness) agentExec(t *testing.T) {
	s := h.newAgentSuite(t, backend.Config{})
	t.Run("Argv", s.execArgv)
	t.Run("Env", s.execEnv)
	t.Run("Cwd", s.execCwd)
	t.Run("User", s.execUser)
	t.Run("Stdin", s.execStdin)
	t.Run("Timeout", s.execTimeout)
	t.Run("DescendantsHoldingPipes", s.execDescendants)
	t.Run("OutputLimit", s.execOutputLimit)
	t.Run("HugeOutput", s.execHugeOutput)
	t.Run("BinaryOutput", s.execBinaryOutput)
	t.Run("ExitStatus", s.execExitStatus)
	t.Run("StartFailures", s.execStartFailures)
	t.Run("InvalidRequests", s.execInvalid)
	t.Run("Concurrent", s.execConcurrent)
	t.Run("CancelKillsProcess", s.execCancel)
	t.Run("StillHealthy", s.healthy)
}

func (s *agentSuite) execArgv(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"spaces", []string{"a b", "  leading", "trailing  ", "\ttab\t", " "}},
		{"quotes and shell syntax", []string{`"double"`, `'single'`, `back\slash`, "`tick`", "$HOME", "$(id)", ";|&<>*?[a]", "~", "#comment"}},
		{"unicode", []string{"héllo", "日本語", "😀", "\u200b", "e\u0301"}},
		{"empty args", []string{"", "x", "", ""}},
		{"newlines", []string{"line1\nline2", "\r\n", "\n"}},
		{"dashes", []string{"-n", "--", "-e", "--help"}},
		{"long", []string{strings.Repeat("x", 100000)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := s.mustExec(t, &wire.ExecRequest{Argv: append([]string{"printf", `%s\0`}, tc.args...)})
			if r.Code != 0 {
				t.Fatalf("printf: %v", r)
			}
			want := strings.Join(tc.args, "\x00") + "\x00"
			if string(r.Stdout) != want {
				t.Errorf("argv not passed verbatim:\n got %s\nwant %s", clip(r.Stdout), clip([]byte(want)))
			}
		})
	}
	t.Run("argv0 verbatim", func(t *testing.T) {
		r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"sh", "-c", `printf %s "$0"`}})
		if string(r.Stdout) != "sh" {
			t.Errorf("argv[0] seen by the program: %v; want %q (not the resolved path)", r, "sh")
		}
	})
}

// parseEnv0 parses `env -0` output.
func parseEnv0(b []byte) (map[string]string, []string) {
	m := map[string]string{}
	var keys []string
	for _, kv := range strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00") {
		if kv == "" {
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
		keys = append(keys, k)
	}
	return m, keys
}

func (s *agentSuite) execEnv(t *testing.T) {
	base := s.mustExec(t, &wire.ExecRequest{Argv: []string{"env", "-0"}})
	defaults, _ := parseEnv0(base.Stdout)
	if base.Code != 0 || defaults["PATH"] == "" {
		t.Fatalf("default environment has no PATH: %v", base)
	}
	// The agent overlays the request's entries on the sandbox defaults,
	// later entries winning (guest.mergeEnv). Note wire.ExecRequest.Env's
	// doc comment says "replaces"; overlay is the implemented behaviour.
	over := []string{"WARREN_A=1", "HOME=/warren-home", "WARREN_EMPTY=", "WARREN_EQ=a b = c", "WARREN_A=2", "WARREN_UNI=é😀"}
	r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"env", "-0"}, Env: over})
	got, keys := parseEnv0(r.Stdout)
	want := map[string]string{}
	for k, v := range defaults {
		want[k] = v
	}
	for _, kv := range over {
		k, v, _ := strings.Cut(kv, "=")
		want[k] = v
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("env %s: got %q (present %v), want %q", k, g, ok, v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected env %s=%q", k, got[k])
		}
	}
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[k] {
			t.Errorf("env key %s appears twice: %q", k, r.Stdout)
		}
		seen[k] = true
	}

	t.Run("request PATH is used for lookup", func(t *testing.T) {
		r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"true"}, Env: []string{"PATH=/warren-nonexistent"}})
		if r.Code != 127 || r.Error == "" {
			t.Errorf("true with PATH=/warren-nonexistent: %v; want code 127 with an error", r)
		}
	})
}

func (s *agentSuite) execCwd(t *testing.T) {
	s.sh(t, "echo x > "+s.tmp+"/cwd-file")
	for _, tc := range []struct {
		name, cwd string
		code      int
		want      string
	}{
		{"tmp", "/tmp", 0, "/tmp\n"},
		{"scratch", s.tmp, 0, s.tmp + "\n"},
		{"root", "/", 0, "/\n"},
		{"missing", "/warren/no/such/dir", 126, ""},
		{"a file", s.tmp + "/cwd-file", 126, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"pwd"}, Cwd: tc.cwd})
			if r.Code != tc.code || string(r.Stdout) != tc.want {
				t.Errorf("pwd in %q: %v; want code %d stdout %q", tc.cwd, r, tc.code, tc.want)
			}
			if tc.code != 0 && (r.Error == "" || !strings.Contains(r.Error, tc.cwd)) {
				t.Errorf("pwd in %q: error %q should name the directory", tc.cwd, r.Error)
			}
		})
	}
	t.Run("default", func(t *testing.T) {
		r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"pwd"}})
		if r.Code != 0 || !bytes.HasPrefix(r.Stdout, []byte("/")) {
			t.Errorf("pwd in the default directory: %v", r)
		}
	})
}

func (s *agentSuite) execUser(t *testing.T) {
	ids := strings.Fields(s.sh(t, "id -u nobody; id -g nobody"))
	if len(ids) != 2 {
		t.Fatalf("nobody's ids: %q", ids)
	}
	nobodyUID, nobodyGID := ids[0], ids[1]
	probe := "/root/warren-user-probe-" + randHex(4)
	script := "id -u; id -g; id -G; touch " + probe + " 2>/dev/null && echo wrote || echo denied"
	for _, tc := range []struct {
		user, uid, gid string
	}{
		{"nobody", nobodyUID, nobodyGID},
		{nobodyUID, nobodyUID, nobodyGID},
		{"1000:1000", "1000", "1000"},
		{"4321:4321", "4321", "4321"},
		{nobodyUID + ":0", nobodyUID, "0"},
		{"0:" + nobodyGID, "0", nobodyGID},
	} {
		t.Run(tc.user, func(t *testing.T) {
			r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, User: tc.user})
			write := "denied"
			if tc.uid == "0" {
				write = "wrote"
			}
			// id -G lists only the primary group: no supplementary
			// groups leak from the agent.
			want := strings.Join([]string{tc.uid, tc.gid, tc.gid, write}, "\n") + "\n"
			if r.Code != 0 || string(r.Stdout) != want {
				t.Errorf("as %q: %v; want stdout %q", tc.user, r, want)
			}
		})
	}
	for _, user := range []string{"warren-no-such-user", "1000:warren-no-such-group", "-1", "4294967296"} {
		t.Run("unknown "+user, func(t *testing.T) {
			r, err := s.exec(ctxFor(t, 30*time.Second), &wire.ExecRequest{Argv: []string{"id"}, User: user})
			wantKind(t, err, wire.ErrNotFound, fmt.Sprintf("exec as %q (%v)", user, r))
		})
	}
}

func (s *agentSuite) execStdin(t *testing.T) {
	var all []byte
	for range 64 {
		for b := range 256 {
			all = append(all, byte(b))
		}
	}
	all = append(all, 0, 0, 0, 't', 'a', 'i', 'l', 0)
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"binary with NULs", all},
		{"single NUL", []byte{0}},
		{"no trailing newline", []byte("abc")},
		{"1 MiB random", randBytes(1 << 20)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"cat"}, Stdin: tc.in})
			if r.Code != 0 || !bytes.Equal(r.Stdout, tc.in) {
				t.Errorf("cat echoed %d bytes (%v); want the %d bytes sent", len(r.Stdout), r.ExitStatus, len(tc.in))
			}
		})
	}
	t.Run("none means EOF", func(t *testing.T) {
		r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"cat"}, TimeoutMs: 10000})
		if r.Code != 0 || r.TimedOut || len(r.Stdout) != 0 {
			t.Errorf("cat without stdin: %v; want immediate EOF", r)
		}
	})
	t.Run("exactly MaxStdin", func(t *testing.T) {
		r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"wc", "-c"}, Stdin: make([]byte, wire.MaxStdin)})
		if r.Code != 0 || strings.TrimSpace(string(r.Stdout)) != strconv.Itoa(wire.MaxStdin) {
			t.Errorf("wc -c of MaxStdin bytes: %v", r)
		}
	})
	t.Run("over MaxStdin", func(t *testing.T) {
		r, err := s.exec(ctxFor(t, 60*time.Second), &wire.ExecRequest{Argv: []string{"wc", "-c"}, Stdin: make([]byte, wire.MaxStdin+1)})
		wantKind(t, err, wire.ErrTooLarge, fmt.Sprintf("exec with MaxStdin+1 bytes of stdin (%v)", r))
	})
	t.Run("not read by the process", func(t *testing.T) {
		r, err := s.exec(ctxFor(t, 20*time.Second), &wire.ExecRequest{Argv: []string{"true"}, Stdin: make([]byte, 1<<20)})
		if err != nil || r.Code != 0 || r.Took > 5*time.Second {
			t.Errorf("true with 1 MiB unread stdin: %v %s", r, errInfo(err))
		}
	})
	t.Run("held open by a child", func(t *testing.T) {
		// The process exits at once; a child it forked keeps the stdin pipe
		// open without reading it. The call must end when the process
		// does, like it does for stdout and stderr.
		const prog = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\n    os._exit(0)\n"
		r, err := s.exec(ctxFor(t, 8*time.Second), &wire.ExecRequest{Argv: []string{"python3", "-c", prog}, Stdin: make([]byte, 1<<20)})
		if err != nil || r.Code != 0 || r.Took > 5*time.Second {
			t.Errorf("exec whose child holds 1 MiB of unread stdin did not return after the process exited: %v %s", r, errInfo(err))
		}
	})
}

func (s *agentSuite) execTimeout(t *testing.T) {
	for _, tc := range []struct {
		name string
		argv []string
	}{
		{"sleep", []string{"sleep", "10"}},
		{"double fork", []string{"/bin/sh", "-c", "sleep 100 & sleep 100"}},
		{"setsid escapee holds pipes", []string{"/bin/sh", "-c", "setsid sleep 100 & sleep 100"}},
		{"ignores SIGTERM", []string{"/bin/sh", "-c", "trap '' TERM INT; sleep 100"}},
		{"busy loop", []string{"/bin/sh", "-c", "while :; do :; done"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := s.exec(ctxFor(t, 30*time.Second), &wire.ExecRequest{Argv: tc.argv, TimeoutMs: 300})
			if err != nil {
				t.Fatalf("exec: %s", errInfo(err))
			}
			if !r.TimedOut || r.Signal != "SIGKILL" || r.Code != 137 {
				t.Errorf("%v; want timed out, SIGKILL, code 137", r)
			}
			if r.Took < 250*time.Millisecond || r.Took > 5*time.Second || r.DurationMs < 250 {
				t.Errorf("took %v (duration_ms %v) for a 300 ms timeout", r.Took, r.DurationMs)
			}
		})
	}
	t.Run("finishes before the timeout", func(t *testing.T) {
		r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"echo", "quick"}, TimeoutMs: 10000})
		if r.TimedOut || r.Code != 0 || string(r.Stdout) != "quick\n" {
			t.Errorf("%v", r)
		}
	})
}

func (s *agentSuite) execDescendants(t *testing.T) {
	// The process exits; what it left behind keeps stdout/stderr open.
	for _, tc := range []struct {
		name, script string
	}{
		{"background child", "sleep 100 & echo started"},
		{"setsid child", "setsid sleep 100 & echo started"},
		{"double fork", "(sleep 100 &) ; echo started"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := s.exec(ctxFor(t, 30*time.Second), &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", tc.script}})
			if err != nil || r.Code != 0 || string(r.Stdout) != "started\n" || r.TimedOut {
				t.Errorf("%v %s", r, errInfo(err))
			}
			if r.Took > 5*time.Second {
				t.Errorf("call hung for %v on a child holding the output pipes", r.Took)
			}
		})
	}
}

func (s *agentSuite) execOutputLimit(t *testing.T) {
	pattern := func(n int) []byte { return bytes.Repeat([]byte("0123456789"), n/10+1)[:n] }
	for _, tc := range []struct {
		name    string
		script  string
		limit   int64
		want    int
		trunc   bool
		prefixd bool // the bytes kept are the stream's first bytes
	}{
		{"1 MB cut to 1000", "yes 0123456789 | tr -d '\\n' | head -c 1000000", 1000, 1000, true, true},
		{"exactly the limit", "yes 0123456789 | tr -d '\\n' | head -c 1000", 1000, 1000, false, true},
		{"one byte over", "yes 0123456789 | tr -d '\\n' | head -c 1001", 1000, 1000, true, true},
		{"streams share the limit", "head -c 5000 /dev/zero; head -c 5000 /dev/zero >&2", 1000, 1000, true, false},
		{"negative means default", "head -c 2097152 /dev/zero", -1, wire.DefaultOutputLimit, true, false},
		{"above the maximum is clamped", "head -c 100000 /dev/zero", 1 << 40, 100000, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", tc.script}, OutputLimit: tc.limit})
			if r.Code != 0 {
				t.Errorf("writer did not complete (the agent must keep draining): %v", r)
			}
			if got := len(r.Stdout) + len(r.Stderr); got != tc.want || r.Truncated != tc.trunc {
				t.Errorf("kept %d bytes, truncated=%v; want %d, truncated=%v", got, r.Truncated, tc.want, tc.trunc)
			}
			if tc.prefixd && !bytes.Equal(r.Stdout, pattern(len(r.Stdout))) {
				t.Errorf("kept bytes are not the start of the stream: %s", clip(r.Stdout))
			}
		})
	}
	// A client that writes output through (warren run) asks for all of
	// it: more than MaxOutputLimit arrives whole, in order.
	t.Run("no limit streams past the maximum", func(t *testing.T) {
		const n = wire.MaxOutputLimit + 3<<20 + 7
		var got, nonzero int64
		var mu sync.Mutex
		st, err := s.c.Exec(ctxFor(t, 60*time.Second), &wire.ExecRequest{
			Argv: []string{"/bin/sh", "-c", "head -c " + strconv.Itoa(n/2) + " /dev/zero; head -c " + strconv.Itoa(n-n/2) + " /dev/zero >&2"}, OutputLimit: 1000, NoOutputLimit: true,
		}, func(_ string, data []byte) {
			mu.Lock()
			defer mu.Unlock()
			got += int64(len(data))
			for _, b := range data {
				if b != 0 {
					nonzero++
				}
			}
		})
		if err != nil {
			t.Fatalf("exec: %s", errInfo(err))
		}
		if st.Code != 0 || st.Truncated || got != n || nonzero != 0 {
			t.Errorf("got %d bytes (%d not zero), exit %+v; want %d bytes, not truncated", got, nonzero, st, n)
		}
	})
}

func (s *agentSuite) execHugeOutput(t *testing.T) {
	r, err := s.exec(ctxFor(t, 60*time.Second), &wire.ExecRequest{Argv: []string{"head", "-c", strconv.Itoa(64 << 20), "/dev/zero"}})
	if err != nil {
		t.Fatalf("64 MiB of output: %s", errInfo(err))
	}
	if r.Code != 0 || !r.Truncated || len(r.Stdout) != wire.DefaultOutputLimit || len(r.Stderr) != 0 {
		t.Errorf("64 MiB with the default limit: code %d truncated %v kept %d+%d bytes; want 0, true, %d", r.Code, r.Truncated, len(r.Stdout), len(r.Stderr), wire.DefaultOutputLimit)
	}
	if r.Took > 30*time.Second {
		t.Errorf("took %v", r.Took)
	}
	s.healthy(t)
}

func (s *agentSuite) execBinaryOutput(t *testing.T) {
	var all []byte
	for range 16 {
		for b := range 256 {
			all = append(all, byte(b))
		}
	}
	t.Run("stdout all byte values", func(t *testing.T) {
		r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"python3", "-c", "import sys; sys.stdout.buffer.write(bytes(range(256)) * 16)"}})
		if r.Code != 0 || !bytes.Equal(r.Stdout, all) {
			t.Errorf("got %d bytes %s (%v); want all 256 byte values 16 times", len(r.Stdout), clip(r.Stdout), r.ExitStatus)
		}
	})
	t.Run("stderr invalid UTF-8", func(t *testing.T) {
		in := []byte("\xff\xfe ok \xc3\x28 é \xed\xa0\x80 \x80\x00 end\xf0\x9f")
		r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "cat >&2"}, Stdin: in})
		if r.Code != 0 || !bytes.Equal(r.Stderr, in) || len(r.Stdout) != 0 {
			t.Errorf("stderr %s stdout %s; want stderr %s byte-exact", clip(r.Stderr), clip(r.Stdout), clip(in))
		}
	})
}

func (s *agentSuite) execExitStatus(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
		code   int
		signal string
	}{
		{"zero", "exit 0", 0, ""},
		{"one", "exit 1", 1, ""},
		{"42", "exit 42", 42, ""},
		{"255", "exit 255", 255, ""},
		{"SIGTERM", "kill -TERM $$", 143, "SIGTERM"},
		{"SIGKILL", "kill -KILL $$", 137, "SIGKILL"},
		{"SIGSEGV", "kill -SEGV $$", 139, "SIGSEGV"},
		{"SIGUSR1", "kill -USR1 $$", 138, "SIGUSR1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", tc.script}})
			if r.Code != tc.code || r.Signal != tc.signal || r.TimedOut || r.Error != "" {
				t.Errorf("%v; want code %d signal %q", r, tc.code, tc.signal)
			}
		})
	}
}

func (s *agentSuite) execStartFailures(t *testing.T) {
	s.sh(t, fmt.Sprintf("printf '#!/warren/no/such/interpreter\\n' > %[1]s/badinterp && chmod 755 %[1]s/badinterp", s.tmp))
	for _, tc := range []struct {
		name  string
		argv  []string
		codes []int
	}{
		{"not in PATH", []string{"warren-no-such-command"}, []int{127}},
		{"missing absolute path", []string{"/warren/no/such/binary"}, []int{127}},
		{"not executable", []string{"/etc/passwd"}, []int{126}},
		{"directory", []string{"/tmp"}, []int{126}},
		{"bad interpreter", []string{s.tmp + "/badinterp"}, []int{126, 127}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := s.exec(ctxFor(t, 30*time.Second), &wire.ExecRequest{Argv: tc.argv})
			if err != nil {
				t.Fatalf("want an exit status with an error, got %s", errInfo(err))
			}
			if !slices.Contains(tc.codes, r.Code) || r.Error == "" || len(r.Stdout) != 0 {
				t.Errorf("%v; want code in %v with an error message", r, tc.codes)
			}
		})
	}
}

func (s *agentSuite) execInvalid(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  wire.ExecRequest
	}{
		{"nil argv", wire.ExecRequest{}},
		{"empty argv", wire.ExecRequest{Argv: []string{}}},
		{"empty argv0", wire.ExecRequest{Argv: []string{""}}},
		{"empty argv0 with args", wire.ExecRequest{Argv: []string{"", "x"}}},
		{"NUL in argv0", wire.ExecRequest{Argv: []string{"/bin/true\x00x"}}},
		{"NUL in an arg", wire.ExecRequest{Argv: []string{"echo", "a\x00b"}}},
		{"env without =", wire.ExecRequest{Argv: []string{"true"}, Env: []string{"WARREN"}}},
		{"NUL in env", wire.ExecRequest{Argv: []string{"true"}, Env: []string{"A=b\x00c"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := s.exec(ctxFor(t, 30*time.Second), &tc.req)
			wantKind(t, err, wire.ErrInvalid, fmt.Sprintf("exec %q env %q (%v)", tc.req.Argv, tc.req.Env, r))
		})
	}
}

func (s *agentSuite) execConcurrent(t *testing.T) {
	const n = 16
	script := `i=0; while [ $i -lt 300 ]; do echo "$0-line-$i"; i=$((i+1)); done; echo "$0-err" >&2; exit $1`
	var wg sync.WaitGroup
	errs := make([]string, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tag := fmt.Sprintf("job%02d", i)
			r, err := s.exec(ctxFor(t, 60*time.Second), &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", script, tag, strconv.Itoa(i)}})
			var want strings.Builder
			for j := range 300 {
				fmt.Fprintf(&want, "%s-line-%d\n", tag, j)
			}
			switch {
			case err != nil:
				errs[i] = errInfo(err)
			case r.Code != i:
				errs[i] = fmt.Sprintf("code %d, want %d", r.Code, i)
			case string(r.Stdout) != want.String():
				errs[i] = "stdout mixed up: " + clip(r.Stdout)
			case string(r.Stderr) != tag+"-err\n":
				errs[i] = "stderr mixed up: " + clip(r.Stderr)
			}
		}()
	}
	wg.Wait()
	for i, e := range errs {
		if e != "" {
			t.Errorf("job %d: %s", i, e)
		}
	}
}

func (s *agentSuite) execCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pidc := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		var once sync.Once
		_, err := s.c.Exec(ctx, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo $$; exec sleep 100"}}, func(_ string, data []byte) {
			once.Do(func() { pidc <- strings.TrimSpace(string(data)) })
		})
		done <- err
	}()
	var pid string
	select {
	case pid = <-pidc:
	case <-time.After(20 * time.Second):
		t.Fatal("no output from the process")
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Exec did not return after its context was cancelled")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "kill -0 " + pid + " 2>/dev/null"}})
		if r.Code != 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %s still runs 5s after the client cancelled the exec (the agent did not notice the hang-up)", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ---------------------------------------------------------------------------
// Shell

func (h *Harness) agentShell(t *testing.T) {
	s := h.newAgentSuite(t, backend.Config{})
	out := s.tmp + "/shell-out"
	script := `set -e
x=hello
echo "$x world" | tr a-z A-Z
printf 'a\nb\nc\n' | sort -r | head -n 2 > ` + out + `
cat ` + out + `
echo to-stderr >&2
cat <<EOF
heredoc $x
EOF
if [ -f ` + out + ` ]; then echo exists; fi
(cd /tmp && pwd)
echo $((6 * 7))
false || echo recovered
for w in one two; do printf '%s;' "$w"; done; echo
yes | head -n 2
exit 3
`
	want := "HELLO WORLD\nc\nb\nheredoc hello\nexists\n/tmp\n42\nrecovered\none;two;\ny\ny\n"
	t.Run("sh -c", func(t *testing.T) {
		r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", script}})
		if r.Code != 3 || string(r.Stdout) != want || string(r.Stderr) != "to-stderr\n" {
			t.Errorf("%v\nwant code 3, stdout %q, stderr %q", r, want, "to-stderr\n")
		}
	})
	t.Run("script on stdin", func(t *testing.T) {
		r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"/bin/sh"}, Stdin: []byte(script)})
		if r.Code != 3 || string(r.Stdout) != want || string(r.Stderr) != "to-stderr\n" {
			t.Errorf("%v\nwant code 3, stdout %q", r, want)
		}
	})
	t.Run("redirects", func(t *testing.T) {
		r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo a > f1 && echo b >> f1 && cat < f1 2>&1 | wc -l && ls nope 2>/dev/null || echo none"}, Cwd: s.tmp})
		if r.Code != 0 || strings.Fields(string(r.Stdout))[0] != "2" || !strings.HasSuffix(string(r.Stdout), "none\n") {
			t.Errorf("%v", r)
		}
	})
	t.Run("StillHealthy", s.healthy)
}

// ---------------------------------------------------------------------------
// Background processes

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
	for _, tc := range []struct {
		name string
		req  wire.ExecRequest
		kind string
	}{
		{"empty argv", wire.ExecRequest{}, wire.ErrInvalid},
		{"NUL in argv", wire.ExecRequest{Argv: []string{"sleep", "1\x00"}}, wire.ErrInvalid},
		{"missing binary", wire.ExecRequest{Argv: []string{"warren-no-such-command"}}, wire.ErrNotFound},
		{"unknown user", wire.ExecRequest{Argv: []string{"true"}, User: "warren-no-such-user"}, wire.ErrNotFound},
		{"stdin too large", wire.ExecRequest{Argv: []string{"cat"}, Stdin: make([]byte, wire.MaxStdin+1)}, wire.ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info, err := s.c.StartProcess(ctxFor(t, 30*time.Second), &tc.req)
			if err == nil {
				s.remove(t, info.ID)
			}
			wantKind(t, err, tc.kind, "start "+tc.name)
		})
	}
	t.Run("missing cwd", func(t *testing.T) {
		info, err := s.c.StartProcess(ctxFor(t, 30*time.Second), &wire.ExecRequest{Argv: []string{"true"}, Cwd: "/warren/no/such/dir"})
		if err == nil {
			s.remove(t, info.ID)
			t.Errorf("start in a missing directory succeeded: %+v", info)
		}
	})
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

// ---------------------------------------------------------------------------
// Process table limit

func (h *Harness) agentProcessLimit(t *testing.T) {
	t.Run("Sequential", func(t *testing.T) {
		s := h.newAgentSuite(t, backend.Config{})
		var ids []string
		for i := range wire.MaxProcesses {
			info, err := s.c.StartProcess(ctxFor(t, 30*time.Second), &wire.ExecRequest{Argv: []string{"sleep", "1000"}})
			if err != nil {
				t.Fatalf("start %d of %d: %s", i+1, wire.MaxProcesses, errInfo(err))
			}
			ids = append(ids, info.ID)
		}
		_, err := s.c.StartProcess(ctxFor(t, 30*time.Second), &wire.ExecRequest{Argv: []string{"sleep", "1000"}})
		wantKind(t, err, wire.ErrLimit, fmt.Sprintf("start number %d", wire.MaxProcesses+1))
		list, err := s.c.Processes(ctxFor(t, 10*time.Second))
		if err != nil || len(list) != wire.MaxProcesses {
			t.Errorf("list has %d processes (%s); want %d", len(list), errInfo(err), wire.MaxProcesses)
		}
		// Removing one makes room.
		s.remove(t, ids[0])
		info, err := s.c.StartProcess(ctxFor(t, 30*time.Second), &wire.ExecRequest{Argv: []string{"sleep", "1000"}})
		if err != nil {
			t.Fatalf("start after a remove: %s", errInfo(err))
		}
		ids = append(ids[1:], info.ID)
		// A full table of which one process has exited evicts that one.
		if err := s.c.Signal(ctxFor(t, 10*time.Second), ids[5], "KILL"); err != nil {
			t.Fatal(errInfo(err))
		}
		s.waitExit(t, ids[5])
		if _, err := s.c.StartProcess(ctxFor(t, 30*time.Second), &wire.ExecRequest{Argv: []string{"sleep", "1000"}}); err != nil {
			t.Fatalf("start with an exited process in a full table: %s", errInfo(err))
		}
		_, err = s.c.Process(ctxFor(t, 10*time.Second), ids[5])
		wantKind(t, err, wire.ErrNotFound, "get of the evicted exited process")
		for _, id := range ids {
			s.remove(t, id)
		}
		t.Run("StillHealthy", s.healthy)
	})
	t.Run("Concurrent", func(t *testing.T) {
		// The limit must hold when starts race each other.
		s := h.newAgentSuite(t, backend.Config{})
		const attempts = wire.MaxProcesses + 64
		var mu sync.Mutex
		ok, limited := 0, 0
		var other []string
		work := make(chan int)
		var wg sync.WaitGroup
		for range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range work {
					_, err := s.c.StartProcess(context.Background(), &wire.ExecRequest{Argv: []string{"sleep", "1000"}})
					mu.Lock()
					switch {
					case err == nil:
						ok++
					case agent.IsKind(err, wire.ErrLimit):
						limited++
					default:
						other = append(other, errInfo(err))
					}
					mu.Unlock()
				}
			}()
		}
		for i := range attempts {
			work <- i
		}
		close(work)
		wg.Wait()
		list, err := s.c.Processes(ctxFor(t, 10*time.Second))
		if err != nil {
			t.Fatal(errInfo(err))
		}
		if ok > wire.MaxProcesses || len(list) > wire.MaxProcesses || len(other) > 0 {
			t.Errorf("%d concurrent starts: %d succeeded, %d hit the limit, list holds %d, other errors %q; want at most %d running",
				attempts, ok, limited, len(list), other, wire.MaxProcesses)
		}
		t.Run("StillHealthy", s.healthy)
	})
}

// agentLateOutput runs a background process whose descendant writes after
// the process itself has exited and been reported.
func (h *Harness) agentLateOutput(t *testing.T) {
	s := h.newAgentSuite(t, backend.Config{})
	info := s.start(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "(sleep 0.6; echo late; sleep 0.3; echo later) & echo early"}})
	ex := s.waitExit(t, info.ID)
	if ex.Exit.Code != 0 {
		t.Errorf("exit %+v", ex.Exit)
	}
	time.Sleep(1500 * time.Millisecond)
	s.healthy(t)
	if t.Failed() {
		t.Fatal("the agent died when a descendant of an exited background process wrote to the output pipe")
	}
	ch, err := s.c.Output(ctxFor(t, 10*time.Second), info.ID, wire.Stdout, 0, 0)
	if err != nil || !strings.HasPrefix(string(ch.Data), "early\n") {
		t.Errorf("output %+v (%q) %s", ch, ch.Data, errInfo(err))
	}
}

// ---------------------------------------------------------------------------
// Files

func (h *Harness) agentFiles(t *testing.T) {
	s := h.newAgentSuite(t, backend.Config{})
	t.Run("RoundTrip", s.filesRoundTrip)
	t.Run("WriteMode", s.filesMode)
	t.Run("WriteErrors", s.filesWriteErrors)
	t.Run("Stat", s.filesStat)
	t.Run("List", s.filesList)
	t.Run("Mkdir", s.filesMkdir)
	t.Run("Remove", s.filesRemove)
	t.Run("Move", s.filesMove)
	t.Run("HostilePaths", s.filesHostilePaths)
	t.Run("SandboxOwnFiles", s.filesOwn)
	t.Run("SymlinkEscape", s.filesSymlinkEscape)
	t.Run("NonRegularReads", s.filesNonRegular)
	t.Run("WriteOverSymlink", s.filesWriteOverSymlink)
	t.Run("TooLarge", s.filesTooLarge)
	t.Run("StillHealthy", s.healthy)
}

func (s *agentSuite) write(t testing.TB, path string, data []byte, mode uint32) {
	t.Helper()
	if err := s.c.WriteFile(ctxFor(t, 60*time.Second), path, bytes.NewReader(data), mode); err != nil {
		t.Fatalf("write %s: %s", path, errInfo(err))
	}
}

func (s *agentSuite) read(t testing.TB, path string) []byte {
	t.Helper()
	b, err := s.c.ReadFile(ctxFor(t, 60*time.Second), path)
	if err != nil {
		t.Fatalf("read %s: %s", path, errInfo(err))
	}
	return b
}

func sha(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func (s *agentSuite) filesRoundTrip(t *testing.T) {
	var all []byte
	for range 64 {
		for b := range 256 {
			all = append(all, byte(b))
		}
	}
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"empty", []byte{}},
		{"binary", all},
		{"NULs only", make([]byte, 1000)},
		{"invalid UTF-8", []byte("\xff\xfe\xc3\x28\xed\xa0\x80")},
		{"5 MB random", randBytes(5 << 20)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := s.tmp + "/rt-" + strings.ReplaceAll(tc.name, " ", "-")
			s.write(t, p, tc.data, 0o644)
			if got := s.read(t, p); !bytes.Equal(got, tc.data) {
				t.Errorf("read back %d bytes %s; wrote %d", len(got), clip(got), len(tc.data))
			}
			// The file is in the sandbox, at that path, for its processes.
			out := s.sh(t, "sha256sum < "+p)
			if f := strings.Fields(out); len(f) == 0 || f[0] != sha(tc.data) {
				t.Errorf("sha256 inside the sandbox %q; want %s", out, sha(tc.data))
			}
		})
	}
	t.Run("overwrite with shorter", func(t *testing.T) {
		p := s.tmp + "/rt-overwrite"
		s.write(t, p, bytes.Repeat([]byte("long content "), 1000), 0o644)
		s.write(t, p, []byte("short"), 0o644)
		if got := s.read(t, p); string(got) != "short" {
			t.Errorf("after overwrite: %s", clip(got))
		}
	})
	t.Run("equivalent spellings", func(t *testing.T) {
		s.write(t, s.tmp+"/rt-spelling", []byte("same"), 0o644)
		rel := strings.TrimPrefix(s.tmp, "/")
		for _, p := range []string{rel + "/rt-spelling", "//" + rel + "//./rt-spelling", "/./" + rel + "/rt-spelling/"} {
			b, err := s.c.ReadFile(ctxFor(t, 10*time.Second), p)
			if err != nil || string(b) != "same" {
				t.Errorf("read %q: %q %s", p, b, errInfo(err))
			}
		}
	})
}

func (s *agentSuite) filesMode(t *testing.T) {
	for _, tc := range []struct {
		mode, want uint32
	}{
		{0o644, 0o644},
		{0o600, 0o600},
		{0o755, 0o755},
		{0o444, 0o444},
		{0o777, 0o777}, // exact: no umask
		{0o4755, 0o755},
		{0o2755, 0o755},
		{0o1777, 0o777},
	} {
		t.Run(fmt.Sprintf("%04o", tc.mode), func(t *testing.T) {
			p := fmt.Sprintf("%s/mode-%04o", s.tmp, tc.mode)
			s.write(t, p, []byte("x"), tc.mode)
			fi, err := s.c.Stat(ctxFor(t, 10*time.Second), p)
			if err != nil {
				t.Fatal(errInfo(err))
			}
			if got := fi.Mode & 0o7777; got != tc.want || os.FileMode(fi.Mode)&os.ModeType != 0 {
				t.Errorf("mode %04o (%v); want %04o, a plain file", got, os.FileMode(fi.Mode), tc.want)
			}
			if out := strings.TrimSpace(s.sh(t, "stat -c %a "+p)); out != strconv.FormatUint(uint64(tc.want), 8) {
				t.Errorf("stat inside the sandbox says %s; want %o", out, tc.want)
			}
		})
	}
	t.Run("out of range", func(t *testing.T) {
		p := s.tmp + "/mode-bad"
		err := s.c.WriteFile(ctxFor(t, 10*time.Second), p, strings.NewReader("x"), 0o10000)
		s.fresh()
		wantKind(t, err, wire.ErrInvalid, "write with mode 010000")
		if _, err := s.c.Stat(ctxFor(t, 10*time.Second), p); !agent.IsKind(err, wire.ErrNotFound) {
			t.Errorf("rejected write left a file: %s", errInfo(err))
		}
	})
}

func (s *agentSuite) filesWriteErrors(t *testing.T) {
	s.sh(t, "mkdir -p "+s.tmp+"/we-dir/sub")
	for _, tc := range []struct {
		name, path, kind string
	}{
		{"missing parent", s.tmp + "/we-missing/f", wire.ErrNotFound},
		{"parent is a file", s.tmp + "/rt-binary/f", wire.ErrInvalid},
		{"onto a directory", s.tmp + "/we-dir", ""},
		{"the root", "/", wire.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := s.c.WriteFile(ctxFor(t, 10*time.Second), tc.path, strings.NewReader("x"), 0o644)
			s.fresh()
			if tc.kind == "" {
				if err == nil {
					t.Errorf("write onto a directory succeeded")
				}
			} else {
				wantKind(t, err, tc.kind, "write "+tc.path)
			}
		})
	}
	if out := s.sh(t, "ls -A "+s.tmp+"/we-dir"); out != "sub\n" {
		t.Errorf("failed writes left files behind: %q", out)
	}
}

func (s *agentSuite) filesStat(t *testing.T) {
	d := s.tmp + "/stat"
	s.sh(t, fmt.Sprintf("mkdir -p %[1]s/dir && printf 12345 > %[1]s/f && chmod 640 %[1]s/f && ln -s target-x %[1]s/lnk && ln -s dir %[1]s/dirlink && mkfifo %[1]s/fifo", d))
	now := time.Now()
	for _, tc := range []struct {
		name, path, wname, wpath, typ, target string
		size                                  int64
		modeType                              os.FileMode
		perm                                  uint32
	}{
		{"file", d + "/f", "f", d + "/f", "file", "", 5, 0, 0o640},
		{"dir", d + "/dir", "dir", d + "/dir", "dir", "", -1, os.ModeDir, 0o755},
		{"symlink not followed", d + "/lnk", "lnk", d + "/lnk", "symlink", "target-x", -1, os.ModeSymlink, 0o777},
		{"dir symlink not followed", d + "/dirlink", "dirlink", d + "/dirlink", "symlink", "dir", -1, os.ModeSymlink, 0o777},
		{"dotdot after a symlink", d + "/dirlink/../f", "", "", "", "", 0, 0, 0}, // ".." is rejected
		{"fifo", d + "/fifo", "fifo", d + "/fifo", "other", "", 0, os.ModeNamedPipe, 0},
		{"root", "/", "/", "/", "dir", "", -1, os.ModeDir, 0},
		{"root empty", "", "/", "/", "dir", "", -1, os.ModeDir, 0},
		{"messy spelling", "//" + strings.TrimPrefix(d, "/") + "/./f", "f", d + "/f", "file", "", 5, 0, 0o640},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fi, err := s.c.Stat(ctxFor(t, 10*time.Second), tc.path)
			if tc.typ == "" {
				wantKind(t, err, wire.ErrInvalid, "stat "+tc.path)
				return
			}
			if err != nil {
				t.Fatal(errInfo(err))
			}
			m := os.FileMode(fi.Mode)
			if fi.Name != tc.wname || fi.Path != tc.wpath || fi.Type != tc.typ || fi.Target != tc.target || m&os.ModeType != tc.modeType {
				t.Errorf("stat %q: %+v (mode %v); want name %q path %q type %q target %q mode type %v", tc.path, fi, m, tc.wname, tc.wpath, tc.typ, tc.target, tc.modeType)
			}
			if tc.size >= 0 && fi.Size != tc.size {
				t.Errorf("size %d, want %d", fi.Size, tc.size)
			}
			if tc.perm != 0 && fi.Mode&0o777 != tc.perm {
				t.Errorf("perm %o, want %o", fi.Mode&0o777, tc.perm)
			}
			if tc.path != "/" && tc.path != "" {
				if d := fi.ModTime.Sub(now); d < -10*time.Minute || d > 10*time.Minute {
					t.Errorf("mod_time %v is far from now %v", fi.ModTime, now)
				}
			}
		})
	}
	t.Run("through an intermediate symlink", func(t *testing.T) {
		s.sh(t, "echo hi > "+d+"/dir/inner")
		fi, err := s.c.Stat(ctxFor(t, 10*time.Second), d+"/dirlink/inner")
		if err != nil || fi.Type != "file" || fi.Size != 3 {
			t.Errorf("%+v %s", fi, errInfo(err))
		}
	})
	t.Run("missing", func(t *testing.T) {
		_, err := s.c.Stat(ctxFor(t, 10*time.Second), d+"/nope")
		wantKind(t, err, wire.ErrNotFound, "stat of a missing file")
	})
}

func (s *agentSuite) filesList(t *testing.T) {
	d := s.tmp + "/list"
	s.sh(t, fmt.Sprintf("mkdir -p %[1]s/d && cd %[1]s && touch b a C _ a.txt 'sp ace' && ln -s a z && ln -s d dl", d))
	want := []string{"C", "_", "a", "a.txt", "b", "d", "dl", "sp ace", "z"}
	list, err := s.c.List(ctxFor(t, 10*time.Second), d)
	if err != nil {
		t.Fatal(errInfo(err))
	}
	var names []string
	for _, fi := range list {
		names = append(names, fi.Name)
		if fi.Path != d+"/"+fi.Name {
			t.Errorf("entry %q has path %q", fi.Name, fi.Path)
		}
	}
	if !slices.Equal(names, want) {
		t.Errorf("list %q; want %q (sorted bytewise)", names, want)
	}
	types := map[string]string{}
	for _, fi := range list {
		types[fi.Name] = fi.Type
	}
	if types["d"] != "dir" || types["z"] != "symlink" || types["dl"] != "symlink" || types["a"] != "file" {
		t.Errorf("types %v", types)
	}
	t.Run("through a dir symlink", func(t *testing.T) {
		s.sh(t, "touch "+d+"/d/inner")
		l, err := s.c.List(ctxFor(t, 10*time.Second), d+"/dl")
		if err != nil || len(l) != 1 || l[0].Name != "inner" {
			t.Errorf("%+v %s", l, errInfo(err))
		}
	})
	t.Run("empty", func(t *testing.T) {
		s.sh(t, "mkdir -p "+d+"/empty")
		l, err := s.c.List(ctxFor(t, 10*time.Second), d+"/empty")
		if err != nil || len(l) != 0 {
			t.Errorf("%+v %s", l, errInfo(err))
		}
	})
	t.Run("a file", func(t *testing.T) {
		_, err := s.c.List(ctxFor(t, 10*time.Second), d+"/a")
		wantKind(t, err, wire.ErrInvalid, "list of a file")
	})
	t.Run("missing", func(t *testing.T) {
		_, err := s.c.List(ctxFor(t, 10*time.Second), d+"/missing")
		wantKind(t, err, wire.ErrNotFound, "list of a missing dir")
	})
}

func (s *agentSuite) filesMkdir(t *testing.T) {
	d := s.tmp + "/mkdir"
	s.sh(t, fmt.Sprintf("mkdir -p %[1]s && touch %[1]s/file", d))
	for _, tc := range []struct {
		name    string
		req     wire.MkdirRequest
		kind    string
		perm    uint32 // checked when set
		checkup string // an intermediate directory to check for 0755
	}{
		{"simple", wire.MkdirRequest{Path: d + "/m1"}, "", 0o755, ""},
		{"exists", wire.MkdirRequest{Path: d + "/m1"}, wire.ErrExists, 0, ""},
		{"missing parent", wire.MkdirRequest{Path: d + "/m2/a/b"}, wire.ErrNotFound, 0, ""},
		{"parents", wire.MkdirRequest{Path: d + "/m2/a/b", Parents: true, Mode: 0o700}, "", 0o700, d + "/m2/a"},
		{"parents existing", wire.MkdirRequest{Path: d + "/m2/a/b", Parents: true}, "", 0, ""},
		{"mode exact", wire.MkdirRequest{Path: d + "/m3", Mode: 0o777}, "", 0o777, ""},
		{"parents over a file", wire.MkdirRequest{Path: d + "/file", Parents: true}, wire.ErrExists, 0, ""},
		{"over a file", wire.MkdirRequest{Path: d + "/file"}, wire.ErrExists, 0, ""},
		{"below a file", wire.MkdirRequest{Path: d + "/file/x", Parents: true}, "any", 0, ""},
		{"root", wire.MkdirRequest{Path: "/"}, wire.ErrExists, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := s.c.Mkdir(ctxFor(t, 10*time.Second), tc.req)
			switch tc.kind {
			case "":
				if err != nil {
					t.Fatalf("mkdir %+v: %s", tc.req, errInfo(err))
				}
			case "any":
				if err == nil {
					t.Fatalf("mkdir %+v succeeded", tc.req)
				}
				return
			default:
				wantKind(t, err, tc.kind, fmt.Sprintf("mkdir %+v", tc.req))
				return
			}
			fi, err := s.c.Stat(ctxFor(t, 10*time.Second), tc.req.Path)
			if err != nil || fi.Type != "dir" {
				t.Fatalf("stat after mkdir: %+v %s", fi, errInfo(err))
			}
			if tc.perm != 0 && fi.Mode&0o7777 != tc.perm {
				t.Errorf("mode %o, want %o", fi.Mode&0o7777, tc.perm)
			}
			if tc.checkup != "" {
				if up, err := s.c.Stat(ctxFor(t, 10*time.Second), tc.checkup); err != nil || up.Mode&0o777 != 0o755 {
					t.Errorf("intermediate %s: %+v %s; want mode 755", tc.checkup, up, errInfo(err))
				}
			}
		})
	}
}

func (s *agentSuite) filesRemove(t *testing.T) {
	d := s.tmp + "/remove"
	s.sh(t, fmt.Sprintf(`mkdir -p %[1]s/empty %[1]s/full/sub/deeper %[1]s/keep && cd %[1]s && touch f full/a full/sub/b full/sub/deeper/c keep/k &&
ln -s keep linkdir && ln -s / linkroot && ln -s keep/k linkfile`, d))
	for _, tc := range []struct {
		name       string
		req        wire.RemoveRequest
		kind       string
		stillThere []string
	}{
		{"file", wire.RemoveRequest{Path: d + "/f"}, "", nil},
		{"empty dir", wire.RemoveRequest{Path: d + "/empty"}, "", nil},
		{"non-empty dir", wire.RemoveRequest{Path: d + "/full"}, wire.ErrInvalid, []string{d + "/full/sub/deeper/c"}},
		{"recursive", wire.RemoveRequest{Path: d + "/full", Recursive: true}, "", nil},
		{"symlink to dir, recursive", wire.RemoveRequest{Path: d + "/linkdir", Recursive: true}, "", []string{d + "/keep/k"}},
		{"symlink to root, recursive", wire.RemoveRequest{Path: d + "/linkroot", Recursive: true}, "", []string{"/etc/passwd", d + "/keep/k"}},
		{"symlink to file", wire.RemoveRequest{Path: d + "/linkfile"}, "", []string{d + "/keep/k"}},
		{"missing", wire.RemoveRequest{Path: d + "/nope"}, wire.ErrNotFound, nil},
		{"root", wire.RemoveRequest{Path: "/", Recursive: true}, wire.ErrPermission, []string{"/etc/passwd"}},
		{"root spelled empty", wire.RemoveRequest{Path: "", Recursive: true}, wire.ErrPermission, []string{"/etc/passwd"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := s.c.Remove(ctxFor(t, 30*time.Second), tc.req)
			if tc.kind != "" {
				wantKind(t, err, tc.kind, fmt.Sprintf("remove %+v", tc.req))
			} else {
				if err != nil {
					t.Fatalf("remove %+v: %s", tc.req, errInfo(err))
				}
				if _, err := s.c.Stat(ctxFor(t, 10*time.Second), tc.req.Path); !agent.IsKind(err, wire.ErrNotFound) {
					t.Errorf("%s still there: %s", tc.req.Path, errInfo(err))
				}
			}
			for _, p := range tc.stillThere {
				if _, err := s.c.Stat(ctxFor(t, 10*time.Second), p); err != nil {
					t.Errorf("%s went away: %s", p, errInfo(err))
				}
			}
		})
	}
}

func (s *agentSuite) filesMove(t *testing.T) {
	d := s.tmp + "/move"
	s.sh(t, fmt.Sprintf(`mkdir -p %[1]s/dir/sub && cd %[1]s && echo a > a && echo b > b && echo c > dir/sub/c && ln -s a lnk`, d))
	t.Run("file", func(t *testing.T) {
		if err := s.c.Move(ctxFor(t, 10*time.Second), d+"/a", d+"/a2"); err != nil {
			t.Fatal(errInfo(err))
		}
		if got := s.read(t, d+"/a2"); string(got) != "a\n" {
			t.Errorf("moved content %q", got)
		}
		if _, err := s.c.Stat(ctxFor(t, 10*time.Second), d+"/a"); !agent.IsKind(err, wire.ErrNotFound) {
			t.Errorf("source still there: %s", errInfo(err))
		}
	})
	t.Run("replaces a file", func(t *testing.T) {
		if err := s.c.Move(ctxFor(t, 10*time.Second), d+"/a2", d+"/b"); err != nil {
			t.Fatal(errInfo(err))
		}
		if got := s.read(t, d+"/b"); string(got) != "a\n" {
			t.Errorf("replaced content %q", got)
		}
	})
	t.Run("directory", func(t *testing.T) {
		if err := s.c.Move(ctxFor(t, 10*time.Second), d+"/dir", d+"/dir2"); err != nil {
			t.Fatal(errInfo(err))
		}
		if got := s.read(t, d+"/dir2/sub/c"); string(got) != "c\n" {
			t.Errorf("content after dir move %q", got)
		}
	})
	t.Run("symlink itself", func(t *testing.T) {
		if err := s.c.Move(ctxFor(t, 10*time.Second), d+"/lnk", d+"/lnk2"); err != nil {
			t.Fatal(errInfo(err))
		}
		fi, err := s.c.Stat(ctxFor(t, 10*time.Second), d+"/lnk2")
		if err != nil || fi.Type != "symlink" || fi.Target != "a" {
			t.Errorf("moved link: %+v %s", fi, errInfo(err))
		}
	})
	for _, tc := range []struct {
		name, from, to, kind string
	}{
		{"missing source", d + "/nope", d + "/x", wire.ErrNotFound},
		{"missing target parent", d + "/b", d + "/nope/x", wire.ErrNotFound},
		{"the root", "/", d + "/rootcopy", wire.ErrInvalid},
		{"onto the root", d + "/b", "/", wire.ErrInvalid},
		{"dir into itself", d + "/dir2", d + "/dir2/sub/inside", wire.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := s.c.Move(ctxFor(t, 10*time.Second), tc.from, tc.to)
			wantKind(t, err, tc.kind, fmt.Sprintf("move %q -> %q", tc.from, tc.to))
		})
	}
	if _, err := s.c.Stat(ctxFor(t, 10*time.Second), "/etc/passwd"); err != nil {
		t.Errorf("sandbox root damaged: %s", errInfo(err))
	}
}

func emptyTar() []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	_ = tw.Close()
	return b.Bytes()
}

func (s *agentSuite) filesHostilePaths(t *testing.T) {
	victim := s.tmp + "/hp-victim"
	s.write(t, victim, []byte("victim"), 0o644)
	passwd := s.read(t, "/etc/passwd")
	marker := "hp-" + randHex(4)
	paths := []struct{ name, path string }{
		{"dotdot", "../../etc/passwd"},
		{"inner dotdot", "a/../../x"},
		{"absolute dotdot", "/tmp/../etc/passwd"},
		{"bare dotdot", ".."},
		{"trailing dotdot", s.tmp + "/.."},
		{"dotdot escape name", "../../../../" + marker},
		{"NUL", "x\x00y"},
		{"NUL suffix", "/etc/passwd\x00.txt"},
		{"path over 4096 bytes", "/" + strings.Repeat("a/", 2048)},
		{"name over 255 bytes", s.tmp + "/" + strings.Repeat("n", 256)},
	}
	ops := []struct {
		name string
		do   func(ctx context.Context, p string) error
	}{
		{"ReadFile", func(ctx context.Context, p string) error { _, err := s.c.ReadFile(ctx, p); return err }},
		{"WriteFile", func(ctx context.Context, p string) error {
			return s.c.WriteFile(ctx, p, strings.NewReader("intruder:x:0:0::/:/bin/sh\n"), 0o644)
		}},
		{"Stat", func(ctx context.Context, p string) error { _, err := s.c.Stat(ctx, p); return err }},
		{"List", func(ctx context.Context, p string) error { _, err := s.c.List(ctx, p); return err }},
		{"Mkdir", func(ctx context.Context, p string) error { return s.c.Mkdir(ctx, wire.MkdirRequest{Path: p}) }},
		{"MkdirParents", func(ctx context.Context, p string) error {
			return s.c.Mkdir(ctx, wire.MkdirRequest{Path: p, Parents: true})
		}},
		{"Remove", func(ctx context.Context, p string) error { return s.c.Remove(ctx, wire.RemoveRequest{Path: p}) }},
		{"RemoveRecursive", func(ctx context.Context, p string) error {
			return s.c.Remove(ctx, wire.RemoveRequest{Path: p, Recursive: true})
		}},
		{"MoveFrom", func(ctx context.Context, p string) error { return s.c.Move(ctx, p, s.tmp+"/hp-moved") }},
		{"MoveTo", func(ctx context.Context, p string) error { return s.c.Move(ctx, victim, p) }},
		{"DownloadTar", func(ctx context.Context, p string) error {
			rc, err := s.c.DownloadTar(ctx, p)
			if err == nil {
				rc.Close()
			}
			return err
		}},
		{"UploadTar", func(ctx context.Context, p string) error { return s.c.UploadTar(ctx, p, bytes.NewReader(emptyTar())) }},
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			for _, op := range ops {
				t.Run(op.name, func(t *testing.T) {
					err := op.do(ctxFor(t, 10*time.Second), p.path)
					s.fresh()
					wantKind(t, err, wire.ErrInvalid, fmt.Sprintf("%s %s", op.name, clip([]byte(p.path))))
				})
			}
		})
	}
	if got := s.read(t, "/etc/passwd"); !bytes.Equal(got, passwd) {
		t.Errorf("sandbox /etc/passwd changed")
	}
	if got := s.read(t, victim); string(got) != "victim" {
		t.Errorf("move source changed: %q", got)
	}
	hostAbsent(t, marker)
}

func (s *agentSuite) filesOwn(t *testing.T) {
	t.Run("/etc/hostname", func(t *testing.T) {
		in := s.mustExec(t, &wire.ExecRequest{Argv: []string{"cat", "/etc/hostname"}})
		got, err := s.c.ReadFile(ctxFor(t, 10*time.Second), "/etc/hostname")
		if in.Code == 0 {
			if err != nil || !bytes.Equal(got, in.Stdout) {
				t.Errorf("agent read %q %s; the sandbox's processes read %q", got, errInfo(err), in.Stdout)
			}
		} else {
			wantKind(t, err, wire.ErrNotFound, "read /etc/hostname, which the sandbox lacks")
		}
		marker := "sandbox-" + randHex(6) + "\n"
		s.write(t, "/etc/hostname", []byte(marker), 0o644)
		if r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"cat", "/etc/hostname"}}); string(r.Stdout) != marker {
			t.Errorf("sandbox processes read %v after the agent wrote %q", r, marker)
		}
		if host, _ := os.ReadFile("/etc/hostname"); string(host) == marker {
			t.Errorf("the host's /etc/hostname was written")
		}
	})
	t.Run("/etc/passwd", func(t *testing.T) {
		in := s.mustExec(t, &wire.ExecRequest{Argv: []string{"cat", "/etc/passwd"}})
		if got := s.read(t, "/etc/passwd"); in.Code != 0 || !bytes.Equal(got, in.Stdout) {
			t.Errorf("agent and sandbox disagree on /etc/passwd")
		}
	})
	t.Run("new file in /etc", func(t *testing.T) {
		name := "warren-marker-" + randHex(6)
		s.write(t, "/etc/"+name, []byte("inside"), 0o644)
		if r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"cat", "/etc/" + name}}); string(r.Stdout) != "inside" {
			t.Errorf("sandbox reads %v", r)
		}
		hostAbsent(t, name)
	})
}

func (s *agentSuite) filesSymlinkEscape(t *testing.T) {
	d := s.tmp + "/esc"
	s.sh(t, "mkdir -p "+d)
	for i, tc := range []struct {
		name, target string
		// inside is where the write lands in the sandbox when followed
		// inside the root; "" when the link must be refused.
		inside string
	}{
		{"absolute root", "/", "/"},
		{"dotdot chain", "../../../../../../../../", "/"},
		{"dotdot root-relative", "../../../..", "/"},
		{"absolute dotdots", "/../../../..", "/"},
		{"to tmp via dotdots", "../../../../../tmp", "/tmp/"},
		{"proc 1 root", "/proc/1/root", ""},
		{"proc self cwd", "/proc/self/cwd", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			link := fmt.Sprintf("%s/link%d", d, i)
			s.sh(t, fmt.Sprintf("ln -s '%s' %s", tc.target, link))
			name := "escape-" + randHex(6)
			content := []byte("written through " + tc.target)
			werr := s.c.WriteFile(ctxFor(t, 10*time.Second), link+"/"+name, bytes.NewReader(content), 0o644)
			s.fresh()
			merr := s.c.Mkdir(ctxFor(t, 10*time.Second), wire.MkdirRequest{Path: link + "/" + name + "-dir/x", Parents: true})
			hostAbsent(t, name, name+"-dir")
			if tc.inside == "" {
				if werr == nil || merr == nil {
					// Following the link is only acceptable if it
					// stays in the sandbox.
					r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "cat /" + name + " && test -d /" + name + "-dir/x"}})
					if r.Code != 0 {
						t.Errorf("write through %s succeeded (%s, %s) but the files are not in the sandbox root: %v", tc.target, errInfo(werr), errInfo(merr), r)
					}
				}
				return
			}
			if werr != nil || merr != nil {
				t.Fatalf("write through a link to %s (followed inside the root) failed: %s / %s", tc.target, errInfo(werr), errInfo(merr))
			}
			at := tc.inside + name
			r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "cat " + at + " && test -d " + at + "-dir/x"}})
			if r.Code != 0 || !bytes.Equal(r.Stdout, content) {
				t.Errorf("the file should be at %s in the sandbox: %v", at, r)
			}
			if got := s.read(t, at); !bytes.Equal(got, content) {
				t.Errorf("read of %s: %q", at, got)
			}
		})
	}
}

func (s *agentSuite) filesNonRegular(t *testing.T) {
	d := s.tmp + "/nonreg"
	s.sh(t, fmt.Sprintf("mkdir -p %[1]s/dir && echo x > %[1]s/dir/f && mkfifo %[1]s/fifo", d))
	s.mustExec(t, &wire.ExecRequest{Argv: []string{"python3", "-c", "import socket; socket.socket(socket.AF_UNIX).bind('" + d + "/sock')"}})
	// A reader stuck opening the FIFO is released by a writer.
	defer s.mustExec(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "exec 3<>" + d + "/fifo; sleep 0.2"}, TimeoutMs: 5000})
	for _, tc := range []struct{ name, path string }{
		{"directory", d + "/dir"},
		{"root", "/"},
		{"fifo", d + "/fifo"},
		{"socket", d + "/sock"},
		{"/dev/null", "/dev/null"},
		{"/dev/zero", "/dev/zero"},
		{"/dev/urandom", "/dev/urandom"},
		{"/proc/self/exe", "/proc/self/exe"},
		{"/proc/self/root/etc/passwd", "/proc/self/root/etc/passwd"},
		{"/proc/1/cwd", "/proc/1/cwd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			b, err := s.c.ReadFile(ctxFor(t, 5*time.Second), tc.path)
			if took := time.Since(start); took > 4*time.Second {
				t.Errorf("read of %s hung for %v", tc.path, took)
			}
			wantKind(t, err, wire.ErrInvalid, fmt.Sprintf("read of %s (got %d bytes)", tc.path, len(b)))
		})
	}
	t.Run("tar of a fifo", func(t *testing.T) {
		rc, err := s.c.DownloadTar(ctxFor(t, 5*time.Second), d+"/fifo")
		if err != nil {
			wantKind(t, err, wire.ErrInvalid, "tar of a fifo")
			return
		}
		defer rc.Close()
		tr := tar.NewReader(rc)
		hdr, rerr := tr.Next()
		// An empty, cleanly ended answer would tell the client the FIFO
		// is an empty archive.
		if rerr == io.EOF || (rerr == nil && hdr != nil) {
			t.Errorf("tar of a fifo answered success (first entry %v, %v); want an error of kind invalid", hdr, rerr)
		}
	})
	t.Run("tar of a dir skips special files", func(t *testing.T) {
		names := tarNames(t, s, d)
		if !slices.Equal(names, []string{"dir/", "dir/f"}) {
			t.Errorf("tar of %s: %q; want the directory and its file, no fifo or socket", d, names)
		}
	})
}

func tarNames(t testing.TB, s *agentSuite, p string) []string {
	t.Helper()
	rc, err := s.c.DownloadTar(ctxFor(t, 30*time.Second), p)
	if err != nil {
		t.Fatalf("download %s: %s", p, errInfo(err))
	}
	defer rc.Close()
	var names []string
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names
		}
		if err != nil {
			t.Fatalf("tar of %s: %v", p, err)
		}
		names = append(names, hdr.Name)
	}
}

func (s *agentSuite) filesWriteOverSymlink(t *testing.T) {
	d := s.tmp + "/over"
	s.sh(t, fmt.Sprintf("mkdir -p %[1]s && ln -s /etc/passwd %[1]s/to-passwd && ln -s %[1]s/no-such-target %[1]s/dangling", d))
	passwd := s.read(t, "/etc/passwd")
	for _, name := range []string{"to-passwd", "dangling"} {
		t.Run(name, func(t *testing.T) {
			p := d + "/" + name
			s.write(t, p, []byte("replaced"), 0o600)
			fi, err := s.c.Stat(ctxFor(t, 10*time.Second), p)
			if err != nil || fi.Type != "file" || fi.Size != 8 {
				t.Errorf("after write: %+v %s; want a regular file replacing the link", fi, errInfo(err))
			}
			if got := s.read(t, "/etc/passwd"); !bytes.Equal(got, passwd) {
				t.Errorf("the link's target /etc/passwd was written")
			}
			if _, err := s.c.Stat(ctxFor(t, 10*time.Second), d+"/no-such-target"); !agent.IsKind(err, wire.ErrNotFound) {
				t.Errorf("the dangling link's target was created: %s", errInfo(err))
			}
		})
	}
}

// zeros is an io.Reader of n zero bytes.
type zeros struct{ n int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	k := min(int64(len(p)), z.n)
	clear(p[:k])
	z.n -= k
	return int(k), nil
}

func (s *agentSuite) filesTooLarge(t *testing.T) {
	d := s.tmp + "/large"
	s.sh(t, fmt.Sprintf("mkdir -p %[1]s && truncate -s %[2]d %[1]s/over && truncate -s %[3]d %[1]s/under", d, wire.MaxFileRead+1, 1<<20))
	t.Run("read over MaxFileRead", func(t *testing.T) {
		_, err := s.c.ReadFile(ctxFor(t, 30*time.Second), d+"/over")
		wantKind(t, err, wire.ErrTooLarge, "read of a MaxFileRead+1 byte file")
	})
	t.Run("sparse read under the limit", func(t *testing.T) {
		if b := s.read(t, d+"/under"); len(b) != 1<<20 || !bytes.Equal(b, make([]byte, 1<<20)) {
			t.Errorf("read %d bytes", len(b))
		}
	})
	t.Run("write over MaxFileWrite", func(t *testing.T) {
		p := d + "/too-big"
		err := s.c.WriteFile(ctxFor(t, 120*time.Second), p, &zeros{wire.MaxFileWrite + 1}, 0o644)
		s.fresh()
		wantKind(t, err, wire.ErrTooLarge, "write of MaxFileWrite+1 bytes")
		list, lerr := s.c.List(ctxFor(t, 10*time.Second), d)
		if lerr != nil {
			t.Fatal(errInfo(lerr))
		}
		for _, fi := range list {
			if fi.Name != "over" && fi.Name != "under" {
				t.Errorf("failed write left %s (%d bytes)", fi.Name, fi.Size)
			}
		}
	})
}

// ---------------------------------------------------------------------------
// Tar

func (h *Harness) agentTar(t *testing.T) {
	s := h.newAgentSuite(t, backend.Config{})
	t.Run("RoundTrip", s.tarRoundTrip)
	t.Run("Hostile", s.tarHostile)
	t.Run("StillHealthy", s.healthy)
}

type tarEnt struct {
	hdr  tar.Header
	body []byte
}

func buildTar(t testing.TB, ents []tarEnt) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range ents {
		hdr := e.hdr
		if hdr.ModTime.IsZero() {
			hdr.ModTime = time.Unix(1700000000, 0)
		}
		if hdr.Typeflag == tar.TypeReg || hdr.Typeflag == 0 {
			hdr.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(&hdr); err != nil {
			t.Fatalf("tar header %q: %v", hdr.Name, err)
		}
		if len(e.body) > 0 {
			if _, err := tw.Write(e.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

type tarItem struct {
	typ  byte
	mode int64
	link string
	body []byte
}

func readTar(t testing.TB, r io.Reader) (map[string]tarItem, []string) {
	t.Helper()
	m := map[string]tarItem{}
	var order []string
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return m, order
		}
		if err != nil {
			t.Fatalf("read tar: %v", err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("read tar entry %q: %v", hdr.Name, err)
		}
		m[hdr.Name] = tarItem{hdr.Typeflag, hdr.Mode, hdr.Linkname, body}
		order = append(order, hdr.Name)
	}
}

func (s *agentSuite) tarRoundTrip(t *testing.T) {
	bin := bytes.Repeat(func() []byte {
		b := make([]byte, 256)
		for i := range b {
			b[i] = byte(i)
		}
		return b
	}(), 64)
	rnd := randBytes(300000)
	ents := []tarEnt{
		{hdr: tar.Header{Name: "sub/", Typeflag: tar.TypeDir, Mode: 0o750}},
		{hdr: tar.Header{Name: "bin.dat", Typeflag: tar.TypeReg, Mode: 0o644}, body: bin},
		{hdr: tar.Header{Name: "random", Typeflag: tar.TypeReg, Mode: 0o600}, body: rnd},
		{hdr: tar.Header{Name: "empty", Typeflag: tar.TypeReg, Mode: 0o600}},
		{hdr: tar.Header{Name: "exec.sh", Typeflag: tar.TypeReg, Mode: 0o755}, body: []byte("#!/bin/sh\necho hi\n")},
		{hdr: tar.Header{Name: "sub/deep/x.txt", Typeflag: tar.TypeReg, Mode: 0o640}, body: []byte("deep")},
		{hdr: tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "sub/deep/x.txt"}},
		{hdr: tar.Header{Name: "abs-link", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"}},
		{hdr: tar.Header{Name: "dangling", Typeflag: tar.TypeSymlink, Linkname: "no/such"}},
		{hdr: tar.Header{Name: "hard", Typeflag: tar.TypeLink, Linkname: "bin.dat"}},
		{hdr: tar.Header{Name: "ünï cödé name", Typeflag: tar.TypeReg, Mode: 0o644}, body: []byte("u")},
	}
	src := s.tmp + "/tarrt/src"
	if err := s.c.UploadTar(ctxFor(t, 60*time.Second), src, bytes.NewReader(buildTar(t, ents))); err != nil {
		t.Fatalf("upload: %s", errInfo(err))
	}
	inside := s.sh(t, "cd "+src+` && cat sub/deep/x.txt && echo && readlink link abs-link dangling && stat -c '%a %h' exec.sh sub sub/deep bin.dat && sha256sum random | cut -d' ' -f1`)
	wantInside := "deep\nsub/deep/x.txt\n/etc/passwd\nno/such\n755 1\n750 3\n755 2\n644 2\n" + sha(rnd) + "\n"
	if inside != wantInside {
		t.Errorf("extracted tree seen from inside:\n%s\nwant:\n%s", inside, wantInside)
	}

	rc, err := s.c.DownloadTar(ctxFor(t, 60*time.Second), src)
	if err != nil {
		t.Fatalf("download: %s", errInfo(err))
	}
	raw, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	got, order := readTar(t, bytes.NewReader(raw))
	want := map[string]tarItem{
		"sub/":           {tar.TypeDir, 0o750, "", []byte{}},
		"sub/deep/":      {tar.TypeDir, 0o755, "", []byte{}},
		"bin.dat":        {tar.TypeReg, 0o644, "", bin},
		"hard":           {tar.TypeReg, 0o644, "", bin},
		"random":         {tar.TypeReg, 0o600, "", rnd},
		"empty":          {tar.TypeReg, 0o600, "", []byte{}},
		"exec.sh":        {tar.TypeReg, 0o755, "", []byte("#!/bin/sh\necho hi\n")},
		"sub/deep/x.txt": {tar.TypeReg, 0o640, "", []byte("deep")},
		"link":           {tar.TypeSymlink, -1, "sub/deep/x.txt", []byte{}},
		"abs-link":       {tar.TypeSymlink, -1, "/etc/passwd", []byte{}},
		"dangling":       {tar.TypeSymlink, -1, "no/such", []byte{}},
		"ünï cödé name":  {tar.TypeReg, 0o644, "", []byte("u")},
	}
	for name, w := range want {
		g, ok := got[name]
		switch {
		case !ok:
			t.Errorf("download lacks %q (has %q)", name, order)
		case g.typ != w.typ || g.link != w.link || !bytes.Equal(g.body, w.body) || (w.mode >= 0 && g.mode&0o7777 != w.mode):
			t.Errorf("entry %q: type %c mode %o link %q body %s; want type %c mode %o link %q body %s", name, g.typ, g.mode, g.link, clip(g.body), w.typ, w.mode, w.link, clip(w.body))
		}
	}
	for _, name := range order {
		if _, ok := want[name]; !ok {
			t.Errorf("unexpected entry %q", name)
		}
		if strings.HasPrefix(name, "/") || slices.Contains(strings.Split(name, "/"), "..") {
			t.Errorf("unsafe entry name %q", name)
		}
	}

	t.Run("re-upload makes a copy", func(t *testing.T) {
		cp := s.tmp + "/tarrt/copy"
		if err := s.c.UploadTar(ctxFor(t, 60*time.Second), cp, bytes.NewReader(raw)); err != nil {
			t.Fatalf("upload: %s", errInfo(err))
		}
		list := `find . -printf '%p %y %m %s %l\n' | LC_ALL=C sort`
		a := s.sh(t, "cd "+src+" && "+list)
		b := s.sh(t, "cd "+cp+" && "+list)
		if a != b {
			t.Errorf("copy differs:\n%s\nvs\n%s", a, b)
		}
	})
	t.Run("single file", func(t *testing.T) {
		rc, err := s.c.DownloadTar(ctxFor(t, 30*time.Second), src+"/bin.dat")
		if err != nil {
			t.Fatal(errInfo(err))
		}
		defer rc.Close()
		m, order := readTar(t, rc)
		if len(order) != 1 || order[0] != "bin.dat" || !bytes.Equal(m["bin.dat"].body, bin) {
			t.Errorf("tar of one file: %q", order)
		}
	})
	t.Run("symlink not followed", func(t *testing.T) {
		rc, err := s.c.DownloadTar(ctxFor(t, 30*time.Second), src+"/abs-link")
		if err != nil {
			t.Fatal(errInfo(err))
		}
		defer rc.Close()
		m, order := readTar(t, rc)
		if len(order) != 1 || m["abs-link"].typ != tar.TypeSymlink || m["abs-link"].link != "/etc/passwd" {
			t.Errorf("tar of a symlink: %q %+v", order, m)
		}
	})
	t.Run("missing", func(t *testing.T) {
		_, err := s.c.DownloadTar(ctxFor(t, 30*time.Second), src+"/nope")
		wantKind(t, err, wire.ErrNotFound, "tar of a missing path")
	})
}

// shortTar is a tar whose only entry's header claims size bytes but whose
// stream ends after body.
func shortTar(t testing.TB, name string, size int64, body []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size, ModTime: time.Unix(1700000000, 0)}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(body); err != nil {
		t.Fatal(err)
	}
	return b.Bytes() // no Close: the stream is cut short
}

func (s *agentSuite) tarHostile(t *testing.T) {
	base := s.tmp + "/tarh"
	for i, tc := range []struct {
		name string
		pre  string // shell run in dest before the upload
		tar  func(r string) []byte
		kind string // "" = success; "any" = any error; "either" = not checked
		// present are paths relative to dest that must exist after;
		// absent must not.
		present, absent []string
		// check runs in dest after the upload and must print "ok".
		check string
	}{
		{name: "dotdot entry",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{
					{hdr: tar.Header{Name: "ok-first", Mode: 0o644}, body: []byte("1")},
					{hdr: tar.Header{Name: "../evil-" + r, Mode: 0o644}, body: []byte("evil")},
				})
			},
			kind: wire.ErrInvalid, present: []string{"ok-first"}},
		{name: "nested dotdot entry",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{{hdr: tar.Header{Name: "a/../../evil-" + r, Mode: 0o644}, body: []byte("evil")}})
			},
			kind: wire.ErrInvalid},
		{name: "deep dotdot entry",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{{hdr: tar.Header{Name: "../../../../../../tmp/evil-" + r, Mode: 0o644}, body: []byte("evil")}})
			},
			kind: wire.ErrInvalid},
		{name: "absolute entry lands in dest",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{{hdr: tar.Header{Name: "/abs-" + r, Mode: 0o644}, body: []byte("abs")}})
			},
			present: []string{"abs-R"}},
		{name: "hardlink to /etc/shadow",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{{hdr: tar.Header{Name: "h-" + r, Typeflag: tar.TypeLink, Linkname: "/etc/shadow"}}})
			},
			kind: wire.ErrInvalid, absent: []string{"h-R"}},
		{name: "hardlink to /etc/passwd outside dest",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{{hdr: tar.Header{Name: "h-" + r, Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}}})
			},
			kind: wire.ErrInvalid, absent: []string{"h-R"}},
		{name: "hardlink dotdot",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{{hdr: tar.Header{Name: "h-" + r, Typeflag: tar.TypeLink, Linkname: "../../x"}}})
			},
			kind: wire.ErrInvalid, absent: []string{"h-R"}},
		{name: "hardlink through a symlink to /etc",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{
					{hdr: tar.Header{Name: "etc-link", Typeflag: tar.TypeSymlink, Linkname: "/etc"}},
					{hdr: tar.Header{Name: "h-" + r, Typeflag: tar.TypeLink, Linkname: "etc-link/passwd"}},
				})
			},
			kind: wire.ErrInvalid, absent: []string{"h-R"}},
		{name: "hardlink to a symlink",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{
					{hdr: tar.Header{Name: "pl", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"}},
					{hdr: tar.Header{Name: "h-" + r, Typeflag: tar.TypeLink, Linkname: "pl"}},
				})
			},
			kind: wire.ErrInvalid, absent: []string{"h-R"}},
		{name: "write through a symlink to /",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{
					{hdr: tar.Header{Name: "root", Typeflag: tar.TypeSymlink, Linkname: "/"}},
					{hdr: tar.Header{Name: "root/tmp/esc-" + r, Mode: 0o644}, body: []byte("esc")},
					{hdr: tar.Header{Name: "root/etc/esc-" + r, Mode: 0o644}, body: []byte("esc")},
				})
			},
			present: []string{"tmp/esc-R", "etc/esc-R"}},
		{name: "write through a dotdot symlink",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{
					{hdr: tar.Header{Name: "up", Typeflag: tar.TypeSymlink, Linkname: "../../../../../.."}},
					{hdr: tar.Header{Name: "up/esc-" + r, Mode: 0o644}, body: []byte("esc")},
					{hdr: tar.Header{Name: "up/newdir-" + r + "/", Typeflag: tar.TypeDir, Mode: 0o755}},
				})
			},
			present: []string{"esc-R", "newdir-R"}},
		{name: "symlink to parent then dir",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{
					{hdr: tar.Header{Name: "p", Typeflag: tar.TypeSymlink, Linkname: ".."}},
					{hdr: tar.Header{Name: "p/pdir-" + r + "/f", Mode: 0o644}, body: []byte("x")},
				})
			},
			present: []string{"pdir-R/f"}},
		{name: "existing symlink in dest to /etc",
			pre: "ln -s /etc etc-pre",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{{hdr: tar.Header{Name: "etc-pre/pre-" + r, Mode: 0o644}, body: []byte("x")}})
			},
			// Refusing, or following the link inside dest, are both
			// fine; /etc must not change (checked for every case).
			kind: "either"},
		{name: "file replaces existing symlink",
			pre: "ln -s /etc/passwd victim",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{{hdr: tar.Header{Name: "victim", Mode: 0o644}, body: []byte("intruder:x:0:0::/:/bin/sh\n")}})
			},
			check: `test -f victim && ! test -L victim && echo ok`},
		{name: "dir replaces existing symlink",
			pre: "ln -s /etc dl",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{
					{hdr: tar.Header{Name: "dl/", Typeflag: tar.TypeDir, Mode: 0o755}},
					{hdr: tar.Header{Name: "dl/x-" + r, Mode: 0o644}, body: []byte("x")},
				})
			},
			present: []string{"dl/x-R"}, check: `test -d dl && ! test -L dl && echo ok`},
		{name: "10 GB size header with a short body",
			tar:  func(r string) []byte { return shortTar(t, "big-"+r, 10<<30, make([]byte, 1000)) },
			kind: wire.ErrTooLarge, absent: []string{"big-R"}},
		{name: "1 MB size header with a short body",
			tar:  func(r string) []byte { return shortTar(t, "short-"+r, 1<<20, make([]byte, 1000)) },
			kind: wire.ErrInvalid, absent: []string{"short-R"}},
		{name: "garbage",
			tar:  func(r string) []byte { return randBytes(4096) },
			kind: wire.ErrInvalid},
		{name: "setuid, device and fifo entries",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{
					{hdr: tar.Header{Name: "suid", Mode: 0o4755}, body: []byte("#!/bin/sh\n")},
					{hdr: tar.Header{Name: "null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}},
					{hdr: tar.Header{Name: "fifo", Typeflag: tar.TypeFifo, Mode: 0o644}},
				})
			},
			absent: []string{"null", "fifo"}, check: `test "$(stat -c %a suid)" = 755 && echo ok`},
		{name: "entry naming the destination as a file",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{{hdr: tar.Header{Name: ".", Typeflag: tar.TypeReg, Mode: 0o644}}})
			},
			kind: wire.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := randHex(5)
			dest := fmt.Sprintf("%s/%d", base, i)
			stamp := fmt.Sprintf("%s/%d.stamp", base, i)
			pre := "true"
			if tc.pre != "" {
				pre = tc.pre
			}
			statStamp := "stat -c '%y %z %s %i %h' " + stamp
			stampBefore := s.sh(t, fmt.Sprintf("mkdir -p %s && cd %s && %s && sleep 0.02 && touch %s && sleep 0.02 && %s", dest, dest, pre, stamp, statStamp))
			err := s.c.UploadTar(ctxFor(t, 60*time.Second), dest, bytes.NewReader(tc.tar(r)))
			s.fresh()
			switch tc.kind {
			case "":
				if err != nil {
					t.Errorf("upload failed: %s", errInfo(err))
				}
			case "any":
				if err == nil {
					t.Errorf("upload succeeded; want an error")
				}
			case "either":
			default:
				wantKind(t, err, tc.kind, "upload")
			}
			// Nothing outside dest changed inside the sandbox. -cnewer
			// compares a file's ctime with the stamp's mtime, and the
			// stamp's own two were once seen a tick apart with nothing
			// touching it (in the cgroup v2 VM), so the stamp itself is
			// checked by comparing its stat before and after.
			changed := s.sh(t, fmt.Sprintf("find / /tmp /etc -xdev -cnewer %[1]s -not -path '%[1]s' -not -path '%[2]s' -not -path '%[2]s/*' 2>/dev/null | sort -u", stamp, dest))
			if changed != "" {
				t.Errorf("files outside the destination changed:\n%s", changed)
			}
			if after := s.sh(t, statStamp); after != stampBefore {
				t.Errorf("the stamp beside the destination changed: %q, then %q", stampBefore, after)
			}
			sub := func(p string) string { return strings.ReplaceAll(p, "R", r) }
			for _, p := range tc.present {
				if _, err := s.c.Stat(ctxFor(t, 10*time.Second), dest+"/"+sub(p)); err != nil {
					t.Errorf("%s missing in the destination: %s", sub(p), errInfo(err))
				}
			}
			for _, p := range tc.absent {
				if _, err := s.c.Stat(ctxFor(t, 10*time.Second), dest+"/"+sub(p)); !agent.IsKind(err, wire.ErrNotFound) {
					t.Errorf("%s should not exist: %s", sub(p), errInfo(err))
				}
			}
			if tc.check != "" {
				if out := s.sh(t, "cd "+dest+" && { "+tc.check+"; }"); out != "ok\n" {
					t.Errorf("check %q: %q", tc.check, out)
				}
			}
			if left := s.sh(t, "find "+dest+" -name '.warren-*' 2>/dev/null"); left != "" {
				t.Errorf("temporary files left: %s", left)
			}
			for _, n := range []string{"evil-", "esc-", "abs-", "h-", "newdir-", "pdir-", "pre-", "big-", "short-", "x-"} {
				hostAbsent(t, n+r)
			}
		})
	}
	if _, err := s.c.Stat(ctxFor(t, 10*time.Second), "/etc/passwd"); err != nil {
		t.Errorf("sandbox /etc/passwd: %s", errInfo(err))
	}
}

// ---------------------------------------------------------------------------
// REPL

func (h *Harness) agentRepl(t *testing.T) {
	s := h.newAgentSuite(t, backend.Config{Hostname: "agentconf-" + randHex(3)})
	run := func(t testing.TB, lang, code string, timeout time.Duration) wire.ReplResult {
		t.Helper()
		res, err := s.c.Repl(ctxFor(t, 60*time.Second), wire.ReplRequest{Language: lang, Code: code, TimeoutMs: timeout.Milliseconds()})
		if err != nil {
			t.Fatalf("repl %s %q: %s", lang, code, errInfo(err))
		}
		return res
	}
	result := func(r wire.ReplResult) string {
		if r.Result == nil {
			return "<none>"
		}
		return *r.Result
	}
	wantOK := func(t testing.TB, r wire.ReplResult, want string) {
		t.Helper()
		if r.Status != wire.ReplSuccess || result(r) != want {
			t.Errorf("status %q result %q error %q output %q; want success with %q", r.Status, result(r), r.Error, r.Output, want)
		}
	}
	hostname := strings.TrimSpace(s.sh(t, "hostname"))
	marker := s.tmp + "/repl-marker"
	s.write(t, marker, []byte("from-agent"), 0o644)

	for _, lc := range []struct {
		lang, aliases                                string
		set, get, getWant, outCode, errCode, errWant string
		loop, host, file                             string
	}{
		{lang: "python", aliases: "python3,PYTHON, python ",
			set: "x = 40", get: "x + 2", getWant: "42",
			outCode: "import sys\nprint('out1')\nprint('err1', file=sys.stderr)\n'last'",
			errCode: "1/0", errWant: "ZeroDivisionError: division by zero",
			loop: "while True: pass",
			host: "import socket; socket.gethostname()", file: "open('" + marker + "').read()",
		},
		{lang: "node", aliases: "nodejs,javascript,js,NODE",
			set: "var x = 40", get: "x + 2", getWant: "42",
			outCode: "console.log('out1'); console.error('err1'); 'last'",
			errCode: "throw new Error('boom')", errWant: "Error: boom",
			loop: "while (true) {}",
			host: "require('os').hostname()", file: "require('fs').readFileSync('" + marker + "', 'utf8')",
		},
	} {
		t.Run(lc.lang, func(t *testing.T) {
			t.Run("state persists", func(t *testing.T) {
				wantOK(t, run(t, lc.lang, lc.set, 30*time.Second), "<none>")
				wantOK(t, run(t, lc.lang, lc.get, 30*time.Second), lc.getWant)
			})
			t.Run("output lines and result", func(t *testing.T) {
				r := run(t, lc.lang, lc.outCode, 30*time.Second)
				want := []wire.OutputLine{{Stream: wire.Stdout, Text: "out1"}, {Stream: wire.Stderr, Text: "err1"}}
				if !slices.Equal(r.Output, want) {
					t.Errorf("output %q; want %q", r.Output, want)
				}
				wantOK(t, r, "'last'")
			})
			t.Run("error", func(t *testing.T) {
				r := run(t, lc.lang, lc.errCode, 30*time.Second)
				if r.Status != wire.ReplError || r.Error != lc.errWant {
					t.Errorf("status %q error %q; want error %q", r.Status, r.Error, lc.errWant)
				}
				wantOK(t, run(t, lc.lang, "x", 30*time.Second), "40")
			})
			t.Run("timeout keeps state", func(t *testing.T) {
				start := time.Now()
				r := run(t, lc.lang, lc.loop, 500*time.Millisecond)
				took := time.Since(start)
				if r.Status != wire.ReplTimeout || !strings.Contains(r.Error, "TimeoutError") {
					t.Errorf("status %q error %q; want timeout", r.Status, r.Error)
				}
				if took < 450*time.Millisecond || took > 15*time.Second {
					t.Errorf("a 500 ms timeout took %v", took)
				}
				wantOK(t, run(t, lc.lang, "x", 30*time.Second), "40")
			})
			t.Run("runs in the sandbox", func(t *testing.T) {
				wantOK(t, run(t, lc.lang, lc.host, 30*time.Second), "'"+hostname+"'")
				wantOK(t, run(t, lc.lang, lc.file, 30*time.Second), "'from-agent'")
			})
			for _, alias := range strings.Split(lc.aliases, ",") {
				t.Run("alias "+strconv.Quote(alias), func(t *testing.T) {
					wantOK(t, run(t, alias, "x", 30*time.Second), "40")
				})
			}
		})
	}
	for _, lang := range []string{"cobol", "", "python2", "ruby", "node\x00"} {
		t.Run("unknown language "+strconv.Quote(lang), func(t *testing.T) {
			_, err := s.c.Repl(ctxFor(t, 10*time.Second), wire.ReplRequest{Language: lang, Code: "1"})
			wantKind(t, err, wire.ErrInvalid, "repl in "+strconv.Quote(lang))
		})
	}
	t.Run("oversized code", func(t *testing.T) {
		// The engines refuse more than 16 MiB of code; that is the
		// client's fault, not an internal error.
		code := "#" + strings.Repeat("x", 16<<20)
		_, err := s.c.Repl(ctxFor(t, 60*time.Second), wire.ReplRequest{Language: "python", Code: code})
		if !agent.IsKind(err, wire.ErrTooLarge) && !agent.IsKind(err, wire.ErrInvalid) {
			t.Errorf("repl with 16 MiB+ of code: %s; want kind too_large (or invalid)", errInfo(err))
		}
		wantOK(t, run(t, "python", "x", 30*time.Second), "40")
	})
	t.Run("StillHealthy", s.healthy)
}

// ---------------------------------------------------------------------------
// Connection handling

// unsized hides a reader's length, so the client sends it chunked.
type unsized struct{ r io.Reader }

func (u unsized) Read(p []byte) (int, error) { return u.r.Read(p) }

func (h *Harness) agentConnection(t *testing.T) {
	s := h.newAgentSuite(t, backend.Config{})
	// A request whose body the agent rejects without reading it must not
	// disturb the next request on the same (pooled, keep-alive)
	// connection.
	for _, tc := range []struct {
		name string
		body func() io.Reader
	}{
		{"sized body", func() io.Reader { return bytes.NewReader(make([]byte, 1000)) }},
		{"chunked body", func() io.Reader { return unsized{bytes.NewReader(make([]byte, 1000))} }},
	} {
		t.Run("request after a rejected "+tc.name, func(t *testing.T) {
			s.fresh()
			const rounds = 150
			var failures []string
			for i := range rounds {
				err := s.c.WriteFile(ctxFor(t, 10*time.Second), "../rejected", tc.body(), 0o644)
				if !agent.IsKind(err, wire.ErrInvalid) {
					failures = append(failures, fmt.Sprintf("round %d: rejected write: %s", i, errInfo(err)))
				}
				if _, err := s.c.Stat(ctxFor(t, 10*time.Second), s.tmp); err != nil {
					failures = append(failures, fmt.Sprintf("round %d: next request: %s", i, errInfo(err)))
				}
			}
			if len(failures) > 0 {
				t.Errorf("%d of %d rounds went wrong; first: %s", len(failures), rounds, failures[0])
			}
		})
	}
	s.fresh()
	t.Run("StillHealthy", s.healthy)
}
