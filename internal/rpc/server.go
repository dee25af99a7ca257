// Package rpc is the server's API layer: the microsandbox-compatible
// JSON-RPC 2.0 endpoint and Warren's extended methods, the health route,
// tar transfers, WebSocket streams, authentication with API keys (kept by
// auth.Keys), and the mapping of error kinds to HTTP statuses and JSON-RPC
// codes (in one place, errors.go).
//
// Methods decode their params and shape their answers; whatever runs in a
// sandbox goes through the manager's sandbox.Lease. The methods live by
// resource: call.go (the method table, params decoding, namespaces),
// sandboxes.go, exec.go, repl.go, processes.go, files.go (with tar),
// metrics.go and admin.go (images, keys); results.go has the API's own
// shapes of what the agent reports.
package rpc

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/buildinfo"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/metrics"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/workspace"
)

// MaxBody bounds a JSON-RPC request body.
const MaxBody = 64 << 20

// DefaultNamespace is used when a request names none (client generation B)
// and its key is for every namespace, or in dev mode; a key for one
// namespace defaults to that one.
const DefaultNamespace = "default"

// Options wire a Server.
type Options struct {
	Manager *sandbox.Manager
	// Images pulls and lists images (nil: image methods answer unavailable).
	Images *image.Store
	// Keys verifies and records API keys; nil only in dev mode.
	Keys *auth.Keys
	// Dev disables authentication: every request acts with namespace "*".
	Dev    bool
	Logger *slog.Logger
	// Metrics is the registry the server's metrics are registered in.
	Metrics *metrics.Registry
	// MaxTarDownload bounds the tar stream of one download, in bytes
	// (0: DefaultMaxTarDownload).
	MaxTarDownload int64
	// Workspaces serves the workspace methods (nil: they answer
	// unavailable). The manager mounts them (sandbox.Options.Workspaces).
	Workspaces *workspace.Manager
	// MaxOutput bounds the output of one sandbox.command.run or
	// sandbox.repl.run, in bytes (0: DefaultMaxOutput; see exec.go).
	MaxOutput int64
	// Audit, when set, records every call, run, refusal and key change
	// (audit.go); nil records nothing.
	Audit Auditor
}

// DefaultMaxTarDownload is the tar download limit when Options sets none:
// that of an upload (wire.MaxTarUpload).
const DefaultMaxTarDownload = 1 << 30

// Server serves the API.
type Server struct {
	opts    Options
	mgr     *sandbox.Manager
	log     *slog.Logger
	methods map[string]method
	m       *serverMetrics
	bulk    *bulkGate
	closing atomic.Bool
}

// New builds the server.
func New(opts Options) (*Server, error) {
	if opts.Manager == nil {
		return nil, errors.New("rpc: no sandbox manager")
	}
	if !opts.Dev && opts.Keys == nil {
		return nil, errors.New("rpc: authentication needs a key store (or dev mode)")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.NewRegistry()
	}
	if opts.MaxTarDownload < 0 {
		return nil, fmt.Errorf("rpc: tar download limit %d: want a positive number of bytes (0 = %d)", opts.MaxTarDownload, DefaultMaxTarDownload)
	}
	if opts.MaxTarDownload == 0 {
		opts.MaxTarDownload = DefaultMaxTarDownload
	}
	var err error
	if opts.MaxOutput, err = maxOutput(opts.MaxOutput); err != nil {
		return nil, err
	}
	s := &Server{opts: opts, mgr: opts.Manager, log: opts.Logger, bulk: newBulkGate(bulkSlots())}
	s.methods = s.methodTable()
	s.m = newServerMetrics(opts.Metrics, opts.Manager, s.methods)
	return s, nil
}

// Shutdown makes new requests fail with unavailable.
func (s *Server) Shutdown() { s.closing.Store(true) }

// Handler routes every endpoint.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	// The health answer is microsandbox's, with the build's version and
	// commit added (no secret: the server's build is no more private than
	// the API it serves).
	health, _ := json.Marshal(struct {
		Message string `json:"message"`
		Version string `json:"version"`
		Commit  string `json:"commit"`
	}{"Service is healthy", buildinfo.Version(), buildinfo.Commit()})
	mux.HandleFunc("GET /api/v1/health", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(health)
	})
	notPost := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "POST")
		s.writeError(w, r.Context(), nil, errdefs.Errorf(errInvalidRequest, "use POST with a JSON-RPC 2.0 body"), http.StatusMethodNotAllowed)
	}
	mux.HandleFunc("POST /api/v1/rpc", func(w http.ResponseWriter, r *http.Request) { s.serveRPC(w, r, "") })
	mux.HandleFunc("/api/v1/rpc", notPost)
	for route, method := range restRoutes {
		mux.HandleFunc("POST "+route, func(w http.ResponseWriter, r *http.Request) { s.serveRPC(w, r, method) })
		mux.HandleFunc(route, notPost)
	}
	mux.HandleFunc("GET /api/v1/sandboxes/{namespace}/{name}/tar", s.audited("tar.download", s.serveTarDownload))
	mux.HandleFunc("PUT /api/v1/sandboxes/{namespace}/{name}/tar", s.audited("tar.upload", s.serveTarUpload))
	mux.HandleFunc("GET /api/v1/workspaces/{namespace}/{name}/tar", s.audited("workspace.download", s.serveWorkspaceDownload))
	mux.HandleFunc("PUT /api/v1/workspaces/{namespace}/{name}/tar", s.audited("workspace.upload", s.serveWorkspaceUpload))
	mux.HandleFunc("/api/v1/sandboxes/{namespace}/{name}/ports/{port}", s.audited("port.proxy", s.servePortProxy))
	mux.HandleFunc("/api/v1/sandboxes/{namespace}/{name}/ports/{port}/{path...}", s.audited("port.proxy", s.servePortProxy))
	mux.HandleFunc("GET /api/v1/ws", s.audited("ws", s.serveWS))
	mux.HandleFunc("GET /metrics", s.serveMetrics)
	return s.withRequestID(mux)
}

// restRoutes are the routes the Python and JavaScript SDKs of the
// generation without namespace post some methods to, each for one method.
// They send the same JSON-RPC request they would post to /api/v1/rpc and
// read the same answer, so a route is /api/v1/rpc held to its method.
// microsandbox's server never served them (docs/compat.md).
var restRoutes = map[string]string{
	"/api/v1/sandbox/start":       "sandbox.start",
	"/api/v1/sandbox/stop":        "sandbox.stop",
	"/api/v1/sandbox/command/run": "sandbox.command.run",
}

type ctxKey int

const (
	requestIDKey ctxKey = iota
	claimsKey
)

// withRequestID gives every request an id (or keeps a sane one the client
// sent), returns it in X-Request-Id and logs the request.
func (s *Server) withRequestID(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Request-Id")
		if len(id) == 0 || len(id) > 64 || strings.ContainsFunc(id, func(c rune) bool { return c < '!' || c > '~' }) {
			var b [8]byte
			_, _ = rand.Read(b[:])
			id = hex.EncodeToString(b[:])
		}
		w.Header().Set("X-Request-Id", id)
		ctx := context.WithValue(r.Context(), requestIDKey, id)
		rec := &statusRecorder{ResponseWriter: w, status: 200}
		t0 := time.Now()
		h.ServeHTTP(rec, r.WithContext(ctx))
		s.log.Info("http", "request_id", id, "method", r.Method, "path", r.URL.Path,
			"status", rec.status, "duration_ms", float64(time.Since(t0).Microseconds())/1000)
	})
}

func requestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey).(string)
	return id
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the writer's Flush and Hijack.
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// Hijack passes through for WebSocket upgrades.
func (r *statusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := r.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("connection cannot be hijacked")
	}
	r.status = http.StatusSwitchingProtocols
	return h.Hijack()
}

// Flush passes flushes through (streams).
func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// authenticate returns the caller's claims: dev mode acts as "*".
func (s *Server) authenticate(r *http.Request) (auth.Claims, error) {
	if s.opts.Dev {
		return auth.Claims{Namespace: "*"}, nil
	}
	k, ok := auth.FromHeader(r.Header)
	if !ok {
		return auth.Claims{}, errdefs.Errorf(errdefs.ErrUnauthorized, "no API key: send it as 'Authorization: Bearer msb_...' (create one with 'warren key create')")
	}
	return s.opts.Keys.Verify(r.Context(), k)
}

// Authenticated gives h, a handler mounted beside Handler's routes (MCP),
// the API's front door: a request id, the access log, and authentication
// with an API key, whose claims ride in the request's context (see
// ClaimsFrom). A request without a valid key gets the API's error answer
// and does not reach h.
func (s *Server) Authenticated(h http.Handler) http.Handler {
	return s.withRequestID(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := s.authenticate(r)
		if err != nil {
			s.writeError(w, r.Context(), nil, err, 0)
			return
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), claimsKey, c)))
	}))
}

// ClaimsFrom returns the claims an authenticated request carries.
func ClaimsFrom(ctx context.Context) (auth.Claims, bool) {
	c, ok := ctx.Value(claimsKey).(auth.Claims)
	return c, ok
}

// request is a JSON-RPC 2.0 request object.
type request struct {
	JSONRPC string          `json:"jsonrpc"`
	Method  string          `json:"method"`
	Params  borrowed        `json:"params"`
	ID      json.RawMessage `json:"id"`
}

// borrowed is a JSON value kept as the slice of the body it is in, not
// copied as json.RawMessage copies it: params can be tens of MiB, and a
// copy that size is one the Go scheduler cannot interrupt (see blocks).
// The body is only read after it is decoded, so the slice stays valid.
type borrowed []byte

func (b *borrowed) UnmarshalJSON(data []byte) error {
	*b = data
	return nil
}

type response struct {
	JSONRPC string          `json:"jsonrpc"`
	Result  any             `json:"result,omitempty"`
	Error   *errorObject    `json:"error,omitempty"`
	ID      json.RawMessage `json:"id,omitempty"`
}

// The id of an answer: nullID when the request's id could not be read
// (JSON-RPC 2.0's rule), noID when a well-formed request had none. An
// answer to a request without an id has no "id" member, as microsandbox
// answers; the generation of SDKs that post to the REST routes sends no
// id with sandbox.start.
var (
	nullID = json.RawMessage("null")
	noID   = json.RawMessage{}
)

// serveRPC answers one JSON-RPC request; only is the one method the route
// serves ("": any).
func (s *Server) serveRPC(w http.ResponseWriter, r *http.Request, only string) {
	ctx := r.Context()
	if s.closing.Load() {
		s.writeError(w, ctx, nil, errdefs.Errorf(errdefs.ErrUnavailable, "the server is shutting down"), 0)
		return
	}
	claims, err := s.authenticate(r)
	if err != nil {
		s.writeError(w, ctx, nil, err, 0)
		return
	}
	b := s.newBulk(ctx, claims.Namespace)
	defer b.done()
	body, err := readBody(w, r, b)
	if err != nil {
		s.writeError(w, ctx, nil, err, 0)
		return
	}
	var req request
	if len(body) < bulkBytes {
		req, err = decodeRequest(body)
	} else if berr := b.do(func() error { req, err = decodeRequest(body); return nil }); berr != nil {
		return // the client went away while it waited
	}
	if err == nil && only != "" && req.Method != only {
		err = errdefs.Errorf(errInvalidRequest, "%s serves only %s, not %.64q; post other methods to /api/v1/rpc", r.URL.Path, only, req.Method)
	}
	if err != nil {
		s.writeError(w, ctx, req.ID, err, 0)
		return
	}
	result, err := s.call(ctx, claims, req.Method, json.RawMessage(req.Params), b)
	s.m.observeCall(req.Method, err)
	if err != nil {
		s.log.Info("rpc error", "request_id", requestID(ctx), "method", req.Method, "kind", kindOf(err), "err", err.Error())
		s.writeError(w, ctx, req.ID, err, 0)
		return
	}
	writeAnswer(w, http.StatusOK, b, response{JSONRPC: "2.0", Result: result, ID: req.ID})
}

// readBody reads a JSON-RPC body of at most MaxBody bytes. A body that
// says it is larger is refused before a byte of it is read; one of a
// given length is read into a buffer of that length, not grown to it. A
// body of bulkBytes or more is bulk (fair.go): the request reads it as its
// tenant's bulk request, and stays that until its params are decoded.
func readBody(w http.ResponseWriter, r *http.Request, b bulk) ([]byte, error) {
	tooLarge := errdefs.Errorf(errdefs.ErrTooLarge, "request body is larger than %d MiB (sandbox.file.write takes at most %d MiB of data; send bigger files with the tar upload route)", MaxBody>>20, MaxFileWrite>>20)
	if r.ContentLength > MaxBody {
		return nil, tooLarge
	}
	rd := http.MaxBytesReader(w, r.Body, MaxBody)
	var body []byte
	var err error
	switch {
	case r.ContentLength >= bulkBytes:
		if err := b.hold(); err != nil {
			return nil, err
		}
		fallthrough
	case r.ContentLength > 0:
		body = make([]byte, r.ContentLength)
		_, err = io.ReadFull(rd, body)
	default:
		var buf blocks
		var n int64
		if n, err = buf.ReadFrom(io.LimitReader(rd, bulkBytes)); err == nil && n == bulkBytes {
			if err := b.hold(); err != nil {
				return nil, err
			}
			_, err = buf.ReadFrom(rd)
		}
		if err == nil {
			body = buf.Bytes()
		}
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge
		}
		return nil, errdefs.Errorf(errInvalidRequest, "read body: %w", err)
	}
	return body, nil
}

// decodeRequest parses and checks the envelope. On error the returned
// request still carries the id when one could be read.
func decodeRequest(body []byte) (request, error) {
	var req request
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) > 0 && trimmed[0] == '[' {
		return request{ID: nullID}, errdefs.Errorf(errInvalidRequest, "batch requests are not supported; send one request per POST")
	}
	if err := json.Unmarshal(body, &req); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) || errors.Is(err, io.ErrUnexpectedEOF) || len(trimmed) == 0 {
			return request{ID: nullID}, errdefs.Errorf(errParse, "body is not valid JSON: %w", err)
		}
		// Valid JSON of the wrong shape: try to keep the id.
		var idOnly struct {
			ID json.RawMessage `json:"id"`
		}
		_ = json.Unmarshal(body, &idOnly)
		req.ID = idOnly.ID
		if req.ID == nil {
			req.ID = nullID
		}
		return req, errdefs.Errorf(errInvalidRequest, "%v", jsonMessage(err))
	}
	if req.ID == nil {
		req.ID = noID
	}
	switch {
	case req.JSONRPC != "2.0":
		return req, errdefs.Errorf(errInvalidRequest, "\"jsonrpc\" must be \"2.0\"")
	case req.Method == "":
		return req, errdefs.Errorf(errInvalidRequest, "\"method\" is missing")
	case len(req.ID) > 0 && (req.ID[0] == '{' || req.ID[0] == '['):
		req.ID = nullID
		return req, errdefs.Errorf(errInvalidRequest, "\"id\" must be a string, number or null")
	}
	if len(req.Params) > 0 && !bytes.Equal(req.Params, []byte("null")) && req.Params[0] != '{' {
		return req, errdefs.Errorf(errInvalidParams, "\"params\" must be an object")
	}
	return req, nil
}

// Call runs one method as the caller with claims (the RPC endpoint and MCP
// both come through here).
func (s *Server) Call(ctx context.Context, claims auth.Claims, name string, params json.RawMessage) (any, error) {
	b := s.newBulk(ctx, claims.Namespace)
	defer b.done()
	return s.call(ctx, claims, name, params, b)
}

// call runs one method; its bulk work takes turns with b (fair.go), whose
// tenant is the namespace the caller's key is for ("*" for a key for
// every namespace).
func (s *Server) call(ctx context.Context, claims auth.Claims, name string, params json.RawMessage, b bulk) (_ any, err error) {
	c := &call{s: s, claims: claims, params: params, method: name, bulk: b}
	if s.opts.Audit != nil {
		if ctx, err = s.beginAudit(ctx, c); err != nil {
			return nil, err
		}
		t0 := time.Now()
		// Deferred first, so it runs last: it records what the recovery
		// below makes of a panic.
		defer func() { err = s.auditCall(ctx, c, params, t0, err) }()
	}
	defer func() {
		// A bug in one method must not take the server down with it.
		if r := recover(); r != nil {
			s.log.Error("panic in method", "request_id", requestID(ctx), "method", name, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = fmt.Errorf("internal error in %s (request %s); the server logged the details", name, requestID(ctx))
		}
	}()
	m, ok := s.methods[name]
	if !ok {
		return nil, errdefs.Errorf(errMethodNotFound, "unknown method %q (see docs/api.md for the list)", truncate(name, 64))
	}
	if len(params) == 0 || bytes.Equal(params, []byte("null")) {
		c.params = json.RawMessage("{}")
	}
	return m.run(ctx, c)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	writeAnswer(w, status, bulk{}, v)
}

// writeAnswer writes v; the bulk of its streamed parts is written in b's
// turns.
func writeAnswer(w http.ResponseWriter, status int, bk bulk, v any) {
	if r, ok := v.(response); ok {
		if parts, markers, done := streamedParts(r.Result); parts != nil {
			writeStreamed(w, status, bk, v, parts, markers, done)
			return
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(response{JSONRPC: "2.0", ID: nullID,
			Error: &errorObject{Code: -32603, Message: "encode response: " + err.Error(), Data: map[string]any{"kind": errdefs.Internal}}})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// CallMCP runs a method for an MCP tool call, as the caller whose claims
// the authenticated /mcp request put in ctx.
func (s *Server) CallMCP(ctx context.Context, method string, params json.RawMessage) (any, error) {
	c, ok := ClaimsFrom(ctx)
	if !ok {
		return nil, errdefs.Errorf(errdefs.ErrUnauthorized, "MCP call without an authenticated request")
	}
	return s.Call(ctx, c, method, params)
}
