package rpc

import (
	"context"
	"time"

	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/wire"
)

// processRef names one background process of a sandbox.
type processRef struct {
	agentRef
	ID string `json:"id"`
}

// onProcess runs f with a lease on the sandbox of the process ref names.
func (s *Server) onProcess(ctx context.Context, c *call, ref processRef, f func(l *sandbox.Lease) (any, error)) (any, error) {
	ns, name, err := c.resolveRef(ref.sandboxRef)
	if err != nil {
		return nil, err
	}
	if ref.ID == "" {
		return nil, errdefs.Errorf(errInvalidParams, "\"id\" (the process id) is missing")
	}
	return s.agentCall(ctx, ns, name, f)
}

type processStartParams struct {
	agentRef
	Argv  []string   `json:"argv"`
	Env   []string   `json:"env"`
	Cwd   string     `json:"cwd"`
	User  string     `json:"user"`
	TTY   bool       `json:"tty"`
	Rows  uint16     `json:"rows"`
	Cols  uint16     `json:"cols"`
	Stdin stdinParam `json:"stdin"`
}

func (s *Server) processStart(ctx context.Context, c *call, p *processStartParams) (any, error) {
	return s.onSandbox(ctx, c, p.sandboxRef, func(l *sandbox.Lease) (any, error) {
		if len(p.Argv) == 0 || p.Argv[0] == "" {
			return nil, errdefs.Errorf(errInvalidParams, "\"argv\" is missing or empty")
		}
		if err := p.Stdin.check(); err != nil {
			return nil, err
		}
		t0 := time.Now()
		pi, err := l.Agent().StartProcess(ctx, &wire.ExecRequest{Argv: p.Argv, Env: p.Env, Cwd: p.Cwd, User: p.User, TTY: p.TTY,
			Rows: p.Rows, Cols: p.Cols, Stdin: []byte(p.Stdin)})
		s.auditStarted(ctx, l, "process", p.Argv, pi.ID, t0, err)
		if err != nil {
			return nil, err
		}
		l.Logf("process %s started: %.200q", pi.ID, p.Argv)
		return toProcessInfo(pi), nil
	})
}

type processList struct {
	Processes []processInfo `json:"processes"`
}

func (s *Server) processList(ctx context.Context, c *call, p *agentRef) (any, error) {
	return s.onSandbox(ctx, c, p.sandboxRef, func(l *sandbox.Lease) (any, error) {
		ps, err := l.Agent().Processes(ctx)
		if err != nil {
			return nil, err
		}
		out := processList{Processes: make([]processInfo, len(ps))}
		for i, pi := range ps {
			out.Processes[i] = toProcessInfo(pi)
		}
		return out, nil
	})
}

func (s *Server) processGet(ctx context.Context, c *call, p *processRef) (any, error) {
	return s.onProcess(ctx, c, *p, func(l *sandbox.Lease) (any, error) {
		pi, err := l.Agent().Process(ctx, p.ID)
		if err != nil {
			return nil, err
		}
		return toProcessInfo(pi), nil
	})
}

type processOutputParams struct {
	processRef
	Stream string  `json:"stream"`
	Offset int64   `json:"offset"`
	Wait   float64 `json:"wait"`
	Binary bool    `json:"binary"`
}

type outputResult struct {
	Offset     int64  `json:"offset"`
	Data       string `json:"data"`
	NextOffset int64  `json:"next_offset"`
	Dropped    int64  `json:"dropped"`
	EOF        bool   `json:"eof"`
}

func (s *Server) processOutput(ctx context.Context, c *call, p *processOutputParams) (any, error) {
	return s.onProcess(ctx, c, p.processRef, func(l *sandbox.Lease) (any, error) {
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

type processWaitParams struct {
	processRef
	Timeout float64 `json:"timeout"`
}

func (s *Server) processWait(ctx context.Context, c *call, p *processWaitParams) (any, error) {
	return s.onProcess(ctx, c, p.processRef, func(l *sandbox.Lease) (any, error) {
		timeout, err := seconds("timeout", p.Timeout, 5*time.Minute)
		if err != nil {
			return nil, err
		}
		if timeout == 0 {
			timeout = 5 * time.Minute
		}
		pi, err := l.Agent().Wait(ctx, p.ID, timeout)
		if err != nil {
			return nil, err
		}
		return toProcessInfo(pi), nil
	})
}

type processSignalParams struct {
	processRef
	Signal string `json:"signal"`
}

func (s *Server) processSignal(ctx context.Context, c *call, p *processSignalParams) (any, error) {
	return s.onProcess(ctx, c, p.processRef, func(l *sandbox.Lease) (any, error) {
		if p.Signal == "" {
			return nil, errdefs.Errorf(errInvalidParams, "\"signal\" is missing")
		}
		return done{}, l.Agent().Signal(ctx, p.ID, p.Signal)
	})
}

type processStdinParams struct {
	processRef
	Data  string `json:"data"`
	Close bool   `json:"close"`
}

func (s *Server) processStdin(ctx context.Context, c *call, p *processStdinParams) (any, error) {
	return s.onProcess(ctx, c, p.processRef, func(l *sandbox.Lease) (any, error) {
		if len(p.Data) > wire.MaxStdin {
			return nil, errdefs.Errorf(errdefs.ErrTooLarge, "data is larger than %d MiB", wire.MaxStdin>>20)
		}
		return done{}, l.Agent().WriteStdin(ctx, p.ID, []byte(p.Data), p.Close)
	})
}

type processResizeParams struct {
	processRef
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

func (s *Server) processResize(ctx context.Context, c *call, p *processResizeParams) (any, error) {
	return s.onProcess(ctx, c, p.processRef, func(l *sandbox.Lease) (any, error) {
		if p.Rows == 0 || p.Cols == 0 {
			return nil, errdefs.Errorf(errInvalidParams, "rows and cols must be positive")
		}
		return done{}, l.Agent().Resize(ctx, p.ID, p.Rows, p.Cols)
	})
}

func (s *Server) processRemove(ctx context.Context, c *call, p *processRef) (any, error) {
	return s.onProcess(ctx, c, *p, func(l *sandbox.Lease) (any, error) {
		return done{}, l.Agent().RemoveProcess(ctx, p.ID)
	})
}
