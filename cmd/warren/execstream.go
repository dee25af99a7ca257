package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/websocket"

	"github.com/warren-sandbox/warren/internal/wire"
)

const execAbout = `
Runs CMD in a running sandbox of a running server, as 'docker exec' does: its
output is passed through as it is produced, its exit code is warren's
(127: CMD not found, 126: not executable, 128+N: killed by signal N, 124:
killed by --timeout). Ctrl-C and SIGTERM are passed on to CMD.

Standard input is passed to CMD when it is not a terminal (echo hi | warren
exec demo -- cat), or with -i. -t runs CMD on a terminal of its own, the
local terminal in raw mode and its size followed.

Examples:
  warren exec demo -- python3 -c 'print(1)'
  warren exec -it demo -- bash`

func execCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren exec", "warren exec [flags] NAME -- CMD [ARGS...]", execAbout)
	c, ns := clientFlags(fs)
	o := streamOptions{}
	fs.DurationVar(&o.timeout, "timeout", 0, "kill CMD after this long; 0 = no limit")
	fs.StringVar(&o.cwd, "workdir", "", "working directory in the sandbox")
	fs.StringVar(&o.user, "user", "", "user to run as (name, uid or uid:gid)")
	fs.BoolVar(&o.resume, "resume", false, "resume the sandbox first if it is paused")
	fs.Var((*stringList)(&o.env), "env", "set an environment variable K=V (repeatable)")
	stdin := fs.Bool("i", !isTerminal(os.Stdin), "pass standard input to CMD (default: when it is not a terminal)")
	fs.BoolVar(&o.tty, "t", false, "run CMD on a terminal (with -i: an interactive session)")
	dockerShort(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	argv := fs.Args()
	if len(argv) > 1 && argv[1] == "--" {
		argv = append(argv[:1:1], argv[2:]...)
	}
	if err := wantArgs(fs, argv, "NAME (the sandbox)", "CMD (what to run)", "ARGS..."); err != nil {
		return err
	}
	o.ns, o.name, o.argv, o.stdin = *ns, argv[0], argv[1:], *stdin
	return c.stream(ctx, o)
}

// streamOptions are one process run over the server's WebSocket.
type streamOptions struct {
	ns, name  string
	argv, env []string
	cwd, user string
	tty       bool
	stdin     bool
	timeout   time.Duration
	resume    bool
}

// wsMessage is every message after the first, both ways (docs/api.md).
type wsMessage struct {
	Type    string `json:"type"`
	Data    []byte `json:"data,omitempty"`
	Rows    uint16 `json:"rows,omitempty"`
	Cols    uint16 `json:"cols,omitempty"`
	Signal  string `json:"signal,omitempty"`
	Message string `json:"message,omitempty"`
	Kind    string `json:"kind,omitempty"`
	Cause   string `json:"cause,omitempty"`
	Stream  string `json:"stream,omitempty"`
	Dropped int64  `json:"dropped,omitempty"`
	Exit    *struct {
		Code   int    `json:"code"`
		Signal string `json:"signal"`
	} `json:"exit,omitempty"`
}

// wsMaxServerMessage bounds one message from the server: an output chunk
// is at most the agent's kept 1 MiB, base64 in JSON.
const wsMaxServerMessage = 4 << 20

// stream runs o's process and passes its output, exit code, input,
// signals and terminal size through. Its exit code comes back as an
// exitError.
func (c *apiClient) stream(ctx context.Context, o streamOptions) error {
	conn, err := c.dialWS(ctx, o)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	conn.MaxPayloadBytes = wsMaxServerMessage
	var sendMu sync.Mutex
	send := func(m any) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		_ = conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
		return websocket.JSON.Send(conn, m)
	}

	// Signals are caught before the process starts, so none is lost
	// between its start and the forwarding below. The caller's ctx ends
	// on the first Ctrl-C; the session must outlive it, to forward it.
	sigc := make(chan os.Signal, 4)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGWINCH)
	defer signal.Stop(sigc)
	term := o.tty && isTerminal(os.Stdin)
	start := map[string]any{"argv": o.argv, "env": o.env, "cwd": o.cwd, "user": o.user, "tty": o.tty}
	if o.tty {
		env := o.env
		if t := os.Getenv("TERM"); t != "" && !hasEnv(env, "TERM") {
			env = append([]string{"TERM=" + t}, env...)
		}
		start["env"] = env
		if rows, cols, ok := termSize(os.Stdin); ok {
			start["rows"], start["cols"] = rows, cols
		}
	}
	if err := send(start); err != nil {
		return fmt.Errorf("send the command: %w", err)
	}
	// warn prints warren's own messages, on a terminal put back first: raw
	// mode would print them without carriage returns.
	restore := func() {}
	defer func() { restore() }()
	warn := func(format string, args ...any) {
		restore()
		fmt.Fprintf(os.Stderr, "warren exec: "+format+"\n", args...)
	}
	eol := "\n"
	if term && o.stdin {
		r, err := makeRaw(os.Stdin)
		if err != nil {
			return err
		}
		restore, eol = r, "\r\n"
	}

	msgs := make(chan wsMessage)
	recvErr := make(chan error, 1)
	go func() {
		for {
			var m wsMessage
			if err := websocket.JSON.Receive(conn, &m); err != nil {
				recvErr <- err
				return
			}
			msgs <- m
		}
	}()
	var timeout <-chan time.Time
	if o.timeout > 0 {
		t := time.NewTimer(o.timeout)
		defer t.Stop()
		timeout = t.C
	}
	started, timedOut, lost, interrupts := false, false, false, 0
	for {
		select {
		case m := <-msgs:
			switch m.Type {
			case "started":
				started = true
				if o.stdin {
					go pumpStdin(send)
				} else {
					_ = send(wsMessage{Type: "eof"})
				}
			case "stdout", "stderr":
				w := os.Stdout
				if m.Type == "stderr" {
					w = os.Stderr
				}
				if _, err := w.Write(m.Data); err != nil && !errors.Is(err, syscall.EPIPE) {
					return err
				}
			case "dropped":
				lost = true
				// Said at once, before the output that follows the gap
				// (with \r on a raw terminal).
				fmt.Fprintf(os.Stderr, "warren exec: %d bytes of %s lost: the sandbox's agent predates held output (restart the sandbox to update it)%s", m.Dropped, m.Stream, eol)
			case "exit":
				if m.Exit == nil {
					return errors.New("the server's exit message has no exit status")
				}
				if timedOut {
					warn("killed after the %s timeout", o.timeout)
					return exitError{124}
				}
				if m.Exit.Code != 0 {
					return exitError{m.Exit.Code}
				}
				if lost {
					// Success with output missing is no success for
					// a script reading it.
					return exitError{1}
				}
				return nil
			case "error":
				if code := startExitCode(started, m); code != 0 {
					// CMD could not be started: the shell's codes.
					warn("%s", m.Message)
					return exitError{code}
				}
				return errors.New(m.Message)
			}
		case err := <-recvErr:
			return fmt.Errorf("the server closed the session before the command's exit: %w", err)
		case <-timeout:
			timedOut = true
			_ = send(wsMessage{Type: "signal", Signal: "SIGKILL"})
		case s := <-sigc:
			switch s {
			case syscall.SIGWINCH:
				if rows, cols, ok := termSize(os.Stdin); ok && o.tty {
					_ = send(wsMessage{Type: "resize", Rows: rows, Cols: cols})
				}
				continue
			case syscall.SIGINT:
				// A third Ctrl-C gives up on a command that ignores
				// them: closing the session kills it.
				if interrupts++; interrupts == 3 {
					warn("interrupted")
					return exitError{130}
				}
			}
			_ = send(wsMessage{Type: "signal", Signal: unixSignalName(s)})
		}
	}
}

// startExitCode is the shell's exit code for an error message m that says
// the command could not be started (127 not found, 126 not executable),
// or 0 for any other error.
func startExitCode(started bool, m wsMessage) int {
	if started || m.Kind != "not_found" {
		return 0
	}
	switch m.Cause {
	case wire.CauseNotFound:
		return 127
	case wire.CauseNotExecutable:
		return 126
	case "":
		// No cause: a user or group the sandbox lacks, or a sandbox agent
		// older than the field (a sandbox started before an upgrade),
		// which only its text tells apart.
		switch {
		case strings.Contains(m.Message, "not found in /etc/passwd") || strings.Contains(m.Message, "not found in /etc/group"):
			return 0
		case strings.Contains(m.Message, "permission denied") || strings.Contains(m.Message, "working directory"):
			return 126
		}
		return 127
	}
	return 126 // a cause newer than this client: still not started
}

func hasEnv(env []string, k string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, k+"=") {
			return true
		}
	}
	return false
}

func unixSignalName(s os.Signal) string {
	switch s {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGHUP:
		return "SIGHUP"
	default:
		return "SIGTERM"
	}
}

// pumpStdin sends standard input to the process as it is read, then its
// end.
func pumpStdin(send func(any) error) {
	buf := make([]byte, 32<<10)
	for {
		n, err := os.Stdin.Read(buf)
		if n > 0 {
			if send(wsMessage{Type: "stdin", Data: buf[:n]}) != nil {
				return
			}
		}
		if err != nil {
			_ = send(wsMessage{Type: "eof"})
			return
		}
	}
}

// dialWS opens the server's WebSocket for o's sandbox. The handshake's
// refusal carries no reason, so a refused one is asked again as a plain GET,
// whose JSON error says why (no such sandbox, not running, no right to it).
func (c *apiClient) dialWS(ctx context.Context, o streamOptions) (*websocket.Conn, error) {
	base, err := url.Parse(strings.TrimRight(c.url, "/"))
	if err != nil {
		return nil, fmt.Errorf("server URL %q: %w", c.url, err)
	}
	q := url.Values{"namespace": {o.ns}, "sandbox": {o.name}}
	if o.resume {
		q.Set("resume", "true")
	}
	httpURL := *base
	httpURL.Path += "/api/v1/ws"
	httpURL.RawQuery = q.Encode()
	wsURL := httpURL
	wsURL.Scheme = map[string]string{"https": "wss"}[base.Scheme]
	if wsURL.Scheme == "" {
		wsURL.Scheme = "ws"
	}
	cfg, err := websocket.NewConfig(wsURL.String(), base.String())
	if err != nil {
		return nil, err
	}
	if c.key != "" {
		cfg.Header.Set("Authorization", "Bearer "+c.key)
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := cfg.DialContext(dctx)
	if err == nil {
		return conn, nil
	}
	var de *websocket.DialError
	if !errors.As(err, &de) || !errors.Is(de.Err, websocket.ErrBadStatus) {
		return nil, fmt.Errorf("cannot reach the server at %s (is 'warren serve' running?): %w", c.url, err)
	}
	return nil, c.explain(ctx, httpURL.String(), err)
}

// explain asks for u without an upgrade and returns the server's error
// message, or err when it has none.
func (c *apiClient) explain(ctx context.Context, u string, err error) error {
	req, rerr := http.NewRequestWithContext(ctx, "GET", u, nil)
	if rerr != nil {
		return err
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, rerr := c.hc.Do(req)
	if rerr != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	return c.explainResponse(resp, err)
}

// explainResponse returns the server's error message in resp's JSON
// body, or err when it has none.
func (c *apiClient) explainResponse(resp *http.Response, err error) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e struct {
		Error *rpcError `json:"error"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Error != nil && e.Error.Message != "" {
		return e.Error
	}
	return err
}
