package rpc

import (
	"bytes"
	"context"
	"encoding/base64"
	"time"

	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/wire"
)

func (s *Server) methodTable() map[string]method {
	return map[string]method{
		// microsandbox (PROTOCOL.md §4)
		"sandbox.start":       s.sandboxStart,
		"sandbox.stop":        s.sandboxStop,
		"sandbox.repl.run":    s.sandboxRepl,
		"sandbox.command.run": s.sandboxCommand,
		"sandbox.metrics.get": s.sandboxMetrics,
		// Warren (docs/api.md)
		"sandbox.create":         s.sandboxCreate,
		"sandbox.get":            s.sandboxGet,
		"sandbox.list":           s.sandboxList,
		"sandbox.remove":         s.sandboxRemove,
		"sandbox.logs":           s.sandboxLogs,
		"sandbox.exec":           s.sandboxExec,
		"sandbox.shell":          s.sandboxExec,
		"sandbox.process.start":  s.processStart,
		"sandbox.process.list":   s.processList,
		"sandbox.process.get":    s.processGet,
		"sandbox.process.output": s.processOutput,
		"sandbox.process.wait":   s.processWait,
		"sandbox.process.signal": s.processSignal,
		"sandbox.process.stdin":  s.processStdin,
		"sandbox.process.resize": s.processResize,
		"sandbox.process.remove": s.processRemove,
		"sandbox.file.read":      s.fileRead,
		"sandbox.file.write":     s.fileWrite,
		"sandbox.file.list":      s.fileList,
		"sandbox.file.stat":      s.fileStat,
		"sandbox.file.mkdir":     s.fileMkdir,
		"sandbox.file.remove":    s.fileRemove,
		"sandbox.file.move":      s.fileMove,
		"image.list":             s.imageList,
		"image.pull":             s.imagePull,
		"key.create":             s.keyCreate,
		"key.list":               s.keyList,
		"key.revoke":             s.keyRevoke,
	}
}

// sandboxInfo is SandboxInfo on the wire.
type sandboxInfo struct {
	Namespace   string            `json:"namespace"`
	Name        string            `json:"name"`
	State       string            `json:"state"`
	Error       string            `json:"error,omitempty"`
	Image       string            `json:"image"`
	MemoryMiB   int64             `json:"memory_mib"`
	CPUs        float64           `json:"cpus"`
	Labels      map[string]string `json:"labels"`
	CreatedAt   *time.Time        `json:"created_at,omitempty"`
	StartedAt   *time.Time        `json:"started_at,omitempty"`
	StoppedAt   *time.Time        `json:"stopped_at,omitempty"`
	IdleTimeout float64           `json:"idle_timeout"`
	MaxLifetime float64           `json:"max_lifetime"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

func toInfo(in sandbox.Info) sandboxInfo {
	labels := in.Spec.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	return sandboxInfo{Namespace: in.Namespace, Name: in.Name, State: string(in.State), Error: in.Error,
		Image: in.Spec.Image, MemoryMiB: in.Spec.MemoryMiB, CPUs: in.Spec.CPUs, Labels: labels,
		CreatedAt: timePtr(in.Created), StartedAt: timePtr(in.Started), StoppedAt: timePtr(in.Stopped),
		IdleTimeout: in.Spec.IdleTimeout.Seconds(), MaxLifetime: in.Spec.MaxLifetime.Seconds()}
}

type createParams struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace"`
	Image       string            `json:"image"`
	MemoryMiB   int64             `json:"memory_mib"`
	CPUs        float64           `json:"cpus"`
	Env         []string          `json:"env"`
	Workdir     string            `json:"workdir"`
	Labels      map[string]string `json:"labels"`
	IdleTimeout float64           `json:"idle_timeout"`
	MaxLifetime float64           `json:"max_lifetime"`
	Workspace   string            `json:"workspace"`
	Secrets     []string          `json:"secrets"`
	Egress      []string          `json:"egress"`
	Volumes     []string          `json:"volumes"`
}

func (s *Server) sandboxCreate(ctx context.Context, c *call) (any, error) {
	var p createParams
	if err := c.decode(&p, true); err != nil {
		return nil, err
	}
	if p.Name == "" {
		return nil, errdefs.Errorf(errInvalidParams, "\"name\" is missing")
	}
	ns, name, err := c.resolve(p.Namespace, p.Name)
	if err != nil {
		return nil, err
	}
	switch {
	case p.Workspace != "":
		return nil, errdefs.Errorf(errInvalidParams, "workspace: workspaces are not configured on this server")
	case len(p.Secrets) > 0:
		return nil, errdefs.Errorf(errInvalidParams, "secrets: no secret store is configured on this server")
	case len(p.Egress) > 0:
		return nil, errdefs.Errorf(errInvalidParams, "egress: sandboxes have no network but loopback; egress rules are not supported yet")
	}
	if p.MemoryMiB == 0 {
		p.MemoryMiB = 512
	}
	if p.CPUs == 0 {
		p.CPUs = 1
	}
	if p.Image == "" {
		p.Image = "python"
	}
	idle, err := seconds("idle_timeout", p.IdleTimeout, 30*24*time.Hour)
	if err != nil {
		return nil, err
	}
	life, err := seconds("max_lifetime", p.MaxLifetime, 30*24*time.Hour)
	if err != nil {
		return nil, err
	}
	vols, err := parseVolumes(p.Volumes)
	if err != nil {
		return nil, err
	}
	spec := sandbox.Spec{Image: p.Image, MemoryMiB: p.MemoryMiB, CPUs: p.CPUs, Env: p.Env, Workdir: p.Workdir,
		Labels: p.Labels, IdleTimeout: idle, MaxLifetime: life, Volumes: vols}
	t0 := time.Now()
	info, err := s.mgr.Start(ctx, ns, name, spec, true)
	if err != nil {
		return nil, err
	}
	s.m.startLatency(ns, time.Since(t0))
	return toInfo(info), nil
}

func (s *Server) sandboxGet(_ context.Context, c *call) (any, error) {
	ns, name, err := c.target(true)
	if err != nil {
		return nil, err
	}
	info, err := s.mgr.Get(ns, name)
	if err != nil {
		return nil, err
	}
	return toInfo(info), nil
}

func (s *Server) sandboxList(_ context.Context, c *call) (any, error) {
	var p struct {
		Namespace string            `json:"namespace"`
		State     string            `json:"state"`
		Labels    map[string]string `json:"labels"`
	}
	if err := c.decode(&p, true); err != nil {
		return nil, err
	}
	nss, err := c.namespaces(p.Namespace)
	if err != nil {
		return nil, err
	}
	if p.State != "" && !sandbox.ValidState(p.State) {
		return nil, errdefs.Errorf(errInvalidParams, "state %.40q: want starting, running, stopping, stopped or error", p.State)
	}
	infos := s.mgr.List(sandbox.Filter{Namespaces: nss, State: sandbox.State(p.State), Labels: p.Labels})
	out := make([]sandboxInfo, len(infos))
	for i, in := range infos {
		out[i] = toInfo(in)
	}
	return map[string]any{"sandboxes": out}, nil
}

func (s *Server) sandboxRemove(ctx context.Context, c *call) (any, error) {
	ns, name, err := c.target(true)
	if err != nil {
		return nil, err
	}
	removed, err := s.mgr.Remove(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	return map[string]bool{"removed": removed}, nil
}

func (s *Server) sandboxLogs(_ context.Context, c *call) (any, error) {
	var p struct {
		Sandbox   string `json:"sandbox"`
		Namespace string `json:"namespace"`
		Tail      int    `json:"tail"`
	}
	if err := c.decode(&p, true); err != nil {
		return nil, err
	}
	ns, name, err := c.resolve(p.Namespace, p.Sandbox)
	if err != nil {
		return nil, err
	}
	lines, err := s.mgr.Logs(ns, name, p.Tail)
	if err != nil {
		return nil, err
	}
	return map[string]any{"lines": lines}, nil
}

type execParams struct {
	Sandbox     string   `json:"sandbox"`
	Namespace   string   `json:"namespace"`
	Argv        []string `json:"argv"`
	Script      *string  `json:"script"`
	Stdin       string   `json:"stdin"`
	Env         []string `json:"env"`
	Cwd         string   `json:"cwd"`
	User        string   `json:"user"`
	Timeout     float64  `json:"timeout"`
	OutputLimit int64    `json:"output_limit"`
	Binary      bool     `json:"binary"`
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

func (p *execParams) request(method string) (*wire.ExecRequest, error) {
	if method == "sandbox.shell" {
		if p.Script == nil || len(p.Argv) > 0 {
			return nil, errdefs.Errorf(errInvalidParams, "sandbox.shell takes \"script\" (and no \"argv\")")
		}
		p.Argv = []string{"/bin/sh", "-c", *p.Script}
	} else if p.Script != nil {
		return nil, errdefs.Errorf(errInvalidParams, "sandbox.exec takes \"argv\"; use sandbox.shell for a script")
	}
	if len(p.Argv) == 0 || p.Argv[0] == "" {
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
	return &wire.ExecRequest{Argv: p.Argv, Env: p.Env, Cwd: p.Cwd, User: p.User, Stdin: []byte(p.Stdin),
		TimeoutMs: timeout.Milliseconds(), OutputLimit: p.OutputLimit}, nil
}

func (s *Server) sandboxExec(ctx context.Context, c *call) (any, error) {
	var p execParams
	if err := c.decode(&p, true); err != nil {
		return nil, err
	}
	ns, name, err := c.resolve(p.Namespace, p.Sandbox)
	if err != nil {
		return nil, err
	}
	req, err := p.request(c.method)
	if err != nil {
		return nil, err
	}
	var stdout, stderr bytes.Buffer
	kind := "exec"
	if c.method == "sandbox.shell" {
		kind = "shell"
	}
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
	out.Stdout, out.Stderr = encode(stdout.Bytes(), p.Binary), encode(stderr.Bytes(), p.Binary)
	return out, nil
}

func encode(b []byte, binary bool) string {
	if binary {
		return base64.StdEncoding.EncodeToString(b)
	}
	return text(b)
}

// agentCall runs f with a lease on the running sandbox; an error that a
// stop caused says so.
func (s *Server) agentCall(ctx context.Context, ns, name string, f func(l *sandbox.Lease) (any, error)) (any, error) {
	l, err := s.mgr.Lease(ns, name)
	if err != nil {
		return nil, err
	}
	defer l.Release()
	res, err := f(l)
	if err != nil {
		return nil, l.Explain(ctx, "the request ran", err)
	}
	return res, nil
}

type processParams struct {
	Sandbox   string   `json:"sandbox"`
	Namespace string   `json:"namespace"`
	ID        string   `json:"id"`
	Argv      []string `json:"argv"`
	Env       []string `json:"env"`
	Cwd       string   `json:"cwd"`
	User      string   `json:"user"`
	TTY       bool     `json:"tty"`
	Stdin     string   `json:"stdin"`
	Stream    string   `json:"stream"`
	Offset    int64    `json:"offset"`
	Wait      float64  `json:"wait"`
	Timeout   float64  `json:"timeout"`
	Binary    bool     `json:"binary"`
	Signal    string   `json:"signal"`
	Data      string   `json:"data"`
	Close     bool     `json:"close"`
	Rows      uint16   `json:"rows"`
	Cols      uint16   `json:"cols"`
}

// processCall decodes a process method's params, checking only the fields
// that method takes are present.
func (s *Server) processCall(ctx context.Context, c *call, allowed map[string]bool, f func(ctx context.Context, l *sandbox.Lease, p *processParams) (any, error)) (any, error) {
	var p processParams
	if err := c.decodeFields(&p, allowed); err != nil {
		return nil, err
	}
	ns, name, err := c.resolve(p.Namespace, p.Sandbox)
	if err != nil {
		return nil, err
	}
	if allowed["id"] && p.ID == "" {
		return nil, errdefs.Errorf(errInvalidParams, "\"id\" (the process id) is missing")
	}
	return s.agentCall(ctx, ns, name, func(l *sandbox.Lease) (any, error) { return f(ctx, l, &p) })
}

func fields(names ...string) map[string]bool {
	m := map[string]bool{"sandbox": true, "namespace": true}
	for _, n := range names {
		m[n] = true
	}
	return m
}

func (s *Server) processStart(ctx context.Context, c *call) (any, error) {
	return s.processCall(ctx, c, fields("argv", "env", "cwd", "user", "tty", "rows", "cols", "stdin"), func(ctx context.Context, l *sandbox.Lease, p *processParams) (any, error) {
		if len(p.Argv) == 0 || p.Argv[0] == "" {
			return nil, errdefs.Errorf(errInvalidParams, "\"argv\" is missing or empty")
		}
		if len(p.Stdin) > wire.MaxStdin {
			return nil, errdefs.Errorf(errdefs.ErrTooLarge, "stdin is larger than %d MiB", wire.MaxStdin>>20)
		}
		pi, err := l.Agent().StartProcess(ctx, &wire.ExecRequest{Argv: p.Argv, Env: p.Env, Cwd: p.Cwd, User: p.User, TTY: p.TTY,
			Rows: p.Rows, Cols: p.Cols, Stdin: []byte(p.Stdin)})
		if err != nil {
			return nil, err
		}
		l.Logf("process %s started: %.200q", pi.ID, p.Argv)
		return pi, nil
	})
}

func (s *Server) processList(ctx context.Context, c *call) (any, error) {
	return s.processCall(ctx, c, fields(), func(ctx context.Context, l *sandbox.Lease, _ *processParams) (any, error) {
		ps, err := l.Agent().Processes(ctx)
		if err != nil {
			return nil, err
		}
		if ps == nil {
			ps = []wire.ProcessInfo{}
		}
		return map[string]any{"processes": ps}, nil
	})
}

func (s *Server) processGet(ctx context.Context, c *call) (any, error) {
	return s.processCall(ctx, c, fields("id"), func(ctx context.Context, l *sandbox.Lease, p *processParams) (any, error) {
		return l.Agent().Process(ctx, p.ID)
	})
}

type outputResult struct {
	Offset     int64  `json:"offset"`
	Data       string `json:"data"`
	NextOffset int64  `json:"next_offset"`
	Dropped    int64  `json:"dropped"`
	EOF        bool   `json:"eof"`
}

func (s *Server) processOutput(ctx context.Context, c *call) (any, error) {
	return s.processCall(ctx, c, fields("id", "stream", "offset", "wait", "binary"), func(ctx context.Context, l *sandbox.Lease, p *processParams) (any, error) {
		if p.Stream == "" {
			p.Stream = wire.Stdout
		}
		if p.Stream != wire.Stdout && p.Stream != wire.Stderr {
			return nil, errdefs.Errorf(errInvalidParams, "stream %.20q: want stdout or stderr", p.Stream)
		}
		if p.Offset < 0 {
			return nil, errdefs.Errorf(errInvalidParams, "offset must not be negative")
		}
		wait, err := seconds("wait", p.Wait, time.Minute)
		if err != nil {
			return nil, err
		}
		ch, err := l.Agent().Output(ctx, p.ID, p.Stream, p.Offset, wait)
		if err != nil {
			return nil, err
		}
		return outputResult{Offset: ch.Offset, Data: encode(ch.Data, p.Binary), NextOffset: ch.NextOffset, Dropped: ch.Dropped, EOF: ch.EOF}, nil
	})
}

func (s *Server) processWait(ctx context.Context, c *call) (any, error) {
	return s.processCall(ctx, c, fields("id", "timeout"), func(ctx context.Context, l *sandbox.Lease, p *processParams) (any, error) {
		timeout, err := seconds("timeout", p.Timeout, 5*time.Minute)
		if err != nil {
			return nil, err
		}
		if timeout == 0 {
			timeout = 5 * time.Minute
		}
		return l.Agent().Wait(ctx, p.ID, timeout)
	})
}

func (s *Server) processSignal(ctx context.Context, c *call) (any, error) {
	return s.processCall(ctx, c, fields("id", "signal"), func(ctx context.Context, l *sandbox.Lease, p *processParams) (any, error) {
		if p.Signal == "" {
			return nil, errdefs.Errorf(errInvalidParams, "\"signal\" is missing")
		}
		return struct{}{}, l.Agent().Signal(ctx, p.ID, p.Signal)
	})
}

func (s *Server) processStdin(ctx context.Context, c *call) (any, error) {
	return s.processCall(ctx, c, fields("id", "data", "close"), func(ctx context.Context, l *sandbox.Lease, p *processParams) (any, error) {
		if len(p.Data) > wire.MaxStdin {
			return nil, errdefs.Errorf(errdefs.ErrTooLarge, "data is larger than %d MiB", wire.MaxStdin>>20)
		}
		return struct{}{}, l.Agent().WriteStdin(ctx, p.ID, []byte(p.Data), p.Close)
	})
}

func (s *Server) processResize(ctx context.Context, c *call) (any, error) {
	return s.processCall(ctx, c, fields("id", "rows", "cols"), func(ctx context.Context, l *sandbox.Lease, p *processParams) (any, error) {
		if p.Rows == 0 || p.Cols == 0 {
			return nil, errdefs.Errorf(errInvalidParams, "rows and cols must be positive")
		}
		return struct{}{}, l.Agent().Resize(ctx, p.ID, p.Rows, p.Cols)
	})
}

func (s *Server) processRemove(ctx context.Context, c *call) (any, error) {
	return s.processCall(ctx, c, fields("id"), func(ctx context.Context, l *sandbox.Lease, p *processParams) (any, error) {
		return struct{}{}, l.Agent().RemoveProcess(ctx, p.ID)
	})
}
