// Package portfwd publishes a TCP port of a sandbox on the host: a host
// listener whose every connection is dialled to the sandbox's address and
// spliced to it, both ways, until either side ends it.
//
// Invariants:
//   - a Forwarder's listener is bound by Listen, before anything else, so a
//     host port that is taken is an error before the caller commits to
//     anything (a start fails before its sandbox boots);
//   - what a client sends is bounded: at most Limits.MaxConns connections
//     at once per port (one beyond is closed at once, not left in the
//     backlog), each ended after Limits.Idle without a byte either way, and
//     a dial to the sandbox bounded by Limits.Dial;
//   - Close ends everything: the listener, every connection, the goroutines
//     (it returns when they have), so a stopped sandbox's ports are free
//     and nothing of its traffic is still in flight.
package portfwd

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Limits bound one published port.
type Limits struct {
	// MaxConns is how many connections are spliced at once (default
	// DefaultMaxConns).
	MaxConns int
	// Idle ends a connection that carried nothing either way for this
	// long (default DefaultIdle).
	Idle time.Duration
	// Dial bounds the connection to the sandbox (default DefaultDial).
	Dial time.Duration
}

// The defaults of Limits.
const (
	DefaultMaxConns = 256
	DefaultIdle     = 10 * time.Minute
	DefaultDial     = 5 * time.Second
)

func (l Limits) withDefaults() Limits {
	if l.MaxConns <= 0 {
		l.MaxConns = DefaultMaxConns
	}
	if l.Idle <= 0 {
		l.Idle = DefaultIdle
	}
	if l.Dial <= 0 {
		l.Dial = DefaultDial
	}
	return l
}

// Forwarder is one published port.
type Forwarder struct {
	ln     *net.TCPListener
	lim    Limits
	slots  chan struct{}
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
	active atomic.Int64
	// ctx ends with Close: a dial under way is cut short.
	ctx    context.Context
	cancel context.CancelFunc
}

// Listen binds addr (port 0: any free one). The Forwarder accepts nothing
// until Serve.
func Listen(addr netip.AddrPort, lim Limits) (*Forwarder, error) {
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(addr))
	if err != nil {
		return nil, err
	}
	lim = lim.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	return &Forwarder{ln: ln, lim: lim, slots: make(chan struct{}, lim.MaxConns), conns: map[net.Conn]struct{}{}, ctx: ctx, cancel: cancel}, nil
}

// Addr is the address it listens on (with the port chosen when 0 was asked).
func (f *Forwarder) Addr() netip.AddrPort {
	return f.ln.Addr().(*net.TCPAddr).AddrPort()
}

// Active is how many connections are spliced now.
func (f *Forwarder) Active() int { return int(f.active.Load()) }

// Serve accepts connections and splices each to target, until Close.
// use, when set, is called as each connection is spliced, and the function
// it returns when that ends (the sandbox counts it as in use meanwhile).
func (f *Forwarder) Serve(target netip.AddrPort, use func() (done func())) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	if use == nil {
		use = func() func() { return func() {} }
	}
	f.wg.Add(1)
	go f.accept(target, use)
}

func (f *Forwarder) accept(target netip.AddrPort, use func() func()) {
	defer f.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		c, err := f.ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors or the like: wait, as net/http does.
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		select {
		case f.slots <- struct{}{}:
		default:
			// Over the bound: closed at once, so the client is told.
			_ = c.SetLinger(0)
			_ = c.Close()
			continue
		}
		if !f.track(c) {
			<-f.slots
			return
		}
		f.wg.Add(1)
		go f.splice(c, target, use)
	}
}

// track records c so that Close ends it; false once closed.
func (f *Forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		_ = c.Close()
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *Forwarder) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
	_ = c.Close()
}

// splice dials target for client and copies both ways.
func (f *Forwarder) splice(client *net.TCPConn, target netip.AddrPort, use func() func()) {
	defer f.wg.Done()
	defer func() { <-f.slots }()
	defer f.untrack(client)
	f.active.Add(1)
	defer f.active.Add(-1)
	defer use()()
	ctx, cancel := context.WithTimeout(f.ctx, f.lim.Dial)
	d := net.Dialer{}
	sc, err := d.DialContext(ctx, "tcp", target.String())
	cancel()
	if err != nil {
		// Nothing listens in the sandbox (or it is gone): the client
		// sees its connection reset.
		_ = client.SetLinger(0)
		return
	}
	server := sc.(*net.TCPConn)
	if !f.track(server) {
		return
	}
	defer f.untrack(server)
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.pipe(server, client, &last)
	}()
	f.pipe(client, server, &last)
	<-done
}

// pipe copies src to dst until src ends (then half-closes dst, as src's
// peer did) or fails, or neither direction carried a byte for the idle
// limit; an error ends both directions.
func (f *Forwarder) pipe(dst, src *net.TCPConn, last *atomic.Int64) {
	buf := make([]byte, 32<<10)
	for {
		_ = src.SetReadDeadline(time.Now().Add(f.lim.Idle))
		n, err := src.Read(buf)
		if n > 0 {
			last.Store(time.Now().UnixNano())
			_ = dst.SetWriteDeadline(time.Now().Add(f.lim.Idle))
			if _, werr := dst.Write(buf[:n]); werr != nil {
				f.abort(dst, src)
				return
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			_ = dst.CloseWrite()
			return
		case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
			// Idle this way; the other may be busy (a long download).
			if time.Since(time.Unix(0, last.Load())) < f.lim.Idle {
				continue
			}
			f.abort(dst, src)
			return
		default:
			f.abort(dst, src)
			return
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// abort ends both connections, so the other direction's read returns.
func (f *Forwarder) abort(a, b *net.TCPConn) {
	_ = a.SetLinger(0)
	_ = b.SetLinger(0)
	_ = a.Close()
	_ = b.Close()
}

// Close stops listening, ends every connection and returns when all of
// its goroutines have.
func (f *Forwarder) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		f.wg.Wait()
		return nil
	}
	f.closed = true
	f.cancel()
	err := f.ln.Close()
	for c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
	return err
}
