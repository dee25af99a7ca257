// Package msb is a Go client for microsandbox-compatible servers such as
// Warren. It reproduces the public API of the microsandbox Go SDK (package
// msb), so programs written against that SDK build and behave the same.
//
// The client is safe for concurrent use: lifecycle calls (Start, Stop) are
// guarded by an atomic state, and every other call goes straight to the
// (thread-safe) HTTP client.
//
// Differences from the original SDK:
//
//   - No API key is needed: a dev server accepts requests without one. The key
//     comes from [WithApiKey] or the MSB_API_KEY environment variable, and the
//     Authorization header is sent only when a key is set.
//   - Every call has a context-taking variant (StartContext, StopContext,
//     RunContext, AllContext, ...). The plain methods use context.Background.
//   - Timeouts ([WithTimeout], or the Timeout of the *http.Client given to
//     [WithHTTPClient]) are sent in seconds.
//   - Server failures are returned as [*RPCError], carrying the server's
//     message, JSON-RPC code, error kind and HTTP status, wrapped in the
//     sentinel of the operation (for example [ErrFailedToStartSandbox]).
//   - No namespace is sent unless [WithNamespace] is used; the server then
//     uses the API key's namespace, or "default" for a key for every
//     namespace (and in dev mode).
//
// # Quick Start
//
// Create and start a Python sandbox:
//
//	sandbox := msb.NewPythonSandbox(msb.WithName("my-sandbox"))
//	if err := sandbox.Start(msb.StartConfig{Memory: 512, CPUs: 1}); err != nil {
//		log.Fatal(err)
//	}
//	defer sandbox.Stop()
//
// Execute Python code:
//
//	execution, err := sandbox.Code().Run("print('Hello World')")
//	if err != nil {
//		log.Fatal(err)
//	}
//	output, _ := execution.GetOutput()
//	fmt.Println(output)
//
// Run a command (no shell):
//
//	cmdExec, err := sandbox.Command().Run("ls", []string{"-la"})
//
// Read resource usage:
//
//	metrics, err := sandbox.Metrics().All()
//	fmt.Printf("CPU: %.2f%%, Memory: %d MiB\n", metrics.CPU, metrics.MemoryMiB)
package msb

import (
	"context"
	"encoding/json"
	"fmt"
)

// Core sandbox interfaces.
type (
	// Starter manages sandbox startup.
	Starter interface {
		// Start starts the sandbox with the given configuration.
		// If Image is empty, the default image of the sandbox's language is
		// used. If Memory <= 0 it defaults to 512; if CPUs <= 0, to 1.
		Start(config StartConfig) error
		// StartContext is Start bounded by ctx.
		StartContext(ctx context.Context, config StartConfig) error
	}

	// Stopper manages sandbox shutdown.
	Stopper interface {
		// Stop stops the sandbox and releases its resources.
		Stop() error
		// StopContext is Stop bounded by ctx.
		StopContext(ctx context.Context) error
	}

	// CodeRunner executes code in the sandbox's REPL. State (variables,
	// imports) persists between runs in the same sandbox.
	CodeRunner interface {
		// Run executes code and returns the execution result.
		// The sandbox must be started first.
		Run(code string) (CodeExecution, error)
		// RunContext is Run bounded by ctx.
		RunContext(ctx context.Context, code string) (CodeExecution, error)
	}

	// CommandRunner executes commands in the sandbox. The command is run
	// directly, not through a shell.
	CommandRunner interface {
		// Run executes cmd with args. The sandbox must be started first.
		// A non-zero exit status is not an error: see
		// CommandExecution.GetExitCode.
		Run(cmd string, args []string) (CommandExecution, error)
		// RunContext is Run bounded by ctx.
		RunContext(ctx context.Context, cmd string, args []string) (CommandExecution, error)
	}

	// MetricsReader reads the sandbox's resource usage.
	MetricsReader interface {
		// All returns all metrics of the sandbox.
		All() (Metrics, error)
		// CPU returns the CPU usage as a percentage (0-100 per CPU).
		CPU() (float64, error)
		// MemoryMiB returns the memory usage in mebibytes.
		MemoryMiB() (int, error)
		// DiskBytes returns the disk usage in bytes.
		DiskBytes() (int, error)
		// IsRunning reports whether the sandbox is running.
		IsRunning() (bool, error)

		// AllContext is All bounded by ctx.
		AllContext(ctx context.Context) (Metrics, error)
		// CPUContext is CPU bounded by ctx.
		CPUContext(ctx context.Context) (float64, error)
		// MemoryMiBContext is MemoryMiB bounded by ctx.
		MemoryMiBContext(ctx context.Context) (int, error)
		// DiskBytesContext is DiskBytes bounded by ctx.
		DiskBytesContext(ctx context.Context) (int, error)
		// IsRunningContext is IsRunning bounded by ctx.
		IsRunningContext(ctx context.Context) (bool, error)
	}

	// Metrics is the resource usage of a sandbox. Values the server could
	// not measure are zero.
	Metrics struct {
		Name      string  // Sandbox name
		IsRunning bool    // Whether the sandbox is running
		CPU       float64 // CPU usage percentage
		MemoryMiB int     // Memory usage in mebibytes
		DiskBytes int     // Disk usage in bytes
	}
)

// StartConfig is the configuration for starting a sandbox.
type StartConfig struct {
	Image     string            // Image to use; empty means the language's default image
	Memory    int               // Memory limit in MiB; <= 0 means 512
	CPUs      int               // CPU limit; <= 0 means 1
	Volumes   []string          // Volumes to mount ("host:guest")
	Ports     []string          // Ports to expose ("host:guest")
	Envs      []string          // Environment variables ("K=V")
	DependsOn []string          // Sandboxes this one depends on
	Workdir   string            // Working directory
	Shell     string            // Shell to use
	Scripts   map[string]string // Named scripts
	Exec      string            // Command to run at start
}

// --- implementation of the interfaces ---

type starter struct {
	b *baseMicroSandbox
}

func (s starter) Start(cfg StartConfig) error {
	return s.StartContext(context.Background(), cfg)
}

func (s starter) StartContext(ctx context.Context, cfg StartConfig) error {
	// A CAS instead of a load keeps two racing Starts from both reaching
	// the server.
	if !s.b.state.CompareAndSwap(off, transitioning) {
		if s.b.state.Load() == started {
			return ErrSandboxAlreadyStarted
		}
		return fmt.Errorf("%w: a start or stop is in progress", ErrFailedToStartSandbox)
	}
	if cfg.Memory <= 0 {
		cfg.Memory = 512
	}
	if cfg.CPUs <= 0 {
		cfg.CPUs = 1
	}
	sc := startConfig(cfg) // the same fields, with the wire's JSON names
	if err := s.b.rpc.startSandbox(ctx, &s.b.cfg, sc); err != nil {
		s.b.state.Store(off)
		return fmt.Errorf("%w: %w", ErrFailedToStartSandbox, err)
	}
	s.b.state.Store(started)
	return nil
}

type stopper struct {
	b *baseMicroSandbox
}

func (s stopper) Stop() error {
	return s.StopContext(context.Background())
}

func (s stopper) StopContext(ctx context.Context) error {
	if !s.b.state.CompareAndSwap(started, transitioning) {
		if s.b.state.Load() == off {
			return ErrSandboxNotStarted
		}
		return fmt.Errorf("%w: a start or stop is in progress", ErrFailedToStopSandbox)
	}
	if err := s.b.rpc.stopSandbox(ctx, &s.b.cfg); err != nil {
		s.b.state.Store(started)
		return fmt.Errorf("%w: %w", ErrFailedToStopSandbox, err)
	}
	s.b.state.Store(off)
	return nil
}

type codeRunner struct {
	b *baseMicroSandbox
	l progLang
}

func (cr codeRunner) Run(code string) (CodeExecution, error) {
	return cr.RunContext(context.Background(), code)
}

func (cr codeRunner) RunContext(ctx context.Context, code string) (CodeExecution, error) {
	if cr.b.state.Load() != started {
		return CodeExecution{}, ErrSandboxNotStarted
	}
	raw, err := cr.b.rpc.runRepl(ctx, &cr.b.cfg, cr.l, code)
	if err != nil {
		return CodeExecution{}, fmt.Errorf("%w: %w", ErrFailedToRunCode, err)
	}
	exec := CodeExecution{Output: raw}
	if err := json.Unmarshal(raw, &exec.parsed); err == nil {
		exec.parsedOK = true
	}
	return exec, nil
}

type commandRunner struct {
	b *baseMicroSandbox
}

func (cr commandRunner) Run(cmd string, args []string) (CommandExecution, error) {
	return cr.RunContext(context.Background(), cmd, args)
}

func (cr commandRunner) RunContext(ctx context.Context, cmd string, args []string) (CommandExecution, error) {
	if cr.b.state.Load() != started {
		return CommandExecution{}, ErrSandboxNotStarted
	}
	raw, err := cr.b.rpc.runCommand(ctx, &cr.b.cfg, cmd, args)
	if err != nil {
		return CommandExecution{}, fmt.Errorf("%w: %w", ErrFailedToRunCommand, err)
	}
	exec := CommandExecution{Output: raw}
	if err := json.Unmarshal(raw, &exec.parsed); err == nil {
		exec.parsedOK = true
	}
	return exec, nil
}

type metricsReader struct {
	b *baseMicroSandbox
}

func (mr metricsReader) All() (Metrics, error) { return mr.AllContext(context.Background()) }

func (mr metricsReader) CPU() (float64, error) { return mr.CPUContext(context.Background()) }

func (mr metricsReader) MemoryMiB() (int, error) { return mr.MemoryMiBContext(context.Background()) }

func (mr metricsReader) DiskBytes() (int, error) { return mr.DiskBytesContext(context.Background()) }

func (mr metricsReader) IsRunning() (bool, error) { return mr.IsRunningContext(context.Background()) }

func (mr metricsReader) AllContext(ctx context.Context) (Metrics, error) {
	if mr.b.state.Load() != started {
		return Metrics{}, ErrSandboxNotStarted
	}
	m, err := mr.b.rpc.getMetrics(ctx, &mr.b.cfg)
	if err != nil {
		return Metrics{}, fmt.Errorf("%w: %w", ErrFailedToGetMetrics, err)
	}
	out := Metrics{Name: m.Name, IsRunning: m.Running}
	if m.CPUUsage != nil {
		out.CPU = *m.CPUUsage
	}
	if m.MemoryUsage != nil {
		out.MemoryMiB = int(*m.MemoryUsage)
	}
	if m.DiskUsage != nil {
		out.DiskBytes = int(*m.DiskUsage)
	}
	return out, nil
}

func (mr metricsReader) CPUContext(ctx context.Context) (float64, error) {
	m, err := mr.AllContext(ctx)
	return m.CPU, err
}

func (mr metricsReader) MemoryMiBContext(ctx context.Context) (int, error) {
	m, err := mr.AllContext(ctx)
	return m.MemoryMiB, err
}

func (mr metricsReader) DiskBytesContext(ctx context.Context) (int, error) {
	m, err := mr.AllContext(ctx)
	return m.DiskBytes, err
}

func (mr metricsReader) IsRunningContext(ctx context.Context) (bool, error) {
	m, err := mr.AllContext(ctx)
	return m.IsRunning, err
}
