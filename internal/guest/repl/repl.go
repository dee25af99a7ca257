//go:build linux

// Package repl runs persistent Python and Node.js REPL engines for the
// in-sandbox agent.
//
// A Manager keeps one interpreter per language, started lazily on the first
// Run. Each interpreter runs a small driver program (driver.py, driver.js,
// embedded in the binary) that executes code in one long-lived namespace, so
// variables, imports and functions survive from run to run, like the cells of
// a notebook.
//
// # Output
//
// What the code writes through the interpreter's own streams (Python's
// sys.stdout/sys.stderr, Node's console and process.stdout/stderr.write)
// travels as tagged frames on a private control channel, so the order of
// stdout and stderr lines is exact. What subprocesses write straight to fd
// 1/2 is read from the interpreter's real stdout/stderr pipes; an end-of-run
// marker on each pipe makes sure everything written before a run ends is
// attributed to that run. That output keeps its own order, but its order
// relative to interpreter-level output is only its order of arrival (they
// travel on different pipes), and partial lines are joined per source.
// Output arriving between runs (background threads, timers, subprocesses) is
// discarded. Bytes that are not valid UTF-8 become
// U+FFFD, and at most Options.OutputLimit bytes are kept per run (each line
// costs its length plus one for its newline).
//
// # Results
//
// Python: the code is parsed with ast; when the last statement is an
// expression, the rest is executed and the last one evaluated, and its repr
// (unless None) is the result. Node: the completion value of the script
// (unless undefined), formatted with util.inspect; a returned Promise is
// awaited. Exceptions give status wire.ReplError, a one-line Error such as
// "ZeroDivisionError: division by zero" and the traceback on stderr.
//
// # What persists in Node
//
// Code runs as a classic script in the interpreter's main context
// (vm.Script.runInThisContext), like successive <script> tags: var and
// function declarations, assignments to undeclared names and globalThis
// properties persist, and so do top-level let, const and class declarations
// (they live in the global lexical scope), but those cannot be declared again
// in a later run ("Identifier 'x' has already been declared"). require is
// available. Code that does not compile as a script because it uses top-level
// await is run inside an async function instead: its declarations are local
// to that run (assign to globalThis to keep a value), and when its trailing
// lines form an expression, that expression's value is the result.
//
// # Timeouts and interrupts
//
// At the timeout, or when ctx is cancelled, the engine interrupts the code:
// SIGINT to the interpreter (Python raises KeyboardInterrupt; Node stops
// synchronous code through breakOnSigint) and, for Node, an interrupt frame
// that abandons an awaited promise. The interpreter and its state survive and
// the run reports wire.ReplTimeout. Code that does not stop within
// Options.InterruptGrace (it catches KeyboardInterrupt, blocks in C, or busy
// loops in a Node callback) gets its interpreter's whole process group
// killed; a fresh interpreter is started and the run reports
// wire.ReplRestarted. An interpreter that exits or is killed by itself is
// reported the same way, and the next run starts a fresh one.
package repl

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/warren-sandbox/warren/internal/wire"
)

// Languages, as returned by NormalizeLanguage.
const (
	Python = "python"
	Node   = "node"
)

// Defaults for Options.
const (
	DefaultPython         = "/usr/bin/python3"
	DefaultNode           = "/usr/bin/node"
	DefaultOutputLimit    = wire.DefaultOutputLimit
	DefaultInterruptGrace = 2 * time.Second
	// MaxCode bounds the code of one run.
	MaxCode = 16 << 20
)

// ErrClosed is returned by Run after Close.
var ErrClosed = errors.New("repl: manager closed")

// Options configure a Manager. The zero value is usable.
type Options struct {
	// Python and Node are the interpreter paths; they default to
	// DefaultPython and DefaultNode.
	Python, Node string
	// Env is the interpreters' environment ("K=V"). Nil means a minimal
	// default: PATH, HOME=/root, LANG=C.UTF-8, PYTHONUNBUFFERED=1 and
	// PYTHONIOENCODING=utf-8.
	Env []string
	// Dir is the interpreters' working directory; empty means the caller's.
	Dir string
	// OutputLimit is how many bytes of output one run keeps (default
	// DefaultOutputLimit); beyond it output is dropped and
	// ReplResult.Truncated set.
	OutputLimit int
	// InterruptGrace is how long interrupted code has to stop before its
	// interpreter is killed and restarted (default DefaultInterruptGrace).
	InterruptGrace time.Duration
	// SysProcAttr, if set, returns the attributes of each interpreter
	// process (credentials, process group). When it is nil, interpreters
	// get their own process group and die with the agent's thread
	// (Pdeathsig). The whole group is killed with the interpreter when the
	// interpreter leads its own group (Setpgid with Pgid 0, or Setsid).
	SysProcAttr func() *syscall.SysProcAttr
	// Starter, if set, starts and releases interpreter processes; the agent
	// passes its PID 1 reaper so it never reaps an interpreter the engine
	// waits for. Nil means cmd.Start.
	Starter Starter
}

// Starter starts child processes on behalf of the engines. Start starts cmd;
// Release is called with the pid once the engine has waited for it.
type Starter interface {
	Start(cmd *exec.Cmd) error
	Release(pid int)
}

func (o Options) withDefaults() Options {
	if o.Python == "" {
		o.Python = DefaultPython
	}
	if o.Node == "" {
		o.Node = DefaultNode
	}
	if o.Env == nil {
		o.Env = []string{
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"HOME=/root",
			"LANG=C.UTF-8",
			"PYTHONUNBUFFERED=1",
			"PYTHONIOENCODING=utf-8",
		}
	}
	if o.OutputLimit <= 0 {
		o.OutputLimit = DefaultOutputLimit
	}
	if o.InterruptGrace <= 0 {
		o.InterruptGrace = DefaultInterruptGrace
	}
	return o
}

// Manager holds one lazily started interpreter per language. It is safe for
// concurrent use: runs on one interpreter are serialized, runs in different
// languages proceed in parallel.
type Manager struct {
	opts    Options
	engines map[string]*engine

	mu     sync.Mutex
	closed bool
}

// NewManager returns a Manager; no interpreter starts until the first Run.
func NewManager(opts Options) *Manager {
	opts = opts.withDefaults()
	m := &Manager{opts: opts}
	m.engines = map[string]*engine{
		Python: newEngine(m, Python),
		Node:   newEngine(m, Node),
	}
	return m
}

// NormalizeLanguage maps a language name to Python or Node, ignoring case
// and surrounding space: "python" and "python3" are Python; "node",
// "nodejs", "javascript" and "js" are Node. Anything else is an error.
func NormalizeLanguage(s string) (string, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "python", "python3":
		return Python, nil
	case "node", "nodejs", "javascript", "js":
		return Node, nil
	}
	return "", fmt.Errorf("repl: unsupported language %q (want python or node)", s)
}

// Run runs code on the language's interpreter, starting it if needed, and
// returns what the code printed and the value of its last expression.
//
// timeout 0 means none. At the timeout, or when ctx is cancelled while the
// code runs, the code is interrupted (see the package documentation) and the
// result has status wire.ReplTimeout or wire.ReplRestarted. Run returns an
// error only when the code could not be run at all: unknown language, code
// larger than MaxCode, an interpreter that fails to start, a closed Manager,
// or ctx done before the run began.
func (m *Manager) Run(ctx context.Context, language, code string, timeout time.Duration) (wire.ReplResult, error) {
	return m.RunLimit(ctx, language, code, timeout, 0)
}

// RunLimit is Run keeping at most limit bytes of output (see
// Options.OutputLimit; 0 = Options.OutputLimit, at most
// wire.MaxOutputLimit).
func (m *Manager) RunLimit(ctx context.Context, language, code string, timeout time.Duration, limit int) (wire.ReplResult, error) {
	lang, err := NormalizeLanguage(language)
	if err != nil {
		return wire.ReplResult{}, err
	}
	if len(code) > MaxCode {
		return wire.ReplResult{}, fmt.Errorf("repl: code is %d bytes, more than the limit of %d", len(code), MaxCode)
	}
	if timeout < 0 {
		timeout = 0
	}
	return m.engines[lang].run(ctx, code, timeout, min(limit, wire.MaxOutputLimit))
}

// Close kills the interpreters (with their process groups) and waits for
// them to exit. Runs in progress and later runs fail with ErrClosed.
func (m *Manager) Close() error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	for _, e := range m.engines {
		e.shutdown()
	}
	return nil
}

func (m *Manager) isClosed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closed
}
