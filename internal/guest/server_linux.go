package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/warren-sandbox/warren/internal/agent"
	"github.com/warren-sandbox/warren/internal/guest/fs"
	"github.com/warren-sandbox/warren/internal/guest/repl"
)

// Server serves the agent protocol.
type Server struct {
	runner *Runner
	procs  *Procs
	root   *fs.Root
	repl   *repl.Manager
}

// NewServer wires the services. root confines the file API.
func NewServer(runner *Runner, root *fs.Root, rm *repl.Manager) *Server {
	return &Server{runner: runner, procs: NewProcs(runner), root: root, repl: rm}
}

// Serve answers requests on l until it is closed.
func (s *Server) Serve(l net.Listener) error {
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	return srv.Serve(l)
}

// Shutdown kills everything the agent started.
func (s *Server) Shutdown() {
	s.procs.KillAll()
	_ = s.repl.Close()
}

// Handler returns the protocol's routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, agent.Health{Version: agent.Version, Pid: os.Getpid()})
	})
	mux.HandleFunc("POST /v1/exec", s.exec)
	mux.HandleFunc("POST /v1/processes", s.startProcess)
	mux.HandleFunc("GET /v1/processes", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, s.procs.List()) })
	mux.HandleFunc("GET /v1/processes/{id}", s.withProc(func(w http.ResponseWriter, r *http.Request, p *proc) { writeJSON(w, p.info()) }))
	mux.HandleFunc("GET /v1/processes/{id}/output", s.withProc(s.processOutput))
	mux.HandleFunc("POST /v1/processes/{id}/wait", s.withProc(s.processWait))
	mux.HandleFunc("POST /v1/processes/{id}/stdin", s.withProc(s.processStdin))
	mux.HandleFunc("POST /v1/processes/{id}/resize", s.withProc(s.processResize))
	mux.HandleFunc("POST /v1/processes/{id}/signal", s.processSignal)
	mux.HandleFunc("DELETE /v1/processes/{id}", func(w http.ResponseWriter, r *http.Request) {
		if err := s.procs.Remove(r.PathValue("id")); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
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
	return mux
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	var req agent.ExecRequest
	if !decode(w, r, &req) {
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	flusher, _ := w.(http.Flusher)
	emit := func(ev agent.ExecEvent) {
		_ = enc.Encode(ev)
		if flusher != nil {
			flusher.Flush()
		}
	}
	st, err := s.runner.Exec(r.Context(), &req, emit)
	if err != nil {
		writeError(w, err)
		return
	}
	_ = enc.Encode(agent.ExecEvent{Exit: &st})
}

func (s *Server) startProcess(w http.ResponseWriter, r *http.Request) {
	var req agent.ExecRequest
	if !decode(w, r, &req) {
		return
	}
	info, err := s.procs.Start(&req)
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusCreated)
	writeJSON(w, info)
}

func (s *Server) withProc(h func(http.ResponseWriter, *http.Request, *proc)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := s.procs.get(r.PathValue("id"))
		if err != nil {
			writeError(w, err)
			return
		}
		h(w, r, p)
	}
}

func (s *Server) processOutput(w http.ResponseWriter, r *http.Request, p *proc) {
	q := r.URL.Query()
	off, err := intParam(q.Get("offset"), 0)
	if err != nil {
		writeError(w, err)
		return
	}
	limit, err := intParam(q.Get("max"), agent.ProcessOutputKeep)
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
	ch, err := p.output(r.Context(), q.Get("stream"), off, int(min(max(limit, 1), agent.ProcessOutputKeep)), wait)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, ch)
}

func (s *Server) processWait(w http.ResponseWriter, r *http.Request, p *proc) {
	ms, err := intParam(r.URL.Query().Get("timeout_ms"), 0)
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

func (s *Server) processStdin(w http.ResponseWriter, r *http.Request, p *proc) {
	if err := p.writeStdin(r.Body, r.URL.Query().Get("close") == "1"); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) processResize(w http.ResponseWriter, r *http.Request, p *proc) {
	var req agent.ResizeRequest
	if !decode(w, r, &req) {
		return
	}
	if err := p.resize(req.Rows, req.Cols); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) processSignal(w http.ResponseWriter, r *http.Request) {
	var req agent.SignalRequest
	if !decode(w, r, &req) {
		return
	}
	if err := s.procs.Signal(r.PathValue("id"), req.Signal); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request) {
	f, info, err := s.root.Open(r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	defer f.Close()
	if info.Size > agent.MaxFileRead {
		writeError(w, &apiError{agent.ErrTooLarge, fmt.Sprintf("%s is %d bytes; the read limit is %d (download it as tar)", info.Path, info.Size, agent.MaxFileRead)})
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(info.Size, 10))
	_, _ = io.Copy(w, io.LimitReader(f, info.Size))
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	mode, err := intParam(q.Get("mode"), 0o644)
	if err != nil || mode < 0 || mode > 0o7777 {
		writeError(w, invalidf("mode must be an octal permission like 420 (0644)"))
		return
	}
	n, err := s.root.WriteFile(q.Get("path"), r.Body, os.FileMode(mode), agent.MaxFileWrite)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, map[string]int64{"written": n})
}

func (s *Server) stat(w http.ResponseWriter, r *http.Request) {
	info, err := s.root.Stat(r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, info)
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	limit, err := intParam(r.URL.Query().Get("limit"), 10000)
	if err != nil {
		writeError(w, err)
		return
	}
	infos, err := s.root.List(r.URL.Query().Get("path"), int(min(limit, 100000)))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, infos)
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request) {
	var req agent.MkdirRequest
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
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) remove(w http.ResponseWriter, r *http.Request) {
	var req agent.RemoveRequest
	if !decode(w, r, &req) {
		return
	}
	if err := s.root.Remove(req.Path, req.Recursive); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) move(w http.ResponseWriter, r *http.Request) {
	var req agent.MoveRequest
	if !decode(w, r, &req) {
		return
	}
	if err := s.root.Move(req.From, req.To); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) downloadTar(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Query().Get("path")
	if _, err := s.root.Stat(p); err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-tar")
	// Headers are sent; a failure mid-stream can only cut the stream,
	// which the client sees as a truncated tar.
	_ = s.root.WriteTar(w, p)
}

func (s *Server) uploadTar(w http.ResponseWriter, r *http.Request) {
	stats, err := s.root.ExtractTar(http.MaxBytesReader(w, r.Body, agent.MaxTarUpload), r.URL.Query().Get("path"), fs.TarLimits{})
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, stats)
}

func (s *Server) replRun(w http.ResponseWriter, r *http.Request) {
	var req agent.ReplRequest
	if !decode(w, r, &req) {
		return
	}
	lang, err := repl.NormalizeLanguage(req.Language)
	if err != nil {
		writeError(w, invalidf("%v", err))
		return
	}
	res, err := s.repl.Run(r.Context(), lang, req.Code, time.Duration(req.TimeoutMs)*time.Millisecond)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, res)
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

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, agent.MaxRequestJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, invalidf("decode request: %v", err))
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

var kindStatus = map[string]int{
	agent.ErrInvalid: http.StatusBadRequest, agent.ErrNotFound: http.StatusNotFound,
	agent.ErrExists: http.StatusConflict, agent.ErrPermission: http.StatusForbidden,
	agent.ErrTooLarge: http.StatusRequestEntityTooLarge, agent.ErrLimit: http.StatusTooManyRequests,
	agent.ErrInternal: http.StatusInternalServerError,
}

func writeError(w http.ResponseWriter, err error) {
	kind := agent.ErrInternal
	var ae *apiError
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &ae):
		kind = ae.kind
	case errors.As(err, &mbe):
		kind = agent.ErrTooLarge
	default:
		if k := fs.Kind(err); k != "" {
			kind = k
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(kindStatus[kind])
	_ = json.NewEncoder(w).Encode(agent.ErrorBody{Kind: kind, Message: err.Error()})
}
