package warren

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// ExecResult is the outcome of [Sandbox.Exec] or [Sandbox.Shell]. A command
// that ran is a result whatever its exit status, timeout included.
type ExecResult struct {
	Stdout    string
	Stderr    string
	ExitCode  int    // the exit code, or 128+signal when killed by a signal
	Signal    string // the terminating signal ("SIGKILL"), if any
	TimedOut  bool   // killed at its timeout
	OOMKilled bool   // killed for running out of memory
	Truncated bool   // output exceeded the limit and was cut
	Duration  time.Duration
}

// Output returns stdout followed by stderr.
func (r ExecResult) Output() string { return r.Stdout + r.Stderr }

// OK reports whether the command exited with code 0 (and did not time out).
func (r ExecResult) OK() bool { return r.ExitCode == 0 && !r.TimedOut }

type execResultWire struct {
	ExitCode   int     `json:"exit_code"`
	Signal     string  `json:"signal"`
	TimedOut   bool    `json:"timed_out"`
	OOMKilled  bool    `json:"oom_killed"`
	Truncated  bool    `json:"truncated"`
	Stdout     string  `json:"stdout"`
	Stderr     string  `json:"stderr"`
	DurationMs float64 `json:"duration_ms"`
}

// ExecOption adjusts [Sandbox.Exec], [Sandbox.Shell] and, where noted,
// [Sandbox.StartProcess].
type ExecOption func(*execConfig)

type execConfig struct {
	timeout     time.Duration
	env         []string
	cwd         string
	user        string
	stdin       *string
	outputLimit int64
	binary      bool
	tty         bool
}

// ExecTimeout kills the command after d (sent in seconds). The result then
// has TimedOut set; it is not an error. Not for processes.
func ExecTimeout(d time.Duration) ExecOption { return func(c *execConfig) { c.timeout = d } }

// ExecEnv adds "K=V" entries to the command's environment (they win over
// the sandbox's). Also for processes.
func ExecEnv(kv ...string) ExecOption {
	return func(c *execConfig) { c.env = append(c.env, kv...) }
}

// ExecCwd sets the working directory. Also for processes.
func ExecCwd(dir string) ExecOption { return func(c *execConfig) { c.cwd = dir } }

// ExecUser runs as user: "uid", "uid:gid" or a name from /etc/passwd. Also
// for processes.
func ExecUser(user string) ExecOption { return func(c *execConfig) { c.user = user } }

// ExecStdin feeds text to the command's standard input, then closes it. Also
// for processes (which can get more with [Process.WriteStdin]).
func ExecStdin(text string) ExecOption { return func(c *execConfig) { c.stdin = &text } }

// ExecOutputLimit caps the captured stdout+stderr bytes (server default
// 1 MiB, at most 64 MiB). Not for processes.
func ExecOutputLimit(n int64) ExecOption { return func(c *execConfig) { c.outputLimit = n } }

// ExecBinary asks for the output as raw bytes (sent base64 and decoded
// here), so output that is not UTF-8 survives unchanged. Without it invalid
// UTF-8 is replaced by U+FFFD. Not for processes.
func ExecBinary() ExecOption { return func(c *execConfig) { c.binary = true } }

// ExecTTY runs a process on a pseudo-terminal (its output then arrives on
// stdout). Processes only.
func ExecTTY() ExecOption { return func(c *execConfig) { c.tty = true } }

func newExecConfig(opts []ExecOption) execConfig {
	var c execConfig
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c
}

type execParams struct {
	Sandbox     string   `json:"sandbox"`
	Namespace   string   `json:"namespace,omitempty"`
	Argv        []string `json:"argv,omitempty"`
	Script      *string  `json:"script,omitempty"`
	Stdin       *string  `json:"stdin,omitempty"`
	Env         []string `json:"env,omitempty"`
	Cwd         string   `json:"cwd,omitempty"`
	User        string   `json:"user,omitempty"`
	Timeout     float64  `json:"timeout,omitempty"`
	OutputLimit int64    `json:"output_limit,omitempty"`
	Binary      bool     `json:"binary,omitempty"`
}

// Exec runs cmd with args directly, no shell (sandbox.exec), and waits for
// it to finish. A command that cannot be started is an error of kind
// exec_failed ([IsExecFailed]); a non-zero exit or a timeout is a result.
func (s *Sandbox) Exec(ctx context.Context, cmd string, args []string, opts ...ExecOption) (ExecResult, error) {
	argv := append([]string{cmd}, args...)
	return s.exec(ctx, "sandbox.exec", argv, nil, newExecConfig(opts))
}

// Shell runs script with /bin/sh -c (sandbox.shell) and waits for it to
// finish.
func (s *Sandbox) Shell(ctx context.Context, script string, opts ...ExecOption) (ExecResult, error) {
	return s.exec(ctx, "sandbox.shell", nil, &script, newExecConfig(opts))
}

func (s *Sandbox) exec(ctx context.Context, method string, argv []string, script *string, c execConfig) (ExecResult, error) {
	p := execParams{
		Sandbox:     s.Name,
		Namespace:   s.c.namespace,
		Argv:        argv,
		Script:      script,
		Stdin:       c.stdin,
		Env:         c.env,
		Cwd:         c.cwd,
		User:        c.user,
		Timeout:     secs(c.timeout),
		OutputLimit: c.outputLimit,
		Binary:      c.binary,
	}
	var w execResultWire
	if err := s.c.Call(ctx, method, p, &w); err != nil {
		return ExecResult{}, err
	}
	r := ExecResult{
		Stdout:    w.Stdout,
		Stderr:    w.Stderr,
		ExitCode:  w.ExitCode,
		Signal:    w.Signal,
		TimedOut:  w.TimedOut,
		OOMKilled: w.OOMKilled,
		Truncated: w.Truncated,
		Duration:  time.Duration(w.DurationMs * float64(time.Millisecond)),
	}
	if c.binary {
		out, err := base64.StdEncoding.DecodeString(w.Stdout)
		if err != nil {
			return ExecResult{}, fmt.Errorf("warren: %s: decode stdout: %w", method, err)
		}
		errOut, err := base64.StdEncoding.DecodeString(w.Stderr)
		if err != nil {
			return ExecResult{}, fmt.Errorf("warren: %s: decode stderr: %w", method, err)
		}
		r.Stdout, r.Stderr = string(out), string(errOut)
	}
	return r, nil
}

// OutputLine is one line of REPL output, newline removed.
type OutputLine struct {
	Stream string `json:"stream"` // "stdout" or "stderr"
	Text   string `json:"text"`
}

// CodeResult is the outcome of [Sandbox.RunCode].
type CodeResult struct {
	// Status is "success", "error", "exception" or "timeout" (the
	// interpreter survives a timeout, with its state).
	Status   string
	Language string
	// Lines is the output in the order produced.
	Lines []OutputLine
	// Result is the repr of the last expression's value, if the server
	// reported one.
	Result string
	// Truncated says the output exceeded its limit and was cut.
	Truncated bool

	serverHasError bool
}

// Stdout returns the stdout lines, each ending in a newline.
func (r CodeResult) Stdout() string { return r.join("stdout") }

// Stderr returns the stderr lines, each ending in a newline.
func (r CodeResult) Stderr() string { return r.join("stderr") }

func (r CodeResult) join(stream string) string {
	var b strings.Builder
	for _, l := range r.Lines {
		if l.Stream == stream {
			b.WriteString(l.Text)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// HasError reports whether the code failed: a status other than success, the
// server's has_error, or any non-empty stderr line.
func (r CodeResult) HasError() bool {
	if r.serverHasError || (r.Status != "" && r.Status != "success") {
		return true
	}
	for _, l := range r.Lines {
		if l.Stream == "stderr" && l.Text != "" {
			return true
		}
	}
	return false
}

// RunCode runs code in the sandbox's REPL for language ("python", "node",
// "nodejs" or "javascript") via sandbox.repl.run. State persists between
// runs. timeout > 0 interrupts the code after that long (sent in seconds).
func (s *Sandbox) RunCode(ctx context.Context, language, code string, timeout time.Duration) (CodeResult, error) {
	p := struct {
		sandboxParams
		Language string  `json:"language"`
		Code     string  `json:"code"`
		Timeout  float64 `json:"timeout,omitempty"`
	}{s.params(), language, code, secs(timeout)}
	var w struct {
		Status    string          `json:"status"`
		Language  string          `json:"language"`
		Output    []OutputLine    `json:"output"`
		HasError  bool            `json:"has_error"`
		Result    json.RawMessage `json:"result"`
		Truncated bool            `json:"truncated"`
	}
	if err := s.c.Call(ctx, "sandbox.repl.run", p, &w); err != nil {
		return CodeResult{}, err
	}
	r := CodeResult{
		Status:         w.Status,
		Language:       w.Language,
		Lines:          w.Output,
		Truncated:      w.Truncated,
		serverHasError: w.HasError,
	}
	if len(w.Result) > 0 && string(w.Result) != "null" {
		var str string
		if json.Unmarshal(w.Result, &str) == nil {
			r.Result = str
		} else {
			r.Result = string(w.Result)
		}
	}
	return r, nil
}
