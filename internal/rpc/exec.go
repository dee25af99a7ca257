package rpc

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/warren-sandbox/warren/internal/audit"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/wire"
)

// The output limit of the microsandbox methods, sandbox.command.run and
// sandbox.repl.run (Options.MaxOutput, warren serve --max-output). Their
// clients read every line and know no "truncated", so the default is one
// they do not run into in practice. A command's output streams from the
// agent and is spooled (spool.go), so the server's memory does not grow
// with it; a REPL run's lines are held whole (by the sandbox's agent,
// then here) until the run ends, so a REPL run keeps at most
// wire.MaxOutputLimit.
const (
	DefaultMaxOutput = 64 << 20
	MinMaxOutput     = 1 << 20
	MaxMaxOutput     = wire.MaxStreamedOutput
)

// maxOutput checks Options.MaxOutput and applies its default.
func maxOutput(n int64) (int64, error) {
	switch {
	case n == 0:
		return DefaultMaxOutput, nil
	case n < MinMaxOutput || n > MaxMaxOutput:
		return 0, fmt.Errorf("rpc: output limit %d: want %d MiB to %d MiB (0 = %d MiB)", n, MinMaxOutput>>20, MaxMaxOutput>>20, DefaultMaxOutput>>20)
	}
	return n, nil
}

type commandParams struct {
	agentRef
	Command string       `json:"command"`
	Args    []string     `json:"args"`
	Timeout limitSeconds `json:"timeout"`
}

type commandResult struct {
	Command    string     `json:"command"`
	Args       []string   `json:"args"`
	ExitCode   int        `json:"exit_code"`
	Success    bool       `json:"success"`
	Output     *lineSpool `json:"output"`
	Truncated  bool       `json:"truncated,omitempty"`
	DurationMs float64    `json:"duration_ms"`
}

func (s *Server) sandboxCommand(ctx context.Context, c *call, p *commandParams) (any, error) {
	ns, name, err := c.resolveRef(p.sandboxRef)
	if err != nil {
		return nil, err
	}
	if p.Command == "" {
		return nil, errdefs.Errorf(errInvalidParams, "\"command\" is missing")
	}
	timeout, err := p.Timeout.duration("timeout", maxTimeout)
	if err != nil {
		return nil, err
	}
	if p.Args == nil {
		p.Args = []string{}
	}
	argv := append([]string{p.Command}, p.Args...)
	out := &lineSpool{}
	res, err := s.exec(ctx, ns, name, "command", &wire.ExecRequest{Argv: argv, TimeoutMs: timeout.Milliseconds(), OutputLimit: s.opts.MaxOutput}, c.bulk.output(out.add))
	if err != nil {
		out.Close()
		return nil, err
	}
	switch {
	case res.Error != "":
		out.Close()
		return nil, errdefs.Errorf(errdefs.ErrExecFailed, "command %.100q could not be started: %s", p.Command, res.Error)
	case res.TimedOut:
		out.Close()
		return nil, errdefs.Errorf(errdefs.ErrTimeout, "command %.100q did not finish within its %v timeout and was killed", p.Command, timeout)
	}
	out.flush()
	if res.OOMKilled {
		out.line(wire.Stderr, "warren: the command was killed: the sandbox ran out of memory")
	}
	if res.Truncated {
		out.line(wire.Stderr, s.outputCut(ctx, ns, name, "sandbox.command.run", s.opts.MaxOutput))
	}
	if err := out.done(); err != nil {
		return nil, err
	}
	return commandResult{Command: p.Command, Args: p.Args, ExitCode: res.Code, Success: res.Code == 0,
		Output: out, Truncated: res.Truncated, DurationMs: res.DurationMs}, nil
}

// outputCut logs that a run's output went over limit and returns the
// line that says so at the end of the output, where microsandbox's
// clients, which know no "truncated", show it.
func (s *Server) outputCut(ctx context.Context, ns, name, method string, limit int64) string {
	s.log.Warn("output cut", "request_id", requestID(ctx), "method", method, "namespace", ns, "sandbox", name, "limit_bytes", limit)
	return fmt.Sprintf("warren: the output was cut at its limit of %d MiB (warren serve --max-output)", limit>>20)
}

// exec runs one command in a running sandbox, timed for the metrics.
func (s *Server) exec(ctx context.Context, ns, name, kind string, req *wire.ExecRequest, onOutput func(string, []byte)) (backend.ExecResult, error) {
	l, err := s.lease(ctx, ns, name)
	if err != nil {
		return backend.ExecResult{}, err
	}
	defer l.Release()
	t0 := time.Now()
	res, err := l.Exec(ctx, kind, req, onOutput)
	s.m.execLatency(ns, kind, time.Since(t0))
	if s.opts.Audit != nil {
		e := &audit.Exec{Via: kind}
		e.SetArgv(req.Argv)
		switch {
		case err != nil:
		case res.Error != "":
			e.Outcome = errdefs.ErrExecFailed.Error()
		default:
			code := res.Code
			e.ExitCode, e.Signal, e.TimedOut, e.OOMKilled = &code, res.Signal, res.TimedOut, res.OOMKilled
		}
		s.auditExec(ctx, ns, name, e, t0, err)
	}
	return res, err
}

// text makes output valid UTF-8 for JSON (invalid bytes become U+FFFD).
func text(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// stdinParam is the stdin of an exec or a background process. One whose
// JSON is sure to hold more than wire.MaxStdin bytes is refused as it is
// met, unquoted in no copy: the decoder went on to unquote tens of MiB,
// and the strict decoding's check of the keys over them twice more, only
// for the request to be refused after.
type stdinParam string

func (p *stdinParam) UnmarshalJSON(b []byte) error {
	// Each escape has a backslash and takes at most six bytes for one at
	// least; each other byte of the string is at least a byte of it.
	if len(b) > 0 && b[0] == '"' && len(b)-2-5*bytes.Count(b, []byte{'\\'}) > wire.MaxStdin {
		return errStdinTooLarge
	}
	return json.Unmarshal(b, (*string)(p))
}

var errStdinTooLarge = errdefs.Errorf(errdefs.ErrTooLarge, "stdin is larger than %d MiB", wire.MaxStdin>>20)

// check refuses a stdin over wire.MaxStdin.
func (p stdinParam) check() error {
	if len(p) > wire.MaxStdin {
		return errStdinTooLarge
	}
	return nil
}

// execOptions are the params sandbox.exec and sandbox.shell share.
type execOptions struct {
	agentRef
	Stdin       stdinParam `json:"stdin"`
	Env         []string   `json:"env"`
	Cwd         string     `json:"cwd"`
	User        string     `json:"user"`
	Timeout     float64    `json:"timeout"`
	OutputLimit int64      `json:"output_limit"`
	Binary      bool       `json:"binary"`
}

type execParams struct {
	execOptions
	Argv []string `json:"argv"`
	// Script is refused, with a better word than "unknown field".
	Script *string `json:"script"`
}

type shellParams struct {
	execOptions
	Script *string `json:"script"`
	// Argv is refused, with a better word than "unknown field".
	Argv []string `json:"argv"`
}

type execResult struct {
	ExitCode   int      `json:"exit_code"`
	Signal     string   `json:"signal,omitempty"`
	TimedOut   bool     `json:"timed_out"`
	OOMKilled  bool     `json:"oom_killed"`
	Truncated  bool     `json:"truncated"`
	Stdout     *outText `json:"stdout"`
	Stderr     *outText `json:"stderr"`
	DurationMs float64  `json:"duration_ms"`
}

func (p *execParams) request() (*wire.ExecRequest, error) {
	if p.Script != nil {
		return nil, errdefs.Errorf(errInvalidParams, "sandbox.exec takes \"argv\"; use sandbox.shell for a script")
	}
	return p.execOptions.request(p.Argv)
}

func (p *shellParams) request() (*wire.ExecRequest, error) {
	if p.Script == nil || len(p.Argv) > 0 {
		return nil, errdefs.Errorf(errInvalidParams, "sandbox.shell takes \"script\" (and no \"argv\")")
	}
	return p.execOptions.request([]string{"/bin/sh", "-c", *p.Script})
}

func (p *execOptions) request(argv []string) (*wire.ExecRequest, error) {
	if len(argv) == 0 || argv[0] == "" {
		return nil, errdefs.Errorf(errInvalidParams, "\"argv\" is missing or empty")
	}
	if err := p.Stdin.check(); err != nil {
		return nil, err
	}
	if p.OutputLimit < 0 || p.OutputLimit > wire.MaxOutputLimit {
		return nil, errdefs.Errorf(errInvalidParams, "output_limit %d: want 0 (1 MiB) up to %d", p.OutputLimit, wire.MaxOutputLimit)
	}
	timeout, err := seconds("timeout", p.Timeout, maxTimeout)
	if err != nil {
		return nil, err
	}
	return &wire.ExecRequest{Argv: argv, Env: p.Env, Cwd: p.Cwd, User: p.User, Stdin: []byte(p.Stdin),
		TimeoutMs: timeout.Milliseconds(), OutputLimit: p.OutputLimit}, nil
}

func (s *Server) sandboxExec(ctx context.Context, c *call, p *execParams) (any, error) {
	ns, name, err := c.resolveRef(p.sandboxRef)
	if err != nil {
		return nil, err
	}
	req, err := p.request()
	if err != nil {
		return nil, err
	}
	return s.execBuffered(ctx, c.bulk, ns, name, "exec", req, p.Binary)
}

func (s *Server) sandboxShell(ctx context.Context, c *call, p *shellParams) (any, error) {
	ns, name, err := c.resolveRef(p.sandboxRef)
	if err != nil {
		return nil, err
	}
	req, err := p.request()
	if err != nil {
		return nil, err
	}
	return s.execBuffered(ctx, c.bulk, ns, name, "shell", req, p.Binary)
}

// execBuffered runs req to its end and answers with its whole output,
// taken in in b's turns once it is bulk.
func (s *Server) execBuffered(ctx context.Context, b bulk, ns, name, kind string, req *wire.ExecRequest, binary bool) (any, error) {
	var stdout, stderr blocks
	res, err := s.exec(ctx, ns, name, kind, req, b.output(func(stream string, d []byte) {
		if stream == wire.Stderr {
			_, _ = stderr.Write(d)
		} else {
			_, _ = stdout.Write(d)
		}
	}))
	if err != nil {
		return nil, err
	}
	if res.Error != "" {
		return nil, errdefs.Errorf(errdefs.ErrExecFailed, "%.100q could not be started: %s", req.Argv[0], res.Error)
	}
	out := execResult{ExitCode: res.Code, Signal: res.Signal, TimedOut: res.TimedOut, OOMKilled: res.OOMKilled,
		Truncated: res.Truncated, DurationMs: res.DurationMs}
	shape := func() error {
		out.Stdout, out.Stderr = newOutText(stdout.Bytes(), binary), newOutText(stderr.Bytes(), binary)
		return nil
	}
	if stdout.Len()+stderr.Len() < bulkBytes {
		_ = shape()
	} else if err := b.do(shape); err != nil {
		return nil, err
	}
	return out, nil
}

func encode(b []byte, binary bool) string {
	if binary {
		return base64.StdEncoding.EncodeToString(b)
	}
	return text(b)
}
