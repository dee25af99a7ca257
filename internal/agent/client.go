package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/wire"
)

// Client talks to one sandbox's agent over its unix socket. It is safe for
// concurrent use; connections are pooled.
type Client struct {
	http *http.Client
	base string
	// bounds bound the answers whose size the request does not give;
	// minAnswerTime is the time an answer's body may take at the least
	// (answerTime). Tests make both smaller.
	bounds        bounds
	minAnswerTime time.Duration
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
		// The agent sends a few short headers; the default allows 10 MiB.
		MaxResponseHeaderBytes: maxSmallAnswer,
	}
	return &Client{http: &http.Client{Transport: tr}, base: "http://agent", bounds: defaultBounds, minAnswerTime: minAnswerTime}
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

// The agent runs as the sandbox's root, so whatever answers on its socket
// may be hostile: every answer is read through a bound derived from what
// was asked, and one over it is ErrAnswerTooLarge, never memory the server
// gives away. An answer the agent writes at once (all but an exec's and a
// REPL run's, which stream as the code runs, and a tar download, which its
// caller bounds) must also arrive within answerTime of its headers, or it
// is ErrAnswerSlow: an agent that trickles it holds no request forever.
const (
	// maxSmallAnswer bounds an answer of a few fields (health, a file's
	// stat: a name, a path and a link target of at most 4 KiB each, six
	// bytes each escaped; an error; an empty answer).
	maxSmallAnswer = 64 << 10
	// maxListAnswer bounds a directory listing (the agent lists at most
	// 10000 entries) and the list of background processes.
	maxListAnswer = 64 << 20
	// maxProcessAnswer bounds one background process's description: its
	// argv came in a request of at most wire.MaxRequestJSON.
	maxProcessAnswer = wire.MaxRequestJSON + maxSmallAnswer
	// maxChunkAnswer bounds an output chunk: at most
	// wire.ProcessOutputKeep bytes, base64 (4/3 of them), and its fields.
	maxChunkAnswer = wire.ProcessOutputKeep*4/3 + maxSmallAnswer
	// maxReplResult bounds a REPL answer's members but its lines: the
	// value's repr (1 MiB) and the error (4 KiB), escaped, and the rest.
	maxReplResult = 6*(1<<20+4<<10) + maxSmallAnswer
	// maxReplLineFraming is the JSON around one line of REPL output
	// ({"stream":"stdout","text":""},).
	maxReplLineFraming = 32
	// replSlack is the output a REPL engine adds past a run's limit (a
	// line saying it timed out or restarted).
	replSlack = 64 << 10

	// noBound is the bound of an answer another bounds (a tar, an
	// exec's stream).
	noBound = math.MaxInt64 - 1

	// minAnswerTime and answerRate make answerTime.
	minAnswerTime = 10 * time.Second
	answerRate    = 1 << 20 // bytes per second
)

// bounds are the bounds of the answers that may be large whatever was asked.
type bounds struct{ list, process, fileRead int64 }

var defaultBounds = bounds{list: maxListAnswer, process: maxProcessAnswer, fileRead: wire.MaxFileRead}

// ErrAnswerTooLarge is the error of an agent answer over its bound.
var ErrAnswerTooLarge = errdefs.Errorf(errdefs.ErrTooLarge, "the sandbox's agent answered more than was asked for")

// ErrAnswerSlow is the error of an agent answer whose body did not arrive
// in time.
var ErrAnswerSlow = errdefs.Errorf(errdefs.ErrTimeout, "the sandbox's agent did not send its whole answer in time")

// answerTime is how long an answer of at most max bytes may take from its
// headers to its end: far more than the agent needs, even throttled.
func (c *Client) answerTime(max int64) time.Duration {
	return c.minAnswerTime + time.Duration(max/answerRate)*time.Second
}

// boundedBody is the body of an agent's answer, read within its bounds.
type boundedBody struct {
	body     io.ReadCloser
	what     string // "agent GET /v1/health", for errors
	n, max   int64
	cancel   context.CancelFunc
	deadline *time.Timer // nil: none
	late     atomic.Bool
}

func (a *boundedBody) Read(p []byte) (int, error) {
	if a.late.Load() {
		return 0, fmt.Errorf("%s: %w", a.what, ErrAnswerSlow)
	}
	if a.n > a.max {
		return 0, fmt.Errorf("%s: over %d bytes: %w", a.what, a.max, ErrAnswerTooLarge)
	}
	if room := a.max - a.n + 1; int64(len(p)) > room {
		p = p[:room] // one byte more than allowed tells an answer over it
	}
	n, err := a.body.Read(p)
	a.n += int64(n)
	switch {
	case a.n > a.max:
		return n - int(a.n-a.max), fmt.Errorf("%s: over %d bytes: %w", a.what, a.max, ErrAnswerTooLarge)
	case err != nil && a.late.Load():
		return n, fmt.Errorf("%s: %w", a.what, ErrAnswerSlow)
	}
	return n, err
}

func (a *boundedBody) Close() error {
	if a.deadline != nil {
		a.deadline.Stop()
	}
	err := a.body.Close()
	a.cancel()
	return err
}

// maxRequestLine bounds the URL of a request to the agent (its request
// line limit is 64 KiB, with the method and protocol).
const maxRequestLine = 60 << 10

// do sends a request and returns its answer, whose body reads at most max
// bytes (an error answer: maxSmallAnswer) within answerTime(max) of the
// headers when timed is set. The caller closes the body.
func (c *Client) do(ctx context.Context, method, path string, q url.Values, body io.Reader, ctype string, max int64, timed bool) (*http.Response, error) {
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
	ctx, cancel := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		cancel()
		return nil, err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("agent %s %s: %w", method, path, err)
	}
	a := &boundedBody{body: resp.Body, what: "agent " + method + " " + path, max: max, cancel: cancel}
	if resp.StatusCode >= 300 {
		a.max, timed = maxSmallAnswer, true
	}
	if timed {
		a.deadline = time.AfterFunc(c.answerTime(a.max), func() { a.late.Store(true); cancel() })
	}
	resp.Body = a
	if resp.StatusCode >= 300 {
		defer func() { _ = resp.Body.Close() }()
		ae := &Error{Status: resp.StatusCode}
		// An error body cut at its bound is still worth quoting.
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxSmallAnswer))
		if json.Unmarshal(b, &ae.ErrorBody) != nil || ae.Kind == "" {
			ae.Kind, ae.Message = wire.ErrInternal, fmt.Sprintf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
		}
		return nil, ae
	}
	return resp, nil
}

// call sends in as JSON (when non-nil) and decodes the answer, of at most
// max bytes, into out (when non-nil).
func (c *Client) call(ctx context.Context, method, path string, q url.Values, in, out any, max int64) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	resp, err := c.do(ctx, method, path, q, body, "application/json", max, true)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if out == nil {
		// Only the status counts; but an endless body is still an error.
		if _, err := io.Copy(io.Discard, resp.Body); errors.Is(err, ErrAnswerTooLarge) || errors.Is(err, ErrAnswerSlow) {
			return err
		}
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
	if err := c.call(ctx, http.MethodGet, "/v1/health", nil, nil, &h, maxSmallAnswer); err != nil {
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
	// The stream lasts as long as the command: its time is the caller's
	// (backend.Exec's deadline), its size bounded event by event below.
	resp, err := c.do(ctx, http.MethodPost, "/v1/exec", nil, bytes.NewReader(b), "application/json", noBound, false)
	if err != nil {
		return wire.ExitStatus{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	return readExecStream(resp.Body, execLimit(req), onOutput)
}

// execLimit is how many bytes of output the agent may send for req: its
// output limit as the agent applies it (none with NoOutputLimit, whose
// caller writes the output through).
func execLimit(req *wire.ExecRequest) int64 {
	switch {
	case req.NoOutputLimit:
		return math.MaxInt64
	case req.OutputLimit <= 0:
		return wire.DefaultOutputLimit
	}
	return min(req.OutputLimit, wire.MaxStreamedOutput)
}

// readExecStream decodes the NDJSON answer of an exec. The agent is not
// trusted: lines are bounded, the output's bytes by limit, and anything
// but well-formed events, each with some output, ending in an exit status
// is an error. Since every event carries a byte, their number is bounded
// too, and so is the stream.
func readExecStream(r io.Reader, limit int64, onOutput func(stream string, data []byte)) (wire.ExitStatus, error) {
	sc := bufio.NewScanner(r)
	// Each event holds at most one 32 KiB read, base64-encoded.
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var n int64
	for sc.Scan() {
		ev, ok := outputEvent(sc.Bytes())
		if !ok {
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				return wire.ExitStatus{}, fmt.Errorf("agent exec: bad event: %w", err)
			}
		}
		if ev.Exit != nil {
			return *ev.Exit, nil
		}
		if ev.Stream != wire.Stdout && ev.Stream != wire.Stderr {
			return wire.ExitStatus{}, fmt.Errorf("agent exec: event for unknown stream %q", ev.Stream)
		}
		if len(ev.Data) == 0 {
			return wire.ExitStatus{}, errors.New("agent exec: an event without output")
		}
		if n += int64(len(ev.Data)); n > limit {
			return wire.ExitStatus{}, fmt.Errorf("agent exec: output over its limit of %d bytes: %w", limit, ErrAnswerTooLarge)
		}
		if onOutput != nil {
			onOutput(ev.Stream, ev.Data)
		}
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		return wire.ExitStatus{}, fmt.Errorf("agent exec: an event over 1 MiB: %w", ErrAnswerTooLarge)
	} else if err != nil {
		return wire.ExitStatus{}, fmt.Errorf("agent exec: %w", err)
	}
	return wire.ExitStatus{}, errors.New("agent exec: stream ended without an exit status (agent died?)")
}

// The output events as the agent writes them, up to their base64 data.
var (
	stdoutEvent = []byte(`{"stream":"stdout","data":"`)
	stderrEvent = []byte(`{"stream":"stderr","data":"`)
)

// outputEvent decodes an output event written as the agent writes it (its
// members in order, the data plain base64) straight from its base64, and
// reports false for any other line, which json.Unmarshal then judges. It
// gives what json.Unmarshal gives for the same line, for a fraction of the
// CPU: encoding/json goes over a string three times (checking it, finding
// its end, unquoting it) before decoding its base64, and an exec's output
// (64 MiB at most, 85 MiB of base64) is decoded outside the server's bulk
// turns, on the CPU other tenants' requests are left (rpc's fair.go).
func outputEvent(line []byte) (wire.ExecEvent, bool) {
	var stream string
	switch {
	case bytes.HasPrefix(line, stdoutEvent):
		stream = wire.Stdout
	case bytes.HasPrefix(line, stderrEvent):
		stream = wire.Stderr
	default:
		return wire.ExecEvent{}, false
	}
	b64, ok := bytes.CutSuffix(line[len(stdoutEvent):], []byte(`"}`))
	// A quote or a backslash (an escape, another member) is no base64,
	// so Decode refuses it and the slow path reads the line; Decode skips
	// a carriage return, which JSON refuses in a string. (A line has no
	// newline.) Padded base64 comes in fours.
	if !ok || len(b64)%4 != 0 || bytes.IndexByte(b64, '\r') >= 0 {
		return wire.ExecEvent{}, false
	}
	// Its exact length (DecodedLen counts the padding): a 32 KiB read
	// stays a small allocation, not a large one of 32 KiB and a byte.
	size := len(b64) / 4 * 3
	if bytes.HasSuffix(b64, []byte("==")) {
		size -= 2
	} else if bytes.HasSuffix(b64, []byte("=")) {
		size--
	}
	data := make([]byte, max(size, 0))
	k, err := base64.StdEncoding.Decode(data, b64)
	if err != nil {
		return wire.ExecEvent{}, false
	}
	return wire.ExecEvent{Stream: stream, Data: data[:k]}, true
}

// StartProcess starts a background process.
func (c *Client) StartProcess(ctx context.Context, req *wire.ExecRequest) (wire.ProcessInfo, error) {
	var info wire.ProcessInfo
	err := c.call(ctx, http.MethodPost, "/v1/processes", nil, req, &info, c.bounds.process)
	return info, err
}

// Processes lists background processes.
func (c *Client) Processes(ctx context.Context) ([]wire.ProcessInfo, error) {
	var out []wire.ProcessInfo
	err := c.call(ctx, http.MethodGet, "/v1/processes", nil, nil, &out, c.bounds.list)
	return out, err
}

// Process describes one background process.
func (c *Client) Process(ctx context.Context, id string) (wire.ProcessInfo, error) {
	var info wire.ProcessInfo
	err := c.call(ctx, http.MethodGet, "/v1/processes/"+url.PathEscape(id), nil, nil, &info, c.bounds.process)
	return info, err
}

// Output reads a process's stream from offset; wait > 0 long-polls for new data.
func (c *Client) Output(ctx context.Context, id, stream string, offset int64, wait time.Duration) (wire.OutputChunk, error) {
	q := url.Values{"stream": {stream}, "offset": {strconv.FormatInt(offset, 10)}}
	if wait > 0 {
		q.Set("wait_ms", strconv.FormatInt(wait.Milliseconds(), 10))
	}
	var ch wire.OutputChunk
	err := c.call(ctx, http.MethodGet, "/v1/processes/"+url.PathEscape(id)+"/output", q, nil, &ch, maxChunkAnswer)
	return ch, err
}

// Wait waits for a process to exit, at most timeout (0 = until ctx ends).
func (c *Client) Wait(ctx context.Context, id string, timeout time.Duration) (wire.ProcessInfo, error) {
	var q url.Values
	if timeout > 0 {
		q = url.Values{"timeout_ms": {strconv.FormatInt(timeout.Milliseconds(), 10)}}
	}
	var info wire.ProcessInfo
	err := c.call(ctx, http.MethodPost, "/v1/processes/"+url.PathEscape(id)+"/wait", q, nil, &info, c.bounds.process)
	return info, err
}

// Detach asks the agent to drop its host connections, this client's among
// them (boot.AttachListener.Detach): the client is of no use after.
func (c *Client) Detach(ctx context.Context) error {
	return c.call(ctx, http.MethodPost, "/v1/detach", nil, nil, nil, maxSmallAnswer)
}

// Signal sends a signal ("SIGTERM", "9") to a process's group.
func (c *Client) Signal(ctx context.Context, id, sig string) error {
	return c.call(ctx, http.MethodPost, "/v1/processes/"+url.PathEscape(id)+"/signal", nil, wire.SignalRequest{Signal: sig}, nil, maxSmallAnswer)
}

// WriteStdin writes to a process's stdin (or terminal), closing it after when close is set.
func (c *Client) WriteStdin(ctx context.Context, id string, data []byte, close bool) error {
	var q url.Values
	if close {
		q = url.Values{"close": {"1"}}
	}
	resp, err := c.do(ctx, http.MethodPost, "/v1/processes/"+url.PathEscape(id)+"/stdin", q, bytes.NewReader(data), "application/octet-stream", maxSmallAnswer, true)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	return nil
}

// Resize sets the terminal size of a TTY process.
func (c *Client) Resize(ctx context.Context, id string, rows, cols uint16) error {
	return c.call(ctx, http.MethodPost, "/v1/processes/"+url.PathEscape(id)+"/resize", nil, wire.ResizeRequest{Rows: rows, Cols: cols}, nil, maxSmallAnswer)
}

// RemoveProcess kills a process if it runs and forgets it.
func (c *Client) RemoveProcess(ctx context.Context, id string) error {
	return c.call(ctx, http.MethodDelete, "/v1/processes/"+url.PathEscape(id), nil, nil, nil, maxSmallAnswer)
}

// ReadFile returns a file's content.
func (c *Client) ReadFile(ctx context.Context, path string) ([]byte, error) {
	resp, err := c.do(ctx, http.MethodGet, "/v1/files/content", url.Values{"path": {path}}, nil, "", c.bounds.fileRead, true)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	return io.ReadAll(resp.Body)
}

// WriteFile replaces a file's content atomically.
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader, mode uint32) error {
	q := url.Values{"path": {path}, "mode": {strconv.FormatUint(uint64(mode), 10)}}
	resp, err := c.do(ctx, http.MethodPut, "/v1/files/content", q, r, "application/octet-stream", maxSmallAnswer, true)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	return nil
}

// Stat describes a file without following a final symlink.
func (c *Client) Stat(ctx context.Context, path string) (wire.FileInfo, error) {
	var fi wire.FileInfo
	err := c.call(ctx, http.MethodGet, "/v1/files/stat", url.Values{"path": {path}}, nil, &fi, maxSmallAnswer)
	return fi, err
}

// List lists a directory.
func (c *Client) List(ctx context.Context, path string) ([]wire.FileInfo, error) {
	var out []wire.FileInfo
	err := c.call(ctx, http.MethodGet, "/v1/files/list", url.Values{"path": {path}}, nil, &out, c.bounds.list)
	return out, err
}

// Mkdir creates a directory.
func (c *Client) Mkdir(ctx context.Context, req wire.MkdirRequest) error {
	return c.call(ctx, http.MethodPost, "/v1/files/mkdir", nil, req, nil, maxSmallAnswer)
}

// Remove removes a file or directory.
func (c *Client) Remove(ctx context.Context, req wire.RemoveRequest) error {
	return c.call(ctx, http.MethodPost, "/v1/files/remove", nil, req, nil, maxSmallAnswer)
}

// Move renames a file or directory.
func (c *Client) Move(ctx context.Context, from, to string) error {
	return c.call(ctx, http.MethodPost, "/v1/files/move", nil, wire.MoveRequest{From: from, To: to}, nil, maxSmallAnswer)
}

// DownloadTar streams a tar of path; the caller closes the reader.
func (c *Client) DownloadTar(ctx context.Context, path string) (io.ReadCloser, error) {
	// Its caller bounds the tar's size (and the caller's request its time).
	resp, err := c.do(ctx, http.MethodGet, "/v1/files/tar", url.Values{"path": {path}}, nil, "", noBound, false)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// UploadTar extracts a tar stream into directory path.
func (c *Client) UploadTar(ctx context.Context, path string, r io.Reader) error {
	resp, err := c.do(ctx, http.MethodPut, "/v1/files/tar", url.Values{"path": {path}}, r, "application/x-tar", maxSmallAnswer, true)
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
	// The answer comes when the run ends: its time is the caller's
	// (Lease.Repl's deadline), its size bounded by the output asked for.
	limit := replLimit(req)
	resp, err := c.do(ctx, http.MethodPost, "/v1/repl/run", nil, bytes.NewReader(b), "application/json", replAnswerMax(limit), false)
	if err != nil {
		return wire.ReplResult{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	res, err := readReplResult(resp.Body, limit, onLine)
	if err != nil {
		return wire.ReplResult{}, fmt.Errorf("agent repl: %w", err)
	}
	return res, nil
}

// maxReplLines bounds the lines of a REPL answer: what a run keeps, and
// the few the engine adds (a timeout, a restart).
const maxReplLines = wire.MaxReplLines + 16

// replLimit is how many bytes of output (a newline counted after each
// line) the agent keeps for req: its output limit as the agent applies it,
// and for 0 the agent's default, which is at most wire.MaxOutputLimit.
func replLimit(req wire.ReplRequest) int64 {
	if req.OutputLimit <= 0 {
		return wire.MaxOutputLimit
	}
	return min(req.OutputLimit, wire.MaxOutputLimit)
}

// replAnswerMax bounds the bytes of a REPL answer keeping limit bytes of
// output: each escaped, in the worst case, to six (\u0001), the lines'
// framing (each line counts a byte at least, so there are at most as many
// as bytes), and the other members.
func replAnswerMax(limit int64) int64 {
	return 6*(limit+replSlack) + maxReplLineFraming*min(maxReplLines, limit+replSlack) + maxReplResult
}

// readReplResult decodes a REPL answer a line of output at a time, handing
// each to onLine: a run's output may be tens of MiB, which a decoder
// reading the answer whole would buffer (and grow to twice) before
// decoding a line of it. The agent is not trusted: it may send at most
// wire.MaxReplLines lines, and limit bytes of them (with a newline after
// each, as the agent counts them). The result's Output is left nil.
func readReplResult(r io.Reader, limit int64, onLine func(wire.OutputLine)) (wire.ReplResult, error) {
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
		var size int64
		for n := 0; dec.More(); n++ {
			if n >= maxReplLines {
				return res, fmt.Errorf("more than %d lines of output: %w", maxReplLines, ErrAnswerTooLarge)
			}
			var l wire.OutputLine
			if err := dec.Decode(&l); err != nil {
				return res, err
			}
			if size += int64(len(l.Text)) + 1; size > limit+replSlack {
				return res, fmt.Errorf("output over its limit of %d bytes: %w", limit, ErrAnswerTooLarge)
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
