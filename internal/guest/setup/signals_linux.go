package setup

import (
	"os"
	"os/signal"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DiscardSignals makes PID 1 deaf to signals sent from inside the sandbox.
//
// The kernel delivers to a PID namespace's init, from its own namespace,
// only the signals it has a handler for (SIGKILL and SIGSTOP never), and the
// Go runtime installs a handler for nearly every signal, exiting on most of
// them (SIGTERM, SIGINT, SIGHUP, a SIGSEGV sent with kill, ...): sandbox code
// that shares the agent's uid could end its own sandbox that way. Relaying
// every signal to a channel that is drained keeps the handlers, so nothing
// is delivered by default, while a fault of the agent's own (a synchronous
// SIGSEGV) still panics. A handler, unlike SIG_IGN, is reset by execve, so
// the processes the agent starts keep default dispositions. The host stops
// the agent with SIGKILL, from outside, which this cannot catch.
//
// Two signals Go will not relay: 32 and 34 (glibc's and musl's internal
// ones) keep their default action, which Linux 6.1 still carries out on a
// namespace's init when the signal is sent while the main thread blocks it
// (the runtime blocks every signal around thread creation and fork) and
// another thread does not: kill -34 1, repeated, ended the agent about
// once in two tries there. Those two are ignored instead. Unlike a
// handler, SIG_IGN survives execve, so the sandbox's processes start with
// them ignored too; the C libraries install their own handlers before
// they use them.
func DiscardSignals() error {
	for _, sig := range []int{32, 34} {
		if err := ignoreSignal(sig); err != nil {
			return err
		}
	}
	c := make(chan os.Signal, 64)
	signal.Notify(c)
	go func() {
		for range c { //nolint:revive // draining is the point
		}
	}()
	return nil
}

// ignoreSignal sets sig to SIG_IGN with rt_sigaction: os/signal refuses the
// signals the Go runtime reserves for C libraries.
func ignoreSignal(sig int) error {
	// The kernel's struct sigaction on 64-bit Linux: handler, flags,
	// restorer, mask.
	act := struct {
		handler  uintptr
		flags    uint64
		restorer uintptr
		mask     uint64
	}{handler: 1} // SIG_IGN
	if _, _, errno := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&act)), 0, 8, 0, 0); errno != 0 { //nolint:gosec // the kernel reads act, a struct laid out as its sigaction, during the call
		return os.NewSyscallError("rt_sigaction "+syscall.Signal(sig).String(), errno)
	}
	return nil
}
