package sandbox

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/errdefs"
)

// Isolation tiers. A tier is a backend, named by its Name; a sandbox gets
// one at its creation (Spec.Isolation) and keeps it for its life. A tier
// the server cannot run is refused, never replaced by another: a caller
// that asked for a second kernel must not get the host's.

// Tier is one isolation tier of the server's besides Options.Backend's
// (Options.Tiers).
type Tier struct {
	Backend backend.Backend
	// Images resolves image names for this tier's sandboxes (the host
	// image is each backend's own); nil = Options.Images.
	Images ImageResolver
}

// TierNames are the tiers a request may name (config.Isolations too).
var TierNames = []string{"native", "gvisor"}

// legacyTier is the tier of a sandbox recorded before sandboxes had one:
// only native ones could be made then.
const legacyTier = "native"

// initTiers fills m.tiers from opts: Backend under its own name (Tiers
// may describe it further) and every other tier.
func (m *Manager) initTiers() error {
	m.tiers = map[string]Tier{}
	for name, t := range m.opts.Tiers {
		if t.Backend == nil || t.Backend.Name() != name {
			return fmt.Errorf("isolation tier %q: its backend is missing or named otherwise", name)
		}
		m.tiers[name] = t
	}
	def := m.be.Name()
	if t, ok := m.tiers[def]; ok && t.Backend != m.be {
		return fmt.Errorf("isolation tier %q: two backends of that name", def)
	}
	if _, ok := m.tiers[def]; !ok {
		m.tiers[def] = Tier{Backend: m.be}
	}
	for name := range m.opts.TiersOff {
		if _, ok := m.tiers[name]; ok {
			return fmt.Errorf("isolation tier %q: both available and not", name)
		}
	}
	return nil
}

// DefaultTier is the tier of a sandbox that asks for none (namespace
// policies aside).
func (m *Manager) DefaultTier() string { return m.be.Name() }

// Pools reports the warm pool of each tier whose backend has one.
func (m *Manager) Pools() map[string]backend.PoolStats {
	out := map[string]backend.PoolStats{}
	for name, t := range m.tiers {
		if p, ok := t.Backend.(backend.Pooler); ok {
			out[name] = p.PoolStats()
		}
	}
	return out
}

// tier returns the tier named name, or why it cannot be had.
func (m *Manager) tier(name string) (Tier, error) {
	if t, ok := m.tiers[name]; ok {
		return t, nil
	}
	if why, ok := m.opts.TiersOff[name]; ok {
		return Tier{}, errdefs.Errorf(errdefs.ErrUnavailable, "isolation %q cannot run on this server: %s", name, why)
	}
	if slices.Contains(TierNames, name) {
		return Tier{}, errdefs.Errorf(errdefs.ErrUnavailable, "isolation %q is not enabled on this server (available: %s)", name, strings.Join(slices.Sorted(maps.Keys(m.tiers)), ", "))
	}
	return Tier{}, errdefs.Errorf(errdefs.ErrInvalid, "isolation %.40q: want one of %s", name, strings.Join(TierNames, ", "))
}

// backendOf is the backend of spec's tier.
func (m *Manager) backendOf(spec Spec) (backend.Backend, error) {
	t, err := m.tier(spec.Isolation)
	if err != nil {
		return nil, err
	}
	return t.Backend, nil
}

// chooseTier settles the tier of a start of ns/name: an existing sandbox
// keeps its own (asking for another is a conflict), a new one gets what
// it asks for or, asking for none, its namespace's first allowed tier
// when the server's default is not among them, else the default. A tier
// the namespace does not allow is forbidden; one the server cannot run is
// unavailable.
func (m *Manager) chooseTier(ns, name string, pol NamespacePolicy, spec *Spec) error {
	m.mu.Lock()
	var had string
	e := m.entries[key{ns, name}]
	if e != nil {
		had = e.spec.Isolation
	}
	m.mu.Unlock()
	switch {
	case e != nil && spec.Isolation != "" && spec.Isolation != had:
		return errdefs.Errorf(errdefs.ErrConflict, "sandbox %q in namespace %q has isolation %q; a sandbox keeps its tier (remove it and create it again for %q)", name, ns, had, spec.Isolation)
	case e != nil:
		// A restart is held to the namespace's policy of now, as to its
		// quotas.
		spec.Isolation = had
	case spec.Isolation == "" && len(pol.Isolation) > 0 && !slices.Contains(pol.Isolation, m.DefaultTier()):
		spec.Isolation = pol.Isolation[0]
	case spec.Isolation == "":
		spec.Isolation = m.DefaultTier()
	}
	if len(pol.Isolation) > 0 && !slices.Contains(pol.Isolation, spec.Isolation) {
		return errdefs.Errorf(errdefs.ErrForbidden, "isolation %q is not among namespace %q's isolation tiers (%s)", spec.Isolation, ns, strings.Join(pol.Isolation, ", "))
	}
	_, err := m.tier(spec.Isolation)
	return err
}

// errNoDiskLimits refuses a disk limit be does not enforce.
func errNoDiskLimits(be backend.Backend, bytes int64) error {
	if d, ok := be.(interface{ DiskLimitsOff() string }); ok {
		// A backend that can have them, on a server that turned them
		// off, or where they could not come on (it says why).
		if why := d.DiskLimitsOff(); why != "" {
			return errdefs.Errorf(errdefs.ErrInvalid, "disk limit %d MiB: isolation %q has no disk limits on this server: %s", bytes>>20, be.Name(), why)
		}
		return errdefs.Errorf(errdefs.ErrInvalid, "disk limit %d MiB: this server has no disk limits (warren serve --disk-pool auto turns them on)", bytes>>20)
	}
	return errdefs.Errorf(errdefs.ErrUnsupported, "disk limit %d MiB: isolation %q has no disk limits: use isolation %q (with warren serve --disk-pool) for one", bytes>>20, be.Name(), "native")
}
