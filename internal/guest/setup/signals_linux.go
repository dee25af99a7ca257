package setup

import (
	"os"
	"os/signal"
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
func DiscardSignals() {
	c := make(chan os.Signal, 64)
	signal.Notify(c)
	go func() {
		for range c { //nolint:revive // draining is the point
		}
	}()
}
