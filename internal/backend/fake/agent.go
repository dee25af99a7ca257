package fake

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/wire"
)

// The in-process agent serves the wire protocol's endpoints (the real
// agent is internal/guest/service) with a fake's means. Nothing runs on
// the host, so results are the same everywhere:
//
//   - GET /v1/health.
//   - POST /v1/exec and the background processes (/v1/processes: start,
//     list, get, output, wait, stdin, resize, signal, remove) run a fixed
//     set of commands in-process:
//     echo ARGS... (prints ARGS and a newline), true, false, exit CODE,
//     cat (copies its stdin to stdout until EOF), spew N (prints N bytes
//     of "x"), sleep SECONDS, oom (counts an OOM kill and ends by SIGKILL,
//     as the memory limit's killer would), hang (deaf to timeouts and
//     signals, never answers: an agent the host must stop trusting).
//     /bin/X and /usr/bin/X are X. sh -c SCRIPT runs these separated by
//     ";", each split at spaces (no quoting, variables, pipes or
//     redirections but a final ">&2"), with the last one's status; exit
//     ends it. Env, Cwd and User are accepted and ignored. An exec of anything else ends with
//     127 and "executable not found"; a process of it is not_found (cause
//     not_found).
//     Timeouts, output limits and offsets, MaxProcesses and signals (which
//     all end a process: 128+N, no handlers) are as in the real agent.
//   - The file API (/v1/files: content, stat, list, mkdir, remove, move,
//     tar) on an in-memory tree of files and directories (files.go), kept
//     across stops and dropped by Remove; no symlinks, owners or devices.
//   - POST /v1/repl/run, for python and node alike, in a tiny language:
//     one statement a line, each NAME = EXPR (let/var/const allowed),
//     print(EXPR) or console.log(EXPR) (print(EXPR, file=sys.stderr) or
//     console.error(EXPR) for stderr), sleep(SECS) or time.sleep(SECS)
//     (the run's timeout interrupts it: status timeout, state kept),
//     raise MSG or throw MSG (status error with MSG), import lines
//     (ignored), or EXPR, whose repr is the result when it is the last
//     line. EXPR is an integer, a quoted string or a variable. Variables
//     live per language until the agent ends. The commands python3 -c CODE
//     and node -e CODE run CODE in a fresh interpreter of the language:
//     its output on stdout, an error on stderr and exit status 1.
//
// Error kinds and HTTP statuses are the real agent's for the same case.

// agentServer is one run of a sandbox's agent: an HTTP server on an
// in-memory listener. Its connections are net.Pipe pairs, which block on
// channels only, so a synctest bubble sees an idle agent as durably blocked.
type agentServer struct {
	srv   *http.Server
	ln    *pipeListener
	done  chan struct{} // the sandbox's Done: closed by close
	once  sync.Once
	sb    *Sandbox
	fs    *fsys
	procs *procs
	repls *repls
	serve sync.WaitGroup
}

func serveAgent(sb *Sandbox, fs *fsys, done chan struct{}) *agentServer {
	a := &agentServer{ln: newPipeListener(), done: done, sb: sb, fs: fs, procs: newProcs(), repls: newRepls()}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, wire.Health{Version: wire.Version, Pid: 1, Procs: 1})
	})
	mux.HandleFunc("POST /v1/exec", a.exec)
	mux.HandleFunc("POST /v1/processes", a.startProcess)
	mux.HandleFunc("GET /v1/processes", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, a.procs.list()) })
	mux.HandleFunc("GET /v1/processes/{id}", a.withProc(func(w http.ResponseWriter, _ *http.Request, p *process) { writeJSON(w, p.info()) }))
	mux.HandleFunc("GET /v1/processes/{id}/output", a.withProc(a.processOutput))
	mux.HandleFunc("POST /v1/processes/{id}/wait", a.withProc(a.processWait))
	mux.HandleFunc("POST /v1/processes/{id}/stdin", a.withProc(a.processStdin))
	mux.HandleFunc("POST /v1/processes/{id}/resize", a.withProc(a.processResize))
	mux.HandleFunc("POST /v1/processes/{id}/signal", a.processSignal)
	mux.HandleFunc("DELETE /v1/processes/{id}", func(w http.ResponseWriter, r *http.Request) {
		answer(w, a.procs.remove(r.PathValue("id")))
	})
	mux.HandleFunc("GET /v1/files/content", a.readFile)
	mux.HandleFunc("PUT /v1/files/content", a.writeFile)
	mux.HandleFunc("GET /v1/files/stat", func(w http.ResponseWriter, r *http.Request) {
		fi, err := a.fs.stat(r.URL.Query().Get("path"))
		answerJSON(w, fi, err)
	})
	mux.HandleFunc("GET /v1/files/list", func(w http.ResponseWriter, r *http.Request) {
		ents, err := a.fs.list(r.URL.Query().Get("path"))
		answerJSON(w, ents, err)
	})
	mux.HandleFunc("POST /v1/files/mkdir", func(w http.ResponseWriter, r *http.Request) {
		var req wire.MkdirRequest
		if decode(w, r, &req) {
			mode := req.Mode & 0o7777
			if mode == 0 {
				mode = 0o755
			}
			answer(w, a.fs.mkdir(req.Path, req.Parents, mode))
		}
	})
	mux.HandleFunc("POST /v1/files/remove", func(w http.ResponseWriter, r *http.Request) {
		var req wire.RemoveRequest
		if decode(w, r, &req) {
			answer(w, a.fs.remove(req.Path, req.Recursive))
		}
	})
	mux.HandleFunc("POST /v1/files/move", func(w http.ResponseWriter, r *http.Request) {
		var req wire.MoveRequest
		if decode(w, r, &req) {
			answer(w, a.fs.move(req.From, req.To))
		}
	})
	mux.HandleFunc("GET /v1/files/tar", a.downloadTar)
	mux.HandleFunc("PUT /v1/files/tar", func(w http.ResponseWriter, r *http.Request) {
		answerJSON(w, map[string]int{}, a.fs.extract(http.MaxBytesReader(w, r.Body, wire.MaxTarUpload), r.URL.Query().Get("path")))
	})
	mux.HandleFunc("POST /v1/repl/run", a.replRun)
	mux.HandleFunc("/", errNotServed)
	// No timeouts: its only peer is the test's own client, in-process; a
	// deadline would close idle connections when a test advances time.
	a.srv = &http.Server{Handler: mux} //nolint:gosec // G112: no remote peer, see above
	a.serve.Add(1)
	go func() {
		defer a.serve.Done()
		_ = a.srv.Serve(a.ln)
	}()
	return a
}

func (a *agentServer) dial(ctx context.Context) (net.Conn, error) { return a.ln.dial(ctx) }

// close ends the agent: Done closes first, then every connection breaks
// and every process ends, as when a real init exits.
func (a *agentServer) close() {
	a.once.Do(func() {
		close(a.done)
		_ = a.srv.Close()
		a.serve.Wait()
		a.procs.wg.Wait()
	})
}

// validate checks what the real agent checks of any command it starts.
func validate(req *wire.ExecRequest) error {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return errorf(wire.ErrInvalid, "argv is empty")
	}
	for _, s := range req.Argv {
		if strings.IndexByte(s, 0) >= 0 {
			return errorf(wire.ErrInvalid, "argv contains a NUL byte")
		}
	}
	if len(req.Stdin) > wire.MaxStdin {
		return errorf(wire.ErrTooLarge, "stdin is %d bytes, limit %d", len(req.Stdin), wire.MaxStdin)
	}
	return nil
}

func (a *agentServer) exec(w http.ResponseWriter, r *http.Request) {
	var req wire.ExecRequest
	if !decode(w, r, &req) {
		return
	}
	if err := validate(&req); err != nil {
		answer(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	// Output is cut at the limit both streams share, as the real agent
	// cuts it; the command runs on.
	limit := int64(math.MaxInt64)
	if !req.NoOutputLimit {
		limit = req.OutputLimit
		if limit <= 0 {
			limit = wire.DefaultOutputLimit
		}
		limit = min(limit, wire.MaxOutputLimit)
	}
	var used int64
	truncated := false
	out := func(stream string, b []byte) {
		if keep := min(int64(len(b)), limit-used); keep < int64(len(b)) {
			b, truncated = b[:keep], true
		}
		used += int64(len(b))
		if len(b) > 0 {
			_ = enc.Encode(wire.ExecEvent{Stream: stream, Data: b})
		}
	}
	kill := make(chan struct{})
	if req.TimeoutMs > 0 {
		t := time.AfterFunc(time.Duration(req.TimeoutMs)*time.Millisecond, func() { close(kill) })
		defer t.Stop()
	}
	gone, end := a.gone(r)
	defer end()
	start := time.Now()
	st, how := (&run{argv: req.Argv, stdin: fullInbox(req.Stdin), out: out, sb: a.sb, kill: kill, gone: gone}).do()
	switch how {
	case lost:
		return // the agent ended or the client went away: no exit status
	case killed:
		st = wire.ExitStatus{Code: 128 + 9, Signal: "SIGKILL", TimedOut: true}
	}
	st.Truncated = truncated
	st.DurationMs = float64(time.Since(start).Microseconds()) / 1000
	_ = enc.Encode(wire.ExecEvent{Exit: &st})
}

// gone returns a channel closed when the agent ends or r's client goes
// away; the caller calls end when done with r.
func (a *agentServer) gone(r *http.Request) (gone <-chan struct{}, end func()) {
	ctx, cancel := context.WithCancel(r.Context())
	go func() {
		select {
		case <-a.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx.Done(), cancel
}

func (a *agentServer) startProcess(w http.ResponseWriter, r *http.Request) {
	var req wire.ExecRequest
	if !decode(w, r, &req) {
		return
	}
	info, err := a.procs.start(a.sb, &req, a.done)
	if err != nil {
		answer(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(info)
}

func (a *agentServer) withProc(h func(http.ResponseWriter, *http.Request, *process)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := a.procs.get(r.PathValue("id"))
		if err != nil {
			answer(w, err)
			return
		}
		h(w, r, p)
	}
}

func (a *agentServer) processOutput(w http.ResponseWriter, r *http.Request, p *process) {
	q := r.URL.Query()
	off, err := intParam(q.Get("offset"), 0)
	if err != nil {
		answer(w, err)
		return
	}
	limit, err := intParam(q.Get("max"), wire.ProcessOutputKeep)
	if err != nil {
		answer(w, err)
		return
	}
	waitMs, err := intParam(q.Get("wait_ms"), 0)
	if err != nil {
		answer(w, err)
		return
	}
	wait := min(time.Duration(waitMs)*time.Millisecond, time.Minute)
	ch, err := p.output(r.Context(), q.Get("stream"), off, int(min(max(limit, 1), wire.ProcessOutputKeep)), wait)
	answerJSON(w, ch, err)
}

func (a *agentServer) processWait(w http.ResponseWriter, r *http.Request, p *process) {
	ms, err := intParam(r.URL.Query().Get("timeout_ms"), 0)
	if err != nil {
		answer(w, err)
		return
	}
	ctx := r.Context()
	if ms > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(ms)*time.Millisecond)
		defer cancel()
	}
	select {
	case <-p.done:
	case <-ctx.Done():
	}
	writeJSON(w, p.info())
}

func (a *agentServer) processStdin(w http.ResponseWriter, r *http.Request, p *process) {
	b, err := io.ReadAll(io.LimitReader(r.Body, wire.MaxStdin))
	if err != nil {
		answer(w, errorf(wire.ErrInvalid, "read stdin: %v", err))
		return
	}
	answer(w, p.writeStdin(b, r.URL.Query().Get("close") == "1"))
}

func (a *agentServer) processResize(w http.ResponseWriter, r *http.Request, p *process) {
	var req wire.ResizeRequest
	if decode(w, r, &req) {
		answer(w, p.resize(req.Rows, req.Cols))
	}
}

func (a *agentServer) processSignal(w http.ResponseWriter, r *http.Request) {
	var req wire.SignalRequest
	if decode(w, r, &req) {
		answer(w, a.procs.signal(r.PathValue("id"), req.Signal))
	}
}

func (a *agentServer) readFile(w http.ResponseWriter, r *http.Request) {
	b, err := a.fs.read(r.URL.Query().Get("path"))
	if err != nil {
		answer(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = w.Write(b)
}

func (a *agentServer) writeFile(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	mode, err := intParam(q.Get("mode"), 0o644)
	if err != nil || mode < 0 || mode > 0o7777 {
		answer(w, errorf(wire.ErrInvalid, "mode must be an octal permission like 420 (0644)"))
		return
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, wire.MaxFileWrite+1))
	if err != nil {
		return
	}
	if len(b) > wire.MaxFileWrite {
		answer(w, errorf(wire.ErrTooLarge, "file too large"))
		return
	}
	answerJSON(w, map[string]int{"written": len(b)}, a.fs.write(q.Get("path"), b, uint32(mode)))
}

func (a *agentServer) downloadTar(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Query().Get("path")
	if _, err := a.fs.stat(p); err != nil {
		answer(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-tar")
	// Headers are sent; a failure mid-stream can only cut the stream.
	_ = a.fs.tar(w, p)
}

func (a *agentServer) replRun(w http.ResponseWriter, r *http.Request) {
	var req wire.ReplRequest
	if !decode(w, r, &req) {
		return
	}
	if len(req.Code) > maxCode {
		answer(w, errorf(wire.ErrTooLarge, "code is %d bytes; the limit is %d", len(req.Code), maxCode))
		return
	}
	lang, err := language(req.Language)
	if err != nil {
		answer(w, err)
		return
	}
	timeout := time.Duration(req.TimeoutMs) * time.Millisecond
	kill := make(chan struct{})
	if timeout > 0 {
		t := time.AfterFunc(timeout, func() { close(kill) })
		defer t.Stop()
	}
	gone, end := a.gone(r)
	defer end()
	res, how := a.repls.run(lang, req.Code, kill, gone)
	switch how {
	case lost:
		return // the agent ended or the client went away: no answer
	case killed:
		res.Status, res.Error = wire.ReplTimeout, "TimeoutError: execution exceeded "+timeout.String()
	}
	writeJSON(w, res)
}

func intParam(s string, def int64) (int64, error) {
	if s == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(s, 0, 64)
	if err != nil {
		return 0, errorf(wire.ErrInvalid, "%q is not a number", s)
	}
	return n, nil
}

// decode reads a JSON request strictly, as the real agent does.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(io.LimitReader(r.Body, wire.MaxRequestJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		answer(w, errorf(wire.ErrInvalid, "decode request: %v", err))
		return false
	}
	return true
}

// answer answers err, or 204 when it is nil.
func answer(w http.ResponseWriter, err error) {
	if err != nil {
		body := wire.ErrorBody{Kind: kindOf(err), Message: err.Error()}
		var fe *fsError
		if errors.As(err, &fe) {
			body.Cause = fe.cause
		}
		writeError(w, body)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// answerJSON answers err, or v when it is nil.
func answerJSON(w http.ResponseWriter, v any, err error) {
	if err != nil {
		answer(w, err)
		return
	}
	writeJSON(w, v)
}

// statuses are the real agent's HTTP statuses of the error kinds.
var statuses = map[string]int{
	wire.ErrInvalid: 400, wire.ErrNotFound: 404, wire.ErrExists: 409, wire.ErrPermission: 403,
	wire.ErrTooLarge: 413, wire.ErrLimit: 429, wire.ErrInternal: 500,
}

// writeError answers body with its kind's status.
func writeError(w http.ResponseWriter, body wire.ErrorBody) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(statuses[body.Kind])
	_ = json.NewEncoder(w).Encode(body)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// pipeListener is a net.Listener whose connections are made in-process by
// dial: no socket, no file descriptor.
type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *pipeListener) dial(ctx context.Context) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.closed:
	case <-ctx.Done():
	}
	_ = client.Close()
	_ = server.Close()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return nil, &net.OpError{Op: "dial", Net: "pipe", Err: net.ErrClosed}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "fake-agent" }
