package service

import (
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/wire"
)

// process is the life of one process the agent runs for the host, the same
// for an exec (whose request waits for it) and a background process (which
// a goroutine of Procs waits for): started through the Starter, killed with
// its process group when its timeout passes, waited for, and its output
// drained.
//
// The timeout and the wait meet under mu: the timer's kill counts as a
// timeout only if the exit has not been seen yet, and the status is read
// after the exit is marked seen. So a process is reported timed out exactly
// when the timer killed it, and nothing is shared unsynchronised.
type process struct {
	cmd     *exec.Cmd
	starter Starter
	pid     int
	started time.Time
	readers sync.WaitGroup
	timer   *time.Timer // nil without a timeout

	mu       sync.Mutex
	exited   bool // Wait has returned
	timedOut bool // the timer killed it before that
}

// startProcess starts cmd through starter. childEnds, the child's ends of
// its standard streams, are closed once it has started or failed to;
// parentEnds, the agent's, are closed if it failed. Then each reader, which
// drains one output stream until it ends, runs in a goroutine of its own
// (wait waits for them). A positive timeout kills the process group when it
// passes.
func startProcess(starter Starter, cmd *exec.Cmd, childEnds, parentEnds []*os.File, readers []func(), timeout time.Duration) (*process, error) {
	started := time.Now()
	err := starter.Start(cmd)
	for _, f := range childEnds {
		_ = f.Close()
	}
	if err != nil {
		for _, f := range parentEnds {
			_ = f.Close()
		}
		return nil, err
	}
	p := &process{cmd: cmd, starter: starter, pid: cmd.Process.Pid, started: started}
	for _, f := range readers {
		p.readers.Add(1)
		go func() { defer p.readers.Done(); f() }()
	}
	if timeout > 0 {
		p.timer = time.AfterFunc(timeout, p.timeout)
	}
	return p, nil
}

func (p *process) timeout() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.exited {
		p.timedOut = true
		p.kill()
	}
}

// kill sends SIGKILL to the process group: the process and what it forked,
// even after the process itself has exited.
func (p *process) kill() { _ = unix.Kill(-p.pid, unix.SIGKILL) }

// killRunning is kill until the exit has been seen, and nothing after.
func (p *process) killRunning() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.exited {
		p.kill()
	}
}

// wait waits for the process to exit and returns how it ended (its
// duration is until the exit), after its output has drained. Descendants
// may hold the output open after the exit: their output is taken for up to
// grace; then cut, if not nil, ends the readers (closes the agent's ends),
// and wait returns once they have ended; with a nil cut, wait waits up to
// grace more and leaves them.
//
// Output already written is never cut: the grace measures how long the
// streams may stay open, not how fast the readers run, and a loaded
// sandbox may not schedule them within it. So past the grace, while one of
// outputs (the agent's read ends) still holds unread bytes, wait goes on
// waiting, up to maxDrain.
func (p *process) wait(grace time.Duration, cut func(), outputs ...*os.File) wire.ExitStatus {
	awaitExit(p.pid)
	err := p.cmd.Wait()
	p.mu.Lock()
	p.exited = true
	timedOut := p.timedOut
	p.mu.Unlock()
	if p.timer != nil {
		p.timer.Stop()
	}
	p.starter.Release(p.pid)
	st := exitStatus(p.cmd.ProcessState, err)
	st.TimedOut = timedOut
	st.DurationMs = float64(time.Since(p.started).Microseconds()) / 1000
	drained := make(chan struct{})
	go func() { p.readers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(grace):
		drainUnread(drained, outputs)
		if cut != nil {
			cut()
			<-drained
		} else {
			select {
			case <-drained:
			case <-time.After(grace):
			}
		}
	}
	return st
}

// maxDrain bounds how long past the grace wait lets the readers take output
// that was written but not yet read: a descendant that writes without end
// would otherwise hold the call open.
const maxDrain = 2 * time.Second

// drainUnread waits, until drained is closed or maxDrain has passed, while
// any of files has bytes written and not yet read.
func drainUnread(drained <-chan struct{}, files []*os.File) {
	deadline := time.Now().Add(maxDrain)
	for unread(files) && time.Now().Before(deadline) {
		select {
		case <-drained:
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// unread reports whether a pipe or terminal in files holds bytes not yet
// read. A closed file holds none.
func unread(files []*os.File) bool {
	for _, f := range files {
		rc, err := f.SyscallConn() // not Fd: that would make f blocking
		if err != nil {
			continue
		}
		n := 0
		_ = rc.Control(func(fd uintptr) {
			n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) // FIONREAD, for pipes and terminals alike
		})
		if n > 0 {
			return true
		}
	}
	return false
}

// stdPipes makes the pipes of a process's stdout and stderr: the read ends
// are the agent's, the write ends go to the child.
func stdPipes() (outR, outW, errR, errW *os.File, err error) {
	if outR, outW, err = os.Pipe(); err != nil {
		return nil, nil, nil, nil, err
	}
	if errR, errW, err = os.Pipe(); err != nil {
		_ = outR.Close()
		_ = outW.Close()
		return nil, nil, nil, nil, err
	}
	return outR, outW, errR, errW, nil
}

func exitStatus(ps *os.ProcessState, waitErr error) wire.ExitStatus {
	if ps == nil {
		msg := "process state unavailable"
		if waitErr != nil {
			msg = waitErr.Error()
		}
		return wire.ExitStatus{Code: 255, Error: msg}
	}
	ws, _ := ps.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return wire.ExitStatus{Code: 128 + int(ws.Signal()), Signal: unix.SignalName(ws.Signal())}
	}
	return wire.ExitStatus{Code: ws.ExitStatus()}
}

// awaitExit returns once the child pid has exited (not reaped: its owner's
// Wait reaps it, at once then). It waits on the runtime's poller, through
// a pidfd, where Wait blocks a thread in waitid: one OS thread per child
// waited for, taken from the agent's pids budget (up to wire.MaxProcesses
// background processes and the execs beside them). Where a pidfd cannot be
// had it returns at once, and Wait blocks as before.
func awaitExit(pid int) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return
	}
	f := os.NewFile(uintptr(fd), "pidfd") // non-blocking: the poller's
	defer func() { _ = f.Close() }()
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	// A pidfd polls readable once its process has exited. Each call looks
	// for itself: the poller's edge-triggered event for an exit that came
	// before the wait was armed is dropped when the wait is armed, and
	// would never come again.
	_ = rc.Read(func(fd uintptr) bool {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}} //nolint:gosec // a descriptor number fits an int32
		n, err := unix.Poll(pfd, 0)
		return err != nil || n > 0
	})
}
