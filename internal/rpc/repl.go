package rpc

import (
	"context"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/warren-sandbox/warren/internal/audit"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/wire"
)

type replParams struct {
	agentRef
	Language string       `json:"language"`
	Code     *string      `json:"code"`
	Timeout  limitSeconds `json:"timeout"`
}

// replResult is sandbox.repl.run's answer: microsandbox's shape plus
// Warren's fields.
type replResult struct {
	Status     string     `json:"status"`
	Language   string     `json:"language"`
	Output     *lineSpool `json:"output"`
	HasError   bool       `json:"has_error"`
	Result     *string    `json:"result,omitempty"`
	Error      string     `json:"error,omitempty"`
	Truncated  bool       `json:"truncated,omitempty"`
	DurationMs float64    `json:"duration_ms"`
}

// outputFull tells a run whose output was cut from one whose result alone
// was (Truncated says either): the agent keeps output up to the limit's
// last bytes (a cut line ends on a whole character) or wire.MaxReplLines.
// bytes counts each line's text and its newline.
func outputFull(bytes int64, lines int, limit int64) bool {
	return bytes >= limit-utf8.UTFMax || lines >= wire.MaxReplLines
}

// maxCode bounds the code of one REPL run.
const maxCode = 16 << 20

func (s *Server) sandboxRepl(ctx context.Context, c *call, p *replParams) (any, error) {
	ns, name, err := c.resolveRef(p.sandboxRef)
	if err != nil {
		return nil, err
	}
	// Any case, as microsandbox takes it ("Python"); the answer names it
	// as the request did.
	lang := strings.ToLower(p.Language)
	switch lang {
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
	l, err := s.lease(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	defer l.Release()
	t0 := time.Now()
	limit := min(s.opts.MaxOutput, wire.MaxOutputLimit)
	// The lines are spooled as they arrive: a large output is never held
	// whole in the server's memory.
	spool := &lineSpool{}
	var nBytes int64
	nLines, stderr := 0, false
	res, err := l.Repl(ctx, wire.ReplRequest{Language: lang, Code: *p.Code, TimeoutMs: timeout.Milliseconds(), OutputLimit: limit},
		func(l wire.OutputLine) {
			spool.line(l.Stream, l.Text)
			nBytes += int64(len(l.Text)) + 1
			nLines++
			stderr = stderr || l.Stream == wire.Stderr
		})
	s.m.execLatency(ns, "repl", time.Since(t0))
	if s.opts.Audit != nil {
		e := &audit.Exec{Via: "repl"}
		e.SetCode(lang, *p.Code)
		if err == nil && res.Status != wire.ReplSuccess {
			e.Outcome = "error" // the code raised: the run itself worked
		}
		s.auditExec(ctx, ns, name, e, t0, err)
	}
	if err != nil {
		spool.Close()
		return nil, err
	}
	out := replResult{Status: "success", Language: p.Language, Output: spool, Result: res.Result,
		Error: res.Error, Truncated: res.Truncated, DurationMs: res.DurationMs, HasError: stderr}
	if res.Status != wire.ReplSuccess {
		out.Status = "error"
		out.HasError = true
	}
	if res.Truncated && outputFull(nBytes, nLines, limit) {
		out.Output.line(wire.Stderr, s.outputCut(ctx, ns, name, "sandbox.repl.run", limit))
		out.HasError = true
	}
	if err := out.Output.done(); err != nil {
		return nil, err
	}
	return out, nil
}
