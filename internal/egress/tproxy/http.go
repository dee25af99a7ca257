package tproxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/secrets"
)

// Plain HTTP, and HTTPS the proxy intercepts for a sandbox's secrets, are
// forwarded request by request rather than spliced:
//   - every request's Host is checked (the first one's alone was, before):
//     a request on a kept-alive connection naming a host the policy denies
//     ends the connection, with a reset, before any byte of it leaves;
//   - each request is parsed (net/http's parser, strict: a request two
//     servers could read differently, such as one with two Host fields, is
//     refused) and written out again from what was parsed, so the server
//     reads the Host, the framing and the target that were checked;
//   - to a host a proxy-mode grant names, the secrets' placeholders are
//     replaced by their values in the target (percent-encoded), the header
//     and trailer fields and a body of at most MaxSubstBody bytes
//     (Content-Length recomputed; a chunked body is sent as one chunk). A
//     larger body is forwarded as it is, placeholders included, and the
//     record says so;
//   - responses are not parsed: the destination's bytes are copied back as
//     they come (spliced on plain connections);
//   - after a CONNECT or an Upgrade request (a WebSocket), the rest of the
//     sandbox's bytes are a tunnel: copied as they are, unchecked.

// MaxSubstBody bounds a body the proxy reads whole to replace
// placeholders in.
const MaxSubstBody = 1 << 20

var errHeadTooBig = fmt.Errorf("request head over %d bytes", MaxPeek)

// deniedError ends a connection whose later request was refused.
type deniedError struct{ name, reason string }

func (e *deniedError) Error() string { return e.reason }

// headBudget bounds the bytes read for one request head: left < 0 is no
// bound (a body).
type headBudget struct {
	r    io.Reader
	left int
}

func (b *headBudget) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, errHeadTooBig
	}
	if b.left > 0 && len(p) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	if b.left > 0 {
		b.left -= n
	}
	return n, err
}

// idleConn is one side of a forwarded connection: pre is read first;
// reads run in rounds, and end with errIdle when nothing moved on the
// sandbox's connection either way for IdleTimeout. hard, when set,
// bounds reads instead (a handshake).
type idleConn struct {
	net.Conn
	client *net.TCPConn
	p      *Proxy
	pre    []byte
	hard   time.Time
}

func (c *idleConn) Read(b []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(b, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	for {
		if !c.hard.IsZero() {
			_ = c.Conn.SetReadDeadline(c.hard)
			return c.Conn.Read(b)
		}
		_ = c.Conn.SetReadDeadline(time.Now().Add(c.p.round()))
		n, err := c.Conn.Read(b)
		if n > 0 || err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return n, err
		}
		if idle, ok := idleFor(c.client); ok && time.Duration(idle)*time.Millisecond >= c.p.cfg.IdleTimeout {
			return 0, errIdle
		}
	}
}

// countWriter counts what is written into the proxy's counter.
type countWriter struct {
	w       io.Writer
	n       int64
	counter *atomic.Uint64
}

func (c *countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	c.counter.Add(uint64(n)) // #nosec G115 -- n >= 0
	return n, err
}

// httpPeer is what forwardHTTP checks requests against.
type httpPeer struct {
	sb  Sandbox
	dst netip.AddrPort
	sec *secrets.Proxy // nil: no secrets
	// tlsName, on an intercepted connection, is the ClientHello's name:
	// every request's Host must be it.
	tlsName string
}

// forwardHTTP forwards the requests read from r to w until r ends (nil),
// a request is refused (*deniedError), or either side fails. On an
// upgrade it returns tunnel set and the reader holding the rest. notes
// collects what the connection's record should say.
func (p *Proxy) forwardHTTP(r io.Reader, w io.Writer, peer httpPeer, notes *[]string) (tunnel *bufio.Reader, err error) {
	budget := &headBudget{r: r, left: -1}
	br := bufio.NewReaderSize(budget, 4096)
	bw := bufio.NewWriterSize(w, 32<<10)
	for n := 1; ; n++ {
		if _, err := br.Peek(1); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, nil
			}
			return nil, err
		}
		// What is buffered counts: it may be this head.
		budget.left = max(MaxPeek-br.Buffered(), 1)
		req, err := http.ReadRequest(br)
		budget.left = -1
		switch {
		case err == nil:
		case errors.Is(err, errHeadTooBig):
			return nil, &deniedError{reason: fmt.Sprintf("request %d: head over %d bytes", n, MaxPeek)}
		case errors.Is(err, errIdle), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF), errors.As(err, new(*net.OpError)):
			return nil, err
		default:
			return nil, &deniedError{reason: fmt.Sprintf("request %d: malformed HTTP request: %v", n, err)}
		}
		host, herr := authorityHost(req.Host)
		switch {
		case herr != nil:
			return nil, &deniedError{reason: fmt.Sprintf("request %d: host %.80q: %v", n, req.Host, herr)}
		case peer.tlsName != "" && host != peer.tlsName:
			return nil, &deniedError{name: host, reason: fmt.Sprintf("request %d: Host %s on a TLS connection to %s", n, host, peer.tlsName)}
		case peer.tlsName == "":
			if v := peer.sb.Decide(peer.dst, host, kindHTTP); !v.Allow {
				return nil, &deniedError{name: host, reason: fmt.Sprintf("request %d: %s", n, v.Reason)}
			}
		}
		names, note, err := writeRequest(bw, req, host, peer.sec)
		if err != nil {
			return nil, err
		}
		for _, s := range append(names, note) {
			if s != "" && !slices.Contains(*notes, s) && len(*notes) < 16 {
				*notes = append(*notes, s)
			}
		}
		if req.Method == http.MethodConnect || req.Header.Get("Upgrade") != "" {
			return br, nil
		}
	}
}

// writeRequest writes req (read from the sandbox, for host) to bw, with
// sec's placeholders replaced when host is one of its grants'. It
// returns what it replaced ("secret NAME") and a note for the record.
func writeRequest(bw *bufio.Writer, req *http.Request, host string, sec *secrets.Proxy) (replaced []string, note string, err error) {
	defer func() { _ = req.Body.Close() }()
	subst := sec.Intercepts(host)
	var names []string
	add := func(ns []string) {
		for _, n := range ns {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	target := req.RequestURI
	if subst {
		var ns []string
		target, ns = sec.ReplaceInTarget(host, target)
		add(ns)
	}
	chunked := len(req.TransferEncoding) > 0
	hadLength := req.Header.Get("Content-Length") != ""
	var body io.Reader = req.Body
	length := req.ContentLength
	if subst && (chunked || length > 0) {
		if chunked || length <= MaxSubstBody {
			b, err := io.ReadAll(io.LimitReader(req.Body, MaxSubstBody+1))
			if err != nil {
				return nil, "", err
			}
			if len(b) <= MaxSubstBody {
				nb, ns := sec.Replace(host, b)
				add(ns)
				body = bytes.NewReader(nb)
				if !chunked {
					length = int64(len(nb))
				}
			} else {
				body = io.MultiReader(bytes.NewReader(b), req.Body)
				note = fmt.Sprintf("a body over %d bytes was forwarded without substitution", MaxSubstBody)
			}
		} else {
			note = fmt.Sprintf("a body over %d bytes was forwarded without substitution", MaxSubstBody)
		}
		// Read whole before the head goes: the server's 100 Continue
		// would come to a client that already got its answer from us.
		req.Header.Del("Expect")
	}
	_, _ = fmt.Fprintf(bw, "%s %s %s\r\n", req.Method, target, req.Proto)
	if req.Host != "" {
		_, _ = fmt.Fprintf(bw, "Host: %s\r\n", req.Host)
	}
	writeFields(bw, req.Header, func(k string) bool {
		return k == "Content-Length" || k == "Transfer-Encoding" || k == "Trailer" || k == "Host"
	}, host, sec, subst, add)
	switch {
	case chunked:
		_, _ = bw.WriteString("Transfer-Encoding: chunked\r\n")
		if len(req.Trailer) > 0 {
			keys := make([]string, 0, len(req.Trailer))
			for k := range req.Trailer {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			_, _ = fmt.Fprintf(bw, "Trailer: %s\r\n", strings.Join(keys, ", "))
		}
	case length > 0 || hadLength:
		_, _ = fmt.Fprintf(bw, "Content-Length: %d\r\n", length)
	}
	if _, err := bw.WriteString("\r\n"); err != nil {
		return nil, "", err
	}
	// The head goes at once: a client that asked for 100 Continue waits
	// for the server's before it sends a body.
	if err := bw.Flush(); err != nil {
		return nil, "", err
	}
	if chunked {
		cw := httputil.NewChunkedWriter(bw)
		if _, err := io.Copy(cw, body); err != nil {
			return nil, "", err
		}
		_ = cw.Close() // the last chunk, "0\r\n"
		writeFields(bw, req.Trailer, func(string) bool { return false }, host, sec, subst, add)
		_, _ = bw.WriteString("\r\n")
	} else if length > 0 {
		if _, err := io.CopyN(bw, body, length); err != nil {
			return nil, "", err
		}
	}
	if err := bw.Flush(); err != nil {
		return nil, "", err
	}
	for _, n := range names {
		replaced = append(replaced, "secret "+n+" sent")
	}
	return replaced, note, nil
}

// writeFields writes h's fields but those skip names, in a stable order,
// with placeholders replaced when subst.
func writeFields(bw *bufio.Writer, h http.Header, skip func(string) bool, host string, sec *secrets.Proxy, subst bool, add func([]string)) {
	keys := make([]string, 0, len(h))
	for k := range h {
		if !skip(k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, v := range h[k] {
			if subst {
				b, ns := sec.Replace(host, []byte(v))
				v = string(b)
				add(ns)
			}
			_, _ = bw.WriteString(k + ": " + v + "\r\n")
		}
	}
}

// recordNotes adds notes to the record's reason.
func recordNotes(rec *egress.Record, notes []string) {
	for _, n := range notes {
		rec.Reason = joinReason(rec.Reason, n)
	}
}

// SecretHolder is a Sandbox with proxy-mode secrets (*egress.Sandbox).
type SecretHolder interface {
	Secrets() *secrets.Proxy // nil: none
}

func secretsOf(sb Sandbox) *secrets.Proxy {
	if h, ok := sb.(SecretHolder); ok {
		return h.Secrets()
	}
	return nil
}

// forwardPlainHTTP is forward for a connection whose first bytes are an
// HTTP request: request by request, then, after an upgrade, spliced.
func (p *Proxy) forwardPlainHTTP(client *net.TCPConn, up net.Conn, first []byte, peer httpPeer, notes *[]string) (int64, error) {
	cw := &countWriter{w: up, counter: &p.bytesOut}
	r := &idleConn{Conn: client, client: client, p: p, pre: first}
	tunnel, err := p.forwardHTTP(r, cw, peer, notes)
	if err != nil {
		return cw.n, err
	}
	if tunnel == nil {
		if c, ok := up.(interface{ CloseWrite() error }); ok {
			_ = c.CloseWrite()
		}
		return cw.n, nil
	}
	// What was read past the upgrade request goes first, then the rest
	// is spliced.
	rest, _ := tunnel.Peek(tunnel.Buffered())
	if _, err := cw.Write(append(rest, r.pre...)); err != nil {
		return cw.n, err
	}
	n, err := p.pump(client, up, client, &p.bytesOut)
	return cw.n + n, err
}

// intercept serves a TLS connection to a host the sandbox's secrets go
// to: the proxy completes the sandbox's handshake with a certificate of
// the sandbox's CA for the ClientHello's name, and makes its own to the
// destination, verifying it as any client would (the host's roots, or
// Config.UpstreamRoots); then it forwards the requests, secrets put in.
// The destination is verified before the sandbox's handshake completes:
// a destination that fails it is a reset, as any refusal.
func (p *Proxy) intercept(client *net.TCPConn, c *conn, sb Sandbox, dst netip.AddrPort, sec *secrets.Proxy, first []byte, start time.Time, v *egress.Verdict, rec *egress.Record, refuse func(string)) {
	name := rec.Name
	up, err := p.dial(dst)
	if err != nil {
		refuse("connect: " + errText(err))
		return
	}
	p.mu.Lock()
	c.up = up
	p.mu.Unlock()
	upc := &idleConn{Conn: up, client: client, p: p, hard: time.Now().Add(p.cfg.DialTimeout)}
	upTLS := tls.Client(upc, &tls.Config{ServerName: name, RootCAs: p.cfg.UpstreamRoots, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
	if err := upTLS.Handshake(); err != nil {
		refuse("secrets: TLS to the destination: " + errText(err))
		return
	}
	upc.hard = time.Time{}
	leaf, err := sec.CA().Leaf(name)
	if err != nil {
		refuse("secrets: " + err.Error())
		return
	}
	cc := &idleConn{Conn: client, client: client, p: p, pre: first, hard: time.Now().Add(p.cfg.FirstBytesTimeout)}
	cliTLS := tls.Server(cc, &tls.Config{Certificates: []tls.Certificate{*leaf}, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
	if err := cliTLS.Handshake(); err != nil {
		refuse("secrets: TLS from the sandbox: " + errText(err))
		return
	}
	cc.hard = time.Time{}
	p.allowed.Add(1)
	down := make(chan copyResult, 1)
	go func() {
		cw := &countWriter{w: cliTLS, counter: &p.bytesIn}
		_, err := io.Copy(cw, upTLS)
		if err == nil {
			_ = cliTLS.CloseWrite()
		} else {
			abort(client, up)
		}
		down <- copyResult{cw.n, err}
	}()
	notes := []string{"intercepted for secrets"}
	cw := &countWriter{w: upTLS, counter: &p.bytesOut}
	tunnel, outErr := p.forwardHTTP(cliTLS, cw, httpPeer{sb: sb, dst: dst, sec: sec, tlsName: name}, &notes)
	if outErr == nil && tunnel != nil {
		_, outErr = io.Copy(cw, tunnel)
	}
	if outErr == nil {
		_ = upTLS.CloseWrite()
	} else {
		abort(client, up)
	}
	in := <-down
	_ = client.Close()
	_ = up.Close()
	p.finish(sb, rec, v.Reason, notes, start, cw.n, in.n, outErr, in.err)
}
