package service

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/confined"
	"github.com/warren-sandbox/warren/internal/guest/httpd"
	"github.com/warren-sandbox/warren/internal/guest/repl"
	"github.com/warren-sandbox/warren/internal/wire"
)

// Server serves the agent protocol.
type Server struct {
	runner *Runner
	procs  *Procs
	root   *confined.Root
	repl   *repl.Manager
	// Detach, when set, drops the host's control socket and every
	// connection through it (boot.AttachListener.Detach): POST
	// /v1/detach, before a checkpoint.
	Detach func()
}

// NewServer wires the services. root confines the file API.
func NewServer(runner *Runner, root *confined.Root, rm *repl.Manager) *Server {
	return &Server{runner: runner, procs: NewProcs(runner), root: root, repl: rm}
}

// Serve answers requests on l until it is closed.
func (s *Server) Serve(l net.Listener) error {
	return httpd.Serve(l, s.Handler())
}

// Shutdown kills everything the agent started.
func (s *Server) Shutdown() {
	s.procs.KillAll()
	_ = s.repl.Close()
}

// Handler returns the protocol's routes.
func (s *Server) Handler() *httpd.Mux {
	mux := &httpd.Mux{}
	mux.HandleFunc("GET /v1/health", func(w httpd.ResponseWriter, r *httpd.Request) {
		writeJSON(w, wire.Health{Version: wire.Version, Pid: os.Getpid(), Procs: runtime.GOMAXPROCS(0)})
	})
	mux.HandleFunc("POST /v1/exec", s.exec)
	mux.HandleFunc("POST /v1/processes", s.startProcess)
	mux.HandleFunc("GET /v1/processes", func(w httpd.ResponseWriter, r *httpd.Request) { writeJSON(w, s.procs.List()) })
	mux.HandleFunc("GET /v1/processes/{id}", s.withProc(func(w httpd.ResponseWriter, r *httpd.Request, p *proc) { writeJSON(w, p.info()) }))
	mux.HandleFunc("GET /v1/processes/{id}/output", s.withProc(s.processOutput))
	mux.HandleFunc("POST /v1/processes/{id}/wait", s.withProc(s.processWait))
	mux.HandleFunc("POST /v1/processes/{id}/stdin", s.withProc(s.processStdin))
	mux.HandleFunc("POST /v1/processes/{id}/resize", s.withProc(s.processResize))
	mux.HandleFunc("POST /v1/processes/{id}/signal", s.processSignal)
	mux.HandleFunc("DELETE /v1/processes/{id}", func(w httpd.ResponseWriter, r *httpd.Request) {
		if err := s.procs.Remove(r.PathValue("id")); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(204)
	})
	mux.HandleFunc("GET /v1/files/content", s.readFile)
	mux.HandleFunc("PUT /v1/files/content", s.writeFile)
	mux.HandleFunc("GET /v1/files/stat", s.stat)
	mux.HandleFunc("GET /v1/files/list", s.list)
	mux.HandleFunc("POST /v1/files/mkdir", s.mkdir)
	mux.HandleFunc("POST /v1/files/remove", s.remove)
	mux.HandleFunc("POST /v1/files/move", s.move)
	mux.HandleFunc("GET /v1/files/tar", s.downloadTar)
	mux.HandleFunc("PUT /v1/files/tar", s.uploadTar)
	mux.HandleFunc("POST /v1/repl/run", s.replRun)
	mux.HandleFunc("POST /v1/detach", s.detach)
	return mux
}

// detach answers, then drops every connection, this one among them: the
// host reads the answer before its end closes.
func (s *Server) detach(w httpd.ResponseWriter, r *httpd.Request) {
	if s.Detach == nil {
		writeError(w, invalidf("this agent cannot detach (it was not started by an OCI runtime)"))
		return
	}
	w.WriteHeader(204)
	w.Flush()
	s.Detach()
}

func (s *Server) exec(w httpd.ResponseWriter, r *httpd.Request) {
	var req wire.ExecRequest
	if !decode(w, r, &req) {
		return
	}
	w.Header()["Content-Type"] = "application/x-ndjson"
	enc := json.NewEncoder(w)
	emit := func(ev wire.ExecEvent) {
		_ = enc.Encode(ev)
		w.Flush()
	}
	st, err := s.runner.Exec(r.Context(), &req, emit)
	if err != nil {
		writeError(w, err)
		return
	}
	_ = enc.Encode(wire.ExecEvent{Exit: &st})
}

func (s *Server) startProcess(w httpd.ResponseWriter, r *httpd.Request) {
	var req wire.ExecRequest
	if !decode(w, r, &req) {
		return
	}
	info, err := s.procs.Start(&req)
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(201)
	writeJSON(w, info)
}

func (s *Server) withProc(h func(httpd.ResponseWriter, *httpd.Request, *proc)) httpd.HandlerFunc {
	return func(w httpd.ResponseWriter, r *httpd.Request) {
		p, err := s.procs.get(r.PathValue("id"))
		if err != nil {
			writeError(w, err)
			return
		}
		h(w, r, p)
	}
}

func (s *Server) processOutput(w httpd.ResponseWriter, r *httpd.Request, p *proc) {
	q := r.Query
	off, err := intParam(q.Get("offset"), 0)
	if err != nil {
		writeError(w, err)
		return
	}
	limit, err := intParam(q.Get("max"), wire.ProcessOutputKeep)
	if err != nil {
		writeError(w, err)
		return
	}
	waitMs, err := intParam(q.Get("wait_ms"), 0)
	if err != nil {
		writeError(w, err)
		return
	}
	wait := min(time.Duration(waitMs)*time.Millisecond, 60*time.Second)
	ch, err := p.output(r.Context(), q.Get("stream"), off, int(min(max(limit, 1), wire.ProcessOutputKeep)), wait)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, ch)
}

func (s *Server) processWait(w httpd.ResponseWriter, r *httpd.Request, p *proc) {
	ms, err := intParam(r.Query.Get("timeout_ms"), 0)
	if err != nil {
		writeError(w, err)
		return
	}
	ctx := r.Context()
	if ms > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(ms)*time.Millisecond)
		defer cancel()
	}
	writeJSON(w, p.wait(ctx))
}

func (s *Server) processStdin(w httpd.ResponseWriter, r *httpd.Request, p *proc) {
	if err := p.writeStdin(r.Body, r.Query.Get("close") == "1"); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(204)
}

func (s *Server) processResize(w httpd.ResponseWriter, r *httpd.Request, p *proc) {
	var req wire.ResizeRequest
	if !decode(w, r, &req) {
		return
	}
	if err := p.resize(req.Rows, req.Cols); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(204)
}

func (s *Server) processSignal(w httpd.ResponseWriter, r *httpd.Request) {
	var req wire.SignalRequest
	if !decode(w, r, &req) {
		return
	}
	if err := s.procs.Signal(r.PathValue("id"), req.Signal); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(204)
}

func (s *Server) readFile(w httpd.ResponseWriter, r *httpd.Request) {
	f, info, err := s.root.Open(r.Query.Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	defer func() { _ = f.Close() }()
	if info.Size > wire.MaxFileRead {
		writeError(w, &apiError{wire.ErrTooLarge, fmt.Sprintf("%s is %d bytes; the read limit is %d (download it as tar)", info.Path, info.Size, wire.MaxFileRead)})
		return
	}
	w.Header()["Content-Type"] = "application/octet-stream"
	w.Header()["Content-Length"] = strconv.FormatInt(info.Size, 10)
	_, _ = io.Copy(w, io.LimitReader(f, info.Size))
}

func (s *Server) writeFile(w httpd.ResponseWriter, r *httpd.Request) {
	q := r.Query
	mode, err := intParam(q.Get("mode"), 0o644)
	if err != nil || mode < 0 || mode > 0o7777 {
		writeError(w, invalidf("mode must be an octal permission like 420 (0644)"))
		return
	}
	n, err := s.root.WriteFile(q.Get("path"), r.Body, os.FileMode(mode), wire.MaxFileWrite)
	if err != nil {
		// Read what the host is still sending (at most the write limit)
		// before answering: a connection closed on an unread body makes
		// the host's send fail with a broken pipe, and the reason (a full
		// disk, say) never reaches the caller.
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, wire.MaxFileWrite+1))
		writeError(w, err)
		return
	}
	writeJSON(w, map[string]int64{"written": n})
}

func (s *Server) stat(w httpd.ResponseWriter, r *httpd.Request) {
	info, err := s.root.Stat(r.Query.Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, info)
}

func (s *Server) list(w httpd.ResponseWriter, r *httpd.Request) {
	limit, err := intParam(r.Query.Get("limit"), 10000)
	if err != nil {
		writeError(w, err)
		return
	}
	infos, err := s.root.List(r.Query.Get("path"), int(min(limit, 100000)))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, infos)
}

func (s *Server) mkdir(w httpd.ResponseWriter, r *httpd.Request) {
	var req wire.MkdirRequest
	if !decode(w, r, &req) {
		return
	}
	mode := os.FileMode(req.Mode & 0o7777)
	if mode == 0 {
		mode = 0o755
	}
	if err := s.root.Mkdir(req.Path, req.Parents, mode); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(204)
}

func (s *Server) remove(w httpd.ResponseWriter, r *httpd.Request) {
	var req wire.RemoveRequest
	if !decode(w, r, &req) {
		return
	}
	if err := s.root.Remove(req.Path, req.Recursive); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(204)
}

func (s *Server) move(w httpd.ResponseWriter, r *httpd.Request) {
	var req wire.MoveRequest
	if !decode(w, r, &req) {
		return
	}
	if err := s.root.Move(req.From, req.To); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(204)
}

func (s *Server) downloadTar(w httpd.ResponseWriter, r *httpd.Request) {
	p := r.Query.Get("path")
	info, err := s.root.Stat(p)
	if err != nil {
		writeError(w, err)
		return
	}
	if info.Type == "other" {
		writeError(w, invalidf("%s is a device, socket or FIFO; only files, directories and symlinks can be downloaded", info.Path))
		return
	}
	w.Header()["Content-Type"] = "application/x-tar"
	// Headers are sent; a failure mid-stream can only cut the stream,
	// which the client sees as a truncated tar.
	_ = s.root.WriteTar(w, p)
}

func (s *Server) uploadTar(w httpd.ResponseWriter, r *httpd.Request) {
	stats, err := s.root.ExtractTar(httpd.LimitBody(r.Body, wire.MaxTarUpload), r.Query.Get("path"), confined.TarLimits{})
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, stats)
}

func (s *Server) replRun(w httpd.ResponseWriter, r *httpd.Request) {
	var req wire.ReplRequest
	if !decode(w, r, &req) {
		return
	}
	if len(req.Code) > repl.MaxCode {
		writeError(w, &apiError{wire.ErrTooLarge, fmt.Sprintf("code is %d bytes; the limit is %d", len(req.Code), repl.MaxCode)})
		return
	}
	lang, err := repl.NormalizeLanguage(req.Language)
	if err != nil {
		writeError(w, invalidf("%v", err))
		return
	}
	limit := int(min(max(req.OutputLimit, 0), wire.MaxOutputLimit))
	res, err := s.repl.RunLimit(r.Context(), lang, req.Code, time.Duration(req.TimeoutMs)*time.Millisecond, limit)
	if err != nil {
		writeError(w, err)
		return
	}
	writeReplResult(w, res)
}

// writeReplResult writes res as writeJSON does, but its output line by
// line, letting each go once written: a run's output may be tens of MiB,
// and encoding it whole would hold it twice more in the sandbox's memory.
func writeReplResult(w httpd.ResponseWriter, res wire.ReplResult) {
	lines := res.Output
	res.Output = nil
	b, err := json.Marshal(res)
	const null = `"output":null`
	i := bytes.Index(b, []byte(null)) // after "status", a fixed word
	if err == nil && i < 0 {
		err = errors.New("no output member")
	}
	if err != nil {
		writeError(w, fmt.Errorf("encode the result: %w", err))
		return
	}
	w.Header()["Content-Type"] = "application/json"
	bw := bufio.NewWriterSize(w, 64<<10)
	enc := json.NewEncoder(bw)
	_, _ = bw.Write(b[:i])
	_, _ = bw.WriteString(`"output":[`)
	for k := range lines {
		if k > 0 {
			_ = bw.WriteByte(',')
		}
		_ = enc.Encode(lines[k])
		lines[k] = wire.OutputLine{}
	}
	_ = bw.WriteByte(']')
	_, _ = bw.Write(b[i+len(null):])
	_ = bw.WriteByte('\n')
	_ = bw.Flush()
}

func intParam(s string, def int64) (int64, error) {
	if s == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(s, 0, 64)
	if err != nil {
		return 0, invalidf("%q is not a number", s)
	}
	return n, nil
}

func decode(w httpd.ResponseWriter, r *httpd.Request, v any) bool {
	dec := json.NewDecoder(httpd.LimitBody(r.Body, wire.MaxRequestJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, invalidf("decode request: %v", err))
		return false
	}
	return true
}

func writeJSON(w httpd.ResponseWriter, v any) {
	w.Header()["Content-Type"] = "application/json"
	_ = json.NewEncoder(w).Encode(v)
}

var kindStatus = map[string]int{
	wire.ErrInvalid: 400, wire.ErrNotFound: 404, wire.ErrExists: 409, wire.ErrPermission: 403,
	wire.ErrTooLarge: 413, wire.ErrLimit: 429, wire.ErrInternal: 500,
}

func writeError(w httpd.ResponseWriter, err error) {
	kind, cause := wire.ErrInternal, ""
	var ae *apiError
	var se *errStart
	switch {
	case errors.As(err, &ae):
		kind = ae.kind
	case errors.As(err, &se):
		kind, cause = wire.ErrNotFound, se.cause
	case errors.Is(err, httpd.ErrBodyTooLarge):
		kind = wire.ErrTooLarge
	default:
		if k := confined.Kind(err); k != "" {
			kind = k
		}
	}
	w.Header()["Content-Type"] = "application/json"
	w.WriteHeader(kindStatus[kind])
	_ = json.NewEncoder(w).Encode(wire.ErrorBody{Kind: kind, Message: err.Error(), Cause: cause})
}

// FirstConn returns l with conn (nil: none) handed out by the first Accept,
// before any connection of l's own.
func FirstConn(l net.Listener, conn net.Conn) net.Listener {
	return &firstConnListener{Listener: l, first: conn}
}

type firstConnListener struct {
	net.Listener
	mu    sync.Mutex
	first net.Conn
}

func (l *firstConnListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	c := l.first
	l.first = nil
	l.mu.Unlock()
	if c != nil {
		return c, nil
	}
	return l.Listener.Accept()
}
