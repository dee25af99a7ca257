// The Exec group: one command run to completion. Argv, environment,
// working directory, user and stdin reach the command; timeouts, output
// limits, huge and binary output, exit statuses, commands that cannot start,
// invalid requests, concurrent runs and a cancelled request (which kills the
// command) are reported as the wire says.

package conformance

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/wire"
)

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
	// later entries winning (service.mergeEnv in the agent). Note wire.ExecRequest.Env's
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
