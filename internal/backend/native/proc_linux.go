package native

import (
	"errors"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// initProc is a sandbox's agent, its PID 1, as the host holds it: by
// pidfd, so a signal can never reach a process that reused its pid. It is
// not this process's child: the spawner's, or an earlier daemon's.
type initProc struct {
	pid   int
	pidfd *os.File
	done  chan struct{} // closed once the process has exited
}

// watchProc takes ownership of pidfd.
func watchProc(pid, pidfd int) *initProc {
	// Non-blocking puts the pidfd in the runtime's poller: a waiting
	// sandbox costs no OS thread.
	_ = unix.SetNonblock(pidfd, true)
	p := &initProc{pid: pid, pidfd: os.NewFile(uintptr(pidfd), "pidfd"), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		rc, err := p.pidfd.SyscallConn()
		if err != nil {
			return
		}
		exited := func(fd uintptr) bool {
			n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
			return n > 0 || (err != nil && !errors.Is(err, unix.EINTR))
		}
		if rc.Read(exited) != nil {
			// Not pollable after all: wait on a thread.
			_ = rc.Control(func(fd uintptr) {
				for !exited(fd) {
					_, _ = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, -1)
				}
			})
		}
		// A spawner's agent becomes this process's child when the spawner
		// died before it (this process is a child subreaper): collect it.
		// For anyone else's child this fails with ECHILD.
		_ = rc.Control(func(fd uintptr) {
			_ = unix.Waitid(unix.P_PIDFD, int(fd), nil, unix.WEXITED|unix.WNOHANG, nil)
		})
	}()
	return p
}

// exited reports whether the process has exited.
func (p *initProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL (a no-op once the process is gone).
func (p *initProc) kill() {
	rc, err := p.pidfd.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_ = unix.PidfdSendSignal(int(fd), syscall.SIGKILL, nil, 0)
	})
}

// close releases the pidfd once the process has exited; before, it would
// end the watcher early.
func (p *initProc) close() {
	<-p.done
	_ = p.pidfd.Close()
}
