// Package timerslack sets how late the kernel may wake a thread's timed
// sleeps so as to batch wakeups (prctl PR_SET_TIMERSLACK), for a whole Go
// process.
//
// Why Warren wants a coarse one: the Go runtime's monitor thread (sysmon)
// sleeps 20 µs at a time while its process is busy, and retakes the P of
// every system call that outlasts a sleep, handing goroutines from thread
// to thread. A sandbox's start and stop is a burst of slow system calls in
// the host and in the agent, so on a small VM those wakeups were ~40% of
// the context switches of a cold start and 0.3 ms of it on each side. A
// slack of a millisecond lets the kernel fold them together; what it costs
// is the precision of the process's own timers (timeouts, tickers), which
// Warren needs to the millisecond at best.
//
// A process's children inherit the slack of the thread that forks them, so
// what Warren starts for users gets Original back: the agent's launcher
// thread, which forks every sandbox process, sets it (boot.Config).
package timerslack

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Coarse is the slack Warren's own processes run with: the host process
// that runs sandboxes (its commands call Coarsen) and every agent (the
// spawner sets it before the agent's exec).
const Coarse = time.Millisecond

// original is the calling thread's slack before Coarsen changed any.
var original = sync.OnceValue(func() uint64 {
	ns, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err != nil || ns <= 0 {
		return 0
	}
	return uint64(ns)
})

// Original is the process's timer slack (ns) as it was before Coarsen: what
// its children should start with. 0 when it cannot be read (a real-time
// thread's reads as 0 on some kernels); Warren then leaves its agents'
// slack alone too, so that nothing of a sandbox's can end up coarse.
func Original() uint64 { return original() }

// UseOriginal locks the calling goroutine to its thread and gives the
// thread the Original slack, so that the processes it starts get it (a
// baseline measured next to Warren, say); restore gives the thread its
// slack back and unlocks it.
func UseOriginal() (restore func()) {
	runtime.LockOSThread()
	cur, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	orig := Original()
	if err != nil || orig == 0 || uint64(cur) == orig { //nolint:gosec // PR_GET_TIMERSLACK returns the slack in ns, never negative
		return runtime.UnlockOSThread
	}
	if unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(orig), 0, 0, 0) != nil {
		return runtime.UnlockOSThread
	}
	return func() {
		_ = unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(cur), 0, 0, 0)
		runtime.UnlockOSThread()
	}
}

// Coarsen sets the timer slack of every thread of the process to d and
// records the one it had (Original). Threads started later inherit it from
// the thread that starts them. Other threads' slack can only be set with
// CAP_SYS_NICE; without it, only the calling thread's changes and the
// error says so.
func Coarsen(d time.Duration) error {
	if d <= 0 || d > time.Second {
		return fmt.Errorf("timer slack %v: want more than 0, at most 1s", d)
	}
	original()
	ns := uint64(d.Nanoseconds()) //nolint:gosec // d is checked to be in (0, 1s] above
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(ns), 0, 0, 0); err != nil {
		return fmt.Errorf("timer slack: %w", err)
	}
	val := []byte(strconv.FormatUint(ns, 10))
	// A thread started during a pass by one not yet set would keep the old
	// slack: passes repeat until one finds no thread it has not set.
	done := map[string]bool{}
	for pass := 0; pass < 10; pass++ {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("timer slack: %w", err)
		}
		var errs []error
		fresh := false
		for _, t := range tasks {
			if done[t.Name()] {
				continue
			}
			fresh = true
			done[t.Name()] = true
			// /proc/TID names any thread, and is where its own slack is.
			err := os.WriteFile("/proc/"+t.Name()+"/timerslack_ns", val, 0)
			if err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ESRCH) { // not one that ended meanwhile
				errs = append(errs, err)
			}
		}
		if len(errs) > 0 {
			return fmt.Errorf("timer slack of the process's other threads: %w", errors.Join(errs...))
		}
		if !fresh {
			return nil
		}
	}
	return nil
}
