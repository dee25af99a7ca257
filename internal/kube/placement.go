package kube

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
)

// What a sandbox that asks for nothing gets: backend.DefaultMemoryBytes and
// backend.DefaultCPUs (a test keeps them equal; importing backend here
// would make testenv, which starts the API server, depend on the backends
// whose tests use it).
const (
	defaultMemoryMiB = 512
	defaultCPUs      = 1.0
)

// node is a live node as placement sees it: what it offers and what the
// sandboxes placed on it ask for.
type node struct {
	name      string
	info      NodeInfo
	memoryMiB int64 // requested by its sandboxes
	milliCPUs int64
	sandboxes int
}

// request is what s asks for, with Warren's defaults for what it leaves out.
func request(s *Sandbox) (memoryMiB, milliCPUs int64) {
	memoryMiB, cpus := s.Spec.Resources.MemoryMiB, s.Spec.Resources.CPUs
	if memoryMiB <= 0 {
		memoryMiB = defaultMemoryMiB
	}
	if cpus <= 0 {
		cpus = defaultCPUs
	}
	return memoryMiB, int64(math.Ceil(cpus * 1000))
}

func (n *node) add(s *Sandbox) {
	m, c := request(s)
	n.memoryMiB += m
	n.milliCPUs += c
	n.sandboxes++
}

// fit says whether s fits on n, with the tier it would get, or why not
// (a short reason counted across nodes in the sandbox's error).
func (n *node) fit(s *Sandbox) (tier, why string) {
	tier = s.Spec.Tier
	if tier == "" {
		if len(n.info.Tiers) == 0 {
			return "", "no tier"
		}
		tier = n.info.Tiers[0]
	} else if !slices.Contains(n.info.Tiers, tier) {
		return "", "no tier " + tier
	}
	for k, v := range s.Spec.NodeSelector {
		if n.info.Labels[k] != v {
			return "", "labels do not match nodeSelector"
		}
	}
	m, c := request(s)
	switch {
	case n.sandboxes+1 > n.info.Sandboxes:
		return "", "too many sandboxes"
	case n.memoryMiB+m > n.info.MemoryMiB:
		return "", "not enough memory"
	case n.milliCPUs+c > int64(math.Floor(n.info.CPUs*1000)):
		return "", "not enough CPUs"
	}
	return tier, ""
}

// place picks the node for s: of those it fits on, the one it leaves the
// least memory free on (best fit: pack nodes full before using empty ones,
// so large sandboxes still find room), then fewest CPUs free, then by
// name for a stable answer. Without one, it says why per node count.
func place(nodes []*node, s *Sandbox) (n *node, tier, why string) {
	m, c := request(s)
	reasons := map[string]int{}
	for _, cand := range nodes {
		t, no := cand.fit(s)
		if no != "" {
			reasons[no]++
			continue
		}
		if n == nil || better(cand, n, m, c) {
			n, tier = cand, t
		}
	}
	if n != nil {
		return n, tier, ""
	}
	if len(nodes) == 0 {
		return nil, "", "no live Warren node"
	}
	var parts []string
	for _, r := range slices.Sorted(maps.Keys(reasons)) {
		parts = append(parts, fmt.Sprintf("%d %s", reasons[r], r))
	}
	return nil, "", fmt.Sprintf("no node has room: %d nodes: %s", len(nodes), strings.Join(parts, ", "))
}

// better: a leaves less free than b after taking m MiB and c milli-CPUs.
func better(a, b *node, m, c int64) bool {
	fa, fb := a.info.MemoryMiB-a.memoryMiB-m, b.info.MemoryMiB-b.memoryMiB-m
	if fa != fb {
		return fa < fb
	}
	ca := int64(a.info.CPUs*1000) - a.milliCPUs - c
	cb := int64(b.info.CPUs*1000) - b.milliCPUs - c
	if ca != cb {
		return ca < cb
	}
	return a.name < b.name
}
