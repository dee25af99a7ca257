package setup

import (
	"fmt"
	"runtime"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/oci"
)

// dropThreadCapabilities narrows the calling thread's bounding, effective,
// permitted and inheritable sets to what the spec lists and clears its
// ambient set. It changes only this thread: the Launcher calls it on the one
// thread every sandbox process is forked from, which is far cheaper than
// changing all of the agent's threads (each such change stops the world).
func dropThreadCapabilities(c *specs.LinuxCapabilities) error {
	return setThreadCapabilities(c, 0)
}

// setThreadCapabilities is dropThreadCapabilities keeping the capabilities
// in keep effective and permitted as well (never in the bounding or
// inheritable set: nothing started from the thread gets them).
func setThreadCapabilities(c *specs.LinuxCapabilities, keep uint64) error {
	if c == nil {
		c = &specs.LinuxCapabilities{}
	}
	bounding, err := oci.CapMask(c.Bounding)
	if err != nil {
		return err
	}
	for cap := 0; cap <= oci.LastCap(); cap++ {
		if bounding&(1<<cap) != 0 {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(cap), 0, 0, 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("drop capability %d from bounding set: %w", cap, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	return capset(c, keep)
}

// capset sets the calling thread's effective, permitted and inheritable
// sets to c's, plus keep in the first two.
func capset(c *specs.LinuxCapabilities, keep uint64) error {
	eff, err := oci.CapMask(c.Effective)
	if err != nil {
		return err
	}
	perm, err := oci.CapMask(c.Permitted)
	if err != nil {
		return err
	}
	inh, err := oci.CapMask(c.Inheritable)
	if err != nil {
		return err
	}
	eff, perm = eff|keep, perm|keep
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{
		{Effective: uint32(eff), Permitted: uint32(perm), Inheritable: uint32(inh)},                   //nolint:gosec // splitting the 64-bit capability sets into the kernel's two 32-bit words; truncation is the point
		{Effective: uint32(eff >> 32), Permitted: uint32(perm >> 32), Inheritable: uint32(inh >> 32)}, //nolint:gosec // splitting the 64-bit capability sets into the kernel's two 32-bit words; truncation is the point
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("set capabilities: %w", err)
	}
	return nil
}

// Launcher forks every sandbox process from one OS thread whose
// capabilities are those of the sandbox (capabilities are per thread, and a
// child inherits its forking thread's). The agent's other threads keep the
// few setup capabilities the host left them, under the same seccomp filter.
type Launcher struct {
	reqs chan func()
}

// NewLauncher starts the launcher thread with the capabilities c and the
// timer slack slack (ns; 0 keeps the thread's). When the sandbox's cgroup
// is split (package cgroup, split_linux.go) the thread first joins the
// workload's cgroup through the descriptor work (0: none), so that all it
// forks is charged to the workload's pids, not to the agent's. With
// cgroupNS it then enters a new cgroup namespace, rooted at the cgroup it
// is in. Its children inherit all of it.
func NewLauncher(c *specs.LinuxCapabilities, cgroupNS bool, slack uint64, work int) (*Launcher, error) {
	return startLauncher(func() error {
		if err := joinWorkload(work); err != nil {
			return err
		}
		if err := setTimerSlack(slack); err != nil {
			return err
		}
		return narrowLauncher(c, cgroupNS)
	})
}

// joinWorkload moves the calling thread into the cgroup whose tasks (v1)
// or cgroup.threads (v2) file the host opened as fd (0: none). "0" names
// the calling thread; the kernel checks the move against the opener's
// credentials.
func joinWorkload(fd int) error {
	if fd <= 0 {
		return nil
	}
	if _, err := unix.Write(fd, []byte("0")); err != nil {
		return fmt.Errorf("launcher: join the workload's cgroup: %w", err)
	}
	return nil
}

// setTimerSlack sets the calling thread's timer slack (ns); 0 keeps it.
func setTimerSlack(ns uint64) error {
	if ns == 0 {
		return nil
	}
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(ns), 0, 0, 0); err != nil {
		return fmt.Errorf("launcher: set the timer slack: %w", err)
	}
	return nil
}

// startLauncher starts the launcher thread, which runs setup (nil: none)
// before it serves anything.
func startLauncher(setup func() error) (*Launcher, error) {
	l := &Launcher{reqs: make(chan func())}
	ready := make(chan error)
	go func() {
		// Never unlocked: the thread's credentials differ from the
		// process's, so no other goroutine may run on it.
		runtime.LockOSThread()
		if setup != nil {
			if err := setup(); err != nil {
				ready <- err
				return
			}
		}
		ready <- nil
		for f := range l.reqs {
			f()
		}
	}()
	if err := <-ready; err != nil {
		return nil, err
	}
	return l, nil
}

// narrowLauncher is what makes the calling (launcher) thread the one
// sandbox processes start from: the new cgroup namespace (entering it needs
// the capabilities dropped next) and the sandbox's capabilities.
func narrowLauncher(c *specs.LinuxCapabilities, cgroupNS bool) error {
	if cgroupNS {
		if err := enterCgroupNS(); err != nil {
			return err
		}
	}
	return dropThreadCapabilities(c)
}

// capSysAdmin is the one capability a staged launcher keeps beyond the
// sandbox's until its start: entering a cgroup namespace needs it.
const capSysAdmin = 1 << unix.CAP_SYS_ADMIN

// stageLauncher prepares the calling (launcher) thread of a pooled agent
// while it waits: the sandbox's default bounding set, no ambient
// capabilities, and the default sets plus CAP_SYS_ADMIN. finishStaged then
// takes only a cgroup namespace and one capset at start.
func stageLauncher() error {
	return setThreadCapabilities(oci.ProcessCapabilities(), capSysAdmin)
}

// finishStaged completes a staged launcher for a sandbox with the default
// capabilities: the timer slack (ns; 0 keeps it), the cgroup namespace,
// then the default sets exactly.
func finishStaged(cgroupNS bool, slack uint64) error {
	if err := setTimerSlack(slack); err != nil {
		return err
	}
	if cgroupNS {
		if err := enterCgroupNS(); err != nil {
			return err
		}
	}
	return capset(oci.ProcessCapabilities(), 0)
}

// Close ends the launcher thread.
func (l *Launcher) Close() {
	if l != nil {
		close(l.reqs)
	}
}

func enterCgroupNS() error {
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("new cgroup namespace: %w", err)
	}
	return nil
}

// Run calls f on the launcher thread. What f starts must be started by the
// time it returns (exec.Cmd.Start forks synchronously, for example).
func (l *Launcher) Run(f func() error) error {
	if l == nil {
		return f()
	}
	done := make(chan error)
	l.reqs <- func() { done <- f() }
	return <-done
}
