package rpc_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/sandbox"
)

type namespaceUsageResult struct {
	Namespaces []struct {
		Namespace string  `json:"namespace"`
		Sandboxes int     `json:"sandboxes"`
		Running   int     `json:"running"`
		MemoryMiB int64   `json:"memory_mib"`
		CPUs      float64 `json:"cpus"`
		Quota     struct {
			MaxSandboxes int      `json:"max_sandboxes"`
			TotalCPUs    float64  `json:"total_cpus"`
			MaxMemoryMiB int64    `json:"max_memory_mib"`
			Egress       []string `json:"egress"`
		} `json:"quota"`
	} `json:"namespaces"`
}

// TestNamespaceUsage: an admin key sees every namespace with sandboxes or
// a policy, a namespace's key only its own (and not "*" nor another's),
// each with its usage and its quota; a start over a quota is limit.
func TestNamespaceUsage(t *testing.T) {
	pol := map[string]sandbox.NamespacePolicy{
		"team-a": {MaxMemoryMiB: 256, MaxSandboxes: 2, Egress: []string{}},
		"idle":   {TotalCPUs: 4},
	}
	e := newFakeEnv(t, false, func(o *sandbox.Options) {
		o.Policy = func(ns string) sandbox.NamespacePolicy { return pol[ns] }
		o.Namespaces = func() []string { return []string{"team-a", "idle"} }
	})
	keyA, _, err := e.keys.Create(t.Context(), "team-a", time.Hour, "")
	if err != nil {
		t.Fatal(err)
	}
	if r := e.callAs(keyA, "sandbox.create", map[string]any{"name": "big", "memory_mib": 512}); r.Error == nil || r.Error.Data["kind"] != "limit" ||
		!strings.Contains(r.Error.Message, `memory 512 MiB is above namespace "team-a"'s max_memory of 256 MiB`) {
		t.Fatalf("create over the quota: %s", r.Raw)
	}
	if r := e.callAs(keyA, "sandbox.create", map[string]any{"name": "a", "memory_mib": 256, "cpus": 0.5}); r.Error != nil {
		t.Fatalf("create: %s", r.Raw)
	}
	e.must("sandbox.create", map[string]any{"name": "b", "namespace": "other"}, nil)

	var all namespaceUsageResult
	e.must("namespace.usage", map[string]any{}, &all)
	var names []string
	for _, u := range all.Namespaces {
		names = append(names, u.Namespace)
	}
	if strings.Join(names, ",") != "idle,other,team-a" {
		t.Fatalf("admin sees %q", names)
	}
	a := all.Namespaces[2]
	if a.Sandboxes != 1 || a.Running != 1 || a.MemoryMiB != 256 || a.CPUs != 0.5 || a.Quota.MaxMemoryMiB != 256 || a.Quota.MaxSandboxes != 2 ||
		a.Quota.Egress == nil || len(a.Quota.Egress) != 0 {
		t.Errorf("team-a: %+v", a)
	}
	if all.Namespaces[0].Quota.TotalCPUs != 4 || all.Namespaces[1].Quota.Egress != nil {
		t.Errorf("idle, other: %+v", all.Namespaces[:2])
	}

	r := e.callAs(keyA, "namespace.usage", map[string]any{})
	var own namespaceUsageResult
	if r.Error != nil || json.Unmarshal(r.Result, &own) != nil || len(own.Namespaces) != 1 || own.Namespaces[0].Namespace != "team-a" {
		t.Fatalf("team-a's key: %s", r.Raw)
	}
	for _, ns := range []string{"*", "other"} {
		if r := e.callAs(keyA, "namespace.usage", map[string]any{"namespace": ns}); r.Error == nil || r.Error.Data["kind"] != "forbidden" {
			t.Errorf("team-a's key asking for %q: %s", ns, r.Raw)
		}
	}
	// A namespace the key may use but that holds nothing is shown empty.
	var empty namespaceUsageResult
	e.must("namespace.usage", map[string]any{"namespace": "nobody"}, &empty)
	if len(empty.Namespaces) != 1 || empty.Namespaces[0].Namespace != "nobody" || empty.Namespaces[0].Sandboxes != 0 {
		t.Errorf("empty namespace: %+v", empty)
	}
	if r := e.call("namespace.usage", map[string]any{"namespace": "x", "bogus": 1}); r.Error == nil {
		t.Error("unknown param accepted")
	}
}
