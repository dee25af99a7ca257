package rpc

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/warren-sandbox/warren/internal/audit"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

// Auditor takes the server's audit records (Options.Audit; *audit.Log is
// one). Append writes a record before it returns or fails; Err says the
// log takes no more records.
type Auditor interface {
	Append(*audit.Record) error
	Err() error
}

// What the server records (docs/policy.md "Audit log"): every method call
// (call, the one place methods run: the RPC endpoint, the REST routes and
// MCP), every HTTP route that acts on a sandbox outside it (tar transfers,
// port proxying, WebSocket sessions), every run in a sandbox (exec.go,
// repl.go, processes.go, ws.go), every refusal of kind limit or forbidden,
// and key changes. A server that cannot record refuses the work: a
// request that arrives while the log takes no records is answered
// unavailable before it runs, and one whose record fails is answered
// unavailable after it ran (the server's log says what failed).

type auditKey int

const (
	auditCallKey auditKey = iota
	auditHTTPKey
)

// errAudit is the answer of a request the server cannot record.
func errAudit(err error) error {
	return errdefs.Errorf(errdefs.ErrUnavailable, "the audit log takes no records, so the server does no work: %v", err)
}

// beginAudit starts the record of c: ctx carries c for the records made
// while it runs (runs record the caller's key). It fails when the log
// takes no records.
func (s *Server) beginAudit(ctx context.Context, c *call) (context.Context, error) {
	if err := s.opts.Audit.Err(); err != nil {
		return ctx, errAudit(err)
	}
	return context.WithValue(ctx, auditCallKey, c), nil
}

// auditCall records c, which ran from t0 and ended with err, and returns
// the error its caller answers with.
func (s *Server) auditCall(ctx context.Context, c *call, params json.RawMessage, t0 time.Time, err error) error {
	r := s.auditRecord(ctx, c, audit.KindCall)
	r.Call = &audit.Call{Method: audit.Clip(c.method, 64), Params: audit.Params(params), Outcome: outcome(err),
		DurationMs: float64(time.Since(t0).Microseconds()) / 1000}
	return s.appendAudit(ctx, r, c, err)
}

// appendAudit writes r, and a refusal record when err is one; it returns
// err, or the failure to record.
func (s *Server) appendAudit(ctx context.Context, r *audit.Record, c *call, err error) error {
	aerr := s.opts.Audit.Append(r)
	if k := errdefs.Kind(err); aerr == nil && err != nil && (k == errdefs.ErrLimit.Error() || k == errdefs.ErrForbidden.Error()) {
		rr := s.auditRecord(ctx, c, audit.KindRefusal)
		rr.Refusal = &audit.Refusal{Method: audit.Clip(c.method, 64), Kind: k, Message: audit.Clip(err.Error(), 1024)}
		aerr = s.opts.Audit.Append(rr)
	}
	if aerr != nil {
		s.log.Error("audit record lost: the request is answered unavailable", "request_id", requestID(ctx), "method", c.method, "err", aerr)
		return errAudit(aerr)
	}
	return err
}

// auditRecord starts a record of kind about c's caller and sandbox.
func (s *Server) auditRecord(ctx context.Context, c *call, kind audit.Kind) *audit.Record {
	r := &audit.Record{Kind: kind, RequestID: requestID(ctx)}
	if c == nil {
		return r
	}
	r.KeyID, r.Namespace, r.Sandbox = c.claims.ID, c.ns, c.sandbox
	if r.Namespace == "" && c.claims.Namespace != "*" {
		r.Namespace = c.claims.Namespace
	}
	r.Labels = c.labels
	if r.Labels == nil && c.sandbox != "" {
		r.Labels = s.mgr.Labels(c.ns, c.sandbox) // made by this call
	}
	return r
}

func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	return kindOf(err)
}

// auditExec records a run in sandbox ns/name, for the call in ctx.
func (s *Server) auditExec(ctx context.Context, ns, name string, e *audit.Exec, t0 time.Time, err error) {
	if s.opts.Audit == nil {
		return
	}
	c, _ := ctx.Value(auditCallKey).(*call)
	r := s.auditRecord(ctx, c, audit.KindExec)
	r.Namespace, r.Sandbox = ns, name
	if c == nil || c.sandbox != name || c.ns != ns {
		r.Labels = s.mgr.Labels(ns, name)
	}
	if e.Outcome == "" {
		e.Outcome = outcome(err)
	}
	e.DurationMs = float64(time.Since(t0).Microseconds()) / 1000
	r.Exec = e
	if aerr := s.opts.Audit.Append(r); aerr != nil {
		// The call's own record fails the same way and answers for it.
		s.log.Error("audit record lost", "request_id", requestID(ctx), "sandbox", name, "err", aerr)
	}
}

// auditStarted records a process started in l's sandbox (no exit yet),
// or that it could not be started.
func (s *Server) auditStarted(ctx context.Context, l *sandbox.Lease, via string, argv []string, id string, t0 time.Time, err error) {
	if s.opts.Audit == nil {
		return
	}
	e := &audit.Exec{Via: via, ProcessID: id}
	e.SetArgv(argv)
	if err == nil {
		e.Outcome = "started"
	}
	ns, name := l.ID()
	s.auditExec(ctx, ns, name, e, t0, err)
}

// auditKeyChange records a key created or revoked through the API.
func (s *Server) auditKeyChange(ctx context.Context, c *call, action, id, ns string) {
	if s.opts.Audit == nil {
		return
	}
	r := s.auditRecord(ctx, c, audit.KindKey)
	r.Key = &audit.KeyChange{Action: action, ID: id, Namespace: ns, By: "api"}
	if aerr := s.opts.Audit.Append(r); aerr != nil {
		s.log.Error("audit record lost", "request_id", requestID(ctx), "key", id, "err", aerr)
	}
}

// httpAudit is the record of an HTTP route outside call: the handler
// names its call (auditHTTP), writeError its error's kind.
type httpAudit struct {
	c   *call
	err error
}

// audited records each request to h as a call of method, with the URL
// as its params.
func (s *Server) audited(method string, h http.HandlerFunc) http.HandlerFunc {
	if s.opts.Audit == nil {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if err := s.opts.Audit.Err(); err != nil {
			s.writeError(w, ctx, nil, errAudit(err), 0)
			return
		}
		t0 := time.Now()
		ha := &httpAudit{}
		h(w, r.WithContext(context.WithValue(ctx, auditHTTPKey, ha)))
		c := ha.c
		if c == nil { // refused before it was authenticated
			c = &call{s: s, method: method}
		}
		c.method = method
		params, _ := json.Marshal(map[string]string{"url": r.URL.RequestURI()})
		rec := s.auditRecord(ctx, c, audit.KindCall)
		rec.Call = &audit.Call{Method: method, Params: audit.Params(params), Outcome: outcome(ha.err),
			DurationMs: float64(time.Since(t0).Microseconds()) / 1000}
		_ = s.appendAudit(ctx, rec, c, ha.err) // the answer is sent; a failure is logged and stops the log
	}
}

// auditHTTP names the call of the HTTP route ctx is in, and carries it
// for the records of its runs; it returns the context to use.
func auditHTTP(ctx context.Context, c *call) context.Context {
	if ha, ok := ctx.Value(auditHTTPKey).(*httpAudit); ok {
		ha.c = c
		return context.WithValue(ctx, auditCallKey, c)
	}
	return ctx
}

// auditHTTPError notes the error an HTTP route answers with.
func auditHTTPError(ctx context.Context, err error) {
	if ha, ok := ctx.Value(auditHTTPKey).(*httpAudit); ok && ha.err == nil {
		ha.err = err
	}
}
