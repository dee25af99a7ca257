// Package httpd is the agent's HTTP/1.1 server: just what the host's
// net/http client needs (keep-alive, Content-Length and chunked bodies,
// streamed chunked responses, cancellation when the client goes away, routes
// with {name} segments). It exists so the agent does not link net/http,
// whose TLS and HTTP/2 code would triple the binary that every sandbox maps
// and starts.
package httpd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Limits on what a client may send.
const (
	MaxHeaderBytes = 64 << 10
	MaxHeaders     = 100
	// drainLimit is how much of an unread request body is skipped to keep
	// a connection; beyond it the connection is closed.
	drainLimit = 256 << 10
)

// Request is one HTTP request.
type Request struct {
	Method string
	Path   string
	Query  url.Values
	// Header holds the request's headers, names lower-cased.
	Header map[string]string
	Body   io.Reader
	ctx    context.Context
	params map[string]string
}

// Context is cancelled when the client closes the connection.
func (r *Request) Context() context.Context { return r.ctx }

// PathValue returns the path segment matched by {name} in the route.
func (r *Request) PathValue(name string) string { return r.params[name] }

// ResponseWriter writes a response. Without a Content-Length header the
// body is sent chunked, so it can stream.
type ResponseWriter interface {
	Header() map[string]string
	WriteHeader(status int)
	Write(p []byte) (int, error)
	Flush()
}

// HandlerFunc answers a request.
type HandlerFunc func(w ResponseWriter, r *Request)

type route struct {
	method string
	parts  []string // literal segments, or "{name}"
	h      HandlerFunc
}

// Mux routes "METHOD /path/{param}" patterns.
type Mux struct{ routes []route }

// HandleFunc registers h for pattern, e.g. "GET /v1/processes/{id}".
func (m *Mux) HandleFunc(pattern string, h HandlerFunc) {
	method, path, ok := strings.Cut(pattern, " ")
	if !ok {
		panic("httpd: pattern needs a method: " + pattern)
	}
	m.routes = append(m.routes, route{method: method, parts: strings.Split(strings.Trim(path, "/"), "/"), h: h})
}

func (m *Mux) match(method, path string) (HandlerFunc, map[string]string, int) {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	status := 404
	for _, rt := range m.routes {
		if len(rt.parts) != len(segs) {
			continue
		}
		var params map[string]string
		ok := true
		for i, p := range rt.parts {
			if strings.HasPrefix(p, "{") && strings.HasSuffix(p, "}") {
				if params == nil {
					params = map[string]string{}
				}
				params[p[1:len(p)-1]] = segs[i]
			} else if p != segs[i] {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		if rt.method != method {
			status = 405
			continue
		}
		return rt.h, params, 200
	}
	return nil, nil, status
}

// Serve accepts connections on l and serves each until it closes.
func Serve(l net.Listener, m *Mux) error {
	for {
		c, err := l.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			return err
		}
		go serveConn(c, m)
	}
}

// connReader lets the server notice a client hang-up while a handler runs,
// by reading ahead one byte in the background once the request body is done.
type connReader struct {
	conn    net.Conn
	mu      sync.Mutex
	hasByte bool
	byte    [1]byte
	bgDone  chan struct{}
	cancel  context.CancelFunc
}

func (cr *connReader) Read(p []byte) (int, error) {
	cr.mu.Lock()
	if cr.hasByte && len(p) > 0 {
		p[0] = cr.byte[0]
		cr.hasByte = false
		cr.mu.Unlock()
		return 1, nil
	}
	cr.mu.Unlock()
	return cr.conn.Read(p)
}

func (cr *connReader) startBackgroundRead() {
	if cr.bgDone != nil {
		return
	}
	done := make(chan struct{})
	cr.bgDone = done
	go func() {
		defer close(done)
		n, err := cr.conn.Read(cr.byte[:])
		cr.mu.Lock()
		if n == 1 {
			cr.hasByte = true
		}
		cr.mu.Unlock()
		var ne net.Error
		if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
			cr.cancel()
		}
	}()
}

// stopBackgroundRead ends a pending background read (by a past deadline)
// and waits for it.
func (cr *connReader) stopBackgroundRead() {
	if cr.bgDone == nil {
		return
	}
	_ = cr.conn.SetReadDeadline(time.Unix(1, 0))
	<-cr.bgDone
	_ = cr.conn.SetReadDeadline(time.Time{})
	cr.bgDone = nil
}

func serveConn(c net.Conn, m *Mux) {
	defer func() { _ = c.Close() }()
	cr := &connReader{conn: c}
	br := bufio.NewReaderSize(cr, 4096)
	bw := bufio.NewWriterSize(c, 32<<10)
	for {
		req, err := readRequest(br)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				writeSimple(bw, 400, err.Error())
			}
			return
		}
		ctx, cancel := context.WithCancel(context.Background())
		cr.cancel = cancel
		req.ctx = ctx
		body := req.Body.(*bodyReader)
		body.onEOF = func() {
			if br.Buffered() == 0 {
				cr.startBackgroundRead()
			}
		}
		if body.done() {
			body.onEOF()
		}
		w := &response{bw: bw, header: map[string]string{}}
		h, params, status := m.match(req.Method, req.Path)
		if h == nil {
			w.header["Content-Type"] = "application/json"
			w.WriteHeader(status)
			fmt.Fprintf(w, `{"kind":"not_found","message":"no route %s %s"}`+"\n", req.Method, req.Path)
		} else {
			req.params = params
			h(w, req)
		}
		cr.stopBackgroundRead()
		cancel()
		// Draining must not start another background read: the next
		// request's first byte would race into it.
		body.onEOF = nil
		keep := w.finish() == nil && body.drain() && req.Header["connection"] != "close"
		if err := bw.Flush(); err != nil || !keep {
			return
		}
	}
}

// WarmUp parses one request from r and answers it into nothing, so the
// first real request does not pay for first-use costs (page faults of
// this code, lazily built tables).
func WarmUp(r *bufio.Reader) {
	req, err := readRequest(r)
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, req.Body)
	bw := bufio.NewWriter(io.Discard)
	w := &response{bw: bw, header: map[string]string{"Content-Type": "application/x-ndjson"}}
	w.WriteHeader(200)
	_, _ = w.Write([]byte("{}\n"))
	w.Flush()
	_ = w.finish()
}

func readRequest(br *bufio.Reader) (*Request, error) {
	line, err := readLine(br)
	if err != nil {
		return nil, err
	}
	parts := strings.Split(line, " ")
	if len(parts) != 3 || !strings.HasPrefix(parts[2], "HTTP/1.") {
		return nil, fmt.Errorf("malformed request line")
	}
	u, err := url.ParseRequestURI(parts[1])
	if err != nil {
		return nil, fmt.Errorf("malformed request target")
	}
	req := &Request{Method: parts[0], Path: u.Path, Query: u.Query(), Header: map[string]string{}}
	total := len(line)
	for n := 0; ; n++ {
		l, err := readLine(br)
		if err != nil {
			return nil, err
		}
		if l == "" {
			break
		}
		total += len(l)
		if n >= MaxHeaders || total > MaxHeaderBytes {
			return nil, fmt.Errorf("request headers too large")
		}
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			return nil, fmt.Errorf("malformed header")
		}
		req.Header[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
	}
	b := &bodyReader{br: br}
	switch {
	case strings.EqualFold(req.Header["transfer-encoding"], "chunked"):
		b.chunked = true
	case req.Header["transfer-encoding"] != "":
		return nil, fmt.Errorf("unsupported transfer encoding")
	case req.Header["content-length"] != "":
		n, err := strconv.ParseInt(req.Header["content-length"], 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("bad content-length")
		}
		b.remaining = n
	}
	req.Body = b
	return req, nil
}

func readLine(br *bufio.Reader) (string, error) {
	var sb []byte
	for {
		frag, err := br.ReadSlice('\n')
		sb = append(sb, frag...)
		if len(sb) > MaxHeaderBytes {
			return "", fmt.Errorf("header line too long")
		}
		if err == nil {
			break
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			if len(sb) == 0 && errors.Is(err, io.EOF) {
				return "", io.EOF
			}
			return "", err
		}
	}
	return strings.TrimRight(string(sb), "\r\n"), nil
}

// bodyReader reads a request body framed by Content-Length or chunked.
type bodyReader struct {
	br        *bufio.Reader
	chunked   bool
	remaining int64 // in the current chunk, or of the whole body
	eof       bool
	err       error
	onEOF     func()
}

func (b *bodyReader) done() bool { return !b.chunked && b.remaining == 0 }

func (b *bodyReader) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.eof || (!b.chunked && b.remaining == 0) {
		return 0, b.finish()
	}
	if b.chunked && b.remaining == 0 {
		line, err := readLine(b.br)
		if err != nil {
			b.err = err
			return 0, err
		}
		size, _, _ := strings.Cut(line, ";")
		n, err := strconv.ParseInt(strings.TrimSpace(size), 16, 64)
		if err != nil || n < 0 {
			b.err = fmt.Errorf("malformed chunk size")
			return 0, b.err
		}
		if n == 0 {
			for { // trailers
				l, err := readLine(b.br)
				if err != nil {
					b.err = err
					return 0, err
				}
				if l == "" {
					break
				}
			}
			return 0, b.finish()
		}
		b.remaining = n
	}
	if int64(len(p)) > b.remaining {
		p = p[:b.remaining]
	}
	n, err := b.br.Read(p)
	b.remaining -= int64(n)
	if !b.chunked && b.remaining == 0 && err == nil {
		// The whole body is in: a decoder that stops at its last byte
		// must still let the server watch for a hang-up.
		_ = b.finish()
	}
	if b.chunked && b.remaining == 0 && err == nil {
		if _, err2 := readLine(b.br); err2 != nil {
			err = err2
		}
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		b.err = err
	}
	return n, err
}

func (b *bodyReader) finish() error {
	if !b.eof {
		b.eof = true
		if b.onEOF != nil {
			b.onEOF()
		}
	}
	return io.EOF
}

// drain skips what the handler left unread, reporting whether the
// connection can carry another request.
func (b *bodyReader) drain() bool {
	if b.eof || (!b.chunked && b.remaining == 0) {
		return b.err == nil
	}
	n, err := io.Copy(io.Discard, io.LimitReader(b, drainLimit+1))
	return (err == nil || errors.Is(err, io.EOF)) && n <= drainLimit && b.err == nil
}

type response struct {
	bw          *bufio.Writer
	header      map[string]string
	wroteHeader bool
	chunked     bool
	err         error
}

func (w *response) Header() map[string]string { return w.header }

func (w *response) WriteHeader(status int) {
	if w.wroteHeader {
		return
	}
	w.wroteHeader = true
	fmt.Fprintf(w.bw, "HTTP/1.1 %d %s\r\n", status, statusText(status))
	if _, ok := w.header["Content-Length"]; !ok && status != 204 && status != 304 {
		w.chunked = true
		w.header["Transfer-Encoding"] = "chunked"
	}
	for k, v := range w.header {
		fmt.Fprintf(w.bw, "%s: %s\r\n", k, v)
	}
	w.bw.WriteString("\r\n")
}

func (w *response) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(200)
	}
	if w.err != nil {
		return 0, w.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if w.chunked {
		fmt.Fprintf(w.bw, "%x\r\n", len(p))
	}
	n, err := w.bw.Write(p)
	if w.chunked && err == nil {
		_, err = w.bw.WriteString("\r\n")
	}
	if err != nil {
		w.err = err
	}
	return n, err
}

func (w *response) Flush() {
	if w.err == nil {
		w.err = w.bw.Flush()
	}
}

func (w *response) finish() error {
	if !w.wroteHeader {
		w.header["Content-Length"] = "0"
		w.WriteHeader(200)
	}
	if w.chunked && w.err == nil {
		_, w.err = w.bw.WriteString("0\r\n\r\n")
	}
	return w.err
}

func writeSimple(bw *bufio.Writer, status int, msg string) {
	body := fmt.Sprintf(`{"kind":"invalid","message":%q}`+"\n", msg)
	fmt.Fprintf(bw, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", status, statusText(status), len(body), body)
	_ = bw.Flush()
}

func statusText(code int) string {
	switch code {
	case 200:
		return "OK"
	case 201:
		return "Created"
	case 204:
		return "No Content"
	case 400:
		return "Bad Request"
	case 403:
		return "Forbidden"
	case 404:
		return "Not Found"
	case 405:
		return "Method Not Allowed"
	case 409:
		return "Conflict"
	case 413:
		return "Request Entity Too Large"
	case 429:
		return "Too Many Requests"
	case 431:
		return "Request Header Fields Too Large"
	case 500:
		return "Internal Server Error"
	}
	return "Status"
}

// ErrBodyTooLarge is returned by a LimitBody reader past its limit.
var ErrBodyTooLarge = errors.New("request body too large")

// LimitBody returns a reader that fails with ErrBodyTooLarge after n bytes.
func LimitBody(r io.Reader, n int64) io.Reader { return &limited{r: r, n: n} }

type limited struct {
	r io.Reader
	n int64
}

func (l *limited) Read(p []byte) (int, error) {
	if l.n < 0 {
		return 0, ErrBodyTooLarge
	}
	if int64(len(p)) > l.n+1 {
		p = p[:l.n+1]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	if l.n < 0 {
		return n + int(l.n), ErrBodyTooLarge
	}
	return n, err
}
