package msb

import (
	"context"
	"errors"
	"sync/atomic"
)

// LangSandBox is a sandbox for one programming language: lifecycle
// (Start/Stop), execution (Code/Command) and monitoring (Metrics).
type LangSandBox interface {
	Starter
	Stopper
	Code() CodeRunner
	Command() CommandRunner
	Metrics() MetricsReader
}

var _ LangSandBox = (*Sandbox)(nil)

// Sandbox is a handle to one named sandbox on a server. Create it with
// [NewPythonSandbox] or [NewNodeSandbox]; it does nothing on the server until
// Start is called.
type Sandbox struct {
	b *baseMicroSandbox
	l progLang
}

// NewPythonSandbox returns a Python sandbox configured by options. It must be
// started with Start before code or commands can run. It never panics: a
// missing API key is allowed (dev servers need none).
//
//	sandbox := msb.NewPythonSandbox(
//		msb.WithName("my-python-sandbox"),
//		msb.WithServerUrl("http://localhost:5555"),
//	)
func NewPythonSandbox(options ...Option) *Sandbox {
	return newLangSandbox(langPython, options...)
}

// NewNodeSandbox returns a Node.js sandbox configured by options. It must be
// started with Start before code or commands can run.
//
//	sandbox := msb.NewNodeSandbox(
//		msb.WithName("my-node-sandbox"),
//		msb.WithApiKey("your-api-key"),
//	)
func NewNodeSandbox(options ...Option) *Sandbox {
	return newLangSandbox(langNodeJs, options...)
}

func newLangSandbox(lang progLang, options ...Option) *Sandbox {
	return &Sandbox{b: newBaseWithOptions(options...), l: lang}
}

// Name returns the sandbox's name (given by [WithName] or generated).
func (s *Sandbox) Name() string { return s.b.cfg.name }

// Start starts the sandbox. If cfg.Image is empty the language's default
// image (microsandbox/python or microsandbox/node) is used. It returns
// [ErrSandboxAlreadyStarted] if this handle already started it, and an error
// wrapping [ErrFailedToStartSandbox] (and an [*RPCError]) if the server
// refused.
func (s *Sandbox) Start(cfg StartConfig) error {
	return starter{s.b}.Start(s.withImage(cfg))
}

// StartContext is Start bounded by ctx.
func (s *Sandbox) StartContext(ctx context.Context, cfg StartConfig) error {
	return starter{s.b}.StartContext(ctx, s.withImage(cfg))
}

func (s *Sandbox) withImage(cfg StartConfig) StartConfig {
	if cfg.Image == "" {
		cfg.Image = s.l.DefaultImage()
	}
	return cfg
}

// Stop stops the sandbox. It returns [ErrSandboxNotStarted] if this handle
// has not started it, and an error wrapping [ErrFailedToStopSandbox] if the
// server refused.
func (s *Sandbox) Stop() error { return stopper{s.b}.Stop() }

// StopContext is Stop bounded by ctx.
func (s *Sandbox) StopContext(ctx context.Context) error { return stopper{s.b}.StopContext(ctx) }

// Code returns the runner for code in the sandbox's language.
func (s *Sandbox) Code() CodeRunner { return codeRunner{s.b, s.l} }

// Command returns the runner for commands.
func (s *Sandbox) Command() CommandRunner { return commandRunner{s.b} }

// Metrics returns the reader of the sandbox's resource usage.
func (s *Sandbox) Metrics() MetricsReader { return metricsReader{s.b} }

// progLang is a sandbox's language.
type progLang int

const (
	langUnspecified progLang = iota
	langPython
	langNodeJs
)

// String returns the language as the RPC "language" parameter spells it.
func (p progLang) String() string {
	switch p {
	case langPython:
		return "python"
	case langNodeJs:
		return "nodejs"
	default:
		return "unspecified"
	}
}

// DefaultImage returns the image used when StartConfig.Image is empty.
func (p progLang) DefaultImage() string {
	switch p {
	case langPython:
		return "microsandbox/python"
	case langNodeJs:
		return "microsandbox/node"
	default:
		return ""
	}
}

// lifecycle states of a baseMicroSandbox.
const (
	off uint32 = iota
	started
	transitioning // a Start or Stop is in flight
)

// baseMicroSandbox holds the configuration and state shared by the runners
// of one sandbox.
type baseMicroSandbox struct {
	cfg   config
	state atomic.Uint32
	rpc   *rpcClient
}

// Lifecycle and operation errors. Operation errors wrap the cause, often an
// [*RPCError]; test with errors.Is and errors.As.
var (
	// ErrSandboxAlreadyStarted is returned by Start on a started sandbox.
	ErrSandboxAlreadyStarted = errors.New("sandbox already started")
	// ErrSandboxNotStarted is returned by operations that need a started sandbox.
	ErrSandboxNotStarted = errors.New("sandbox not started")
	// ErrFailedToStartSandbox wraps failures of Start.
	ErrFailedToStartSandbox = errors.New("failed to start sandbox")
	// ErrFailedToStopSandbox wraps failures of Stop.
	ErrFailedToStopSandbox = errors.New("failed to stop sandbox")
	// ErrFailedToRunCode wraps failures of Code().Run.
	ErrFailedToRunCode = errors.New("failed to run code")
	// ErrFailedToRunCommand wraps failures of Command().Run.
	ErrFailedToRunCommand = errors.New("failed to run command")
	// ErrFailedToGetMetrics wraps failures of Metrics().
	ErrFailedToGetMetrics = errors.New("failed to get metrics")
	// ErrUnknownLanguage is kept for compatibility; this package never
	// returns it.
	ErrUnknownLanguage = errors.New("unknown language")
)
