package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/wire"
)

// ring keeps the last keep bytes written to it, addressed by absolute offset
// from the first byte ever written, and lets readers wait for more.
//
// A holding ring (HoldOutput) loses nothing: a write waits while keep bytes
// or more are unread (written past the offset the reader last asked for),
// so its writer (the pump) stops reading the pipe and the process blocks on
// its writes; it trims only what was read. Memory stays ≤ keep + one write.
type ring struct {
	mu     sync.Mutex
	keep   int
	buf    []byte
	start  int64 // offset of buf[0]
	closed bool
	notify chan struct{} // closed when data or the end arrives
	hold   bool
	acked  int64         // a holding ring: the reader has everything before this
	space  chan struct{} // a holding ring: closed when the reader moves on
}

func newRing(keep int, hold bool) *ring {
	return &ring{keep: keep, notify: make(chan struct{}), hold: hold, space: make(chan struct{})}
}

func (r *ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for r.hold && !r.closed && r.start+int64(len(r.buf))-r.acked >= int64(r.keep) {
		space := r.space
		r.mu.Unlock()
		<-space
		r.mu.Lock()
	}
	if r.closed {
		// A descendant still holds the pipe after the process was
		// reported finished (or was removed); readers have seen EOF, so
		// this is dropped.
		return len(p), nil
	}
	r.buf = append(r.buf, p...)
	// Trim with slack so trimming is amortized; memory stays ≤ 1.25 × keep.
	if over := len(r.buf) - r.keep; over > r.keep/4 {
		if r.hold {
			over = min(over, int(r.acked-r.start))
		}
		n := copy(r.buf, r.buf[over:])
		r.buf = r.buf[:n]
		r.start += int64(over)
	}
	close(r.notify)
	r.notify = make(chan struct{})
	return len(p), nil
}

// ack records that the reader has everything before off, letting a held
// writer go on.
func (r *ring) ackLocked(off int64) {
	if !r.hold || r.closed || off <= r.acked {
		return
	}
	r.acked = off
	close(r.space)
	r.space = make(chan struct{})
}

func (r *ring) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.closed = true
		close(r.notify)
		close(r.space)
	}
}

// read returns up to max bytes from off; with wait > 0 it blocks until there
// is something new, the stream ends, ctx ends or wait passes.
func (r *ring) read(ctx context.Context, off int64, max int, wait time.Duration) wire.OutputChunk {
	var deadline <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		deadline = t.C
	}
	for {
		r.mu.Lock()
		end := r.start + int64(len(r.buf))
		if off < 0 {
			off = 0
		}
		r.ackLocked(min(off, end))
		if off < end || r.closed || wait <= 0 {
			ch := wire.OutputChunk{Offset: off}
			if off < r.start {
				ch.Dropped = r.start - off
				ch.Offset = r.start
			}
			if ch.Offset > end {
				ch.Offset = end
			}
			lo := int(ch.Offset - r.start)
			hi := min(len(r.buf), lo+max)
			ch.Data = append([]byte(nil), r.buf[lo:hi]...)
			ch.NextOffset = ch.Offset + int64(hi-lo)
			ch.EOF = r.closed && ch.NextOffset == end
			r.mu.Unlock()
			return ch
		}
		n := r.notify
		r.mu.Unlock()
		select {
		case <-n:
		case <-ctx.Done():
			wait = 0
		case <-deadline:
			wait = 0
		}
	}
}

// proc is one background process.
type proc struct {
	id      string
	argv    []string
	pid     int
	started time.Time
	stdout  *ring
	stderr  *ring
	stdin   io.WriteCloser // pipe or pty master; nil when closed
	tty     *os.File       // pty master, when the process has a terminal
	outputs []*os.File     // the agent's read ends of its output
	life    *process
	hold    bool // HoldOutput: its end waits until its output is read
	done    chan struct{}
	mu      sync.Mutex
	exit    *wire.ExitStatus
}

func (p *proc) info() wire.ProcessInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	return wire.ProcessInfo{ID: p.id, Argv: p.argv, Pid: p.pid, Running: p.exit == nil, StartedAt: p.started, Exit: p.exit}
}

// Procs is the table of background processes.
type Procs struct {
	runner *Runner
	mu     sync.Mutex
	seq    int
	m      map[string]*proc
	// reserved counts starts in flight, so concurrent starts cannot
	// overrun MaxProcesses between the check and the insert.
	reserved int
}

// NewProcs returns an empty table that starts processes with runner.
func NewProcs(runner *Runner) *Procs { return &Procs{runner: runner, m: map[string]*proc{}} }

// Start launches req in the background. Output is kept per stream (the last
// wire.ProcessOutputKeep bytes) for re-reading from an offset.
func (ps *Procs) Start(req *wire.ExecRequest) (wire.ProcessInfo, error) {
	if err := ps.reserve(); err != nil {
		return wire.ProcessInfo{}, err
	}
	inserted := false
	defer func() {
		if !inserted {
			ps.mu.Lock()
			ps.reserved--
			ps.mu.Unlock()
		}
	}()
	cmd, err := ps.runner.command(req)
	if err != nil {
		return wire.ProcessInfo{}, err // an *errStart is answered as not_found with its cause
	}
	p := &proc{argv: req.Argv, stdout: newRing(wire.ProcessOutputKeep, req.HoldOutput), stderr: newRing(wire.ProcessOutputKeep, req.HoldOutput),
		hold: req.HoldOutput, done: make(chan struct{})}
	var closeAfterStart, closeOnFailure []*os.File
	var readers []func()
	if req.TTY {
		master, slave, err := OpenPTY()
		if err != nil {
			return wire.ProcessInfo{}, err
		}
		if req.Rows > 0 && req.Cols > 0 {
			if err := setWinsize(master, req.Rows, req.Cols); err != nil {
				_ = master.Close()
				_ = slave.Close()
				return wire.ProcessInfo{}, fmt.Errorf("terminal size: %w", err)
			}
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		cmd.SysProcAttr.Setpgid = false
		cmd.SysProcAttr.Setsid = true
		cmd.SysProcAttr.Setctty = true
		cmd.SysProcAttr.Ctty = 0
		p.tty, p.stdin = master, master
		p.outputs = []*os.File{master}
		closeAfterStart = append(closeAfterStart, slave)
		closeOnFailure = append(closeOnFailure, master)
		readers = append(readers, func() { pumpTo(p.stdout, master) })
	} else {
		outR, outW, errR, errW, err := stdPipes()
		if err != nil {
			return wire.ProcessInfo{}, err
		}
		cmd.Stdout, cmd.Stderr = outW, errW
		p.outputs = []*os.File{outR, errR}
		closeAfterStart = append(closeAfterStart, outW, errW)
		closeOnFailure = append(closeOnFailure, outR, errR)
		readers = append(readers,
			func() { pumpTo(p.stdout, outR); _ = outR.Close() },
			func() { pumpTo(p.stderr, errR); _ = errR.Close() })
		if cmd.Stdin == nil {
			inR, inW, err := os.Pipe()
			if err != nil {
				return wire.ProcessInfo{}, err
			}
			cmd.Stdin = inR
			p.stdin = inW
			closeAfterStart = append(closeAfterStart, inR)
			closeOnFailure = append(closeOnFailure, inW)
		}
	}
	life, err := startProcess(ps.runner.Starter, cmd, closeAfterStart, closeOnFailure, readers, time.Duration(req.TimeoutMs)*time.Millisecond)
	if err != nil {
		return wire.ProcessInfo{}, startError(err)
	}
	p.life, p.pid, p.started = life, life.pid, life.started
	ps.mu.Lock()
	ps.seq++
	p.id = "proc-" + strconv.Itoa(ps.seq)
	ps.m[p.id] = p
	ps.reserved--
	inserted = true
	ps.mu.Unlock()

	go ps.supervise(p)
	return p.info(), nil
}

// supervise records how p ended once its output has drained, or after a
// grace: a descendant may hold its output open.
func (ps *Procs) supervise(p *proc) {
	var cut func() // pipes: leave their readers, whose writes are dropped once the streams end
	if p.tty != nil {
		// The pty reader ends with EIO once every slave fd is closed; a
		// grandchild may keep one open, so end it.
		cut = func() { _ = p.tty.Close() }
	}
	grace := 100 * time.Millisecond
	if p.hold {
		// Its output is held for its reader: the end waits until the
		// reader has it all (or the process is removed, which releases
		// the streams), as a terminal's would.
		grace = heldGrace
	}
	st := p.life.wait(grace, cut, p.outputs...)
	if p.tty != nil {
		_ = p.tty.Close()
	}
	p.mu.Lock()
	p.exit = &st
	p.mu.Unlock()
	p.stdout.close()
	p.stderr.close()
	close(p.done)
}

// reserve takes a slot in the table for a start, evicting the oldest
// exited process when the table is full.
func (ps *Procs) reserve() error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if len(ps.m)+ps.reserved < wire.MaxProcesses {
		ps.reserved++
		return nil
	}
	var oldest *proc
	for _, p := range ps.m {
		select {
		case <-p.done:
			if oldest == nil || p.started.Before(oldest.started) {
				oldest = p
			}
		default:
		}
	}
	if oldest == nil {
		return &apiError{wire.ErrLimit, fmt.Sprintf("%d background processes are running or starting; that is the limit", wire.MaxProcesses)}
	}
	delete(ps.m, oldest.id)
	ps.reserved++
	return nil
}

func (ps *Procs) get(id string) (*proc, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p, ok := ps.m[id]
	if !ok {
		return nil, &apiError{wire.ErrNotFound, fmt.Sprintf("no process %q", id)}
	}
	return p, nil
}

// List returns all processes, oldest first.
func (ps *Procs) List() []wire.ProcessInfo {
	ps.mu.Lock()
	all := make([]*proc, 0, len(ps.m))
	for _, p := range ps.m {
		all = append(all, p)
	}
	ps.mu.Unlock()
	sort.Slice(all, func(i, j int) bool { return all[i].started.Before(all[j].started) })
	out := make([]wire.ProcessInfo, len(all))
	for i, p := range all {
		out[i] = p.info()
	}
	return out
}

// Signal sends sig to the process group of id.
func (ps *Procs) Signal(id, sig string) error {
	p, err := ps.get(id)
	if err != nil {
		return err
	}
	s, err := parseSignal(sig)
	if err != nil {
		return err
	}
	select {
	case <-p.done:
		return &apiError{wire.ErrInvalid, fmt.Sprintf("process %q has exited", id)}
	default:
	}
	if err := unix.Kill(-p.pid, s); err != nil && !errors.Is(err, unix.ESRCH) {
		return err
	}
	return nil
}

// Remove kills id if it runs and forgets it.
func (ps *Procs) Remove(id string) error {
	p, err := ps.get(id)
	if err != nil {
		return err
	}
	p.life.kill()
	// Nobody reads it any more: held writers go on (dropping).
	p.stdout.close()
	p.stderr.close()
	select {
	case <-p.done:
	case <-time.After(2 * time.Second):
	}
	ps.mu.Lock()
	delete(ps.m, id)
	ps.mu.Unlock()
	return nil
}

// KillAll kills every running process (agent shutdown).
func (ps *Procs) KillAll() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, p := range ps.m {
		p.life.kill()
		p.stdout.close()
		p.stderr.close()
	}
}

// heldGrace is how long a process whose output is held waits, once it has
// exited, for its reader to take that output: for as long as its session
// lasts, in practice (a removal releases it).
const heldGrace = 24 * time.Hour

func (p *proc) output(ctx context.Context, stream string, off int64, max int, wait time.Duration) (wire.OutputChunk, error) {
	switch stream {
	case wire.Stdout, "":
		return p.stdout.read(ctx, off, max, wait), nil
	case wire.Stderr:
		return p.stderr.read(ctx, off, max, wait), nil
	}
	return wire.OutputChunk{}, invalidf("stream must be stdout or stderr, not %q", stream)
}

func (p *proc) wait(ctx context.Context) wire.ProcessInfo {
	select {
	case <-p.done:
	case <-ctx.Done():
	}
	return p.info()
}

func (p *proc) writeStdin(r io.Reader, closeAfter bool) error {
	p.mu.Lock()
	w := p.stdin
	p.mu.Unlock()
	if w == nil {
		return invalidf("stdin of process %q is closed", p.id)
	}
	if _, err := io.Copy(w, io.LimitReader(r, wire.MaxStdin)); err != nil {
		return &apiError{wire.ErrInvalid, "write stdin: " + err.Error()}
	}
	if closeAfter && p.tty == nil {
		p.mu.Lock()
		p.stdin = nil
		p.mu.Unlock()
		return w.Close()
	}
	return nil
}

func (p *proc) resize(rows, cols uint16) error {
	if p.tty == nil {
		return invalidf("process %q has no terminal", p.id)
	}
	return setWinsize(p.tty, rows, cols)
}

func setWinsize(tty *os.File, rows, cols uint16) error {
	return unix.IoctlSetWinsize(int(tty.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
}

// OpenPTY opens a new pseudo-terminal pair.
func OpenPTY() (master, slave *os.File, err error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	fd := int(m.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		_ = m.Close()
		return nil, nil, fmt.Errorf("unlock pty: %w", err)
	}
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err != nil {
		_ = m.Close()
		return nil, nil, fmt.Errorf("pty number: %w", err)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		_ = m.Close()
		return nil, nil, fmt.Errorf("open pty slave: %w", err)
	}
	return m, s, nil
}

func parseSignal(s string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 || n > 64 {
			return 0, invalidf("signal %d out of range", n)
		}
		return syscall.Signal(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, invalidf("unknown signal %q", s)
}
