package warren

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"
)

// Output streams of a process.
const (
	Stdout = "stdout"
	Stderr = "stderr"
)

// ProcessInfo describes a background process.
type ProcessInfo struct {
	ID        string
	Argv      []string
	Pid       int
	Running   bool
	StartedAt time.Time
	// Exit is set once the process has ended.
	Exit *ProcessExit
}

// ProcessExit says how a process ended.
type ProcessExit struct {
	Code     int    // exit code, or 128+signal when killed by a signal
	Signal   string // the terminating signal, if any
	TimedOut bool
	Duration time.Duration
}

type processInfoWire struct {
	ID        string    `json:"id"`
	Argv      []string  `json:"argv"`
	Pid       int       `json:"pid"`
	Running   bool      `json:"running"`
	StartedAt time.Time `json:"started_at"`
	Exit      *struct {
		Code       int     `json:"code"`
		Signal     string  `json:"signal"`
		TimedOut   bool    `json:"timed_out"`
		DurationMs float64 `json:"duration_ms"`
	} `json:"exit"`
}

// UnmarshalJSON decodes the API's ProcessInfo.
func (p *ProcessInfo) UnmarshalJSON(b []byte) error {
	var w processInfoWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*p = ProcessInfo{ID: w.ID, Argv: w.Argv, Pid: w.Pid, Running: w.Running, StartedAt: w.StartedAt}
	if w.Exit != nil {
		p.Exit = &ProcessExit{
			Code:     w.Exit.Code,
			Signal:   w.Exit.Signal,
			TimedOut: w.Exit.TimedOut,
			Duration: time.Duration(w.Exit.DurationMs * float64(time.Millisecond)),
		}
	}
	return nil
}

// Process is a handle to a background process in a sandbox, identified by
// its id. Processes outlive the client's connection: a handle made later
// with [Sandbox.Process] reattaches to the same process.
type Process struct {
	// ID is the process's id in its sandbox.
	ID string
	// Started describes the process as it started; it is zero in handles
	// made by [Sandbox.Process].
	Started ProcessInfo
	sb      *Sandbox
}

// StartProcess starts cmd with args in the background
// (sandbox.process.start) and returns its handle. Of the
// options, ExecEnv, ExecCwd, ExecUser, ExecStdin and ExecTTY apply.
func (s *Sandbox) StartProcess(ctx context.Context, cmd string, args []string, opts ...ExecOption) (*Process, error) {
	c := newExecConfig(opts)
	p := struct {
		sandboxParams
		Argv  []string `json:"argv"`
		Env   []string `json:"env,omitempty"`
		Cwd   string   `json:"cwd,omitempty"`
		User  string   `json:"user,omitempty"`
		TTY   bool     `json:"tty,omitempty"`
		Stdin *string  `json:"stdin,omitempty"`
	}{s.params(), append([]string{cmd}, args...), c.env, c.cwd, c.user, c.tty, c.stdin}
	var info ProcessInfo
	if err := s.c.Call(ctx, "sandbox.process.start", p, &info); err != nil {
		return nil, err
	}
	return &Process{ID: info.ID, Started: info, sb: s}, nil
}

// Processes lists the sandbox's background processes
// (sandbox.process.list).
func (s *Sandbox) Processes(ctx context.Context) ([]ProcessInfo, error) {
	var res struct {
		Processes []ProcessInfo `json:"processes"`
	}
	if err := s.c.Call(ctx, "sandbox.process.list", s.params(), &res); err != nil {
		return nil, err
	}
	return res.Processes, nil
}

// Process returns a handle to the process id without asking the server.
func (s *Sandbox) Process(id string) *Process {
	return &Process{ID: id, sb: s}
}

type processParams struct {
	Sandbox   string `json:"sandbox"`
	Namespace string `json:"namespace,omitempty"`
	ID        string `json:"id"`
}

func (p *Process) params() processParams {
	return processParams{Sandbox: p.sb.Name, Namespace: p.sb.c.namespace, ID: p.ID}
}

// Info describes the process (sandbox.process.get).
func (p *Process) Info(ctx context.Context) (ProcessInfo, error) {
	var info ProcessInfo
	err := p.sb.c.Call(ctx, "sandbox.process.get", p.params(), &info)
	return info, err
}

// OutputChunk is a piece of a process's output stream.
type OutputChunk struct {
	// Offset is the stream offset of Data's first byte.
	Offset int64
	// Data is the raw output.
	Data []byte
	// NextOffset is the offset to ask for next.
	NextOffset int64
	// Dropped counts bytes skipped because the requested offset was older
	// than the last 1 MiB the server keeps.
	Dropped int64
	// EOF says the process has exited and all its output was returned.
	EOF bool
}

// Output reads stream ([Stdout] or [Stderr]) from offset
// (sandbox.process.output). wait > 0 (at most 60s) waits that long for
// output past offset before answering. Offsets count bytes since the
// process started. The data is fetched in binary mode, so it is returned
// byte for byte.
func (p *Process) Output(ctx context.Context, stream string, offset int64, wait time.Duration) (OutputChunk, error) {
	params := struct {
		processParams
		Stream string  `json:"stream,omitempty"`
		Offset int64   `json:"offset,omitempty"`
		Wait   float64 `json:"wait,omitempty"`
		Binary bool    `json:"binary"`
	}{p.params(), stream, offset, secs(wait), true}
	var w struct {
		Offset     int64  `json:"offset"`
		Data       string `json:"data"`
		NextOffset int64  `json:"next_offset"`
		Dropped    int64  `json:"dropped"`
		EOF        bool   `json:"eof"`
	}
	if err := p.sb.c.Call(ctx, "sandbox.process.output", params, &w); err != nil {
		return OutputChunk{}, err
	}
	data, err := base64.StdEncoding.DecodeString(w.Data)
	if err != nil {
		return OutputChunk{}, fmt.Errorf("warren: sandbox.process.output: decode data: %w", err)
	}
	return OutputChunk{Offset: w.Offset, Data: data, NextOffset: w.NextOffset, Dropped: w.Dropped, EOF: w.EOF}, nil
}

// Wait waits for the process to exit (sandbox.process.wait) and returns its
// description. timeout > 0 (at most 300s) bounds the wait on the server;
// 0 uses the server's default (300s). If the process is still running when
// the wait ends, the returned info has Running set.
func (p *Process) Wait(ctx context.Context, timeout time.Duration) (ProcessInfo, error) {
	params := struct {
		processParams
		Timeout float64 `json:"timeout,omitempty"`
	}{p.params(), secs(timeout)}
	var info ProcessInfo
	err := p.sb.c.Call(ctx, "sandbox.process.wait", params, &info)
	return info, err
}

// Signal sends sig ("SIGTERM", "TERM" or "15") to the process
// (sandbox.process.signal).
func (p *Process) Signal(ctx context.Context, sig string) error {
	params := struct {
		processParams
		Signal string `json:"signal"`
	}{p.params(), sig}
	return p.sb.c.Call(ctx, "sandbox.process.signal", params, nil)
}

// WriteStdin writes text to the process's standard input and, if closeAfter
// is set, closes it (sandbox.process.stdin).
func (p *Process) WriteStdin(ctx context.Context, text string, closeAfter bool) error {
	params := struct {
		processParams
		Data  string `json:"data"`
		Close bool   `json:"close,omitempty"`
	}{p.params(), text, closeAfter}
	return p.sb.c.Call(ctx, "sandbox.process.stdin", params, nil)
}

// Resize sets the terminal size of a process started with [ExecTTY]
// (sandbox.process.resize).
func (p *Process) Resize(ctx context.Context, rows, cols int) error {
	params := struct {
		processParams
		Rows int `json:"rows"`
		Cols int `json:"cols"`
	}{p.params(), rows, cols}
	return p.sb.c.Call(ctx, "sandbox.process.resize", params, nil)
}

// Remove forgets the process, killing it if it still runs
// (sandbox.process.remove).
func (p *Process) Remove(ctx context.Context) error {
	return p.sb.c.Call(ctx, "sandbox.process.remove", p.params(), nil)
}
