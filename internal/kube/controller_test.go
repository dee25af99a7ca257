package kube_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/kube"
)

// nodes registers live nodes (Register only: a test's controller clock
// decides when they expire).
func nodes(t *testing.T, c *kube.Client, ns string, infos map[string]kube.NodeInfo) {
	t.Helper()
	for name, info := range infos {
		r := &kube.Registrar{Client: c, Namespace: ns, Node: name, Info: info, Duration: 10 * time.Second}
		if err := r.Register(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}

func statuses(t *testing.T, c *kube.Client, ns string) map[string]kube.SandboxStatus {
	t.Helper()
	var l kube.SandboxList
	if err := c.Do(t.Context(), http.MethodGet, sandboxPath(ns, ""), nil, &l); err != nil {
		t.Fatal(err)
	}
	out := map[string]kube.SandboxStatus{}
	for _, s := range l.Items {
		out[s.Metadata.Name] = s.Status
	}
	return out
}

// TestPlacementAcrossNodes: sandboxes are packed onto nodes with room,
// honouring tier and nodeSelector; what fits nowhere stays Pending saying
// why, and is placed once room appears.
func TestPlacementAcrossNodes(t *testing.T) {
	c := needCluster(t)
	leases, ns := namespace(t, c), namespace(t, c)
	nodes(t, c, leases, map[string]kube.NodeInfo{
		"small": {MemoryMiB: 1024, CPUs: 2, Sandboxes: 10, Tiers: []string{"native"}, Labels: map[string]string{"zone": "a"}},
		"big":   {MemoryMiB: 4096, CPUs: 8, Sandboxes: 10, Tiers: []string{"native", "gvisor"}, Labels: map[string]string{"zone": "b"}},
	})
	// Another component's Lease in the namespace is not a node.
	other := map[string]any{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": map[string]any{"name": "leader"},
		"spec": map[string]any{"holderIdentity": "someone", "leaseDurationSeconds": 15}}
	if err := c.Do(t.Context(), http.MethodPost, "/apis/coordination.k8s.io/v1/namespaces/"+leases+"/leases", other, nil); err != nil {
		t.Fatal(err)
	}
	mem := func(mib int) map[string]any { return map[string]any{"memoryMiB": mib, "cpus": 0.5} }
	for _, s := range []struct {
		name string
		spec map[string]any
	}{
		// Best fit: the small node first while it has room.
		{"a-fits-small", map[string]any{"image": "python", "resources": mem(512)}},
		{"b-fits-small", map[string]any{"image": "python", "resources": mem(512)}},
		{"c-small-full", map[string]any{"image": "python", "resources": mem(512)}},
		{"d-gvisor", map[string]any{"image": "python", "tier": "gvisor", "resources": mem(256)}},
		{"e-zone-a", map[string]any{"image": "python", "nodeSelector": map[string]any{"zone": "a"}, "resources": mem(256)}},
		{"f-too-big", map[string]any{"image": "python", "resources": mem(8192)}},
		{"g-default-tier", map[string]any{"image": "python"}},
	} {
		if err := createSandbox(t, c, ns, s.name, s.spec); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond) // distinct creation order
	}
	ctl := &kube.Controller{Client: c, Namespace: leases, SandboxNamespace: ns}
	if err := ctl.Reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	got := statuses(t, c, ns)
	want := map[string]kube.SandboxStatus{
		"a-fits-small":   {Phase: kube.PhasePlaced, Node: "small", Tier: "native"},
		"b-fits-small":   {Phase: kube.PhasePlaced, Node: "small", Tier: "native"},
		"c-small-full":   {Phase: kube.PhasePlaced, Node: "big", Tier: "native"},
		"d-gvisor":       {Phase: kube.PhasePlaced, Node: "big", Tier: "gvisor"},
		"e-zone-a":       {Phase: kube.PhasePending, Error: "no node has room: 2 nodes: 1 labels do not match nodeSelector, 1 not enough memory"},
		"f-too-big":      {Phase: kube.PhasePending, Error: "no node has room: 2 nodes: 2 not enough memory"},
		"g-default-tier": {Phase: kube.PhasePlaced, Node: "big", Tier: "native"},
	}
	for name, w := range want {
		g := got[name]
		g.ObservedGeneration = 0
		if g != w {
			t.Errorf("%s: status %+v, want %+v", name, g, w)
		}
	}
	// A second pass changes nothing (the statuses are level, not events).
	if err := ctl.Reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	before := getSandbox(t, c, ns, "f-too-big").Metadata.ResourceVersion
	if err := ctl.Reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	if after := getSandbox(t, c, ns, "f-too-big").Metadata.ResourceVersion; after != before {
		t.Error("an unchanged Pending status was written again")
	}
	// Room appears in zone a: the pending sandbox is placed.
	if err := c.Do(t.Context(), http.MethodDelete, sandboxPath(ns, "a-fits-small"), nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := ctl.Reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	if s := getSandbox(t, c, ns, "e-zone-a").Status; s.Phase != kube.PhasePlaced || s.Node != "small" || s.Error != "" {
		t.Errorf("after room appeared: %+v", s)
	}
}

// TestCapacityExhaustion: a node takes as many sandboxes as it offers,
// the rest wait.
func TestCapacityExhaustion(t *testing.T) {
	c := needCluster(t)
	leases, ns := namespace(t, c), namespace(t, c)
	nodes(t, c, leases, map[string]kube.NodeInfo{
		"n1": {MemoryMiB: 1 << 20, CPUs: 64, Sandboxes: 3, Tiers: []string{"native"}},
		"n2": {MemoryMiB: 1 << 20, CPUs: 1, Sandboxes: 100, Tiers: []string{"native"}},
	})
	for i := range 8 {
		if err := createSandbox(t, c, ns, fmt.Sprintf("s%d", i), map[string]any{"image": "python", "resources": map[string]any{"cpus": 0.5}}); err != nil {
			t.Fatal(err)
		}
	}
	ctl := &kube.Controller{Client: c, Namespace: leases, SandboxNamespace: ns}
	if err := ctl.Reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	per := map[string]int{}
	for name, s := range statuses(t, c, ns) {
		per[s.Node]++
		if s.Phase == kube.PhasePending && s.Error != "no node has room: 2 nodes: 1 not enough CPUs, 1 too many sandboxes" {
			t.Errorf("%s: error %q", name, s.Error)
		}
	}
	// n1: 3 sandboxes (its count), n2: 2 (1 CPU of 0.5 each), 3 wait.
	if per["n1"] != 3 || per["n2"] != 2 || per[""] != 3 {
		t.Fatalf("placed per node %v, want n1:3 n2:2 pending:3", per)
	}
}

// TestNodeLostMarksSandboxes: the sandboxes of a node that stops renewing
// its Lease are marked Lost once the Lease's duration has passed since the
// controller last saw it change, and are not placed on it again; those of
// a live node are untouched.
func TestNodeLostMarksSandboxes(t *testing.T) {
	c := needCluster(t)
	leases, ns := namespace(t, c), namespace(t, c)
	info := kube.NodeInfo{MemoryMiB: 2048, CPUs: 4, Sandboxes: 2, Tiers: []string{"native"}}
	dying := &kube.Registrar{Client: c, Namespace: leases, Node: "dying", Info: info, Duration: 2 * time.Second}
	alive := &kube.Registrar{Client: c, Namespace: leases, Node: "alive", Info: info, Duration: 2 * time.Second}
	for _, r := range []*kube.Registrar{dying, alive} {
		if err := r.Register(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan struct{})
	go func() { defer close(done); alive.Run(t.Context()) }()
	t.Cleanup(func() { <-done }) // t.Context ends before cleanups
	for i := range 4 {
		if err := createSandbox(t, c, ns, fmt.Sprintf("s%d", i), map[string]any{"image": "python"}); err != nil {
			t.Fatal(err)
		}
	}
	ctl := &kube.Controller{Client: c, Namespace: leases, SandboxNamespace: ns}
	start := time.Now() // before the controller first sees the dying node's Lease
	if err := ctl.Reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	onDying := map[string]bool{}
	for name, s := range statuses(t, c, ns) {
		if s.Phase != kube.PhasePlaced {
			t.Fatalf("%s: %+v", name, s)
		}
		if s.Node == "dying" {
			onDying[name] = true
		}
	}
	if len(onDying) != 2 {
		t.Fatalf("sandboxes on the dying node: %v", onDying)
	}
	// The dying node never renews; the controller passes every 100 ms.
	for {
		if err := ctl.Reconcile(t.Context()); err != nil {
			t.Fatal(err)
		}
		lost := 0
		for name, s := range statuses(t, c, ns) {
			switch {
			case onDying[name] && s.Phase == kube.PhaseLost:
				lost++
				if s.Node != "dying" || s.Error != "node dying stopped renewing its lease" {
					t.Fatalf("%s: %+v", name, s)
				}
			case !onDying[name] && (s.Phase != kube.PhasePlaced || s.Node != "alive"):
				t.Fatalf("%s on the live node: %+v", name, s)
			}
		}
		if lost == 2 {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the dead node's sandboxes not marked lost within 10s (lease 2s)")
		}
		time.Sleep(100 * time.Millisecond)
	}
	took := time.Since(start)
	t.Logf("node loss detected after %v (lease duration 2s)", took.Round(10*time.Millisecond))
	if took < 2*time.Second {
		t.Errorf("marked lost after %v, before the lease's 2s duration", took)
	}
	// A new sandbox does not go to the dead node (the live one is full).
	if err := createSandbox(t, c, ns, "late", map[string]any{"image": "python"}); err != nil {
		t.Fatal(err)
	}
	if err := ctl.Reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	if s := getSandbox(t, c, ns, "late").Status; s.Phase != kube.PhasePending || s.Error != "no node has room: 1 nodes: 1 too many sandboxes" {
		t.Errorf("late: %+v", s)
	}
}
