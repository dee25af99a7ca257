package sandbox

import (
	"context"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/errdefs"
)

// Namespace policy. A server may hand each namespace (tenant) quotas and
// allowlists (Options.Policy, read from the configuration file). They
// apply on top of the server's caps (Limits) and capacity (Capacity), at
// every start, a new sandbox's and a stopped one's restart alike, so a
// policy that changed while a sandbox was stopped holds it to the new one.
// Invariants:
//   - per-sandbox quotas and allowlists are checked before anything is
//     made or pulled: a refused image is never fetched;
//   - a namespace's totals (running sandboxes, their memory and cpus) are
//     counted under m.mu with the same hold that admits a start against
//     the server's capacity and marks it starting: concurrent starts of one
//     namespace cannot both take its last share;
//   - every refusal is ErrLimit naming the limit, the asked value and the
//     allowed one.

// NamespacePolicy is what one namespace may ask for. A zero number does
// not limit; an empty list allows anything, except Egress (see there).
type NamespacePolicy struct {
	// MaxMemoryMiB and MaxCPUs cap one sandbox's request.
	MaxMemoryMiB int64
	MaxCPUs      float64
	// TotalMemoryMiB and TotalCPUs cap the sum over the namespace's
	// running sandboxes; MaxSandboxes their number.
	TotalMemoryMiB int64
	TotalCPUs      float64
	MaxSandboxes   int
	// DiskBytes is each sandbox's disk limit (carried for the backend;
	// 0 = none).
	DiskBytes int64
	// Images are glob patterns (path.Match) an image name must match, as
	// asked or as resolved; empty = any image.
	Images []string
	// Egress, when non-nil, holds the patterns every egress rule a
	// sandbox asks for must be covered by (egress.Covers); non-nil and
	// empty allows no rule. nil = any rule.
	Egress []string
	// EgressDefault is the rules a new sandbox that asks for none gets
	// (on a server that gives sandboxes a network).
	EgressDefault []string
	// Isolation lists the allowed isolation tiers (backends, by their
	// Name); empty = any. A new sandbox asking for none gets the server's
	// default tier when allowed, else the first listed (tier.go).
	Isolation []string
	// ReadOnlyRoot and WritePaths are the root file system's write
	// policy (carried for the backend).
	ReadOnlyRoot bool
	WritePaths   []string
	// Secrets are the secret names the namespace is granted (carried for
	// the secrets' check).
	Secrets []string
	// WorkspaceStore and WorkspaceQuota are the namespace's workspace
	// store and byte quota (carried).
	WorkspaceStore string
	WorkspaceQuota int64
	// MaxSnapshots and SnapshotBytes cap the namespace's snapshots, in
	// number and in bytes on disk (snapshot.go).
	MaxSnapshots  int
	SnapshotBytes int64
}

// policy is ns's policy (the zero one without Options.Policy).
func (m *Manager) policy(ns string) NamespacePolicy {
	if m.opts.Policy == nil {
		return NamespacePolicy{}
	}
	return m.opts.Policy(ns)
}

func limitErr(format string, args ...any) error {
	return errdefs.Errorf(errdefs.ErrLimit, format, args...)
}

// checkSpec refuses a spec the namespace's per-sandbox quotas and
// allowlists do not allow.
func (m *Manager) checkSpec(ctx context.Context, ns string, p NamespacePolicy, s Spec) error {
	if p.MaxMemoryMiB > 0 && s.MemoryMiB > p.MaxMemoryMiB {
		return limitErr("memory %d MiB is above namespace %q's max_memory of %d MiB", s.MemoryMiB, ns, p.MaxMemoryMiB)
	}
	if p.MaxCPUs > 0 && s.CPUs > p.MaxCPUs+1e-9 {
		return limitErr("cpus %g is above namespace %q's max_cpus of %g", s.CPUs, ns, p.MaxCPUs)
	}
	if p.DiskBytes > 0 && s.DiskMiB<<20 > p.DiskBytes {
		return limitErr("disk %d MiB is above namespace %q's disk of %d MiB", s.DiskMiB, ns, p.DiskBytes>>20)
	}
	if err := m.checkImage(ctx, ns, p, s.Image); err != nil {
		return err
	}
	return checkEgressPolicy(ns, p, s.Egress)
}

// checkImage allows name when it, or the name of the image it resolves
// to, matches one of p.Images. Only a stored image is resolved: an image
// that would be pulled is judged by the name asked for.
func (m *Manager) checkImage(ctx context.Context, ns string, p NamespacePolicy, name string) error {
	if len(p.Images) == 0 || matchAny(p.Images, name) {
		return nil
	}
	if m.opts.Images != nil {
		if img, err := m.opts.Images(ctx, name); err == nil && img != nil && matchAny(p.Images, img.Name) {
			return nil
		}
	}
	return limitErr("image %q is not among namespace %q's images (%s)", name, ns, strings.Join(p.Images, ", "))
}

func matchAny(patterns []string, name string) bool {
	for _, pat := range patterns {
		if ok, err := path.Match(pat, name); err == nil && ok {
			return true
		}
	}
	return false
}

// checkEgressPolicy refuses rules not covered by the namespace's egress
// patterns, naming the first such rule.
func checkEgressPolicy(ns string, p NamespacePolicy, rules []string) error {
	if p.Egress == nil {
		return nil
	}
	for _, r := range rules {
		ok, err := egress.Covered(r, p.Egress)
		if err != nil {
			return errdefs.Errorf(errdefs.ErrInvalid, "egress: %w", err)
		}
		if !ok {
			allowed := "none"
			if len(p.Egress) > 0 {
				allowed = strings.Join(p.Egress, ", ")
			}
			return limitErr("egress rule %q is not covered by namespace %q's egress patterns (%s)", r, ns, allowed)
		}
	}
	return nil
}

// nsHeldLocked is what ns's sandboxes that hold their grant hold
// together, and how many they are. Holds m.mu.
func (m *Manager) nsHeldLocked(ns string) (Grant, int) {
	var sum Grant
	n := 0
	for _, e := range m.entries {
		if e.ns == ns && holds(e.state) {
			sum.add(m.limits.grant(e.spec))
			n++
		}
	}
	return sum, n
}

// admitNamespace refuses a start of spec s in ns beyond the namespace's
// totals. Holds m.mu (the hold that marks the start starting).
func (m *Manager) admitNamespace(ns string, p NamespacePolicy, s Spec) error {
	if p.MaxSandboxes <= 0 && p.TotalMemoryMiB <= 0 && p.TotalCPUs <= 0 {
		return nil
	}
	used, n := m.nsHeldLocked(ns)
	if p.MaxSandboxes > 0 && n+1 > p.MaxSandboxes {
		return limitErr("namespace %q runs %d sandboxes, its max_sandboxes of %d; stop one first", ns, n, p.MaxSandboxes)
	}
	if mem := used.MemoryBytes>>20 + s.MemoryMiB; p.TotalMemoryMiB > 0 && mem > p.TotalMemoryMiB {
		return limitErr("memory %d MiB would bring namespace %q's running sandboxes to %d MiB, above its total_memory of %d MiB (%d MiB left)",
			s.MemoryMiB, ns, mem, p.TotalMemoryMiB, max(p.TotalMemoryMiB-used.MemoryBytes>>20, 0))
	}
	if cpus := used.CPUs + s.CPUs; p.TotalCPUs > 0 && cpus > p.TotalCPUs+1e-9 {
		return limitErr("cpus %g would bring namespace %q's running sandboxes to %g, above its total_cpus of %g (%g left)",
			s.CPUs, ns, cpus, p.TotalCPUs, max(p.TotalCPUs-used.CPUs, 0))
	}
	return nil
}

// NamespaceUsage is one namespace's use of its quota.
type NamespaceUsage struct {
	Namespace string
	// Sandboxes counts them all, stopped ones included; Running those
	// holding their grant, whose memory and cpus are summed.
	Sandboxes int
	Running   int
	MemoryMiB int64
	CPUs      float64
	// DiskBytes sums the sandboxes' disk usage as last measured
	// (sandbox.metrics.get measures it).
	DiskBytes int64
	Policy    NamespacePolicy
}

// NamespaceUsage returns the usage of the namespaces in only (nil = all
// that have sandboxes or a policy of their own, Options.Namespaces),
// sorted by name.
func (m *Manager) NamespaceUsage(only []string) []NamespaceUsage {
	names := map[string]bool{}
	if m.opts.Namespaces != nil {
		for _, ns := range m.opts.Namespaces() {
			names[ns] = true
		}
	}
	type entryDisk struct {
		ns string
		e  *entry
	}
	var disks []entryDisk
	byNS := map[string]*NamespaceUsage{}
	m.mu.Lock()
	for k, e := range m.entries {
		names[k.ns] = true
		u := byNS[k.ns]
		if u == nil {
			u = &NamespaceUsage{Namespace: k.ns}
			byNS[k.ns] = u
		}
		u.Sandboxes++
		if holds(e.state) {
			g := m.limits.grant(e.spec)
			u.Running++
			u.MemoryMiB += g.MemoryBytes >> 20
			u.CPUs += g.CPUs
		}
		disks = append(disks, entryDisk{k.ns, e})
	}
	m.mu.Unlock()
	for _, d := range disks {
		d.e.usage.mu.Lock()
		n := d.e.usage.disk
		d.e.usage.mu.Unlock()
		byNS[d.ns].DiskBytes += n
	}
	var out []NamespaceUsage
	for ns := range names {
		if only != nil && !slices.Contains(only, ns) {
			continue
		}
		u := byNS[ns]
		if u == nil {
			u = &NamespaceUsage{Namespace: ns}
		}
		u.Policy = m.policy(ns)
		out = append(out, *u)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Namespace < out[j].Namespace })
	return out
}
