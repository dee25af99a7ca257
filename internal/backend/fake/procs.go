package fake

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/wire"
)

// process is one background process: a fake command run in a goroutine,
// its output kept as the real agent keeps it (the last
// wire.ProcessOutputKeep bytes of each stream, read by offset).
type process struct {
	id      string
	argv    []string
	pid     int
	started time.Time
	tty     bool
	stdout  *ring
	stderr  *ring // unused with a terminal: its output is all on stdout
	stdin   *inbox

	kill     chan struct{}
	killOnce sync.Once
	done     chan struct{} // closed once exit is set

	mu       sync.Mutex
	signal   int  // the signal kill was closed for
	timedOut bool // by the request's timeout
	exit     *wire.ExitStatus
	rows     uint16
	cols     uint16
}

func (p *process) info() wire.ProcessInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	return wire.ProcessInfo{ID: p.id, Argv: p.argv, Pid: p.pid, Running: p.exit == nil, StartedAt: p.started, Exit: p.exit}
}

// sendSignal ends the process as signal n would (no fake command handles
// a signal).
func (p *process) sendSignal(n int) {
	p.killOnce.Do(func() {
		p.mu.Lock()
		p.signal = n
		p.mu.Unlock()
		close(p.kill)
	})
}

// procs is an agent's table of background processes.
type procs struct {
	mu  sync.Mutex
	seq int
	m   map[string]*process
	wg  sync.WaitGroup // the processes' goroutines
}

func newProcs() *procs { return &procs{m: map[string]*process{}} }

// start runs req's command in the background until it ends, is killed or
// the agent ends (gone). A command the fake does not have is not_found,
// as an executable the real agent cannot start.
func (ps *procs) start(sb *Sandbox, req *wire.ExecRequest, gone <-chan struct{}) (wire.ProcessInfo, error) {
	if err := validate(req); err != nil {
		return wire.ProcessInfo{}, err
	}
	if !known(req.Argv) {
		return wire.ProcessInfo{}, &fsError{kind: wire.ErrNotFound, cause: wire.CauseNotFound, msg: "executable not found: " + req.Argv[0]}
	}
	p := &process{argv: req.Argv, started: time.Now(), tty: req.TTY, rows: req.Rows, cols: req.Cols,
		stdout: newRing(), stderr: newRing(), stdin: newInbox(), kill: make(chan struct{}), done: make(chan struct{})}
	if len(req.Stdin) > 0 {
		_ = p.stdin.write(req.Stdin, false)
	}
	ps.mu.Lock()
	if err := ps.makeRoom(); err != nil {
		ps.mu.Unlock()
		return wire.ProcessInfo{}, err
	}
	ps.seq++
	p.id, p.pid = "proc-"+strconv.Itoa(ps.seq), 100+ps.seq
	ps.m[p.id] = p
	ps.wg.Add(1)
	ps.mu.Unlock()
	out := func(stream string, b []byte) {
		if stream == wire.Stderr && !p.tty {
			p.stderr.write(b)
			return
		}
		p.stdout.write(b)
	}
	var timer *time.Timer
	if req.TimeoutMs > 0 {
		timer = time.AfterFunc(time.Duration(req.TimeoutMs)*time.Millisecond, func() {
			p.mu.Lock()
			p.timedOut = true
			p.mu.Unlock()
			p.sendSignal(9)
		})
	}
	go func() {
		defer ps.wg.Done()
		if timer != nil {
			defer timer.Stop()
		}
		st, how := (&run{argv: req.Argv, stdin: p.stdin, out: out, sb: sb, kill: p.kill, gone: gone}).do()
		p.mu.Lock()
		if how != exited {
			n := max(p.signal, 9) // lost: the agent's end kills it
			st = wire.ExitStatus{Code: 128 + n, Signal: signalName(n), TimedOut: p.timedOut}
		}
		st.DurationMs = float64(time.Since(p.started).Microseconds()) / 1000
		p.exit = &st
		p.mu.Unlock()
		p.stdout.close()
		p.stderr.close()
		close(p.done)
	}()
	return p.info(), nil
}

// makeRoom keeps the table within wire.MaxProcesses by forgetting the
// oldest exited process; with none exited a start is refused (limit).
func (ps *procs) makeRoom() error {
	if len(ps.m) < wire.MaxProcesses {
		return nil
	}
	var oldest *process
	for _, p := range ps.m {
		select {
		case <-p.done:
			if oldest == nil || p.started.Before(oldest.started) || (p.started.Equal(oldest.started) && p.pid < oldest.pid) {
				oldest = p
			}
		default:
		}
	}
	if oldest == nil {
		return errorf(wire.ErrLimit, "%d background processes are running or starting; that is the limit", wire.MaxProcesses)
	}
	delete(ps.m, oldest.id)
	return nil
}

func (ps *procs) get(id string) (*process, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p := ps.m[id]
	if p == nil {
		return nil, errorf(wire.ErrNotFound, "no process %q", id)
	}
	return p, nil
}

// list describes every process, oldest first.
func (ps *procs) list() []wire.ProcessInfo {
	ps.mu.Lock()
	all := make([]*process, 0, len(ps.m))
	for _, p := range ps.m {
		all = append(all, p)
	}
	ps.mu.Unlock()
	slices.SortFunc(all, func(a, b *process) int { return a.pid - b.pid })
	out := make([]wire.ProcessInfo, len(all))
	for i, p := range all {
		out[i] = p.info()
	}
	return out
}

func (ps *procs) signal(id, sig string) error {
	p, err := ps.get(id)
	if err != nil {
		return err
	}
	n, err := parseSignal(sig)
	if err != nil {
		return err
	}
	select {
	case <-p.done:
		return errorf(wire.ErrInvalid, "process %q has exited", id)
	default:
	}
	p.sendSignal(n)
	return nil
}

// remove kills id if it runs and forgets it, after waiting (at most 2 s,
// as the real agent does) for it to end.
func (ps *procs) remove(id string) error {
	p, err := ps.get(id)
	if err != nil {
		return err
	}
	p.sendSignal(9)
	t := time.NewTimer(2 * time.Second)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
	}
	ps.mu.Lock()
	delete(ps.m, id)
	ps.mu.Unlock()
	return nil
}

func (p *process) output(ctx context.Context, stream string, off int64, limit int, wait time.Duration) (wire.OutputChunk, error) {
	switch stream {
	case wire.Stdout, "":
		return p.stdout.read(ctx, off, limit, wait), nil
	case wire.Stderr:
		return p.stderr.read(ctx, off, limit, wait), nil
	}
	return wire.OutputChunk{}, errorf(wire.ErrInvalid, "stream must be stdout or stderr, not %q", stream)
}

func (p *process) writeStdin(b []byte, eof bool) error {
	if p.tty {
		eof = false // a terminal is not closed by its input
	}
	if err := p.stdin.write(b, eof); err != nil {
		return errorf(wire.ErrInvalid, "process %q: %v", p.id, err)
	}
	return nil
}

func (p *process) resize(rows, cols uint16) error {
	if !p.tty {
		return errorf(wire.ErrInvalid, "process %q has no terminal", p.id)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rows, p.cols = rows, cols
	return nil
}

// signals are the names the fake knows; a number from 1 to 64 is taken too.
var signals = map[string]int{"SIGHUP": 1, "SIGINT": 2, "SIGQUIT": 3, "SIGKILL": 9, "SIGUSR1": 10, "SIGUSR2": 12, "SIGTERM": 15}

func parseSignal(s string) (int, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 || n > 64 {
			return 0, errorf(wire.ErrInvalid, "signal %d out of range", n)
		}
		return n, nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if n, ok := signals[name]; ok {
		return n, nil
	}
	return 0, errorf(wire.ErrInvalid, "unknown signal %q", s)
}

func signalName(n int) string {
	for name, m := range signals {
		if m == n {
			return name
		}
	}
	return fmt.Sprintf("signal %d", n)
}

// ring keeps (at least) the last wire.ProcessOutputKeep bytes written to it,
// addressed by offset from the first byte ever written, and lets readers
// wait for more.
type ring struct {
	mu     sync.Mutex
	buf    []byte
	start  int64 // offset of buf[0]
	closed bool
	more   chan struct{} // closed and replaced at every write and at close
}

func newRing() *ring { return &ring{more: make(chan struct{})} }

func (r *ring) write(b []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.buf = append(r.buf, b...)
	// Trimmed with slack, as the real agent does: at most 1.25 × the keep.
	if over := len(r.buf) - wire.ProcessOutputKeep; over > wire.ProcessOutputKeep/4 {
		n := copy(r.buf, r.buf[over:])
		r.buf = r.buf[:n]
		r.start += int64(over)
	}
	close(r.more)
	r.more = make(chan struct{})
}

func (r *ring) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.closed = true
		close(r.more)
	}
}

// read returns up to limit bytes from off, as the real agent does: an
// offset older than what is kept reads from the oldest kept byte and says
// how many were dropped; with wait > 0 it waits for something new, the
// end of the stream, ctx or wait.
func (r *ring) read(ctx context.Context, off int64, limit int, wait time.Duration) wire.OutputChunk {
	var deadline <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		deadline = t.C
	}
	off = max(off, 0)
	for {
		r.mu.Lock()
		end := r.start + int64(len(r.buf))
		if off < end || r.closed || wait <= 0 {
			ch := wire.OutputChunk{Offset: min(max(off, r.start), end)}
			if off < r.start {
				ch.Dropped = r.start - off
			}
			lo := int(ch.Offset - r.start)
			hi := min(len(r.buf), lo+limit)
			ch.Data = append([]byte(nil), r.buf[lo:hi]...)
			ch.NextOffset = ch.Offset + int64(hi-lo)
			ch.EOF = r.closed && ch.NextOffset == end
			r.mu.Unlock()
			return ch
		}
		more := r.more
		r.mu.Unlock()
		select {
		case <-more:
		case <-ctx.Done():
			wait = 0
		case <-deadline:
			wait = 0
		}
	}
}
