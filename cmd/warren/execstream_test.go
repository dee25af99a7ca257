package main

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestExecStreams: warren exec streams output as it is produced, passes
// stdin (piped, without -i) and exit codes through (127, 126, 128+N, 124),
// runs with --user, --workdir, --env, and forwards Ctrl-C to the command.
func TestExecStreams(t *testing.T) {
	_, client, cmd := serverClient(t)
	if r := client("", "create", "box"); r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	defer client("", "rm", "-f", "box")
	if r := client("", "exec", "box", "--", "sh", "-c", "echo no program > /tmp/junk; echo '#!/no/such/interpreter' > /tmp/script; chmod +x /tmp/junk /tmp/script"); r.code != 0 {
		t.Fatalf("setup: %+v", r)
	}
	big := strings.Repeat("0123456789", 300000)
	for _, tc := range []struct {
		name      string
		args      []string
		stdin     string
		code      int
		stdout    string
		stdoutLen int
		stderrHas string
	}{
		{name: "piped stdin", args: []string{"exec", "box", "--", "cat"}, stdin: "hi\n", stdout: "hi\n"},
		// More than one stdin message, and more than the agent keeps of
		// a stream: both ways whole.
		{name: "large stdin", args: []string{"exec", "box", "--", "sh", "-c", "cat | wc -c"}, stdin: big, stdout: "3000000\n"},
		{name: "streams apart", args: []string{"exec", "box", "--", "sh", "-c", "echo out; echo err >&2; exit 3"}, code: 3, stdout: "out\n", stderrHas: "err"},
		{name: "not found", args: []string{"exec", "box", "--", "no-such-command"}, code: 127, stderrHas: "not found"},
		{name: "not executable", args: []string{"exec", "box", "--", "/etc/passwd"}, code: 126, stderrHas: "not an executable"},
		// Told by execve's errno (the agent's cause), not by the text.
		{name: "exec format", args: []string{"exec", "box", "--", "/tmp/junk"}, code: 126, stderrHas: "exec format error"},
		{name: "interpreter missing", args: []string{"exec", "box", "--", "/tmp/script"}, code: 127, stderrHas: "no such file"},
		{name: "no workdir", args: []string{"exec", "--workdir", "/nowhere", "box", "--", "true"}, code: 126, stderrHas: "working directory"},
		{name: "unknown user", args: []string{"exec", "--user", "nosuch", "box", "--", "true"}, code: 1, stderrHas: `user "nosuch" not found`},
		{name: "signal", args: []string{"exec", "box", "--", "sh", "-c", "kill -TERM $$"}, code: 143},
		{name: "timeout", args: []string{"exec", "--timeout", "500ms", "box", "--", "sleep", "30"}, code: 124, stderrHas: "timeout"},
		{name: "user workdir env", args: []string{"exec", "--user", "nobody", "--workdir", "/tmp", "--env", "A=b c", "box", "--", "sh", "-c", `id -u; pwd; echo "$A"`},
			stdout: "65534\n/tmp\nb c\n"},
		// docker's one-letter names, -ti together.
		{name: "docker short flags", args: []string{"exec", "-u", "nobody", "-w", "/tmp", "-e", "A=b c", "box", "--", "sh", "-c", `id -u; pwd; echo "$A"`},
			stdout: "65534\n/tmp\nb c\n"},
		{name: "no sandbox", args: []string{"exec", "nosuch", "--", "true"}, code: 1, stderrHas: `sandbox "nosuch" in namespace "default" does not exist`},
		{name: "no command", args: []string{"exec", "box"}, code: 2, stderrHas: "missing CMD (what to run)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := client(tc.stdin, tc.args...)
			if r.code != tc.code || (tc.stdout != "" && r.stdout != tc.stdout) || (tc.stdoutLen > 0 && len(r.stdout) != tc.stdoutLen) ||
				!strings.Contains(r.stderr, tc.stderrHas) {
				t.Fatalf("%.300v, want code %d stdout %q (%d bytes) stderr with %q", r, tc.code, tc.stdout, tc.stdoutLen, tc.stderrHas)
			}
		})
	}

	// Output far faster than it can be passed on: the agent holds the
	// command back instead of losing any of it.
	r := client("", "exec", "box", "--", "head", "-c", "3000000", "/dev/zero")
	if len(r.stdout) != 3000000 || r.code != 0 || strings.Contains(r.stderr, "lost") {
		t.Fatalf("3000000 bytes of output: %d passed, exit %d: %s", len(r.stdout), r.code, r.stderr)
	}

	// Output arrives while the command runs: the first line is read
	// before the command has written the second, which waits for a file
	// only the test creates after it read the first.
	c := cmd("exec", "box", "--", "sh", "-c", "echo first; while [ ! -e /tmp/go-on ]; do sleep 0.05; done; echo second")
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(out)
	line, err := readLineWithin(br, 10*time.Second)
	if err != nil || line != "first\n" {
		t.Fatalf("first line while the command runs: %q, %v", line, err)
	}
	if r := client("", "exec", "box", "--", "touch", "/tmp/go-on"); r.code != 0 {
		t.Fatalf("touch: %+v", r)
	}
	if rest, _ := io.ReadAll(br); string(rest) != "second\n" {
		t.Fatalf("after the file: %q", rest)
	}
	if err := c.Wait(); err != nil {
		t.Fatal(err)
	}

	// Ctrl-C reaches the command: its trap prints and exits 5.
	c = cmd("exec", "box", "--", "sh", "-c", "trap 'echo caught; exit 5' INT; echo ready; while :; do sleep 0.05; done")
	out, err = c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	br = bufio.NewReader(out)
	if line, err := readLineWithin(br, 10*time.Second); err != nil || line != "ready\n" {
		t.Fatalf("ready: %q, %v", line, err)
	}
	if err := c.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if rest, _ := io.ReadAll(br); string(rest) != "caught\n" {
		t.Fatalf("after Ctrl-C: %q", rest)
	}
	if err := c.Wait(); procExitCode(err) != 5 {
		t.Fatalf("exit after Ctrl-C: %v, want 5", err)
	}
}

func procExitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return -int(ws.Signal())
		}
		return ee.ExitCode()
	}
	if err != nil {
		return -1000
	}
	return 0
}

// readLineWithin reads a line, failing after d.
func readLineWithin(br *bufio.Reader, d time.Duration) (string, error) {
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := br.ReadString('\n')
		ch <- res{s, err}
	}()
	select {
	case r := <-ch:
		return r.s, r.err
	case <-time.After(d):
		return "", os.ErrDeadlineExceeded
	}
}

// TestStartExitCode: the agent's cause decides 127 or 126; without one (a
// sandbox agent older than the field) the text still does.
func TestStartExitCode(t *testing.T) {
	for _, tc := range []struct {
		m       wsMessage
		started bool
		want    int
	}{
		{m: wsMessage{Kind: "not_found", Cause: "not_found", Message: "x: permission denied"}, want: 127},
		{m: wsMessage{Kind: "not_found", Cause: "not_executable", Message: "fork/exec /x: exec format error"}, want: 126},
		{m: wsMessage{Kind: "not_found", Cause: "some_later_cause"}, want: 126},
		{m: wsMessage{Kind: "not_found", Message: "x: command not found in PATH"}, want: 127},
		{m: wsMessage{Kind: "not_found", Message: "/etc/passwd: permission denied (not an executable file)"}, want: 126},
		{m: wsMessage{Kind: "not_found", Message: `user "x" not found in /etc/passwd`}, want: 0},
		{m: wsMessage{Kind: "not_found", Cause: "not_found"}, started: true, want: 0},
		{m: wsMessage{Kind: "internal", Message: "not found"}, want: 0},
	} {
		if got := startExitCode(tc.started, tc.m); got != tc.want {
			t.Errorf("%+v started %v: %d, want %d", tc.m, tc.started, got, tc.want)
		}
	}
}
