package rpc

import (
	"context"
	"time"

	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/wire"
)

type replParams struct {
	sandboxRef
	Language string       `json:"language"`
	Code     *string      `json:"code"`
	Timeout  limitSeconds `json:"timeout"`
}

// replResult is sandbox.repl.run's answer: microsandbox's shape plus
// Warren's fields.
type replResult struct {
	Status     string       `json:"status"`
	Language   string       `json:"language"`
	Output     []outputLine `json:"output"`
	HasError   bool         `json:"has_error"`
	Result     *string      `json:"result,omitempty"`
	Error      string       `json:"error,omitempty"`
	Truncated  bool         `json:"truncated,omitempty"`
	DurationMs float64      `json:"duration_ms"`
}

// maxCode bounds the code of one REPL run.
const maxCode = 16 << 20

func (s *Server) sandboxRepl(ctx context.Context, c *call, p *replParams) (any, error) {
	ns, name, err := c.resolveRef(p.sandboxRef)
	if err != nil {
		return nil, err
	}
	switch p.Language {
	case "python", "nodejs", "node", "javascript":
	case "":
		return nil, errdefs.Errorf(errInvalidParams, "\"language\" is missing: want python, nodejs, node or javascript")
	default:
		return nil, errdefs.Errorf(errInvalidParams, "language %.40q: want python, nodejs, node or javascript", p.Language)
	}
	if p.Code == nil {
		return nil, errdefs.Errorf(errInvalidParams, "\"code\" is missing")
	}
	if len(*p.Code) > maxCode {
		return nil, errdefs.Errorf(errdefs.ErrTooLarge, "code is larger than %d MiB", maxCode>>20)
	}
	timeout, err := p.Timeout.duration("timeout", maxTimeout)
	if err != nil {
		return nil, err
	}
	l, err := s.mgr.Lease(ns, name)
	if err != nil {
		return nil, err
	}
	defer l.Release()
	t0 := time.Now()
	res, err := l.Repl(ctx, wire.ReplRequest{Language: p.Language, Code: *p.Code, TimeoutMs: timeout.Milliseconds()})
	s.m.execLatency(ns, "repl", time.Since(t0))
	if err != nil {
		return nil, err
	}
	out := replResult{Status: "success", Language: p.Language, Output: toOutputLines(res.Output), Result: res.Result,
		Error: res.Error, Truncated: res.Truncated, DurationMs: res.DurationMs}
	if res.Status != wire.ReplSuccess {
		out.Status = "error"
		out.HasError = true
	}
	for _, l := range out.Output {
		if l.Stream == wire.Stderr {
			out.HasError = true
		}
	}
	return out, nil
}
