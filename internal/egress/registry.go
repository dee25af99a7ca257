package egress

import (
	"errors"
	"net/netip"
	"sync"
)

// Registry maps a sandbox's source address (its end of the veth pair) to
// its state, for the resolver and the proxy, which know a query or a
// connection only by where it comes from (trustworthy: the host drops
// spoofed sources). Addresses are unwrapped from IPv4-mapped IPv6, as a
// dual-stack listener reports them. It is safe for concurrent use;
// Lookup takes a read lock only. The zero Registry is empty and ready.
type Registry struct {
	mu     sync.RWMutex
	m      map[netip.Addr]*Sandbox
	gate   Gate
	forget func(netip.Addr)
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{m: map[netip.Addr]*Sandbox{}}
}

func regKey(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

// SetGate puts the sandboxes added from now on behind g (see Gate). Call it
// before the first Add.
func (r *Registry) SetGate(g Gate) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gate = g
}

// OnRemove has f called with an address whose sandbox left (Remove, or an
// Add replacing it), before the address can name another sandbox: the
// resolver drops what it keeps per source. Call it before the first Add.
func (r *Registry) OnRemove(f func(netip.Addr)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forget = f
}

// Add maps a to s, replacing what a mapped to before, and puts s behind
// the registry's gate at a (its pins opened, its bypass set). An error is
// the gate's: s is registered, and connections the gate refuses are
// refused (fail closed).
func (r *Registry) Add(a netip.Addr, s *Sandbox) error {
	a = regKey(a)
	r.mu.Lock()
	if r.m == nil {
		r.m = map[netip.Addr]*Sandbox{}
	}
	old := r.m[a]
	r.m[a] = s
	g, forget := r.gate, r.forget
	r.mu.Unlock()
	var err error
	if old != nil && old != s {
		err = old.detachGate()
		if forget != nil {
			forget(a)
		}
	}
	if s != nil {
		err = errors.Join(err, s.attachGate(g, a))
	}
	return err
}

// Remove forgets a and closes what its sandbox had opened in the gate.
func (r *Registry) Remove(a netip.Addr) error {
	a = regKey(a)
	r.mu.Lock()
	s := r.m[a]
	delete(r.m, a)
	forget := r.forget
	r.mu.Unlock()
	if s == nil {
		return nil
	}
	err := s.detachGate()
	if forget != nil {
		forget(a)
	}
	return err
}

// Lookup returns the sandbox at a, or nil.
func (r *Registry) Lookup(a netip.Addr) *Sandbox {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.m[regKey(a)]
}

// Len is the number of addresses mapped.
func (r *Registry) Len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.m)
}
