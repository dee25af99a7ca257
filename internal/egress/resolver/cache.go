package resolver

import (
	"net/netip"
	"sync"
	"time"
)

// answer is an upstream's answer to an A query, reduced to what a sandbox
// may be given: the addresses the queried name resolves to (through its
// CNAME chain), or that it does not exist.
type answer struct {
	nx      bool // NXDOMAIN
	addrs   []netip.Addr
	expires time.Time // now + the chain's smallest TTL, clamped
}

// cache holds answers by name, shared by every sandbox: it holds only what
// upstream said; whether a sandbox may have it is asked every time.
type cache struct {
	max int
	mu  sync.Mutex
	m   map[string]*answer
}

func newCache(max int) *cache { return &cache{max: max, m: make(map[string]*answer)} }

// get returns name's answer if it has not expired. Answers are never
// modified once stored.
func (c *cache) get(name string, now time.Time) *answer {
	c.mu.Lock()
	a := c.m[name]
	c.mu.Unlock()
	if a == nil || !now.Before(a.expires) {
		return nil
	}
	return a
}

func (c *cache) put(name string, a *answer, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[name]; !ok && len(c.m) >= c.max {
		// Full: expired entries go first, then arbitrary ones (map order
		// is random, so no name can be kept out by a crafted sequence).
		for k, v := range c.m {
			if !now.Before(v.expires) {
				delete(c.m, k)
			}
		}
		for k := range c.m {
			if len(c.m) < c.max {
				break
			}
			delete(c.m, k)
		}
	}
	c.m[name] = a
}

func (c *cache) evictExpired(now time.Time) {
	c.mu.Lock()
	for k, v := range c.m {
		if !now.Before(v.expires) {
			delete(c.m, k)
		}
	}
	c.mu.Unlock()
}

// clampTTL bounds a TTL to [MinTTL, MaxTTL].
func clampTTL(d time.Duration) time.Duration { return min(max(d, MinTTL), MaxTTL) }
