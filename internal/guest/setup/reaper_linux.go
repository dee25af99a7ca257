package setup

import (
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Reaper makes PID 1 reap orphans without stealing the exit status of the
// children the agent waits for itself.
//
// Every child the agent starts goes through Start, which records its pid as
// owned while holding the lock the reaper needs, so a child that exits at once
// cannot be reaped before it is recorded. The reaper peeks at zombies with
// WNOWAIT and only reaps pids nobody owns (reparented orphans); owned children
// are reaped by their owner's Wait.
type Reaper struct {
	mu       sync.Mutex
	owned    map[int]bool
	launcher *Launcher
}

// NewReaper returns a reaper that forks children through launcher (nil:
// from the calling thread); call Run in a goroutine when running as PID 1.
func NewReaper(launcher *Launcher) *Reaper {
	return &Reaper{owned: make(map[int]bool), launcher: launcher}
}

// Start starts cmd and marks its process owned until Release.
func (r *Reaper) Start(cmd *exec.Cmd) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.launcher.Run(cmd.Start); err != nil {
		return err
	}
	r.owned[cmd.Process.Pid] = true
	return nil
}

// StartProcess is Start for os.StartProcess.
func (r *Reaper) StartProcess(name string, argv []string, attr *os.ProcAttr) (*os.Process, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var p *os.Process
	err := r.launcher.Run(func() (err error) {
		p, err = os.StartProcess(name, argv, attr)
		return err
	})
	if err != nil {
		return nil, err
	}
	r.owned[p.Pid] = true
	return p, nil
}

// Release forgets pid after its owner has waited for it.
func (r *Reaper) Release(pid int) {
	r.mu.Lock()
	delete(r.owned, pid)
	r.mu.Unlock()
}

// Run reaps unowned zombies until stop is closed. It wakes on SIGCHLD and,
// because an owned zombie at the head of the queue hides the ones behind it
// until its owner waits, also every 200ms.
func (r *Reaper) Run(stop <-chan struct{}) {
	sig := make(chan os.Signal, 16)
	signal.Notify(sig, syscall.SIGCHLD)
	defer signal.Stop(sig)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		r.reap()
		select {
		case <-stop:
			return
		case <-sig:
		case <-tick.C:
		}
	}
}

func (r *Reaper) reap() {
	for range 1024 {
		r.mu.Lock()
		var info unix.Siginfo
		err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		pid := siginfoPid(&info)
		if err != nil || pid == 0 || r.owned[pid] {
			r.mu.Unlock()
			return
		}
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		r.mu.Unlock()
	}
}

// siginfoPid reads si_pid from a SIGCHLD siginfo: on every 64-bit Linux
// architecture the union starts at byte 16 and si_pid is its first field.
func siginfoPid(info *unix.Siginfo) int {
	return int(*(*int32)(unsafe.Add(unsafe.Pointer(info), 16))) //nolint:gosec // reading si_pid at its fixed offset in the kernel's siginfo union, which x/sys/unix does not expose
}
