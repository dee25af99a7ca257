// Package tproxy is the transparent TCP proxy every TCP connection of a
// sandbox (DNS aside) is redirected to: it finds the sandbox by the source
// address and the destination by the address the connection was first
// sent to, asks the sandbox's egress policy, checks the name a TLS
// ClientHello (SNI) or an HTTP request (Host) carries, and either resets
// the connection at once or splices it to its destination, logging one
// record per connection. The policy is not here (internal/egress); the
// redirection is not here (internal/netplumb).
//
// Invariants:
//   - No byte from the sandbox reaches a destination before the
//     destination's address was allowed, and no byte of a TLS ClientHello
//     or HTTP request head before its name was allowed too.
//   - On ports 80 and 443 the client must speak first and its first bytes
//     must be a TLS ClientHello or an HTTP/1.x request: a name the policy
//     can check. Elsewhere the upstream is dialled as soon as the address
//     is allowed, so server-first protocols (SSH, SMTP, databases) work
//     without a wait, and a ClientHello or request the client then sends
//     is still checked before it is forwarded.
//   - A denial is a TCP reset, at once: the sandbox sees "connection
//     refused"/"reset", never a hang.
//   - Everything is bounded: bytes read before a decision (MaxPeek), time
//     for them, connections per sandbox and in all, goroutines per
//     connection (two), records logged for refusals over a limit.
//
// Plain HTTP/1.x is forwarded request by request, every request's Host
// checked (http.go); so is HTTPS to a host a sandbox's proxy-mode secrets
// go to, which the proxy intercepts with the sandbox's own CA to put the
// secrets in. Everything else is spliced. Of TLS, only the ClientHello's
// cleartext name is checked: what a server makes of an encrypted
// ClientHello is not seen, nor the bytes of a tunnel after a CONNECT or
// an upgrade.
package tproxy

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-sandbox/warren/internal/egress"
)

// Sandbox is one sandbox's egress state as the proxy needs it (*egress.Sandbox).
type Sandbox interface {
	// Decide: wireKind is "" (nothing recognised), "tls" (wireName = SNI, may be "") or "http" (wireName = Host without port, may be "").
	Decide(dst netip.AddrPort, wireName, wireKind string) egress.Verdict
	Record(r egress.Record) // the connection log (Kind "tcp")
}

// MaxPeek bounds the bytes read from a client before its connection is
// decided: a ClientHello (with post-quantum key shares about 2 KiB) or an
// HTTP request head must fit.
const MaxPeek = 16 << 10

// Defaults for the zero fields of Config.
const (
	DefaultFirstBytesTimeout = 5 * time.Second
	DefaultDialTimeout       = 10 * time.Second
	DefaultIdleTimeout       = 10 * time.Minute
	DefaultMaxPerSandbox     = 256
	DefaultMaxTotal          = 4096
)

// Config wires a Proxy. Lookup is required; the rest have defaults.
type Config struct {
	// Lookup finds the sandbox a connection comes from by its source
	// address (unforgeable: the host drops spoofed sources); nil = none.
	Lookup func(src netip.Addr) Sandbox
	// OriginalDst is where the connection was sent before it was
	// redirected. Default: SO_ORIGINAL_DST (IP6T_SO_ORIGINAL_DST for IPv6).
	OriginalDst func(*net.TCPConn) (netip.AddrPort, error)
	// Dial connects to an allowed destination. Default: a net.Dialer with
	// DialTimeout. A *net.TCPConn keeps the copy in the kernel (splice).
	Dial func(ctx context.Context, dst netip.AddrPort) (net.Conn, error)
	// UpstreamRoots verify the destinations of the HTTPS connections the
	// proxy intercepts for a sandbox's secrets; nil: the host's roots.
	UpstreamRoots *x509.CertPool
	// Log gets what is not a sandbox's business (unknown sources, accept
	// errors). Default: discarded.
	Log *slog.Logger

	// FirstBytesTimeout bounds the wait for a client's first byte on ports
	// 80 and 443, and for the rest of a ClientHello or request head once
	// it has begun, on any port.
	FirstBytesTimeout time.Duration
	DialTimeout       time.Duration
	// IdleTimeout ends a connection on which no data moved either way.
	IdleTimeout time.Duration
	// MaxPerSandbox and MaxTotal bound open connections; one beyond is
	// reset.
	MaxPerSandbox int
	MaxTotal      int
}

// Stats are the proxy's counters since New, for metrics.
type Stats struct {
	Active   int64  // connections being handled now
	Allowed  uint64 // connections spliced to their destination
	Denied   uint64 // connections of a known sandbox that were reset
	Unknown  uint64 // connections from a source no sandbox has, reset
	BytesOut uint64 // sandbox → destination, including the checked first bytes
	BytesIn  uint64 // destination → sandbox
}

// Proxy is the transparent proxy. Serve may run on several listeners.
type Proxy struct {
	cfg Config

	ctx    context.Context // ends with Close, and so do dials
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	lns    map[net.Listener]struct{}
	conns  map[*conn]struct{}
	perSrc map[netip.Addr]*srcState
	total  int
	wg     sync.WaitGroup

	active                                      atomic.Int64
	allowed, denied, unknown, bytesOut, bytesIn atomic.Uint64
	unknownLogged                               atomic.Int64 // unix seconds of the last log line
}

// srcState is one source's open connections and the sampling of the
// records of its refusals over a limit.
type srcState struct {
	n       int
	lastLog time.Time
	dropped int // refusals not logged since lastLog
}

// conn is one proxied connection; up is set once dialled (under Proxy.mu,
// so Close can reset it).
type conn struct {
	client *net.TCPConn
	up     net.Conn
}

// New makes a proxy; it serves nothing until Serve.
func New(cfg Config) *Proxy {
	if cfg.OriginalDst == nil {
		cfg.OriginalDst = originalDst
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.Dial == nil {
		d := &net.Dialer{Timeout: cfg.DialTimeout}
		cfg.Dial = func(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", dst.String())
		}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.FirstBytesTimeout <= 0 {
		cfg.FirstBytesTimeout = DefaultFirstBytesTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.MaxPerSandbox <= 0 {
		cfg.MaxPerSandbox = DefaultMaxPerSandbox
	}
	if cfg.MaxTotal <= 0 {
		cfg.MaxTotal = DefaultMaxTotal
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Proxy{
		ctx:    ctx,
		cancel: cancel,
		cfg:    cfg,
		lns:    map[net.Listener]struct{}{},
		conns:  map[*conn]struct{}{},
		perSrc: map[netip.Addr]*srcState{},
	}
}

// Stats returns the counters.
func (p *Proxy) Stats() Stats {
	return Stats{
		Active:   p.active.Load(),
		Allowed:  p.allowed.Load(),
		Denied:   p.denied.Load(),
		Unknown:  p.unknown.Load(),
		BytesOut: p.bytesOut.Load(),
		BytesIn:  p.bytesIn.Load(),
	}
}

// Serve accepts connections on ln until Close (then it returns nil) or
// until ln fails otherwise. Accepting never stops for a limit: a
// connection over one is accepted and reset, so the sandbox is told at
// once rather than left in a full backlog.
func (p *Proxy) Serve(ln net.Listener) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = ln.Close()
		return nil
	}
	p.lns[ln] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.lns, ln)
		p.mu.Unlock()
	}()
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Out of descriptors or memory, an aborted handshake: wait
			// a little and go on, as the condition passes.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			p.cfg.Log.Warn("egress proxy: accept", "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		tc, ok := c.(*net.TCPConn)
		if !ok {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			reset(tc)
			return nil
		}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.handle(tc)
	}
}

// Close stops every Serve, resets every connection and waits until their
// goroutines are gone.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.cancel()
	for ln := range p.lns {
		_ = ln.Close()
	}
	for c := range p.conns {
		reset(c.client)
		if c.up != nil {
			reset(c.up)
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

// reset closes c with a TCP reset (SO_LINGER 0) rather than a FIN, so the
// other end sees a refusal, not an orderly end it might take as success.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

func addrPort(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

// handle is one connection, start to end; its second goroutine is the
// destination → sandbox copy.
func (p *Proxy) handle(client *net.TCPConn) {
	defer p.wg.Done()
	p.active.Add(1)
	defer p.active.Add(-1)
	start := time.Now()

	src := addrPort(client.RemoteAddr()).Addr()
	var sb Sandbox
	if src.IsValid() {
		sb = p.cfg.Lookup(src)
	}
	if sb == nil {
		p.unknown.Add(1)
		// One line a second at most: a flood from nowhere is not news.
		if now := start.Unix(); p.unknownLogged.Swap(now) != now {
			p.cfg.Log.Warn("egress proxy: connection from an unknown source, reset", "src", src)
		}
		reset(client)
		return
	}
	rec := egress.Record{Time: start, Kind: "tcp"}
	c := &conn{client: client}
	refuse := func(reason string) {
		reset(client)
		p.mu.Lock()
		if c.up != nil {
			reset(c.up)
		}
		p.mu.Unlock()
		p.denied.Add(1)
		rec.Verdict, rec.Reason = "deny", reason
		rec.Duration = ms(time.Since(start))
		sb.Record(rec)
	}

	dst, err := p.cfg.OriginalDst(client)
	if err != nil {
		refuse(err.Error())
		return
	}
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	rec.Addr, rec.Port = dst.Addr().String(), dst.Port()
	if dst == addrPort(client.LocalAddr()) {
		// Sent to the proxy's own port, not redirected to it: dialling
		// it would loop.
		refuse("connection to the egress proxy itself")
		return
	}
	if reason, log := p.acquire(src, c); reason != "" {
		if log {
			refuse(reason)
		} else {
			reset(client)
			p.denied.Add(1)
		}
		return
	}
	defer p.release(src, c)

	v := sb.Decide(dst, "", "")
	rec.Name, rec.Rule = v.Name, v.Rule
	web := dst.Port() == 80 || dst.Port() == 443
	if !v.Allow && !web {
		refuse(v.Reason)
		return
	}

	var first []byte
	var kind string
	if web {
		var reason string
		first, kind, reason = p.decideWire(client, sb, dst, true, &v, &rec)
		if reason != "" {
			refuse(reason)
			return
		}
	}
	sec := secretsOf(sb)
	if kind == kindTLS && sec.Intercepts(rec.Name) {
		p.intercept(client, c, sb, dst, sec, first, start, &v, &rec, refuse)
		return
	}
	up, err := p.dial(dst)
	if err != nil {
		refuse("connect: " + errText(err))
		return
	}
	p.mu.Lock()
	c.up = up
	p.mu.Unlock()
	// From here on the destination may speak first, whatever the sandbox
	// sends (or does not).
	down := make(chan copyResult, 1)
	var downFailed atomic.Bool
	go func() {
		n, err := p.pump(client, client, up, &p.bytesIn)
		if err != nil {
			downFailed.Store(true)
			abort(client, up) // the other way cannot go on either
		}
		down <- copyResult{n, err}
	}()
	var outN int64
	var outErr error
	forward := true
	if !web {
		var reason string
		first, kind, reason = p.decideWire(client, sb, dst, false, &v, &rec)
		switch {
		case reason == reasonIdle:
			forward, outErr = false, errIdle
		case reason != "" && downFailed.Load():
			// The destination's side ended it (idle, a reset) while the
			// sandbox had yet to speak: an allowed connection that ended.
			forward = false
		case reason != "":
			refuse(reason)
			<-down
			return
		}
	}

	p.allowed.Add(1)
	var notes []string
	switch {
	case forward && kind == kindHTTP:
		outN, outErr = p.forwardPlainHTTP(client, up, first, httpPeer{sb: sb, dst: dst, sec: sec}, &notes)
	case forward:
		outN, outErr = p.forward(client, up, first)
	}
	if outErr != nil {
		abort(client, up)
	}
	in := <-down
	_ = client.Close()
	_ = up.Close()

	p.finish(sb, &rec, v.Reason, notes, start, outN, in.n, outErr, in.err)
}

// finish logs the record of a connection that was allowed, saying how it
// ended: a later request refused makes it a denial.
func (p *Proxy) finish(sb Sandbox, rec *egress.Record, reason string, notes []string, start time.Time, outN, inN int64, outErr, inErr error) {
	rec.Verdict, rec.Reason = "allow", reason
	rec.BytesOut, rec.BytesIn = outN, inN
	rec.Duration = ms(time.Since(start))
	recordNotes(rec, notes)
	var denied *deniedError
	in := copyResult{inN, inErr}
	switch {
	case errors.As(outErr, &denied):
		p.denied.Add(1)
		rec.Verdict, rec.Reason = "deny", joinReason(rec.Reason, denied.reason)
		if denied.name != "" {
			rec.Name = denied.name
		}
	case errors.Is(outErr, errIdle) || errors.Is(in.err, errIdle):
		rec.Reason = joinReason(rec.Reason, "ended: idle")
	case p.ctx.Err() != nil && (outErr != nil || in.err != nil):
		rec.Reason = joinReason(rec.Reason, "ended: egress proxy closed")
	case outErr != nil:
		rec.Reason = joinReason(rec.Reason, "ended: sandbox side: "+errText(outErr))
	case in.err != nil:
		rec.Reason = joinReason(rec.Reason, "ended: destination side: "+errText(in.err))
	}
	sb.Record(*rec)
}

type copyResult struct {
	n   int64
	err error
}

func joinReason(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// errText is err without the addresses a net.OpError spells out (the
// record has them): "connection reset by peer".
func errText(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		err = op.Err
	}
	var sys *os.SyscallError
	if errors.As(err, &sys) {
		err = sys.Err
	}
	return err.Error()
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// abort resets both ends, which ends a copy blocked on either: once one
// way fails (a reset, idle) the other cannot go on.
func abort(client *net.TCPConn, up net.Conn) {
	reset(client)
	reset(up)
}

func (p *Proxy) dial(dst netip.AddrPort) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.DialTimeout)
	defer cancel()
	return p.cfg.Dial(ctx, dst)
}

// decideWire reads the client's first bytes, names what they are, and
// when they are a ClientHello or a request head asks the policy again
// with the name; v and rec are updated. It returns the bytes read (to be
// forwarded) or why the connection is refused.
func (p *Proxy) decideWire(client *net.TCPConn, sb Sandbox, dst netip.AddrPort, web bool, v *egress.Verdict, rec *egress.Record) ([]byte, string, string) {
	first, kind, name, reason := p.peek(client, web)
	if reason != "" {
		return nil, "", reason
	}
	if kind == "" {
		if web {
			return nil, "", fmt.Sprintf("neither TLS nor HTTP on port %d", dst.Port())
		}
		return first, "", "" // the address's verdict stands
	}
	*v = sb.Decide(dst, name, kind)
	rec.Name, rec.Rule = name, v.Rule
	if !v.Allow {
		return nil, "", v.Reason
	}
	return first, kind, ""
}

// peek reads the client's first bytes until they are known to be a
// ClientHello, a request head, or neither. On ports 80 and 443 (web) the
// first byte must come within FirstBytesTimeout; elsewhere the client may
// wait for the server to speak (IdleTimeout). Once a ClientHello or head
// has begun, it must be complete within FirstBytesTimeout and MaxPeek.
func (p *Proxy) peek(client *net.TCPConn, web bool) (first []byte, kind, name, reason string) {
	wait := p.round()
	if web {
		wait = p.cfg.FirstBytesTimeout
	}
	_ = client.SetReadDeadline(time.Now().Add(wait))
	defer func() { _ = client.SetReadDeadline(time.Time{}) }()
	buf := make([]byte, 0, 2048)
	need, scanned := 0, 0
	for {
		if len(buf) == cap(buf) {
			if len(buf) >= MaxPeek {
				return nil, "", "", fmt.Sprintf("%s over %d bytes", what(buf), MaxPeek)
			}
			nb := make([]byte, len(buf), min(2*cap(buf), MaxPeek))
			copy(nb, buf)
			buf = nb
		}
		n, err := client.Read(buf[len(buf):cap(buf)])
		if len(buf) == 0 && n > 0 {
			_ = client.SetReadDeadline(time.Now().Add(p.cfg.FirstBytesTimeout))
		}
		buf = buf[:len(buf)+n]
		if n > 0 {
			switch tls, maybeTLS := looksTLS(buf); {
			case tls:
				if len(buf) < need {
					break
				}
				sni, more, perr := tlsSNI(buf)
				if perr != nil {
					return nil, "", "", perr.Error()
				}
				if more == 0 {
					return buf, kindTLS, sni, ""
				}
				need = more
			case maybeTLS:
			default:
				method, maybe := httpPrefix(buf)
				if !method && !maybe {
					return buf, "", "", ""
				}
				if !method {
					break
				}
				// The head can only have ended on a new line feed.
				if newLF := indexByteFrom(buf, '\n', max(scanned-1, 0)); newLF < 0 {
					scanned = len(buf)
					break
				}
				scanned = len(buf)
				host, perr := httpHost(buf)
				if errors.Is(perr, errNeedMore) {
					break
				}
				if errors.Is(perr, errNotHTTP) {
					return buf, "", "", ""
				}
				if perr != nil {
					return nil, "", "", perr.Error()
				}
				return buf, kindHTTP, host, ""
			}
		}
		if err != nil {
			switch {
			case len(buf) == 0 && errors.Is(err, io.EOF) && !web:
				return nil, "", "", "" // nothing sent, just the half-close
			case len(buf) == 0 && errors.Is(err, os.ErrDeadlineExceeded) && !web:
				// The client waits for the server: fine while data
				// moves the other way.
				if idle, ok := idleFor(client); !ok || time.Duration(idle)*time.Millisecond < p.cfg.IdleTimeout {
					_ = client.SetReadDeadline(time.Now().Add(wait))
					continue
				}
				return nil, "", "", reasonIdle
			case len(buf) == 0 && errors.Is(err, os.ErrDeadlineExceeded):
				return nil, "", "", fmt.Sprintf("no bytes from the sandbox within %v", wait)
			case len(buf) == 0:
				return nil, "", "", "reading the first bytes: " + err.Error()
			case errors.Is(err, os.ErrDeadlineExceeded):
				return nil, "", "", fmt.Sprintf("%s incomplete after %v", what(buf), p.cfg.FirstBytesTimeout)
			default:
				return nil, "", "", fmt.Sprintf("%s incomplete: %v", what(buf), err)
			}
		}
	}
}

// looksTLS: b starts with a TLS handshake record header (type 22, version
// 3.0 to 3.4), or could still (maybe).
func looksTLS(b []byte) (tls, maybe bool) {
	if len(b) == 0 || b[0] != 22 {
		return false, false
	}
	if len(b) >= 2 && b[1] != 3 {
		return false, false
	}
	if len(b) >= 3 {
		return b[2] <= 4, false
	}
	return false, true
}

func what(b []byte) string {
	if tls, _ := looksTLS(b); tls {
		return "TLS ClientHello"
	}
	return "HTTP request head"
}

func indexByteFrom(b []byte, c byte, from int) int {
	for i := from; i < len(b); i++ {
		if b[i] == c {
			return i
		}
	}
	return -1
}

// forward sends the checked first bytes, then copies the rest of the
// sandbox's bytes to the destination, and half-closes the destination
// when the sandbox does.
func (p *Proxy) forward(client *net.TCPConn, up net.Conn, first []byte) (int64, error) {
	if len(first) > 0 {
		_ = up.SetWriteDeadline(time.Now().Add(p.cfg.IdleTimeout))
		n, err := up.Write(first)
		p.bytesOut.Add(uint64(n)) // #nosec G115 -- n >= 0
		if err != nil {
			return int64(n), err
		}
		_ = up.SetWriteDeadline(time.Time{})
	}
	n, err := p.pump(client, up, client, &p.bytesOut)
	return n + int64(len(first)), err
}

var errIdle = errors.New("idle")

// reasonIdle is peek's word for a client that sent nothing while nothing
// came from the server either, for IdleTimeout: an allowed connection that
// ended idle, not a refusal.
const reasonIdle = "idle"

// round is how long a copy runs between looks at the connection's
// idleness (and updates of the byte counters).
func (p *Proxy) round() time.Duration { return min(p.cfg.IdleTimeout, 30*time.Second) }

// pump copies src to dst until src ends (then it half-closes dst) or
// fails. The copy is io.Copy between the two connections as they are, so
// between TCP connections the kernel splices and the bytes never enter
// the process; it runs in rounds bounded by a read deadline, at whose end
// the kernel says whether anything moved either way (TCP_INFO), which is
// how an idle connection is found without seeing its bytes.
func (p *Proxy) pump(client *net.TCPConn, dst, src net.Conn, counter *atomic.Uint64) (int64, error) {
	round := p.round()
	var total int64
	for {
		_ = src.SetReadDeadline(time.Now().Add(round))
		n, err := io.Copy(dst, src)
		total += n
		counter.Add(uint64(n)) // #nosec G115 -- n >= 0
		if err == nil {
			if cw, ok := dst.(interface{ CloseWrite() error }); ok {
				_ = cw.CloseWrite()
			}
			return total, nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return total, err
		}
		if n > 0 {
			continue
		}
		if idle, ok := idleFor(client); !ok || time.Duration(idle)*time.Millisecond < p.cfg.IdleTimeout {
			continue
		}
		return total, errIdle
	}
}

// acquire counts c against the limits. Over one, it says why and whether
// to log it: the first refusal and then one a second, carrying the count
// of those not logged, so a flood does not flood the log.
func (p *Proxy) acquire(src netip.Addr, c *conn) (reason string, log bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.perSrc[src]
	if st == nil {
		st = &srcState{}
		p.perSrc[src] = st
	}
	switch {
	case p.closed:
		return "egress proxy closed", false
	case st.n >= p.cfg.MaxPerSandbox:
		reason = fmt.Sprintf("over %d connections for this sandbox", p.cfg.MaxPerSandbox)
	case p.total >= p.cfg.MaxTotal:
		reason = fmt.Sprintf("over %d connections in all", p.cfg.MaxTotal)
	default:
		st.n++
		p.total++
		p.conns[c] = struct{}{}
		return "", false
	}
	now := time.Now()
	if now.Sub(st.lastLog) < time.Second {
		st.dropped++
		return reason, false
	}
	if st.dropped > 0 {
		reason = fmt.Sprintf("%s (and %d more refused, not logged)", reason, st.dropped)
	}
	st.lastLog, st.dropped = now, 0
	return reason, true
}

func (p *Proxy) release(src netip.Addr, c *conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
	p.total--
	st := p.perSrc[src]
	st.n--
	if st.n == 0 && time.Since(st.lastLog) >= time.Second {
		delete(p.perSrc, src)
	}
}
