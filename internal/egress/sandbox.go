package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-sandbox/warren/internal/secrets"
)

// Bounds on one sandbox's state.
const (
	// MinPinTTL and MaxPinTTL bound how long a pin lasts, whatever TTL
	// the answer carried: a client may connect well after a short-TTL
	// answer (connection pools, retries), and a pin outliving a day
	// serves nobody.
	MinPinTTL = 5 * time.Minute
	MaxPinTTL = 24 * time.Hour
	// MaxPins bounds the (name, address) pins of one sandbox; at the
	// bound, expired pins go first, then the ones closest to expiry.
	MaxPins = 4096
	// LogSize is how many records a sandbox's log keeps (the newest).
	LogSize = 1000
)

// Count is how many records of one kind were allowed and denied.
type Count struct {
	Allowed uint64 `json:"allowed"`
	Denied  uint64 `json:"denied"`
}

// Sandbox is one sandbox's live egress state: its policy, the addresses
// its resolver handed it (pins), and its log. It is safe for concurrent
// use; Decide and AllowName take no lock but a read lock on the pins.
//
// A nil *Sandbox (Registry.Lookup's answer for an unknown source, easily
// wrapped by mistake in a non-nil interface) denies everything and
// records nothing, rather than crashing the resolver or the proxy.
//
// Decide's invariants, in the order it applies them (dst is unwrapped
// from IPv4-mapped IPv6 first):
//
//  1. An address rule covering dst (address and port) allows it, whatever
//     the protocol; the verdict names that rule.
//  2. A special address (Special) that no address rule covers at any port
//     is denied, pinned or not: an IP literal or a stale pin cannot reach
//     loopback, metadata, private or host-local addresses.
//  3. Otherwise dst's address must be pinned for this sandbox (its own
//     resolver answered it, and the pin has not expired) to at least one
//     name the current policy allows at dst's port. An IP literal of an
//     allowed name's address therefore reaches nothing unless this sandbox
//     resolved the name, and never after the name's rule is removed.
//  4. For "tls" and "http", the name on the wire (SNI, Host) must be
//     present, allowed at dst's port, and itself pinned to dst's address:
//     two names sharing one address do not open each other.
//  5. On ports 80 and 443 the connection must be "tls" or "http": an
//     unrecognised protocol there is denied, since its name cannot be
//     checked. On other ports it is allowed by rule 3 alone.
//
// Policy changes (SetPolicy) take effect for every later call; pins are
// kept across changes, but rule 3 re-checks them against the new policy.
type Sandbox struct {
	namespace, name string
	now             func() time.Time
	policy          atomic.Pointer[Policy]
	setMu           sync.Mutex // orders SetPolicy's swaps as its records

	gateMu sync.Mutex // orders the gate's updates with its state
	gate   gateState

	pinMu sync.RWMutex
	pins  map[netip.Addr]map[string]time.Time // address → name → expiry
	npins int

	// secrets are the proxy-mode secrets of the sandbox's current run
	// (nil: none); the proxy reads them per connection.
	secrets atomic.Pointer[secrets.Proxy]
	// observe, when set, is given every record as it is logged (the
	// audit log's copy: the ring keeps only the newest).
	observe func(Record)

	logMu  sync.Mutex
	ring   []Record // the newest records; ring[start] is the oldest
	start  int
	seq    uint64
	counts map[string]Count
}

// NewSandbox returns the state of sandbox namespace/name under p (nil:
// nothing allowed).
func NewSandbox(namespace, name string, p *Policy) *Sandbox {
	s := &Sandbox{
		namespace: namespace,
		name:      name,
		now:       time.Now,
		pins:      map[netip.Addr]map[string]time.Time{},
		counts:    map[string]Count{},
	}
	if p == nil {
		p = &Policy{}
	}
	s.policy.Store(p)
	return s
}

// Policy is the sandbox's current policy (never nil).
func (s *Sandbox) Policy() *Policy {
	if s == nil {
		return &Policy{}
	}
	return s.policy.Load()
}

// SetPolicy replaces the policy (nil: nothing allowed) for every later
// decision and logs a "policy" record listing the new rules.
func (s *Sandbox) SetPolicy(p *Policy) {
	if p == nil {
		p = &Policy{}
	}
	s.setMu.Lock()
	defer s.setMu.Unlock()
	// The gate lets an address-rule policy's traffic through before the
	// policy is in force, and closes after one without is: it never
	// refuses what the policy in force allows.
	var gateErr error
	if p.hasAddrRules() {
		gateErr = s.bypassGate(true)
	}
	s.policy.Store(p)
	if !p.hasAddrRules() {
		gateErr = s.bypassGate(false)
	}
	// The record shares the policy's (immutable) rule texts, at most
	// maxListed bytes of them, so a thousand changes to a long policy
	// cannot hold much memory.
	n, size := 0, 0
	for ; n < p.Len() && size+len(p.text[n]) <= maxListed; n++ {
		size += len(p.text[n])
	}
	r := Record{Kind: "policy", Verdict: "set", Reason: fmt.Sprintf("%d rules", p.Len())}
	if n > 0 {
		r.Rules = p.text[:n:n]
	}
	if n < p.Len() {
		r.Reason += fmt.Sprintf(" (the first %d listed)", n)
	}
	if gateErr != nil {
		r.Reason += "; the host's gate did not follow (connections to address rules may be refused): " + gateErr.Error()
	}
	s.Record(r)
}

// Secrets are the sandbox's proxy-mode secrets (nil: none).
func (s *Sandbox) Secrets() *secrets.Proxy {
	if s == nil {
		return nil
	}
	return s.secrets.Load()
}

// SetSecrets replaces the proxy-mode secrets (nil: none) for every later
// connection.
func (s *Sandbox) SetSecrets(p *secrets.Proxy) {
	if s != nil {
		s.secrets.Store(p)
	}
}

// maxListed bounds the rule texts one policy record lists, in bytes.
const maxListed = 4096

// Observe makes f see every record from now on, outside the log's lock,
// in the order they were logged by each caller. Call it before the
// sandbox is used (registered, or handed to a resolver or proxy).
func (s *Sandbox) Observe(f func(Record)) { s.observe = f }

// ID returns the sandbox's namespace and name.
func (s *Sandbox) ID() (namespace, name string) { return s.namespace, s.name }

// AllowName reports whether a rule allows name (at some port).
func (s *Sandbox) AllowName(name string) (rule string, ok bool) {
	return s.Policy().AllowsName(name)
}

// Rebinding reports whether name's answer a must be refused: a is special
// and no address rule names it.
func (s *Sandbox) Rebinding(name string, a netip.Addr) (why string, refused bool) {
	if s == nil {
		return "unknown sandbox", true
	}
	kind, special := Special(a)
	if !special || s.Policy().NamesRange(a) {
		return "", false
	}
	return fmt.Sprintf("%s resolves to %s, which is %s", show(name), a.Unmap(), kind), true
}

// Pin records that the sandbox's resolver answers name with as, for
// max(ttl, MinPinTTL) (at most MaxPinTTL); a later pin of the same pair
// extends it. The sandbox's gate is opened for as before Pin returns, so
// the answer may leave once it has: an error means the gate did not open
// and the answer must not be given (the connections would be refused).
func (s *Sandbox) Pin(name string, as []netip.Addr, ttl time.Duration) error {
	name, ok := canonName(name)
	if s == nil || !ok {
		return nil
	}
	ttl = min(max(ttl, MinPinTTL), MaxPinTTL)
	now := s.now()
	exp := now.Add(ttl)
	var pinned, evicted []netip.Addr
	s.pinMu.Lock()
	for _, a := range as {
		a = a.Unmap().WithZone("")
		if !a.IsValid() {
			continue
		}
		pinned = append(pinned, a)
		names := s.pins[a]
		if old, ok := names[name]; ok {
			if exp.After(old) {
				names[name] = exp
			}
			continue
		}
		if s.npins >= MaxPins {
			evicted = append(evicted, s.evictLocked(now)...)
		}
		if names = s.pins[a]; names == nil {
			names = map[string]time.Time{}
			s.pins[a] = names
		}
		names[name] = exp
		s.npins++
	}
	// An evicted address pinned again above is open and stays so.
	evicted = slices.DeleteFunc(evicted, func(a netip.Addr) bool { return len(s.pins[a]) > 0 })
	s.pinMu.Unlock()
	return errors.Join(s.closeGate(evicted), s.openGate(pinned, exp))
}

// evictLocked drops every expired pin, or if none has expired the one
// closest to expiry, and returns the addresses left without a pin.
func (s *Sandbox) evictLocked(now time.Time) []netip.Addr {
	var gone []netip.Addr
	var oldA netip.Addr
	var oldN string
	var oldT time.Time
	for a, names := range s.pins {
		for n, exp := range names {
			switch {
			case !exp.After(now):
				delete(names, n)
				s.npins--
			case oldT.IsZero() || exp.Before(oldT):
				oldA, oldN, oldT = a, n, exp
			}
		}
		if len(names) == 0 {
			delete(s.pins, a)
			gone = append(gone, a)
		}
	}
	if s.npins < MaxPins {
		return gone
	}
	delete(s.pins[oldA], oldN)
	if len(s.pins[oldA]) == 0 {
		delete(s.pins, oldA)
		gone = append(gone, oldA)
	}
	s.npins--
	return gone
}

// PinnedNames lists the names pinned to a that have not expired, sorted.
func (s *Sandbox) PinnedNames(a netip.Addr) []string {
	a = a.Unmap().WithZone("")
	now := s.now()
	s.pinMu.RLock()
	defer s.pinMu.RUnlock()
	var out []string
	for n, exp := range s.pins[a] {
		if exp.After(now) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// pinned reports whether name (canonical) is pinned to a and unexpired.
func (s *Sandbox) pinned(name string, a netip.Addr, now time.Time) bool {
	s.pinMu.RLock()
	defer s.pinMu.RUnlock()
	exp, ok := s.pins[a][name]
	return ok && exp.After(now)
}

// allowedPin returns the first (sorted) unexpired name pinned to a that p
// allows at port, and whether a had any unexpired pin at all.
func (s *Sandbox) allowedPin(p *Policy, a netip.Addr, port uint16, now time.Time) (name, rule string, anyPin bool) {
	s.pinMu.RLock()
	defer s.pinMu.RUnlock()
	for n, exp := range s.pins[a] {
		if !exp.After(now) {
			continue
		}
		anyPin = true
		if r, ok := p.AllowsNamePort(n, port); ok && (name == "" || n < name) {
			name, rule = n, r
		}
	}
	return name, rule, anyPin
}

// Decide rules on one connection from the sandbox to dst. wireKind is ""
// (nothing recognised), "tls" (wireName is the SNI, "" when absent) or
// "http" (wireName is the Host without port, "" when absent). See
// Sandbox for the rules.
func (s *Sandbox) Decide(dst netip.AddrPort, wireName, wireKind string) Verdict {
	if s == nil {
		return deny("unknown sandbox")
	}
	p := s.Policy()
	a := dst.Addr().Unmap().WithZone("")
	port := dst.Port()
	if !a.IsValid() {
		return deny("invalid destination address")
	}
	if rule, ok := p.AllowsAddr(netip.AddrPortFrom(a, port)); ok {
		return Verdict{Allow: true, Rule: rule, Reason: "address rule"}
	}
	if kind, special := Special(a); special && !p.NamesRange(a) {
		return deny(fmt.Sprintf("address %s is %s", a, kind))
	}
	now := s.now()
	name, rule, anyPin := s.allowedPin(p, a, port, now)
	if name == "" {
		if !anyPin {
			return deny(fmt.Sprintf("address %s not resolved by this sandbox", a))
		}
		return deny(fmt.Sprintf("no name resolved to %s is allowed at port %d", a, port))
	}
	var what, ok string
	switch wireKind {
	case "tls":
		what, ok = "SNI", "SNI allowed"
	case "http":
		what, ok = "Host", "Host allowed"
	case "":
		if port == 80 || port == 443 {
			return deny(fmt.Sprintf("unrecognised protocol on port %d (TLS with SNI or HTTP with Host needed)", port))
		}
		return Verdict{Allow: true, Name: name, Rule: rule, Reason: "resolved name"}
	default:
		return deny(fmt.Sprintf("unknown protocol kind %s", show(wireKind)))
	}
	if wireName == "" {
		return deny(fmt.Sprintf("%s without a name", map[string]string{"tls": "TLS", "http": "HTTP"}[wireKind]))
	}
	wn, valid := canonName(wireName)
	if !valid {
		return deny(fmt.Sprintf("%s %s is not a host name", what, show(wireName)))
	}
	wrule, allowed := p.AllowsNamePort(wn, port)
	if !allowed {
		if _, any := p.AllowsName(wn); any {
			return deny(fmt.Sprintf("%s %s not allowed at port %d", what, wn, port))
		}
		return deny(fmt.Sprintf("%s %s not allowed", what, wn))
	}
	if !s.pinned(wn, a, now) {
		return deny(fmt.Sprintf("%s %s not pinned to %s", what, wn, a))
	}
	return Verdict{Allow: true, Name: wn, Rule: wrule, Reason: ok}
}

func deny(reason string) Verdict { return Verdict{Reason: reason} }

// clip cuts s to at most n bytes, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// show renders a hostile string for a reason: short and quoted unless it
// is a plain host name.
func show(s string) string {
	if n, ok := canonName(s); ok {
		return n
	}
	if len(s) > 64 {
		return fmt.Sprintf("%.64q...", s)
	}
	return fmt.Sprintf("%q", s)
}

// Record appends r to the sandbox's log, filling Seq, Time (when zero),
// Namespace and Sandbox, and counts it under its Kind when its Verdict is
// "allow" or "deny". The log keeps the newest LogSize records. Strings a
// sandbox chose (a queried name, an SNI, a Host) are cut to bounded
// lengths, so the log's memory is bounded too.
func (s *Sandbox) Record(r Record) {
	if s == nil {
		return
	}
	r.Kind = clip(r.Kind, 16)
	r.Name = clip(r.Name, maxNameLen+2)
	r.Addr = clip(r.Addr, 8*40) // up to 8 addresses a DNS answer gave
	r.Verdict = clip(r.Verdict, 16)
	r.Rule = clip(r.Rule, MaxRuleLen)
	r.Reason = clip(r.Reason, 512)
	s.logMu.Lock()
	s.recordLocked(&r)
	s.logMu.Unlock()
	if s.observe != nil {
		s.observe(r)
	}
}

func (s *Sandbox) recordLocked(r *Record) {
	s.seq++
	r.Seq = s.seq
	if r.Time.IsZero() {
		r.Time = s.now()
	}
	r.Namespace, r.Sandbox = s.namespace, s.name
	switch r.Verdict {
	case "allow":
		c := s.counts[r.Kind]
		c.Allowed++
		s.counts[r.Kind] = c
	case "deny":
		c := s.counts[r.Kind]
		c.Denied++
		s.counts[r.Kind] = c
	}
	if len(s.ring) < LogSize {
		s.ring = append(s.ring, *r)
		return
	}
	s.ring[s.start] = *r
	s.start = (s.start + 1) % LogSize
}

// Log returns up to limit records with Seq > since, oldest first (limit
// <= 0 or above LogSize means LogSize). Records older than the log's
// bound are gone; a caller sees that from a gap in Seq. A record's Rules
// are shared and must not be modified.
func (s *Sandbox) Log(since uint64, limit int) []Record {
	if limit <= 0 || limit > LogSize {
		limit = LogSize
	}
	s.logMu.Lock()
	defer s.logMu.Unlock()
	n := len(s.ring)
	oldest := s.seq - uint64(n) + 1 // Seq of ring[start]
	skip := 0
	if since >= oldest {
		if since >= s.seq {
			return []Record{}
		}
		skip = int(since - oldest + 1) //nolint:gosec // G115: at most n, since since < s.seq
	}
	out := make([]Record, 0, min(limit, n-skip))
	for i := skip; i < n && len(out) < limit; i++ {
		out = append(out, s.ring[(s.start+i)%n])
	}
	return out
}

// Counts returns the allowed and denied counts per record kind since the
// sandbox's state was made.
func (s *Sandbox) Counts() map[string]Count {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	out := make(map[string]Count, len(s.counts))
	for k, v := range s.counts {
		out[k] = v
	}
	return out
}
