package kube

import (
	"testing"

	"github.com/warren-sandbox/warren/internal/backend"
)

// TestDefaultsMatchTheServer: placement reserves for a sandbox that asks
// for nothing what a server gives it.
func TestDefaultsMatchTheServer(t *testing.T) {
	if defaultMemoryMiB != backend.DefaultMemoryBytes>>20 || defaultCPUs != backend.DefaultCPUs {
		t.Fatalf("placement's defaults %d MiB, %v CPUs; the server's %d MiB, %v CPUs",
			defaultMemoryMiB, defaultCPUs, backend.DefaultMemoryBytes>>20, backend.DefaultCPUs)
	}
}

func TestPlace(t *testing.T) {
	mk := func() []*node {
		return []*node{
			{name: "a", info: NodeInfo{MemoryMiB: 2048, CPUs: 2, Sandboxes: 4, Tiers: []string{"native"}, Labels: map[string]string{"zone": "x"}}},
			{name: "b", info: NodeInfo{MemoryMiB: 8192, CPUs: 8, Sandboxes: 4, Tiers: []string{"gvisor", "native"}}},
			{name: "c", info: NodeInfo{MemoryMiB: 8192, CPUs: 8, Sandboxes: 4, Tiers: []string{"gvisor", "native"}}},
		}
	}
	sb := func(mem int64, cpus float64, tier string, sel map[string]string) *Sandbox {
		return &Sandbox{Spec: SandboxSpec{Image: "i", Tier: tier, Resources: Resources{MemoryMiB: mem, CPUs: cpus}, NodeSelector: sel}}
	}
	for _, tc := range []struct {
		name       string
		used       map[string]int64 // memory already requested per node
		s          *Sandbox
		node, tier string
		why        string
	}{
		{name: "best fit: the fullest node that fits", s: sb(1024, 1, "", nil), node: "a", tier: "native"},
		{name: "defaults: 512 MiB, 1 CPU", s: sb(0, 0, "", nil), node: "a", tier: "native"},
		{name: "the node's default tier", used: map[string]int64{"a": 2048}, s: sb(512, 1, "", nil), node: "b", tier: "gvisor"},
		{name: "asked tier", s: sb(512, 1, "gvisor", nil), node: "b", tier: "gvisor"},
		{name: "ties broken by name", s: sb(4096, 1, "", nil), node: "b", tier: "gvisor"},
		{name: "fuller wins", used: map[string]int64{"c": 1024}, s: sb(4096, 1, "", nil), node: "c", tier: "gvisor"},
		{name: "selector", s: sb(512, 1, "", map[string]string{"zone": "x"}), node: "a", tier: "native"},
		{name: "cpus bound", s: sb(512, 3, "native", nil), node: "b", tier: "native"},
		{name: "nowhere", s: sb(9000, 1, "", nil), why: "no node has room: 3 nodes: 3 not enough memory"},
		{name: "mixed reasons", s: sb(4096, 1, "native", map[string]string{"zone": "x"}),
			why: "no node has room: 3 nodes: 2 labels do not match nodeSelector, 1 not enough memory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := mk()
			for _, n := range ns {
				n.memoryMiB = tc.used[n.name]
			}
			n, tier, why := place(ns, tc.s)
			got := ""
			if n != nil {
				got = n.name
			}
			if got != tc.node || tier != tc.tier || why != tc.why {
				t.Fatalf("place: %q %q %q, want %q %q %q", got, tier, why, tc.node, tc.tier, tc.why)
			}
		})
	}
	if _, _, why := place(nil, sb(1, 1, "", nil)); why != "no live Warren node" {
		t.Fatalf("no nodes: %q", why)
	}
	// Sandbox count bounds a node whatever its memory.
	n := &node{name: "n", info: NodeInfo{MemoryMiB: 1 << 20, CPUs: 100, Sandboxes: 2, Tiers: []string{"native"}}}
	for range 2 {
		n.add(sb(16, 0.01, "", nil))
	}
	if _, why := n.fit(sb(16, 0.01, "", nil)); why != "too many sandboxes" {
		t.Fatalf("full node: %q", why)
	}
}
