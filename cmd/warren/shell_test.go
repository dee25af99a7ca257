package main

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openPTY opens a new pseudo-terminal pair, the test's stand-in for the
// terminal a user types into.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetUint32(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(); _ = s.Close() })
	return m, s
}

// screen collects what a terminal shows.
type screen struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *screen) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *screen) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// waitFor waits until the screen shows want after offset from, and
// returns the offset past it.
func (s *screen) waitFor(t *testing.T, from int, want string) int {
	t.Helper()
	for t0 := time.Now(); time.Since(t0) < 15*time.Second; time.Sleep(20 * time.Millisecond) {
		if i := strings.Index(s.String()[from:], want); i >= 0 {
			return from + i + len(want)
		}
	}
	t.Fatalf("the terminal did not show %q; it shows:\n%s", want, s.String()[from:])
	return 0
}

// TestShellTerminal: warren shell on a terminal (a PTY, as a user's) gets
// the terminal's size, follows its resize, passes Ctrl-C to the sandbox's
// terminal (which interrupts the foreground command, not the shell), puts
// the local terminal back as it was, and exits with the shell's code.
func TestShellTerminal(t *testing.T) {
	_, client, cmd := serverClient(t)
	if r := client("", "create", "box"); r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	defer client("", "rm", "-f", "box")
	master, slave := openPTY(t)
	setSize := func(rows, cols uint16) {
		if err := unix.IoctlSetWinsize(int(master.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
			t.Fatal(err)
		}
	}
	setSize(30, 100)
	before, err := unix.IoctlGetTermios(int(slave.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	c := cmd("shell", "box")
	c.Stdin, c.Stdout, c.Stderr = slave, slave, slave
	// Its own session with the PTY as controlling terminal: resizes
	// signal it (SIGWINCH), as they do a shell's foreground job.
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	var scr screen
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			_, _ = scr.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}()
	typeIn := func(s string) {
		if _, err := master.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	// The marks are computed by the shell, so the typed line's echo
	// cannot match them.
	typeIn("stty size; echo mark-$((1+1))\r")
	off := scr.waitFor(t, 0, "mark-2")
	if !strings.Contains(scr.String()[:off], "30 100") {
		t.Fatalf("the size at the start: %q", scr.String())
	}
	setSize(40, 120)
	time.Sleep(300 * time.Millisecond) // the resize travels to the sandbox's terminal
	typeIn("stty size; echo mark-$((2+1))\r")
	off2 := scr.waitFor(t, off, "mark-3")
	if !strings.Contains(scr.String()[off:off2], "40 120") {
		t.Fatalf("the size after a resize: %q", scr.String()[off:off2])
	}
	typeIn("sleep 100; echo slept-$((5+5))\r")
	time.Sleep(500 * time.Millisecond)
	typeIn("\x03")
	typeIn("echo mark-$((3+1))\r")
	off3 := scr.waitFor(t, off2, "mark-4")
	if strings.Contains(scr.String()[off2:off3], "slept-10") {
		t.Fatalf("Ctrl-C did not interrupt sleep: %q", scr.String()[off2:off3])
	}
	typeIn("exit 3\r")
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err := <-done:
		if procExitCode(err) != 3 {
			t.Fatalf("exit: %v, want 3\n%s", err, scr.String())
		}
	case <-time.After(15 * time.Second):
		_ = c.Process.Kill()
		t.Fatalf("warren shell did not exit:\n%s", scr.String())
	}
	after, err := unix.IoctlGetTermios(int(slave.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	if after.Lflag != before.Lflag || after.Iflag != before.Iflag || after.Oflag != before.Oflag {
		t.Errorf("the terminal was not restored: %+v, was %+v", after, before)
	}

	// exec -it: the command's terminal has the local one's size.
	off4 := len(scr.String())
	c = cmd("exec", "-it", "box", "--", "sh", "-c", "stty size; exit 6")
	c.Stdin, c.Stdout, c.Stderr = slave, slave, slave
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := c.Run(); procExitCode(err) != 6 {
		t.Fatalf("exec -it: %v, want 6\n%s", err, scr.String()[off4:])
	}
	scr.waitFor(t, off4, "40 120")

	// -ti, as docker takes it too, and a PTY's stdin passed on (-i): the
	// command reads the line typed on the local terminal.
	off5 := len(scr.String())
	c = cmd("exec", "-ti", "box", "--", "sh", "-c", "stty size; read l; echo \"got $l\"; exit 7")
	c.Stdin, c.Stdout, c.Stderr = slave, slave, slave
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	scr.waitFor(t, off5, "40 120")
	if _, err := master.Write([]byte("typed\r")); err != nil {
		t.Fatal(err)
	}
	kill := time.AfterFunc(20*time.Second, func() { _ = c.Process.Kill() }) // stdin not passed: read waits
	defer kill.Stop()
	if err := c.Wait(); procExitCode(err) != 7 {
		t.Fatalf("exec -ti: %v, want 7\n%s", err, scr.String()[off5:])
	}
	scr.waitFor(t, off5, "got typed")
}
