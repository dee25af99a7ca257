package fake

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/wire"
)

// The in-process agent serves this subset of the wire protocol:
//
//   - GET /v1/health.
//   - POST /v1/exec, for a fixed set of commands the fake runs itself
//     (nothing runs on the host, so results are the same everywhere):
//     echo ARGS... (prints ARGS and a newline), true, false, cat (prints
//     its stdin), sleep SECONDS (honours the request's timeout, answering
//     timed out and SIGKILL), oom (counts an OOM kill and ends by SIGKILL,
//     as the memory limit's killer would), hang (ignores its timeout and
//     never answers: an agent the host must stop trusting), exit CODE.
//     Anything else ends with 127 and "executable not found".
//   - GET and PUT /v1/files/content: whole files in memory, kept across
//     stops and dropped by Remove.
//
// Everything else (background processes, REPLs, the rest of the file API,
// tars) answers not_found; a test needing those uses the native backend.

// agentServer is one run of a sandbox's agent: an HTTP server on an
// in-memory listener. Its connections are net.Pipe pairs, which block on
// channels only, so a synctest bubble sees an idle agent as durably blocked.
type agentServer struct {
	srv   *http.Server
	ln    *pipeListener
	done  chan struct{} // the sandbox's Done: closed by close
	once  sync.Once
	sb    *Sandbox
	serve sync.WaitGroup
}

func serveAgent(sb *Sandbox, done chan struct{}) *agentServer {
	a := &agentServer{ln: newPipeListener(), done: done, sb: sb}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, wire.Health{Version: wire.Version, Pid: 1, Procs: 1})
	})
	mux.HandleFunc("POST /v1/exec", a.exec)
	mux.HandleFunc("GET /v1/files/content", a.readFile)
	mux.HandleFunc("PUT /v1/files/content", a.writeFile)
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

// close ends the agent: Done closes first, then every connection breaks,
// as when a real init exits.
func (a *agentServer) close() {
	a.once.Do(func() {
		close(a.done)
		_ = a.srv.Close()
		a.serve.Wait()
	})
}

func (a *agentServer) exec(w http.ResponseWriter, r *http.Request) {
	var req wire.ExecRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, wire.MaxRequestJSON)).Decode(&req); err != nil || len(req.Argv) == 0 {
		writeError(w, http.StatusBadRequest, wire.ErrInvalid, "want an exec request with an argv")
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	out := func(stream string, b []byte) {
		_ = enc.Encode(wire.ExecEvent{Stream: stream, Data: b})
	}
	start := time.Now()
	st, ok := a.run(r.Context(), &req, out)
	if !ok {
		return // the agent ended or the client went away: no exit status
	}
	st.DurationMs = float64(time.Since(start).Microseconds()) / 1000
	_ = enc.Encode(wire.ExecEvent{Exit: &st})
}

// run runs one fake command; ok is false when it was cut short by the
// agent's end or the request's.
func (a *agentServer) run(ctx context.Context, req *wire.ExecRequest, out func(string, []byte)) (st wire.ExitStatus, ok bool) {
	args := req.Argv[1:]
	killed := wire.ExitStatus{Code: 128 + 9, Signal: "SIGKILL"}
	switch req.Argv[0] {
	case "echo":
		out(wire.Stdout, []byte(strings.Join(args, " ")+"\n"))
	case "true":
	case "false":
		st.Code = 1
	case "exit":
		if len(args) == 1 {
			st.Code, _ = strconv.Atoi(args[0])
		}
	case "cat":
		if len(req.Stdin) > 0 {
			out(wire.Stdout, req.Stdin)
		}
	case "oom":
		a.sb.oomKill()
		return killed, true
	case "sleep":
		var secs float64
		if len(args) == 1 {
			secs, _ = strconv.ParseFloat(args[0], 64)
		}
		d := time.Duration(secs * float64(time.Second))
		timedOut := false
		if req.TimeoutMs > 0 && time.Duration(req.TimeoutMs)*time.Millisecond < d {
			d, timedOut = time.Duration(req.TimeoutMs)*time.Millisecond, true
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return st, false
		case <-a.done:
			return st, false
		}
		if timedOut {
			killed.TimedOut = true
			return killed, true
		}
	case "hang":
		select {
		case <-ctx.Done():
		case <-a.done:
		}
		return st, false
	default:
		return wire.ExitStatus{Code: 127, Error: "executable not found: " + req.Argv[0]}, true
	}
	return st, true
}

func (a *agentServer) readFile(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Query().Get("path")
	a.sb.mu.Lock()
	b, ok := a.sb.files[p]
	a.sb.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, wire.ErrNotFound, "open "+p+": no such file")
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = w.Write(b)
}

func (a *agentServer) writeFile(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Query().Get("path")
	if !strings.HasPrefix(p, "/") {
		writeError(w, http.StatusBadRequest, wire.ErrInvalid, "path "+p+": want an absolute path")
		return
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, wire.MaxFileWrite+1))
	if err != nil {
		return
	}
	if len(b) > wire.MaxFileWrite {
		writeError(w, http.StatusRequestEntityTooLarge, wire.ErrTooLarge, "file too large")
		return
	}
	a.sb.mu.Lock()
	if a.sb.files != nil {
		a.sb.files[p] = b
	}
	a.sb.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, kind, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(wire.ErrorBody{Kind: kind, Message: msg})
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
