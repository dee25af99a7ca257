package fake

import (
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/wire"
)

// A run is one run of a fake command, in the foreground (exec) or in the
// background (a process). The commands are few and run in-process, so
// their results are the same everywhere; see agent.go for the list.
type run struct {
	argv  []string
	stdin *inbox
	out   func(stream string, b []byte)
	sb    *Sandbox
	// kill is closed to end the command as a signal would (a timeout, a
	// signal to a process); gone is closed when no one is left to tell
	// (the agent ended, the client went away).
	kill, gone <-chan struct{}
}

// outcome is how a run ended.
type outcome int

const (
	exited outcome = iota // with the status run returned
	killed                // by kill
	lost                  // by gone: there is no one to tell
)

// do runs the command; an unknown one exits 127 with Error set, as a
// missing executable does in the real agent.
func (r *run) do() (wire.ExitStatus, outcome) {
	if base(r.argv[0]) != "sh" {
		return r.command(r.argv, r.out)
	}
	// A shell runs its script (sh -c SCRIPT) as commands separated by
	// ";", each split at spaces (no quoting, variables or pipes), whose
	// output goes to stderr when its last word is ">&2". The status is
	// the last command's; exit ends the script.
	if len(r.argv) != 3 || r.argv[1] != "-c" {
		r.out(wire.Stderr, []byte("sh: the fake sh takes only -c SCRIPT\n"))
		return wire.ExitStatus{Code: 2}, exited
	}
	var st wire.ExitStatus
	for line := range strings.SplitSeq(r.argv[2], ";") {
		argv := strings.Fields(line)
		out := r.out
		if n := len(argv); n > 0 && argv[n-1] == ">&2" {
			argv = argv[:n-1]
			out = func(_ string, b []byte) { r.out(wire.Stderr, b) }
		}
		if len(argv) == 0 {
			continue
		}
		var how outcome
		if st, how = r.command(argv, out); how != exited || argv[0] == "exit" {
			return st, how
		}
		if st.Error != "" {
			// As a shell says it, and goes on.
			r.out(wire.Stderr, []byte("sh: "+st.Error+"\n"))
			st.Error = ""
		}
	}
	return st, exited
}

// command runs one command, its output to out.
func (r *run) command(argv []string, out func(string, []byte)) (wire.ExitStatus, outcome) {
	args := argv[1:]
	var st wire.ExitStatus
	switch base(argv[0]) {
	case "echo":
		out(wire.Stdout, []byte(strings.Join(args, " ")+"\n"))
	case "true":
	case "false":
		st.Code = 1
	case "exit":
		if len(args) == 1 {
			st.Code, _ = strconv.Atoi(args[0])
		}
	case "spew":
		n := 0
		if len(args) == 1 {
			n, _ = strconv.Atoi(args[0])
		}
		chunk := []byte(strings.Repeat("x", 32<<10))
		for ; n > 0; n -= len(chunk) {
			out(wire.Stdout, chunk[:min(n, len(chunk))])
		}
	case "cat":
		for {
			b, eof, more := r.stdin.take()
			if len(b) > 0 {
				out(wire.Stdout, b)
				continue
			}
			if eof {
				break
			}
			select {
			case <-more:
			case <-r.kill:
				return st, killed
			case <-r.gone:
				return st, lost
			}
		}
	case "python3", "node":
		lang, flag := "python", "-c"
		if base(argv[0]) == "node" {
			lang, flag = "node", "-e"
		}
		if len(args) != 2 || args[0] != flag {
			out(wire.Stderr, []byte(argv[0]+": the fake takes only "+flag+" CODE\n"))
			st.Code = 2
			break
		}
		res, how := newRepls().run(lang, args[1], r.kill, r.gone)
		if how != exited {
			return st, how
		}
		for _, l := range res.Output {
			out(l.Stream, []byte(l.Text+"\n"))
		}
		if res.Status != wire.ReplSuccess {
			st.Code = 1
		}
	case "oom":
		r.sb.oomKill()
		return wire.ExitStatus{Code: 128 + 9, Signal: "SIGKILL"}, exited
	case "sleep":
		var secs float64
		if len(args) == 1 {
			secs, _ = strconv.ParseFloat(args[0], 64)
		}
		t := time.NewTimer(time.Duration(secs * float64(time.Second)))
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.kill:
			return st, killed
		case <-r.gone:
			return st, lost
		}
	case "hang":
		// Deaf to kill: an agent that stops answering.
		<-r.gone
		return st, lost
	default:
		return wire.ExitStatus{Code: 127, Error: "executable not found: " + argv[0]}, exited
	}
	return st, exited
}

// base names a command given by path (/bin/echo, /usr/bin/true) as the
// fake's own.
func base(name string) string {
	if strings.HasPrefix(name, "/bin/") || strings.HasPrefix(name, "/usr/bin/") {
		return path.Base(name)
	}
	return name
}

// known reports whether the fake has argv's command (sh counts as known:
// what its script runs is its business).
func known(argv []string) bool {
	switch base(argv[0]) {
	case "echo", "true", "false", "exit", "spew", "cat", "python3", "node", "oom", "sleep", "hang", "sh":
		return true
	}
	return false
}

// inbox is a command's stdin: what was written and not yet read, and
// whether it was closed.
type inbox struct {
	mu     sync.Mutex
	buf    []byte
	closed bool
	more   chan struct{} // closed and replaced at every write and at close
}

func newInbox() *inbox { return &inbox{more: make(chan struct{})} }

// fullInbox is the stdin of an exec: all of it, then EOF.
func fullInbox(b []byte) *inbox {
	in := newInbox()
	in.buf, in.closed = b, true
	return in
}

// take returns what is pending (nil if nothing), whether the end was
// reached, and a channel that is closed when there may be more.
func (in *inbox) take() (b []byte, eof bool, more <-chan struct{}) {
	in.mu.Lock()
	defer in.mu.Unlock()
	b, in.buf = in.buf, nil
	return b, in.closed && len(b) == 0, in.more
}

// write adds b, then closes the inbox if eof is set. Pending input is
// bounded as a pipe's is, but with an error instead of a block.
func (in *inbox) write(b []byte, eof bool) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	switch {
	case in.closed:
		return errorf(wire.ErrInvalid, "stdin is closed")
	case len(in.buf)+len(b) > wire.MaxStdin:
		return errorf(wire.ErrInvalid, "write stdin: more than %d bytes pending: the process does not read its input", wire.MaxStdin)
	}
	in.buf = append(in.buf, b...)
	in.closed = eof
	close(in.more)
	in.more = make(chan struct{})
	return nil
}
