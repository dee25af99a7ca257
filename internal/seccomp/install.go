//go:build linux

package seccomp

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Install sets no_new_privs and installs the program on every thread of the
// process: seccomp(2) SECCOMP_SET_MODE_FILTER with SECCOMP_FILTER_FLAG_TSYNC,
// because the Go runtime is multi-threaded and a filter on one thread alone
// would leave the others unfiltered. Threads created later inherit the filter.
// Filters stack: installing twice applies both.
func Install(prog []unix.SockFilter) error {
	if len(prog) == 0 {
		return errors.New("seccomp: empty program")
	}
	if len(prog) > unix.BPF_MAXINSNS {
		return fmt.Errorf("seccomp: program has %d instructions, more than the kernel's %d", len(prog), unix.BPF_MAXINSNS)
	}
	// no_new_privs is per thread and must be set on the thread that calls
	// seccomp; TSYNC then copies it, with the filter, to every other thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("seccomp: set no_new_privs: %w", err)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}                                                                            //nolint:gosec // len(prog) <= BPF_MAXINSNS (4096) is checked above
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog))) //nolint:gosec // seccomp(2) takes a pointer to the sock_fprog; prog is kept alive below
	runtime.KeepAlive(prog)
	if errno != 0 {
		return fmt.Errorf("seccomp: seccomp(SECCOMP_SET_MODE_FILTER, TSYNC): %w", errno)
	}
	if r != 0 {
		// With TSYNC, a positive result is the ID of a thread that could not
		// be synchronised; nothing was installed.
		return fmt.Errorf("seccomp: thread %d could not be synchronised; filter not installed", r)
	}
	return nil
}
