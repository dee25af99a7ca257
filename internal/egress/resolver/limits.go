package resolver

import (
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/egress"
)

// idleState is how long a source's state is kept after its last query.
const idleState = time.Minute

// source is what the server keeps per query source address: its token
// bucket, its queries and TCP connections in flight, and the rate-limited
// queries not yet logged.
type source struct {
	tokens   float64
	last     time.Time // of the last refill
	inflight int
	tcp      int
	refused  int     // refused since the last summary record
	refSB    Sandbox // the sandbox they came from
}

type limits struct {
	cfg *Config
	mu  sync.Mutex
	m   map[netip.Addr]*source
}

func newLimits(cfg *Config) *limits {
	return &limits{cfg: cfg, m: make(map[netip.Addr]*source)}
}

// get returns src's state, making it (and room for it) if needed. l.mu held.
func (l *limits) get(src netip.Addr, now time.Time) (*source, []pending) {
	if st := l.m[src]; st != nil {
		return st, nil
	}
	var out []pending
	if len(l.m) >= l.cfg.MaxSandboxes {
		// Only sources Lookup knows get state, so this is a server with
		// more sandboxes than the bound: drop idle state first, then any
		// that is not busy (a fresh bucket is full: that errs open by one
		// burst, not closed).
		for a, st := range l.m {
			if len(l.m) < l.cfg.MaxSandboxes {
				break
			}
			if st.inflight == 0 && st.tcp == 0 {
				if p, ok := st.summary(); ok {
					out = append(out, p)
				}
				delete(l.m, a)
			}
		}
	}
	st := &source{tokens: float64(l.cfg.Burst), last: now}
	l.m[src] = st
	return st, out
}

// admit takes a token and an in-flight slot for one query from src; when
// it cannot, the query is counted for the next summary record.
func (l *limits) admit(src netip.Addr, sb Sandbox, now time.Time) bool {
	l.mu.Lock()
	st, out := l.get(src, now)
	if dt := now.Sub(st.last); dt > 0 {
		st.tokens = min(float64(l.cfg.Burst), st.tokens+dt.Seconds()*l.cfg.Rate)
		st.last = now
	}
	ok := st.tokens >= 1 && st.inflight < l.cfg.MaxInFlightPerSandbox
	if ok {
		st.tokens--
		st.inflight++
	} else {
		st.refused++
		st.refSB = sb
	}
	l.mu.Unlock()
	logAll(out, now)
	return ok
}

// release returns the in-flight slot admit took.
func (l *limits) release(src netip.Addr) {
	l.mu.Lock()
	if st := l.m[src]; st != nil && st.inflight > 0 {
		st.inflight--
	}
	l.mu.Unlock()
}

// tcpOpen takes one of src's TCP connection slots.
func (l *limits) tcpOpen(src netip.Addr, now time.Time) bool {
	l.mu.Lock()
	st, out := l.get(src, now)
	ok := st.tcp < l.cfg.MaxTCPConnsPerSandbox
	if ok {
		st.tcp++
	}
	l.mu.Unlock()
	logAll(out, now)
	return ok
}

func (l *limits) tcpClose(src netip.Addr) {
	l.mu.Lock()
	if st := l.m[src]; st != nil && st.tcp > 0 {
		st.tcp--
	}
	l.mu.Unlock()
}

// pending is a summary record waiting to be logged (outside l.mu: the
// sandbox's Record takes its own locks).
type pending struct {
	sb Sandbox
	n  int
}

func (st *source) summary() (pending, bool) {
	if st.refused == 0 || st.refSB == nil {
		return pending{}, false
	}
	p := pending{st.refSB, st.refused}
	st.refused, st.refSB = 0, nil
	return p, true
}

func logAll(ps []pending, now time.Time) {
	for _, p := range ps {
		p.sb.Record(egress.Record{
			Time: now, Kind: "dns", Verdict: "deny",
			Reason: fmt.Sprintf("rate limit: %d queries refused", p.n),
		})
	}
}

// flush logs one summary record per source that had queries refused.
func (l *limits) flush(now time.Time) {
	var out []pending
	l.mu.Lock()
	for _, st := range l.m {
		if p, ok := st.summary(); ok {
			out = append(out, p)
		}
	}
	l.mu.Unlock()
	logAll(out, now)
}

// evictIdle drops the state of sources quiet for idleState (their bucket
// would be full again anyway).
func (l *limits) evictIdle(now time.Time) {
	l.mu.Lock()
	for a, st := range l.m {
		if st.inflight == 0 && st.tcp == 0 && st.refused == 0 && now.Sub(st.last) > idleState {
			delete(l.m, a)
		}
	}
	l.mu.Unlock()
}

// forget logs src's pending summary and drops its state.
func (l *limits) forget(src netip.Addr) {
	var out []pending
	l.mu.Lock()
	if st := l.m[src]; st != nil {
		if p, ok := st.summary(); ok {
			out = append(out, p)
		}
		delete(l.m, src)
	}
	l.mu.Unlock()
	logAll(out, l.cfg.Now())
}
