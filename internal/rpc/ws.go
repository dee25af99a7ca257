package rpc

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/websocket"

	"github.com/warren-sandbox/warren/internal/audit"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/wire"
)

// wsStart is the first message of a WebSocket session.
type wsStart struct {
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Cwd  string   `json:"cwd"`
	User string   `json:"user"`
	TTY  bool     `json:"tty"`
	Rows uint16   `json:"rows"`
	Cols uint16   `json:"cols"`
}

// wsMsg is every later message, both ways.
type wsMsg struct {
	Type    string      `json:"type"`
	Data    []byte      `json:"data,omitempty"`
	Rows    uint16      `json:"rows,omitempty"`
	Cols    uint16      `json:"cols,omitempty"`
	Signal  string      `json:"signal,omitempty"`
	ID      string      `json:"id,omitempty"`
	Pid     int         `json:"pid,omitempty"`
	Exit    *exitStatus `json:"exit,omitempty"`
	Message string      `json:"message,omitempty"`
	Kind    string      `json:"kind,omitempty"`
	// Cause, on an "error" before "started": why the program could not
	// be started (wire.Cause*: not_found, not_executable).
	Cause string `json:"cause,omitempty"`
	// Stream and Dropped make a "dropped" message: Dropped bytes of
	// Stream were lost before the data that follows on it.
	Stream  string `json:"stream,omitempty"`
	Dropped int64  `json:"dropped,omitempty"`
}

// wsMaxMessage bounds one client message (stdin chunks included).
const wsMaxMessage = 1 << 20

// serveWS streams one process: its output as it is produced, the client's
// input, resizes and signals. Closing the socket kills the process.
func (s *Server) serveWS(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	claims, err := s.authenticate(r)
	if err != nil {
		s.writeError(w, ctx, nil, err, 0)
		return
	}
	c := &call{s: s, claims: claims, method: "ws"}
	r = r.WithContext(auditHTTP(ctx, c)) // the session's runs are recorded as the caller's
	q := r.URL.Query()
	ns, name, err := c.resolve(q.Get("namespace"), q.Get("sandbox"))
	if err != nil {
		s.writeError(w, ctx, nil, err, 0)
		return
	}
	l, err := s.lease(withResumeQuery(ctx, r), ns, name)
	if err != nil {
		s.writeError(w, ctx, nil, err, 0)
		return
	}
	defer l.Release()
	// Keys travel in headers, which browsers cannot set on a WebSocket, so
	// a page on another origin cannot ride a user's credentials: no
	// origin check is needed beyond authentication.
	srv := websocket.Server{Handshake: func(*websocket.Config, *http.Request) error { return nil },
		Handler: func(conn *websocket.Conn) {
			conn.MaxPayloadBytes = wsMaxMessage
			s.wsSession(conn, l)
		}}
	srv.ServeHTTP(w, r)
}

func (s *Server) wsSession(conn *websocket.Conn, l *sandbox.Lease) {
	defer func() { _ = conn.Close() }()
	a := l.Agent()
	ctx, cancel := context.WithCancel(conn.Request().Context())
	defer cancel()
	var sendMu sync.Mutex
	send := func(m wsMsg) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		_ = conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
		return websocket.JSON.Send(conn, m)
	}
	fail := func(err error) {
		if ctx.Err() != nil {
			return // the session is over (the client went away): a cancelled call is no error to report
		}
		_ = send(wsMsg{Type: "error", Message: err.Error(), Kind: kindOf(err), Cause: causeOf(err)})
	}
	var start wsStart
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	if err := websocket.JSON.Receive(conn, &start); err != nil {
		fail(errdefs.Errorf(errInvalidParams, "first message must be {\"argv\": [...], ...}: %w", err))
		return
	}
	_ = conn.SetReadDeadline(time.Time{})
	if len(start.Argv) == 0 || start.Argv[0] == "" {
		fail(errdefs.Errorf(errInvalidParams, "\"argv\" is missing or empty"))
		return
	}
	t0 := time.Now()
	req := &wire.ExecRequest{Argv: start.Argv, Env: start.Env, Cwd: start.Cwd, User: start.User, TTY: start.TTY,
		Rows: start.Rows, Cols: start.Cols, HoldOutput: true}
	pi, err := a.StartProcess(ctx, req)
	if err != nil && errors.Is(err, errdefs.ErrInvalid) && strings.Contains(err.Error(), "hold_output") {
		// An agent of an older build (a sandbox started before an
		// upgrade) does not know the field: it keeps the last 1 MiB of
		// each stream instead, and the pumps below say what was lost.
		req.HoldOutput = false
		pi, err = a.StartProcess(ctx, req)
	}
	if err != nil {
		s.auditStarted(ctx, l, "ws", start.Argv, "", t0, err)
		fail(err)
		return
	}
	l.Logf("process %s started over WebSocket: %.200q", pi.ID, start.Argv)
	// However the session ends, the process does not outlive it.
	defer func() {
		rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer rcancel()
		_ = a.RemoveProcess(rctx, pi.ID)
	}()
	if err := send(wsMsg{Type: "started", ID: pi.ID, Pid: pi.Pid}); err != nil {
		return
	}
	// Client → process.
	go func() {
		defer cancel()
		for {
			var m wsMsg
			if err := websocket.JSON.Receive(conn, &m); err != nil {
				return
			}
			var err error
			switch m.Type {
			case "stdin":
				err = a.WriteStdin(ctx, pi.ID, m.Data, false)
			case "eof":
				err = a.WriteStdin(ctx, pi.ID, nil, true)
			case "resize":
				err = a.Resize(ctx, pi.ID, m.Rows, m.Cols)
			case "signal":
				err = a.Signal(ctx, pi.ID, m.Signal)
			default:
				err = errdefs.Errorf(errInvalidParams, "message type %.20q: want stdin, eof, resize or signal", m.Type)
			}
			if err != nil && ctx.Err() == nil {
				fail(err)
			}
		}
	}()
	// Process → client, one pump per stream, long-polling the agent. The
	// process's output is held for this session (HoldOutput): a client
	// slower than the process holds it back, as a terminal does, and
	// loses nothing. A "dropped" message (exactly how much, before the
	// data that follows the gap) is for an agent that does not hold: one
	// of an older build, of a sandbox started before an upgrade.
	streams := []string{wire.Stdout}
	if !start.TTY {
		streams = append(streams, wire.Stderr)
	}
	var wg sync.WaitGroup
	for _, st := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var off int64
			for ctx.Err() == nil {
				ch, err := a.Output(ctx, pi.ID, st, off, 20*time.Second)
				if err != nil {
					if ctx.Err() == nil {
						fail(l.Explain(ctx, "the process ran", err))
						cancel()
					}
					return
				}
				if ch.Dropped > 0 {
					l.Logf("process %s: %d bytes of %s dropped: the WebSocket client read slower than the process wrote", pi.ID, ch.Dropped, st)
					if err := send(wsMsg{Type: "dropped", Stream: st, Dropped: ch.Dropped}); err != nil {
						cancel()
						return
					}
				}
				if len(ch.Data) > 0 {
					if err := send(wsMsg{Type: st, Data: ch.Data}); err != nil {
						cancel()
						return
					}
				}
				off = ch.NextOffset
				if ch.EOF {
					return
				}
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	info, err := a.Wait(ctx, pi.ID, time.Minute)
	if err != nil || info.Exit == nil {
		if err == nil {
			err = errdefs.Errorf(errdefs.ErrTimeout, "process %s did not report its exit", pi.ID)
		}
		fail(l.Explain(ctx, "the process ran", err))
		return
	}
	l.Logf("process %s exited: code %d", pi.ID, info.Exit.Code)
	if s.opts.Audit != nil {
		e := &audit.Exec{Via: "ws", ProcessID: pi.ID, Signal: info.Exit.Signal}
		e.SetArgv(start.Argv)
		code := info.Exit.Code
		e.ExitCode = &code
		ns, name := l.ID()
		s.auditExec(ctx, ns, name, e, t0, nil)
	}
	_ = send(wsMsg{Type: "exit", Exit: toExitStatus(info.Exit)})
}
