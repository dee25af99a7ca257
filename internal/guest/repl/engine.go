//go:build linux

package repl

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/wire"
)

//go:embed driver.py
var driverPython string

//go:embed driver.js
var driverNode string

const (
	// startTimeout bounds an interpreter's start-up, up to its hello frame.
	startTimeout = 30 * time.Second
	// markerWait bounds the wait for end markers after a result frame; they
	// were written before it, so they are normally already in the pipes.
	markerWait = 2 * time.Second
	// drainWait bounds the wait for the last output of a dead interpreter.
	drainWait = time.Second
	// exitWait bounds the wait for a killed interpreter to be reaped.
	exitWait = 10 * time.Second
	// pipeSize is the capacity asked for the control pipes.
	pipeSize = 1 << 20
)

// engine runs one language. sem serializes runs; mu guards proc, which is
// nil until the first run and after a death.
type engine struct {
	m    *Manager
	lang string
	sem  chan struct{}

	mu   sync.Mutex
	proc *proc
}

func newEngine(m *Manager, lang string) *engine {
	return &engine{m: m, lang: lang, sem: make(chan struct{}, 1)}
}

func (e *engine) run(ctx context.Context, code string, timeout time.Duration, limit int) (wire.ReplResult, error) {
	select {
	case e.sem <- struct{}{}:
	case <-ctx.Done():
		return wire.ReplResult{}, ctx.Err()
	}
	defer func() { <-e.sem }()
	if err := ctx.Err(); err != nil {
		return wire.ReplResult{}, err
	}
	p, err := e.get(ctx)
	if err != nil {
		return wire.ReplResult{}, err
	}
	opts := e.m.opts
	if limit > 0 {
		opts.OutputLimit = limit
	}
	res, alive := p.run(ctx, code, timeout, opts)
	if alive {
		return res, nil
	}
	// The interpreter died during the run: replace it.
	e.mu.Lock()
	if e.proc == p {
		e.proc = nil
	}
	e.mu.Unlock()
	p.cleanup()
	if e.m.isClosed() {
		return res, ErrClosed
	}
	// Start the fresh interpreter now so the next run finds it warm; if this
	// fails, the next run tries again and reports the error.
	sctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	_, _ = e.get(sctx)
	return res, nil
}

// get returns the running interpreter, starting one if there is none or
// the last one died.
func (e *engine) get(ctx context.Context) (*proc, error) {
	e.mu.Lock()
	p := e.proc
	if p != nil && p.isDead() {
		e.proc = nil
		p.cleanup()
		p = nil
	}
	e.mu.Unlock()
	if p != nil {
		return p, nil
	}
	if e.m.isClosed() {
		return nil, ErrClosed
	}
	p, err := startProc(ctx, e.m.opts, e.lang)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m.isClosed() {
		p.kill()
		p.cleanup()
		return nil, ErrClosed
	}
	e.proc = p
	return p, nil
}

// shutdown kills the interpreter and waits for it.
func (e *engine) shutdown() {
	e.mu.Lock()
	p := e.proc
	e.proc = nil
	e.mu.Unlock()
	if p != nil {
		p.kill()
		p.cleanup()
	}
}

// proc is one interpreter process and its channels.
type proc struct {
	lang    string
	cmd     *exec.Cmd
	pid     int
	group   bool // the interpreter leads its own process group
	starter Starter

	ctlW *os.File // commands to the driver
	wmu  sync.Mutex
	ctlR *os.File // frames from the driver
	outR *os.File // the interpreter's fd 1
	errR *os.File // the interpreter's fd 2

	prefix []byte // end marker prefix, random per process

	seq     uint64 // last run id; touched only by the running run
	runSeq  atomic.Uint64
	resSeq  atomic.Uint64    // last run whose result frame was read
	rawMark [2]atomic.Uint64 // last run whose end marker was read, per pipe
	cur     atomic.Pointer[collector]

	results   chan resultFrame
	markCh    chan struct{}
	hello     chan struct{}
	helloOnce sync.Once
	protoErr  atomic.Pointer[string]

	exited      chan struct{} // closed once reaped
	waitState   *os.ProcessState
	readersDone chan struct{}
	cleanOnce   sync.Once
}

type runCommand struct {
	ID            uint64 `json:"id"`
	Code          string `json:"code"`
	Marker        string `json:"marker"`
	Interruptible bool   `json:"interruptible"`
	// Limit is the bytes of output the driver forwards in this run.
	Limit int `json:"limit"`
}

// startProc starts an interpreter and waits for its driver's hello.
func startProc(ctx context.Context, opts Options, lang string) (*proc, error) {
	var argv []string
	switch lang {
	case Python:
		argv = []string{opts.Python, "-I", "-u", "-c", driverPython}
	case Node:
		argv = []string{opts.Node, "-e", driverNode}
	default:
		return nil, fmt.Errorf("repl: unknown language %q", lang)
	}
	var token [16]byte
	// getrandom directly, not crypto/rand (see fs.withTempName).
	if n, err := unix.Getrandom(token[:], 0); err != nil {
		return nil, fmt.Errorf("repl: random token: %w", err)
	} else if n != len(token) {
		return nil, fmt.Errorf("repl: random token: %d of %d bytes", n, len(token))
	}
	var err error
	p := &proc{
		lang:        lang,
		prefix:      []byte("\x00\x1bwarren-end:" + hex.EncodeToString(token[:]) + ":"),
		results:     make(chan resultFrame, 8),
		markCh:      make(chan struct{}, 1),
		hello:       make(chan struct{}),
		exited:      make(chan struct{}),
		readersDone: make(chan struct{}),
		starter:     opts.Starter,
	}

	var childEnds []*os.File
	defer func() {
		for _, f := range childEnds {
			_ = f.Close()
		}
	}()
	pipe := func() (r, w *os.File) {
		if err != nil {
			return nil, nil
		}
		r, w, err = os.Pipe()
		return r, w
	}
	var outW, errW, cmdR, frW *os.File
	p.outR, outW = pipe()
	p.errR, errW = pipe()
	cmdR, p.ctlW = pipe()
	p.ctlR, frW = pipe()
	childEnds = []*os.File{outW, errW, cmdR, frW}
	if err != nil {
		p.closeFiles()
		return nil, fmt.Errorf("repl: start %s: %w", lang, err)
	}
	// Larger control pipes mean fewer hand-offs for big code and floods of
	// output; a failure only costs speed.
	for _, f := range []*os.File{p.ctlW, p.ctlR} {
		if sc, err := f.SyscallConn(); err == nil {
			_ = sc.Control(func(fd uintptr) { _, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, pipeSize) })
		}
	}

	cmd := exec.Command(argv[0], argv[1:]...) //nolint:gosec // argv is the interpreter path from the agent's options and a fixed driver script (see above), not client input
	cmd.Env = append([]string(nil), opts.Env...)
	cmd.Dir = opts.Dir
	cmd.Stdout = outW
	cmd.Stderr = errW
	cmd.ExtraFiles = []*os.File{cmdR, frW} // fd 3, fd 4
	var attr *syscall.SysProcAttr
	if opts.SysProcAttr != nil {
		attr = opts.SysProcAttr()
	}
	if attr == nil {
		attr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	}
	cmd.SysProcAttr = attr
	p.group = attr.Setsid || (attr.Setpgid && attr.Pgid == 0)
	p.cmd = cmd
	if p.starter != nil {
		err = p.starter.Start(cmd)
	} else {
		err = cmd.Start()
	}
	if err != nil {
		p.closeFiles()
		return nil, fmt.Errorf("repl: start %s: %w", lang, err)
	}
	p.pid = cmd.Process.Pid
	for _, f := range childEnds {
		_ = f.Close()
	}
	childEnds = nil

	go p.wait()
	// A collector for start-up, so a driver that fails to start can say why.
	startup := newCollector(1, 8192)
	p.cur.Store(startup)
	var readers sync.WaitGroup
	readers.Add(3)
	go func() { defer readers.Done(); p.readControl() }()
	go func() { defer readers.Done(); p.readRaw(0, p.outR) }()
	go func() { defer readers.Done(); p.readRaw(1, p.errR) }()
	go func() { readers.Wait(); close(p.readersDone) }()

	cfg, _ := json.Marshal(map[string]int{"limit": opts.OutputLimit})
	go func() { _ = p.send(frameConfig, cfg) }()

	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case <-p.hello:
		p.cur.Store(nil)
		return p, nil
	case <-p.exited:
		err = fmt.Errorf("repl: %s interpreter exited during start-up (%s)", lang, p.exitText())
	case <-ctx.Done():
		err = fmt.Errorf("repl: start %s: %w", lang, ctx.Err())
	case <-timer.C:
		err = fmt.Errorf("repl: %s interpreter did not start within %v", lang, startTimeout)
	}
	p.kill()
	p.cleanup()
	if lines, _ := startup.finish(); len(lines) > 0 {
		msg := ""
		for i, l := range lines {
			if i == 5 {
				break
			}
			msg += "\n" + l.Text
		}
		err = fmt.Errorf("%w; output:%s", err, msg)
	}
	return nil, err
}

// wait reaps the interpreter. When it leads its own process group, the
// group is killed first, while the unreaped leader still pins the group id,
// so nothing the interpreter started outlives it.
func (p *proc) wait() {
	if p.group {
		var info unix.Siginfo
		for {
			err := unix.Waitid(unix.P_PID, p.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
			if err != unix.EINTR {
				break
			}
		}
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	}
	_ = p.cmd.Wait()
	if p.starter != nil {
		p.starter.Release(p.pid)
	}
	p.waitState = p.cmd.ProcessState
	close(p.exited)
}

func (p *proc) isDead() bool {
	select {
	case <-p.exited:
		return true
	default:
		return p.protoErr.Load() != nil
	}
}

// kill sends SIGKILL to the interpreter; wait then kills its group.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
}

// cleanup kills the interpreter if needed, waits for it to be reaped and
// releases the pipes.
func (p *proc) cleanup() {
	p.cleanOnce.Do(func() {
		select {
		case <-p.exited:
		default:
			p.kill()
			select {
			case <-p.exited:
			case <-time.After(exitWait):
			}
		}
		p.closeFiles()
	})
}

func (p *proc) closeFiles() {
	for _, f := range []*os.File{p.ctlW, p.ctlR, p.outR, p.errR} {
		if f != nil {
			_ = f.Close()
		}
	}
}

// exitText describes how the reaped interpreter ended.
func (p *proc) exitText() string {
	ps := p.waitState
	if ps == nil {
		return "unknown status"
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return "killed by signal " + unix.SignalName(ws.Signal())
	}
	return "exit code " + strconv.Itoa(ps.ExitCode())
}

// send writes one frame to the driver.
func (p *proc) send(typ byte, payload []byte) error {
	frame := appendFrame(make([]byte, 0, headerLen+len(payload)), typ, payload)
	p.wmu.Lock()
	defer p.wmu.Unlock()
	_, err := p.ctlW.Write(frame)
	return err
}

// interrupt asks the driver to stop run seq.
func (p *proc) interrupt(seq uint64) {
	if p.lang == Node {
		payload, _ := json.Marshal(map[string]uint64{"id": seq})
		go func() { _ = p.send(frameInterrupt, payload) }()
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
}

// protocolError records a broken control stream and kills the interpreter.
func (p *proc) protocolError(msg string) {
	p.protoErr.CompareAndSwap(nil, &msg)
	p.kill()
}

// readControl reads the driver's frames until the channel closes.
func (p *proc) readControl() {
	fr := frameReader{r: bufio.NewReaderSize(p.ctlR, 64<<10)}
	for {
		typ, n, err := fr.next()
		if err != nil {
			return
		}
		if n > maxFrame {
			p.protocolError(fmt.Sprintf("a frame of %d bytes exceeds the limit of %d", n, maxFrame))
			return
		}
		switch typ {
		case frameStdout, frameStderr:
			s := 0
			if typ == frameStderr {
				s = 1
			}
			err = fr.stream(n, func(b []byte) { p.deliverFrame(s, b) })
		case frameResult:
			var b []byte
			if b, err = fr.payload(n); err == nil {
				p.gotResult(b)
			}
		case frameHello:
			if _, err = fr.payload(n); err == nil {
				p.helloOnce.Do(func() { close(p.hello) })
			}
		default:
			err = fr.stream(n, func([]byte) {})
		}
		if err != nil {
			return
		}
	}
}

// gotResult accepts a result frame for the current run only: ids are never
// reused and a frame for a run not yet sent cannot be genuine.
func (p *proc) gotResult(b []byte) {
	var r resultFrame
	if json.Unmarshal(b, &r) != nil {
		return
	}
	if r.ID == 0 || r.ID != p.runSeq.Load() || r.ID <= p.resSeq.Load() {
		return
	}
	p.resSeq.Store(r.ID)
	select {
	case p.results <- r:
	default:
	}
}

// deliverFrame adds interpreter-level output to the current run, unless that
// run's result frame was already read.
func (p *proc) deliverFrame(s int, b []byte) {
	if c := p.cur.Load(); c != nil && c.seq > p.resSeq.Load() {
		c.write(srcFrame, s, b)
	}
}

// readRaw reads the interpreter's fd 1 or 2 until EOF.
func (p *proc) readRaw(s int, f *os.File) {
	sc := markerScanner{prefix: p.prefix}
	out := func(b []byte) {
		if len(b) == 0 {
			return
		}
		if c := p.cur.Load(); c != nil && c.seq > p.rawMark[s].Load() {
			c.write(srcRaw, s, b)
		}
	}
	mark := func(seq uint64) {
		if seq > p.rawMark[s].Load() && seq <= p.runSeq.Load() {
			p.rawMark[s].Store(seq)
			select {
			case p.markCh <- struct{}{}:
			default:
			}
		}
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			sc.scan(buf[:n], out, mark)
		}
		if err != nil {
			sc.flush(out)
			return
		}
	}
}

// run executes one run. alive is false when the interpreter died (or was
// killed) during it and must be replaced.
func (p *proc) run(ctx context.Context, code string, timeout time.Duration, opts Options) (res wire.ReplResult, alive bool) {
	p.seq++
	seq := p.seq
	c := newCollector(seq, opts.OutputLimit)
	p.cur.Store(c)
	defer p.cur.Store(nil)
	p.runSeq.Store(seq)

	payload, err := json.Marshal(runCommand{
		ID:            seq,
		Code:          code,
		Marker:        string(p.prefix) + strconv.FormatUint(seq, 10) + "\n",
		Interruptible: timeout > 0 || ctx.Done() != nil,
		Limit:         opts.OutputLimit,
	})
	if err != nil {
		// Unreachable for a string; keep the interpreter.
		return wire.ReplResult{Status: wire.ReplError, Output: []wire.OutputLine{}, Error: err.Error()}, true
	}

	start := time.Now()
	werr := make(chan error, 1)
	go func() { werr <- p.send(frameRun, payload) }()

	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	done := ctx.Done()
	var grace <-chan time.Time
	var graceTimer *time.Timer
	defer func() {
		if graceTimer != nil {
			graceTimer.Stop()
		}
	}()
	interrupted := "" // why the engine interrupted the code
	killed := false
	var rf *resultFrame
	interrupt := func(why string) {
		interrupted = why
		deadline, done = nil, nil
		p.interrupt(seq)
		graceTimer = time.NewTimer(opts.InterruptGrace)
		grace = graceTimer.C
	}
loop:
	for {
		select {
		case r := <-p.results:
			if r.ID == seq && !killed {
				rf = &r
				break loop
			}
		case <-p.exited:
			break loop
		case err := <-werr:
			werr = nil
			if err != nil {
				// The channel broke: the interpreter is going or gone.
				p.kill()
			}
		case <-deadline:
			interrupt("timeout")
		case <-done:
			interrupt("cancel")
		case <-grace:
			grace = nil
			killed = true
			p.kill()
		}
	}
	elapsed := time.Since(start)

	res = wire.ReplResult{DurationMs: float64(elapsed) / float64(time.Millisecond)}
	timeoutMsg := "TimeoutError: execution exceeded " + timeout.String()
	cancelMsg := "Interrupted: " + errText(ctx.Err())

	if rf != nil {
		p.waitMarkers(seq, rf.Marks)
		switch rf.Status {
		case "ok":
			res.Status = wire.ReplSuccess
			if rf.Result != nil {
				s := sanitize([]byte(*rf.Result))
				res.Result = &s
			}
		case "interrupted":
			switch interrupted {
			case "timeout":
				res.Status, res.Error = wire.ReplTimeout, timeoutMsg
			case "cancel":
				res.Status, res.Error = wire.ReplTimeout, cancelMsg
			default:
				res.Status, res.Error = wire.ReplError, "KeyboardInterrupt: interrupted by SIGINT"
			}
			c.add(1, res.Error)
		default:
			res.Status = wire.ReplError
			res.Error = truncateError(rf.Error)
			if res.Error == "" {
				res.Error = "error"
			}
		}
		res.Output, res.Truncated = c.finish()
		res.Truncated = res.Truncated || rf.Truncated
		return res, true
	}

	// The interpreter is dead or dying: collect what it wrote, then explain.
	if !killed {
		p.kill() // a protocol error may have left it running
	}
	select {
	case <-p.exited:
	case <-time.After(exitWait):
	}
	select {
	case <-p.readersDone:
	case <-time.After(drainWait):
	}
	var msg string
	switch {
	case p.protoErr.Load() != nil:
		msg = "interpreter protocol error: " + *p.protoErr.Load()
	case killed && interrupted == "timeout":
		msg = fmt.Sprintf("%s; the code did not stop within %v of the interrupt and the interpreter was killed", timeoutMsg, opts.InterruptGrace)
	case killed:
		msg = fmt.Sprintf("%s; the code did not stop within %v of the interrupt and the interpreter was killed", cancelMsg, opts.InterruptGrace)
	default:
		msg = "interpreter exited unexpectedly (" + p.exitText() + ")"
	}
	msg += "; the interpreter was restarted and all state was lost"
	c.add(1, msg)
	res.Status = wire.ReplRestarted
	res.Error = msg
	res.Output, res.Truncated = c.finish()
	return res, false
}

// waitMarkers waits until the end markers of run seq came through the pipes
// the driver wrote them to, so their earlier output is in the collector.
func (p *proc) waitMarkers(seq uint64, marks [2]bool) {
	var timer *time.Timer
	for {
		pending := false
		for s := range 2 {
			if marks[s] && p.rawMark[s].Load() < seq { //nolint:gosec // s ranges over 0..1 and both marks and rawMark have two elements
				pending = true
			}
		}
		if !pending {
			return
		}
		if timer == nil {
			timer = time.NewTimer(markerWait)
			defer timer.Stop()
		}
		select {
		case <-p.markCh:
		case <-p.readersDone:
			return
		case <-timer.C:
			return
		}
	}
}

func errText(err error) string {
	if err == nil {
		return "interrupted"
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "context deadline exceeded"
	}
	return err.Error()
}
