package rpc

import (
	"bytes"
	"context"
	"encoding/base64"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/wire"
)

type commandParams struct {
	sandboxRef
	Command string       `json:"command"`
	Args    []string     `json:"args"`
	Timeout limitSeconds `json:"timeout"`
}

type commandResult struct {
	Command    string       `json:"command"`
	Args       []string     `json:"args"`
	ExitCode   int          `json:"exit_code"`
	Success    bool         `json:"success"`
	Output     []outputLine `json:"output"`
	Truncated  bool         `json:"truncated,omitempty"`
	DurationMs float64      `json:"duration_ms"`
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
	var lines lineSplitter
	res, err := s.exec(ctx, ns, name, "command", &wire.ExecRequest{Argv: argv, TimeoutMs: timeout.Milliseconds()}, lines.add)
	if err != nil {
		return nil, err
	}
	switch {
	case res.Error != "":
		return nil, errdefs.Errorf(errdefs.ErrExecFailed, "command %.100q could not be started: %s", p.Command, res.Error)
	case res.TimedOut:
		return nil, errdefs.Errorf(errdefs.ErrTimeout, "command %.100q did not finish within its %v timeout and was killed", p.Command, timeout)
	}
	out := lines.done()
	if res.OOMKilled {
		out = append(out, outputLine{Stream: wire.Stderr, Text: "warren: the command was killed: the sandbox ran out of memory"})
	}
	return commandResult{Command: p.Command, Args: p.Args, ExitCode: res.Code, Success: res.Code == 0,
		Output: out, Truncated: res.Truncated, DurationMs: res.DurationMs}, nil
}

// exec runs one command in a running sandbox, timed for the metrics.
func (s *Server) exec(ctx context.Context, ns, name, kind string, req *wire.ExecRequest, onOutput func(string, []byte)) (backend.ExecResult, error) {
	l, err := s.mgr.Lease(ns, name)
	if err != nil {
		return backend.ExecResult{}, err
	}
	defer l.Release()
	t0 := time.Now()
	res, err := l.Exec(ctx, kind, req, onOutput)
	s.m.execLatency(ns, kind, time.Since(t0))
	return res, err
}

// lineSplitter turns output chunks into lines per stream, in the order
// lines were completed.
type lineSplitter struct {
	lines   []outputLine
	partial [2][]byte
}

const maxLines = 100000

func (l *lineSplitter) add(stream string, data []byte) {
	i := 0
	if stream == wire.Stderr {
		i = 1
	}
	buf := append(l.partial[i], data...)
	for {
		j := bytes.IndexByte(buf, '\n')
		if j < 0 {
			break
		}
		l.emit(stream, buf[:j])
		buf = buf[j+1:]
	}
	l.partial[i] = append([]byte(nil), buf...)
}

func (l *lineSplitter) emit(stream string, b []byte) {
	if len(l.lines) >= maxLines {
		return
	}
	l.lines = append(l.lines, outputLine{Stream: stream, Text: text(b)})
}

func (l *lineSplitter) done() []outputLine {
	for i, stream := range []string{wire.Stdout, wire.Stderr} {
		if len(l.partial[i]) > 0 {
			l.emit(stream, l.partial[i])
		}
	}
	if l.lines == nil {
		return []outputLine{}
	}
	return l.lines
}

// text makes output valid UTF-8 for JSON (invalid bytes become U+FFFD).
func text(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// execOptions are the params sandbox.exec and sandbox.shell share.
type execOptions struct {
	sandboxRef
	Stdin       string   `json:"stdin"`
	Env         []string `json:"env"`
	Cwd         string   `json:"cwd"`
	User        string   `json:"user"`
	Timeout     float64  `json:"timeout"`
	OutputLimit int64    `json:"output_limit"`
	Binary      bool     `json:"binary"`
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
	ExitCode   int     `json:"exit_code"`
	Signal     string  `json:"signal,omitempty"`
	TimedOut   bool    `json:"timed_out"`
	OOMKilled  bool    `json:"oom_killed"`
	Truncated  bool    `json:"truncated"`
	Stdout     string  `json:"stdout"`
	Stderr     string  `json:"stderr"`
	DurationMs float64 `json:"duration_ms"`
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
	if len(p.Stdin) > wire.MaxStdin {
		return nil, errdefs.Errorf(errdefs.ErrTooLarge, "stdin is larger than %d MiB", wire.MaxStdin>>20)
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
	return s.execBuffered(ctx, ns, name, "exec", req, p.Binary)
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
	return s.execBuffered(ctx, ns, name, "shell", req, p.Binary)
}

// execBuffered runs req to its end and answers with its whole output.
func (s *Server) execBuffered(ctx context.Context, ns, name, kind string, req *wire.ExecRequest, binary bool) (any, error) {
	var stdout, stderr bytes.Buffer
	res, err := s.exec(ctx, ns, name, kind, req, func(stream string, d []byte) {
		if stream == wire.Stderr {
			stderr.Write(d)
		} else {
			stdout.Write(d)
		}
	})
	if err != nil {
		return nil, err
	}
	if res.Error != "" {
		return nil, errdefs.Errorf(errdefs.ErrExecFailed, "%.100q could not be started: %s", req.Argv[0], res.Error)
	}
	out := execResult{ExitCode: res.Code, Signal: res.Signal, TimedOut: res.TimedOut, OOMKilled: res.OOMKilled,
		Truncated: res.Truncated, DurationMs: res.DurationMs}
	out.Stdout, out.Stderr = encode(stdout.Bytes(), binary), encode(stderr.Bytes(), binary)
	return out, nil
}

func encode(b []byte, binary bool) string {
	if binary {
		return base64.StdEncoding.EncodeToString(b)
	}
	return text(b)
}
