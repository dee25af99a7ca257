package egress

import (
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
	mu sync.RWMutex
	m  map[netip.Addr]*Sandbox
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{m: map[netip.Addr]*Sandbox{}}
}

func regKey(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

// Add maps a to s, replacing what a mapped to before.
func (r *Registry) Add(a netip.Addr, s *Sandbox) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[netip.Addr]*Sandbox{}
	}
	r.m[regKey(a)] = s
}

// Remove forgets a.
func (r *Registry) Remove(a netip.Addr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, regKey(a))
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
