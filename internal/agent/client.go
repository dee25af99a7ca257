package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/wire"
)

// Client talks to one sandbox's agent over its unix socket. It is safe for
// concurrent use; connections are pooled.
type Client struct {
	http *http.Client
	base string
}

// NewClient returns a client for the agent listening at socketPath.
func NewClient(socketPath string) *Client { return NewClientConn(socketPath, nil) }

// NewClientConn is NewClient with a connection to the agent already made
// (nil: none), which the first request uses instead of dialling.
func NewClientConn(socketPath string, first net.Conn) *Client {
	var mu sync.Mutex
	return NewClientDial(func(ctx context.Context) (net.Conn, error) {
		mu.Lock()
		c := first
		first = nil
		mu.Unlock()
		if c != nil {
			return c, nil
		}
		var d net.Dialer
		return d.DialContext(ctx, "unix", socketPath)
	})
}

// NewClientDial returns a client that gets each connection to the agent
// from dial (an agent served in-process, without a socket, in tests).
func NewClientDial(dial func(ctx context.Context) (net.Conn, error)) *Client {
	tr := &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &Client{http: &http.Client{Transport: tr}, base: "http://agent"}
}

// Close drops pooled connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Error is an error answered by the agent.
type Error struct {
	Status int
	wire.ErrorBody
}

func (e *Error) Error() string { return "agent: " + e.Message }

// Unwrap returns the server's kind for the agent's kind (nil for internal
// or unknown kinds), so that errors.Is(err, errdefs.ErrNotFound) and
// errdefs.Kind see an agent error as the kind it is.
func (e *Error) Unwrap() error { return kinds[e.Kind] }

// kinds maps the agent's error kinds onto the server's.
var kinds = map[string]error{
	wire.ErrInvalid:    errdefs.ErrInvalid,
	wire.ErrNotFound:   errdefs.ErrNotFound,
	wire.ErrExists:     errdefs.ErrConflict,
	wire.ErrPermission: errdefs.ErrForbidden,
	wire.ErrTooLarge:   errdefs.ErrTooLarge,
	wire.ErrLimit:      errdefs.ErrLimit,
}

// IsKind reports whether err is an agent error of kind.
func IsKind(err error, kind string) bool {
	var ae *Error
	return errors.As(err, &ae) && ae.Kind == kind
}

// maxRequestLine bounds the URL of a request to the agent (its request
// line limit is 64 KiB, with the method and protocol).
const maxRequestLine = 60 << 10

func (c *Client) do(ctx context.Context, method, path string, q url.Values, body io.Reader, ctype string) (*http.Response, error) {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	// The agent reads request lines of at most 64 KiB: a longer one (a path
	// far past PATH_MAX, from a caller) is refused here, as the caller's
	// mistake and without quoting it, rather than failing on the way as a
	// transport error that carries the whole URL.
	if len(u) > maxRequestLine {
		return nil, errdefs.Errorf(errdefs.ErrInvalid, "agent %s %s: the parameters are %d bytes encoded, over %d (a path is at most 4096 bytes)", method, path, len(u), maxRequestLine)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("agent %s %s: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		defer func() { _ = resp.Body.Close() }()
		ae := &Error{Status: resp.StatusCode}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(b, &ae.ErrorBody) != nil || ae.Kind == "" {
			ae.Kind, ae.Message = wire.ErrInternal, fmt.Sprintf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
		}
		return nil, ae
	}
	return resp, nil
}

// call sends in as JSON (when non-nil) and decodes the answer into out (when non-nil).
func (c *Client) call(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	resp, err := c.do(ctx, method, path, q, body, "application/json")
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("agent %s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// Health checks the agent answers and speaks this protocol version.
func (c *Client) Health(ctx context.Context) (wire.Health, error) {
	var h wire.Health
	if err := c.call(ctx, http.MethodGet, "/v1/health", nil, nil, &h); err != nil {
		return h, err
	}
	if h.Version != wire.Version {
		return h, fmt.Errorf("agent speaks protocol %q, host %q", h.Version, wire.Version)
	}
	return h, nil
}

// Exec runs req to completion. onOutput, when non-nil, sees each chunk as it
// arrives. The exit status is the stream's last event.
func (c *Client) Exec(ctx context.Context, req *wire.ExecRequest, onOutput func(stream string, data []byte)) (wire.ExitStatus, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return wire.ExitStatus{}, err
	}
	resp, err := c.do(ctx, http.MethodPost, "/v1/exec", nil, bytes.NewReader(b), "application/json")
	if err != nil {
		return wire.ExitStatus{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	return readExecStream(resp.Body, onOutput)
}

// readExecStream decodes the NDJSON answer of an exec. The agent is not
// trusted: lines are bounded, and anything but well-formed events ending in
// an exit status is an error.
func readExecStream(r io.Reader, onOutput func(stream string, data []byte)) (wire.ExitStatus, error) {
	sc := bufio.NewScanner(r)
	// Each event holds at most one 32 KiB read, base64-encoded.
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev wire.ExecEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return wire.ExitStatus{}, fmt.Errorf("agent exec: bad event: %w", err)
		}
		if ev.Exit != nil {
			return *ev.Exit, nil
		}
		if ev.Stream != wire.Stdout && ev.Stream != wire.Stderr {
			return wire.ExitStatus{}, fmt.Errorf("agent exec: event for unknown stream %q", ev.Stream)
		}
		if onOutput != nil && len(ev.Data) > 0 {
			onOutput(ev.Stream, ev.Data)
		}
	}
	if err := sc.Err(); err != nil {
		return wire.ExitStatus{}, fmt.Errorf("agent exec: %w", err)
	}
	return wire.ExitStatus{}, errors.New("agent exec: stream ended without an exit status (agent died?)")
}

// StartProcess starts a background process.
func (c *Client) StartProcess(ctx context.Context, req *wire.ExecRequest) (wire.ProcessInfo, error) {
	var info wire.ProcessInfo
	err := c.call(ctx, http.MethodPost, "/v1/processes", nil, req, &info)
	return info, err
}

// Processes lists background processes.
func (c *Client) Processes(ctx context.Context) ([]wire.ProcessInfo, error) {
	var out []wire.ProcessInfo
	err := c.call(ctx, http.MethodGet, "/v1/processes", nil, nil, &out)
	return out, err
}

// Process describes one background process.
func (c *Client) Process(ctx context.Context, id string) (wire.ProcessInfo, error) {
	var info wire.ProcessInfo
	err := c.call(ctx, http.MethodGet, "/v1/processes/"+url.PathEscape(id), nil, nil, &info)
	return info, err
}

// Output reads a process's stream from offset; wait > 0 long-polls for new data.
func (c *Client) Output(ctx context.Context, id, stream string, offset int64, wait time.Duration) (wire.OutputChunk, error) {
	q := url.Values{"stream": {stream}, "offset": {strconv.FormatInt(offset, 10)}}
	if wait > 0 {
		q.Set("wait_ms", strconv.FormatInt(wait.Milliseconds(), 10))
	}
	var ch wire.OutputChunk
	err := c.call(ctx, http.MethodGet, "/v1/processes/"+url.PathEscape(id)+"/output", q, nil, &ch)
	return ch, err
}

// Wait waits for a process to exit, at most timeout (0 = until ctx ends).
func (c *Client) Wait(ctx context.Context, id string, timeout time.Duration) (wire.ProcessInfo, error) {
	var q url.Values
	if timeout > 0 {
		q = url.Values{"timeout_ms": {strconv.FormatInt(timeout.Milliseconds(), 10)}}
	}
	var info wire.ProcessInfo
	err := c.call(ctx, http.MethodPost, "/v1/processes/"+url.PathEscape(id)+"/wait", q, nil, &info)
	return info, err
}

// Signal sends a signal ("SIGTERM", "9") to a process's group.
func (c *Client) Signal(ctx context.Context, id, sig string) error {
	return c.call(ctx, http.MethodPost, "/v1/processes/"+url.PathEscape(id)+"/signal", nil, wire.SignalRequest{Signal: sig}, nil)
}

// WriteStdin writes to a process's stdin (or terminal), closing it after when close is set.
func (c *Client) WriteStdin(ctx context.Context, id string, data []byte, close bool) error {
	var q url.Values
	if close {
		q = url.Values{"close": {"1"}}
	}
	resp, err := c.do(ctx, http.MethodPost, "/v1/processes/"+url.PathEscape(id)+"/stdin", q, bytes.NewReader(data), "application/octet-stream")
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	return nil
}

// Resize sets the terminal size of a TTY process.
func (c *Client) Resize(ctx context.Context, id string, rows, cols uint16) error {
	return c.call(ctx, http.MethodPost, "/v1/processes/"+url.PathEscape(id)+"/resize", nil, wire.ResizeRequest{Rows: rows, Cols: cols}, nil)
}

// RemoveProcess kills a process if it runs and forgets it.
func (c *Client) RemoveProcess(ctx context.Context, id string) error {
	return c.call(ctx, http.MethodDelete, "/v1/processes/"+url.PathEscape(id), nil, nil, nil)
}

// ReadFile returns a file's content.
func (c *Client) ReadFile(ctx context.Context, path string) ([]byte, error) {
	resp, err := c.do(ctx, http.MethodGet, "/v1/files/content", url.Values{"path": {path}}, nil, "")
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	return io.ReadAll(io.LimitReader(resp.Body, wire.MaxFileRead+1))
}

// WriteFile replaces a file's content atomically.
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader, mode uint32) error {
	q := url.Values{"path": {path}, "mode": {strconv.FormatUint(uint64(mode), 10)}}
	resp, err := c.do(ctx, http.MethodPut, "/v1/files/content", q, r, "application/octet-stream")
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	return nil
}

// Stat describes a file without following a final symlink.
func (c *Client) Stat(ctx context.Context, path string) (wire.FileInfo, error) {
	var fi wire.FileInfo
	err := c.call(ctx, http.MethodGet, "/v1/files/stat", url.Values{"path": {path}}, nil, &fi)
	return fi, err
}

// List lists a directory.
func (c *Client) List(ctx context.Context, path string) ([]wire.FileInfo, error) {
	var out []wire.FileInfo
	err := c.call(ctx, http.MethodGet, "/v1/files/list", url.Values{"path": {path}}, nil, &out)
	return out, err
}

// Mkdir creates a directory.
func (c *Client) Mkdir(ctx context.Context, req wire.MkdirRequest) error {
	return c.call(ctx, http.MethodPost, "/v1/files/mkdir", nil, req, nil)
}

// Remove removes a file or directory.
func (c *Client) Remove(ctx context.Context, req wire.RemoveRequest) error {
	return c.call(ctx, http.MethodPost, "/v1/files/remove", nil, req, nil)
}

// Move renames a file or directory.
func (c *Client) Move(ctx context.Context, from, to string) error {
	return c.call(ctx, http.MethodPost, "/v1/files/move", nil, wire.MoveRequest{From: from, To: to}, nil)
}

// DownloadTar streams a tar of path; the caller closes the reader.
func (c *Client) DownloadTar(ctx context.Context, path string) (io.ReadCloser, error) {
	resp, err := c.do(ctx, http.MethodGet, "/v1/files/tar", url.Values{"path": {path}}, nil, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// UploadTar extracts a tar stream into directory path.
func (c *Client) UploadTar(ctx context.Context, path string, r io.Reader) error {
	resp, err := c.do(ctx, http.MethodPut, "/v1/files/tar", url.Values{"path": {path}}, r, "application/x-tar")
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	return nil
}

// Repl runs code in the sandbox's persistent interpreter for the language.
func (c *Client) Repl(ctx context.Context, req wire.ReplRequest) (wire.ReplResult, error) {
	var out []wire.OutputLine
	res, err := c.ReplStream(ctx, req, func(l wire.OutputLine) { out = append(out, l) })
	if out == nil && err == nil {
		out = []wire.OutputLine{}
	}
	res.Output = out
	return res, err
}

// ReplStream is Repl handing each line of the run's output to onLine as it
// is read, in order, instead of keeping them: the result's Output is nil.
// A caller that spools the lines holds none of a large output in memory.
func (c *Client) ReplStream(ctx context.Context, req wire.ReplRequest, onLine func(wire.OutputLine)) (wire.ReplResult, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return wire.ReplResult{}, err
	}
	resp, err := c.do(ctx, http.MethodPost, "/v1/repl/run", nil, bytes.NewReader(b), "application/json")
	if err != nil {
		return wire.ReplResult{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	res, err := readReplResult(resp.Body, onLine)
	if err != nil {
		return wire.ReplResult{}, fmt.Errorf("agent repl: %w", err)
	}
	return res, nil
}

// maxReplLines bounds the lines of a REPL answer: what a run keeps, and
// the few the engine adds (a timeout, a restart).
const maxReplLines = wire.MaxReplLines + 16

// readReplResult decodes a REPL answer a line of output at a time, handing
// each to onLine: a run's output may be tens of MiB, which a decoder
// reading the answer whole would buffer (and grow to twice) before
// decoding a line of it. The agent is not trusted: it may send at most
// wire.MaxReplLines lines. The result's Output is left nil.
func readReplResult(r io.Reader, onLine func(wire.OutputLine)) (wire.ReplResult, error) {
	var res wire.ReplResult
	dec := json.NewDecoder(r)
	if tok, err := dec.Token(); err != nil {
		return res, err
	} else if tok != json.Delim('{') {
		return res, errors.New("the answer is not a JSON object")
	}
	rest := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return res, err
		}
		key, _ := tok.(string)
		if key != "output" {
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				return res, err
			}
			rest[key] = v
			continue
		}
		if tok, err := dec.Token(); err != nil {
			return res, err
		} else if tok != json.Delim('[') {
			return res, errors.New("output is not an array")
		}
		for n := 0; dec.More(); n++ {
			if n >= maxReplLines {
				return res, fmt.Errorf("more than %d lines of output", maxReplLines)
			}
			var l wire.OutputLine
			if err := dec.Decode(&l); err != nil {
				return res, err
			}
			onLine(l)
		}
		if _, err := dec.Token(); err != nil {
			return res, err
		}
	}
	if _, err := dec.Token(); err != nil {
		return res, err
	}
	b, err := json.Marshal(rest)
	if err != nil {
		return res, err
	}
	if err := json.Unmarshal(b, &res); err != nil {
		return res, err
	}
	return res, nil
}
