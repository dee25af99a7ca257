// Package resolver is the DNS server every sandbox talks to: one UDP and
// TCP port in the server process, to which the host's firewall redirects
// each sandbox's port-53 traffic. It answers only A queries for names the
// sandbox's rules allow, forwards those to the upstream resolvers, hands
// out only addresses the sandbox may be given (no rebinding into loopback,
// link-local, private ranges), records what it handed out (the pins the
// transparent proxy checks connections against) and logs every query.
// Everything else gets a short, fast, final answer: NXDOMAIN for a name
// the rules do not allow, REFUSED for record types a sandbox does not need
// (TXT, MX, ANY...: the DNS tunnelling vectors), an empty answer for AAAA
// (IPv6 is not routed out of a sandbox).
//
// The sandbox is identified by the query's source address, which the
// firewall's anti-spoofing rules make trustworthy. Every byte of a query
// is hostile: sizes, counts, rates, time and memory are bounded.
//
// Names are handed to the Sandbox lowercased and without the trailing dot
// ("pypi.org"). A CNAME chain in the upstream's answer is followed (to at
// most maxChain links) but its targets are not checked against the rules
// and not pinned: the queried name is what the sandbox asked for and what
// a rule allowed, the CNAME is its operator's indirection (pypi.org →
// a CDN name). The answer is flattened: the sandbox sees A records owned
// by the name it asked for, so it never learns the target names, and the
// addresses are pinned to the queried name.
package resolver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-sandbox/warren/internal/egress"
)

// Sandbox is one sandbox's egress state as the resolver needs it (*egress.Sandbox).
type Sandbox interface {
	AllowName(name string) (rule string, ok bool)                   // may the sandbox resolve name (any port)?
	Rebinding(name string, a netip.Addr) (why string, refused bool) // an answer address that must not be handed out
	Pin(name string, as []netip.Addr, ttl time.Duration) error      // record what this sandbox is given (and open its gate) before the answer leaves
	Record(r egress.Record)                                         // the connection log (Kind "dns")
}

// Config configures a Server. A zero limit takes the default its comment names.
type Config struct {
	// Lookup maps a query's source address to its sandbox; nil means the
	// source is not a sandbox, and its query gets no answer. Called for
	// every query: it must be fast and safe for concurrent use. It must
	// return an untyped nil, not a nil *egress.Sandbox in the interface:
	//
	//	func(a netip.Addr) resolver.Sandbox {
	//		if sb := registry.Lookup(a); sb != nil {
	//			return sb
	//		}
	//		return nil
	//	}
	Lookup func(src netip.Addr) Sandbox
	// Upstreams are the resolvers allowed names are forwarded to, tried
	// in order. Empty: the nameservers of ResolvConf.
	Upstreams []netip.AddrPort
	// ResolvConf is read when Upstreams is empty; default /etc/resolv.conf.
	ResolvConf string

	// Rate and Burst are each sandbox's token bucket: queries per second
	// and the most queries in a burst (default 50 and 200). A query beyond
	// it is REFUSED; one log record a second counts them.
	Rate  float64
	Burst int
	// UpstreamTimeout bounds one upstream's answer (UDP, and TCP when the
	// UDP answer was truncated); the next upstream is tried after it
	// (default 2s). At most 3 upstreams are tried.
	UpstreamTimeout time.Duration
	// MaxInFlight bounds the queries being answered at once over all
	// sandboxes (default 512); a UDP query beyond it is dropped, as an
	// overloaded resolver does. MaxInFlightPerSandbox bounds one sandbox's
	// share of them (default 64): its queries beyond that are REFUSED.
	MaxInFlight           int
	MaxInFlightPerSandbox int
	// MaxUpstream bounds the upstream queries in flight over all sandboxes
	// (default 128); a cache miss beyond it is answered SERVFAIL.
	MaxUpstream int
	// MaxTCPConns bounds open TCP connections over all sandboxes (default
	// 256), MaxTCPConnsPerSandbox one sandbox's (default 4); a connection
	// beyond either is closed at once. TCPQueries is how many queries one
	// connection may carry (default 4), TCPIdle how long the server waits
	// for each (default 5s).
	MaxTCPConns           int
	MaxTCPConnsPerSandbox int
	TCPQueries            int
	TCPIdle               time.Duration
	// MaxCache bounds the names cached (default 4096); MaxSandboxes the
	// per-source state kept (default 4096; idle state is dropped after a
	// minute in any case).
	MaxCache     int
	MaxSandboxes int

	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// Bounds of the protocol this server speaks.
const (
	// MaxQuery is the largest query accepted, over UDP and TCP: one
	// question of at most 255 bytes and an EDNS0 record fit in far less.
	MaxQuery = 512
	// MaxAnswers is how many addresses one answer hands out; 8 A records
	// fit a 512-byte answer whatever the name.
	MaxAnswers = 8
	// MinTTL and MaxTTL clamp the TTLs handed out (and pinned): short
	// enough that a rule change or a moved name is followed soon, long
	// enough that a sandbox does not ask again for every connection.
	MinTTL = 5 * time.Second
	MaxTTL = 300 * time.Second
	// ednsSize is the UDP payload size advertised to upstreams and in
	// answers to EDNS0 queries (the DNS flag day 2020 value).
	ednsSize = 1232
	// maxUpstreams is how many upstreams are used (resolv.conf's MAXNS).
	maxUpstreams = 3
	// maxChain is how many CNAME links an upstream answer may chain.
	maxChain = 8
	// longName marks a name as long in the log (tunnelling shows as long
	// names or many labels under an allowed suffix).
	longName, manyLabels = 100, 8
)

func (c *Config) defaults() {
	setDefault(&c.Rate, 50)
	setDefault(&c.Burst, 200)
	setDefault(&c.UpstreamTimeout, 2*time.Second)
	setDefault(&c.MaxInFlight, 512)
	setDefault(&c.MaxInFlightPerSandbox, 64)
	setDefault(&c.MaxUpstream, 128)
	setDefault(&c.MaxTCPConns, 256)
	setDefault(&c.MaxTCPConnsPerSandbox, 4)
	setDefault(&c.TCPQueries, 4)
	setDefault(&c.TCPIdle, 5*time.Second)
	setDefault(&c.MaxCache, 4096)
	setDefault(&c.MaxSandboxes, 4096)
	if c.ResolvConf == "" {
		c.ResolvConf = "/etc/resolv.conf"
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

func setDefault[T int | float64 | time.Duration](p *T, v T) {
	if *p <= 0 {
		*p = v
	}
}

// Stats are the server's counters since it started.
type Stats struct {
	Queries     uint64 // queries from sandboxes (answered or not)
	Allowed     uint64 // allowed names answered: addresses, or none (AAAA, upstream NXDOMAIN or no data)
	Denied      uint64 // NXDOMAIN: the rules do not allow the name
	Rebinding   uint64 // answers that lost addresses to the rebinding check (not Allowed when they lost all)
	Refused     uint64 // REFUSED/NOTIMP: a type, class or opcode not served
	RateLimited uint64 // REFUSED: over the sandbox's rate or in-flight limit
	Malformed   uint64 // FORMERR or dropped: not a well-formed query
	LongNames   uint64 // names over 100 bytes or 8 labels (logged as such)
	Unknown     uint64 // queries and TCP connections from a source that is not a sandbox
	Overload    uint64 // UDP queries dropped and TCP connections closed at the global limits
	ServFail    uint64 // SERVFAIL: no upstream answered
	CacheHits   uint64
	CacheMisses uint64
}

type counters struct {
	queries, allowed, denied, rebinding, refused, rateLimited, malformed,
	longNames, unknown, overload, servFail, cacheHits, cacheMisses atomic.Uint64
}

// Server is the resolver. Its Serve methods may run at once, on any number
// of sockets; Close stops them all.
type Server struct {
	cfg       Config
	upstreams []netip.AddrPort
	cache     *cache
	limits    *limits
	inflight  chan struct{} // MaxInFlight slots
	upstream  chan struct{} // MaxUpstream slots
	tcpConns  chan struct{} // MaxTCPConns slots
	flightMu  sync.Mutex
	flights   map[string]*flight // upstream resolutions under way, by name
	n         counters
	ctx       context.Context // cancelled by Close: ends upstream queries
	cancel    context.CancelFunc

	mu      sync.Mutex
	closed  bool
	sockets map[closer]struct{}
	wg      sync.WaitGroup
	done    chan struct{}
}

type closer interface{ Close() error }

// New returns a resolver; it serves once given sockets.
func New(cfg Config) (*Server, error) {
	if cfg.Lookup == nil {
		return nil, errors.New("resolver: no Lookup")
	}
	cfg.defaults()
	ups := cfg.Upstreams
	if len(ups) == 0 {
		var err error
		if ups, err = readResolvConf(cfg.ResolvConf); err != nil {
			return nil, err
		}
	}
	for _, u := range ups {
		if !u.IsValid() || u.Port() == 0 {
			return nil, fmt.Errorf("resolver: invalid upstream %s", u)
		}
	}
	if len(ups) > maxUpstreams {
		ups = ups[:maxUpstreams]
	}
	s := &Server{
		cfg:       cfg,
		upstreams: ups,
		cache:     newCache(cfg.MaxCache),
		limits:    newLimits(&cfg),
		inflight:  make(chan struct{}, cfg.MaxInFlight),
		upstream:  make(chan struct{}, cfg.MaxUpstream),
		tcpConns:  make(chan struct{}, cfg.MaxTCPConns),
		flights:   make(map[string]*flight),
		sockets:   make(map[closer]struct{}),
		done:      make(chan struct{}),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.janitor()
	return s, nil
}

// Upstreams returns the resolvers the server forwards to.
func (s *Server) Upstreams() []netip.AddrPort { return append([]netip.AddrPort(nil), s.upstreams...) }

// Stats returns the counters.
func (s *Server) Stats() Stats {
	return Stats{
		Queries: s.n.queries.Load(), Allowed: s.n.allowed.Load(), Denied: s.n.denied.Load(),
		Rebinding: s.n.rebinding.Load(), Refused: s.n.refused.Load(),
		RateLimited: s.n.rateLimited.Load(), Malformed: s.n.malformed.Load(),
		LongNames: s.n.longNames.Load(), Unknown: s.n.unknown.Load(),
		Overload: s.n.overload.Load(), ServFail: s.n.servFail.Load(),
		CacheHits: s.n.cacheHits.Load(), CacheMisses: s.n.cacheMisses.Load(),
	}
}

// Forget drops the state kept for a source address (its rate bucket, its
// pending rate-limit record, which is logged first): call it when the
// sandbox that had the address is gone, before the address is reused.
func (s *Server) Forget(src netip.Addr) { s.limits.forget(src.Unmap()) }

// track registers a socket for Close; false when the server is closed.
func (s *Server) track(c closer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.sockets[c] = struct{}{}
	return true
}

func (s *Server) untrack(c closer) {
	s.mu.Lock()
	delete(s.sockets, c)
	s.mu.Unlock()
}

// Close closes every socket given to the Serve methods and every TCP
// connection, and waits for the queries being answered.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	s.cancel()
	for c := range s.sockets {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.limits.flush(s.cfg.Now())
	return nil
}

// janitor logs the rate-limit summaries once a second and drops idle state.
func (s *Server) janitor() {
	defer s.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
			now := s.cfg.Now()
			s.limits.flush(now)
			s.limits.evictIdle(now)
			s.cache.evictExpired(now)
		}
	}
}

// addrOf is the unmapped IP of a socket address (nil-safe).
func addrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap()
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}
