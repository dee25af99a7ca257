package cgroup

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// Spawn is SpawnInto for c from this process, as the tests use it. (The
// product spawns through warren-spawner, package spawner; these tests
// exercise the cgroup layer on its own.)
func (c *Cgroup) Spawn(start func(cgroupFD int) error) error {
	t, err := c.OpenSpawnTarget()
	if err != nil {
		return err
	}
	defer t.Close()
	fds := make([]int, len(t.Files))
	for i, f := range t.Files {
		fds[i] = int(f.Fd())
	}
	return SpawnInto(t.V2, fds, start)
}

// SpawnInto calls start so that the process it creates is born inside the
// cgroup of a SpawnTarget's descriptors. On v2 start receives the directory fd and must start the
// process with SysProcAttr{UseCgroupFD: true, CgroupFD: fd} (clone3
// CLONE_INTO_CGROUP). On v1 start receives -1 (it must then not set
// UseCgroupFD) and its thread has joined every hierarchy through the tasks
// files, so a fork from it lands there.
//
// In both modes start runs on a dedicated OS thread that is discarded
// afterwards, so it may change per-thread state the child should inherit
// (the capability bounding set, say). start must create the process
// synchronously and must not leave goroutines depending on the thread.
func SpawnInto(v2 bool, fds []int, start func(cgroupFD int) error) error {
	if len(fds) == 0 {
		return errors.New("no cgroup to spawn in")
	}
	var err error
	runOnFreshThread(func() {
		if v2 {
			err = start(fds[0])
			return
		}
		// Every v1 migration waits for an RCU grace period, so the
		// thread is not moved back: it is discarded right after start
		// returns, and a thread leaves its cgroups on exit at no such
		// cost.
		tid := []byte(strconv.Itoa(unix.Gettid()))
		for _, fd := range fds {
			if _, werr := unix.Write(fd, tid); werr != nil {
				err = fmt.Errorf("cgroup: join by tasks file: %w", werr)
				return
			}
		}
		err = start(-1)
	})
	return err
}

// runOnFreshThread runs f on a goroutine locked to an OS thread that is
// destroyed when f returns. If that thread is the process's main thread
// (which the runtime never destroys), it stays locked to hold the main thread
// and f runs on a nested goroutine, which therefore gets another thread.
func runOnFreshThread(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			runOnFreshThread(f)
			runtime.UnlockOSThread()
			return
		}
		f()
		// No UnlockOSThread: the goroutine exits locked, so the runtime
		// terminates this thread instead of reusing it.
	}()
	<-done
}
