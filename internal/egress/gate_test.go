package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// recGate records what a sandbox asks of its gate (the kernel's side has
// its own test in internal/netplumb); fail makes the next call fail.
type recGate struct {
	mu     sync.Mutex
	calls  []string
	open   map[string]time.Time // "src dst" → until
	bypass map[netip.Addr]bool
	fail   error
	// onBypass sees each Bypass call before it is recorded.
	onBypass func(on bool)
}

func newRecGate() *recGate {
	return &recGate{open: map[string]time.Time{}, bypass: map[netip.Addr]bool{}}
}

func (g *recGate) Open(src netip.Addr, dsts []netip.Addr, until time.Time) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.fail; err != nil {
		g.fail = nil
		return err
	}
	g.calls = append(g.calls, fmt.Sprintf("open %v %v", src, dsts))
	for _, d := range dsts {
		g.open[src.String()+" "+d.String()] = until
	}
	return nil
}

func (g *recGate) Close(src netip.Addr, dsts []netip.Addr) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls = append(g.calls, fmt.Sprintf("close %v %v", src, dsts))
	for _, d := range dsts {
		delete(g.open, src.String()+" "+d.String())
	}
	return nil
}

func (g *recGate) Bypass(src netip.Addr, on bool) error {
	if g.onBypass != nil {
		g.onBypass(on)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls = append(g.calls, fmt.Sprintf("bypass %v %v", src, on))
	g.bypass[src] = on
	return nil
}

func (g *recGate) take() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.calls
	g.calls = nil
	return c
}

func (g *recGate) until(src, dst string) (time.Time, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	u, ok := g.open[src+" "+dst]
	return u, ok
}

// TestGate checks the invariant the gate rests on: whatever Decide would
// allow, the gate holds open, from before the resolver's answer leaves.
func TestGate(t *testing.T) {
	now := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	src := netip.MustParseAddr("10.201.0.2")
	g := newRecGate()
	reg := NewRegistry()
	reg.SetGate(g)
	s := NewSandbox("ns", "a", mustCompile(t, "allowed.test", "*.wild.test"))
	s.now = func() time.Time { return now }
	if err := reg.Add(src, s); err != nil {
		t.Fatal(err)
	}
	if c := g.take(); len(c) != 0 {
		t.Fatalf("a sandbox without pins or address rules asked the gate %v", c)
	}

	a1, a2 := netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("203.0.113.11")
	if err := s.Pin("allowed.test", []netip.Addr{a1, a2}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if c := g.take(); !slices.Equal(c, []string{"open 10.201.0.2 [203.0.113.10 203.0.113.11]"}) {
		t.Fatalf("pinning two addresses: %v, want one open of both", c)
	}
	u, ok := g.until("10.201.0.2", "203.0.113.10")
	if !ok || u.Before(now.Add(time.Hour)) {
		t.Fatalf("open until %v, want at least the pin's expiry %v", u, now.Add(time.Hour))
	}
	if !s.Decide(netip.AddrPortFrom(a1, 443), "allowed.test", "tls").Allow {
		t.Fatal("the pinned address is not allowed")
	}

	// The same answer again within the slack: no call. A longer one: one.
	now = now.Add(30 * time.Second)
	_ = s.Pin("allowed.test", []netip.Addr{a1}, time.Hour)
	if c := g.take(); len(c) != 0 {
		t.Errorf("a pin extended within the slack asked the gate %v", c)
	}
	now = now.Add(2 * time.Minute)
	_ = s.Pin("allowed.test", []netip.Addr{a1}, time.Hour)
	if c := g.take(); !slices.Equal(c, []string{"open 10.201.0.2 [203.0.113.10]"}) {
		t.Errorf("a pin extended past what the gate holds: %v", c)
	}
	if u, _ := g.until("10.201.0.2", "203.0.113.10"); u.Before(now.Add(time.Hour)) {
		t.Errorf("open until %v, want at least %v", u, now.Add(time.Hour))
	}

	// A gate that fails: Pin says so (the resolver then gives no answer).
	g.fail = errors.New("netlink: no")
	if err := s.Pin("x.wild.test", []netip.Addr{netip.MustParseAddr("203.0.113.20")}, time.Hour); err == nil {
		t.Error("Pin hid the gate's failure")
	}
	g.take()

	// Address rules: the gate lets everything through BEFORE the policy
	// that needs it is in force, and closes only AFTER it is gone.
	var seen []string
	g.onBypass = func(on bool) {
		seen = append(seen, fmt.Sprintf("%v with %d address rule(s) in force", on, len(s.Policy().addrs)))
	}
	s.SetPolicy(mustCompile(t, "allowed.test", "198.51.100.0/24:22"))
	s.SetPolicy(mustCompile(t, "allowed.test", "198.51.100.0/24:22", "203.0.113.99:7")) // no change for the gate
	s.SetPolicy(mustCompile(t, "allowed.test"))
	if want := []string{"true with 0 address rule(s) in force", "false with 0 address rule(s) in force"}; !slices.Equal(seen, want) {
		t.Errorf("bypass calls %v, want %v", seen, want)
	}
	g.onBypass = nil
	g.take()

	// Removal closes everything it opened; the bypass goes too.
	s.SetPolicy(mustCompile(t, "allowed.test", "198.51.100.7:22"))
	g.take()
	if err := reg.Remove(src); err != nil {
		t.Fatal(err)
	}
	c := g.take()
	if len(c) != 2 || c[0] != "bypass 10.201.0.2 false" || !strings.HasPrefix(c[1], "close 10.201.0.2 [") {
		t.Fatalf("remove: %v, want the bypass off and one close", c)
	}
	if len(g.open) != 0 {
		t.Errorf("after remove the gate still holds %v", g.open)
	}

	// A restart on a new address: unexpired pins are opened there, at once.
	src2 := netip.MustParseAddr("10.201.0.6")
	if err := reg.Add(src2, s); err != nil {
		t.Fatal(err)
	}
	c = g.take()
	if len(c) != 2 || c[0] != "bypass 10.201.0.6 true" || !strings.HasPrefix(c[1], "open 10.201.0.6 [") {
		t.Fatalf("re-add: %v, want the bypass and the pins opened", c)
	}
	for _, a := range []netip.Addr{a1, a2} {
		if _, ok := g.until("10.201.0.6", a.String()); !ok {
			t.Errorf("re-add: %v not opened at the new address", a)
		}
	}
	// Expired pins are not.
	now = now.Add(25 * time.Hour)
	_ = reg.Remove(src2)
	g.take()
	_ = reg.Add(src2, s)
	if c := g.take(); len(c) != 1 || c[0] != "bypass 10.201.0.6 true" {
		t.Errorf("re-add with every pin expired: %v", c)
	}
}

// TestGateEviction: a sandbox churning through names cannot make the gate
// hold more than MaxPins addresses; what eviction drops is closed.
func TestGateEviction(t *testing.T) {
	g := newRecGate()
	reg := NewRegistry()
	reg.SetGate(g)
	s := NewSandbox("ns", "churn", mustCompile(t, "*.many.test"))
	src := netip.MustParseAddr("10.201.0.2")
	_ = reg.Add(src, s)
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{203, 0, byte(i >> 8), byte(i)}) }
	for i := range MaxPins + 50 {
		if err := s.Pin(fmt.Sprintf("h%d.many.test", i), []netip.Addr{addr(i)}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(g.open); n > MaxPins {
		t.Errorf("the gate holds %d addresses, more than MaxPins %d", n, MaxPins)
	}
	if _, ok := g.until(src.String(), addr(MaxPins+49).String()); !ok {
		t.Error("the newest pin is not open")
	}
}

// TestRegistryForget: the resolver hears of an address whose sandbox left,
// by Remove or by an Add that replaces it, and not otherwise.
func TestRegistryForget(t *testing.T) {
	var forgot []string
	reg := NewRegistry()
	reg.OnRemove(func(a netip.Addr) { forgot = append(forgot, a.String()) })
	a, b := NewSandbox("ns", "a", nil), NewSandbox("ns", "b", nil)
	src := netip.MustParseAddr("10.201.0.2")
	_ = reg.Add(src, a)
	_ = reg.Add(src, a) // the same sandbox again: nothing left
	_ = reg.Add(src, b)
	_ = reg.Remove(src)
	_ = reg.Remove(src) // nothing there
	if !slices.Equal(forgot, []string{"10.201.0.2", "10.201.0.2"}) {
		t.Errorf("forgotten %v, want the address twice (replaced, removed)", forgot)
	}
}
