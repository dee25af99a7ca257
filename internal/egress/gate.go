package egress

import (
	"net/netip"
	"time"
)

// Gate is the host's fast path in front of the proxy (internal/netplumb
// keeps it in the kernel): a new TCP connection from a sandbox to an
// address the gate does not hold open for it is refused at its SYN, so a
// client sees "connection refused" at connect time instead of a connection
// that is accepted and then reset (and a port scan sees nothing open).
//
// The gate only ever refuses what Decide would deny; the proxy still
// decides everything that passes it. That holds because:
//   - a sandbox opens an address for itself BEFORE its resolver's answer
//     carries the address (PinAnswer), until at least the pin's expiry;
//   - a policy with an address rule lets everything of its sandbox through
//     (Bypass): such rules allow addresses nobody resolved;
//   - a gate that fails to open leaves the connection refused: fail closed,
//     and the sandbox's log says why (the error is the caller's to log).
//
// What the gate holds beyond Decide (a pin whose rule was removed, an
// address whose pins were evicted, until Close) only reaches the proxy,
// which denies it.
type Gate interface {
	// Open lets src's new connections to dsts through until the deadline.
	Open(src netip.Addr, dsts []netip.Addr, until time.Time) error
	// Close takes dsts away from src.
	Close(src netip.Addr, dsts []netip.Addr) error
	// Bypass lets every new connection of src through to the proxy (on)
	// or puts them under the gate again (off).
	Bypass(src netip.Addr, on bool) error
}

// gateSlack is added to what a pin needs when the gate is opened, so that a
// name queried again and again (its pin extended each time) costs the gate
// one update a minute, not one per answer.
const gateSlack = time.Minute

// gateState is what a sandbox's gate holds; guarded by Sandbox.gateMu.
type gateState struct {
	g      Gate
	src    netip.Addr
	open   map[netip.Addr]time.Time // address → until, as told to g
	bypass bool
}

// attachGate puts s behind g at src (Registry.Add): every unexpired pin
// is opened (pins outlive stops; the address may be new) and the bypass set
// by the current policy.
func (s *Sandbox) attachGate(g Gate, src netip.Addr) error {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	s.gate = gateState{g: g, src: src, open: map[netip.Addr]time.Time{}}
	if g == nil {
		return nil
	}
	var err error
	if s.Policy().hasAddrRules() {
		err = g.Bypass(src, true)
		s.gate.bypass = err == nil
	}
	// One batch for every unexpired pin, until the latest expiry: holding
	// an address open longer than its own pin only reaches the proxy.
	now := s.now()
	var as []netip.Addr
	var last time.Time
	s.pinMu.RLock()
	for a, names := range s.pins {
		live := false
		for _, exp := range names {
			if exp.After(now) {
				live = true
				if exp.After(last) {
					last = exp
				}
			}
		}
		if live {
			as = append(as, a)
		}
	}
	s.pinMu.RUnlock()
	if len(as) > 0 {
		until := last.Add(gateSlack)
		if e := g.Open(src, as, until); e != nil {
			return e
		}
		for _, a := range as {
			s.gate.open[a] = until
		}
	}
	return err
}

// detachGate takes s from its gate (Registry.Remove): what it opened is
// closed, so the next holder of the address starts with nothing.
func (s *Sandbox) detachGate() error {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	st := s.gate
	s.gate = gateState{}
	if st.g == nil {
		return nil
	}
	var err error
	if st.bypass {
		err = st.g.Bypass(st.src, false)
	}
	if len(st.open) > 0 {
		as := make([]netip.Addr, 0, len(st.open))
		for a := range st.open {
			as = append(as, a)
		}
		if e := st.g.Close(st.src, as); e != nil {
			err = e
		}
	}
	return err
}

// openGate opens as until the pins' expiry (plus slack) where the gate
// holds them for less. Called before the answer carrying them leaves.
func (s *Sandbox) openGate(as []netip.Addr, exp time.Time) error {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	if s.gate.g == nil {
		return nil
	}
	var need []netip.Addr
	for _, a := range as {
		if u, ok := s.gate.open[a]; !ok || u.Before(exp) {
			need = append(need, a)
		}
	}
	if len(need) == 0 {
		return nil
	}
	until := exp.Add(gateSlack)
	if err := s.gate.g.Open(s.gate.src, need, until); err != nil {
		return err
	}
	for _, a := range need {
		s.gate.open[a] = until
	}
	return nil
}

// closeGate closes addresses whose last pin went (eviction), so a sandbox
// churning through names cannot grow the kernel's set past MaxPins.
func (s *Sandbox) closeGate(as []netip.Addr) error {
	if len(as) == 0 {
		return nil
	}
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	if s.gate.g == nil {
		return nil
	}
	var open []netip.Addr
	for _, a := range as {
		if _, ok := s.gate.open[a]; ok {
			open = append(open, a)
			delete(s.gate.open, a)
		}
	}
	if len(open) == 0 {
		return nil
	}
	return s.gate.g.Close(s.gate.src, open)
}

// bypassGate follows a policy change: on before a policy with address rules
// is in force, off after one without is.
func (s *Sandbox) bypassGate(on bool) error {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	if s.gate.g == nil || s.gate.bypass == on {
		return nil
	}
	if err := s.gate.g.Bypass(s.gate.src, on); err != nil {
		return err
	}
	s.gate.bypass = on
	return nil
}
