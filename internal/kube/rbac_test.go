package kube_test

import (
	"net/http"
	"testing"

	"github.com/warren-sandbox/warren/internal/kube"
)

// TestRBAC: the shipped least-privilege roles let a node register and the
// controller place, and refuse each what the other does, and both what
// only users do (a Sandbox's request).
func TestRBAC(t *testing.T) {
	c := needCluster(t)
	ns := "rbac-system"
	if err := cluster.Apply(t.Context(), "packaging/kubernetes/rbac.yaml", "warren-system", ns); err != nil {
		t.Fatal(err)
	}
	node, err := cluster.ServiceAccountClient(t.Context(), ns, "warren-node")
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	ctl, err := cluster.ServiceAccountClient(t.Context(), ns, "warren-controller")
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	users := namespace(t, c)
	if err := createSandbox(t, c, users, "s", map[string]any{"image": "python"}); err != nil {
		t.Fatal(err)
	}
	// Allowed: a node registers (and re-registers); the controller places.
	info := kube.NodeInfo{MemoryMiB: 1024, CPUs: 1, Sandboxes: 1, Tiers: []string{"native"}}
	for range 2 {
		if err := (&kube.Registrar{Client: node, Namespace: ns, Node: "n1", Info: info}).Register(t.Context()); err != nil {
			t.Fatalf("node registers: %v", err)
		}
	}
	if err := (&kube.Controller{Client: ctl, Namespace: ns, SandboxNamespace: users}).Reconcile(t.Context()); err != nil {
		t.Fatalf("controller places: %v", err)
	}
	s := getSandbox(t, c, users, "s")
	if s.Status.Phase != kube.PhasePlaced || s.Status.Node != "n1" {
		t.Fatalf("placed by the controller's account: %+v", s.Status)
	}
	// Refused.
	other := namespace(t, c)
	sbx := map[string]any{"apiVersion": kube.APIVersion, "kind": "Sandbox", "metadata": map[string]any{"name": "x"}, "spec": map[string]any{"image": "python"}}
	leases := "/apis/coordination.k8s.io/v1/namespaces/"
	for _, tc := range []struct {
		who          string
		c            *kube.Client
		method, path string
		body         any
	}{
		{"node", node, http.MethodPost, leases + other + "/leases", nil},
		{"node", node, http.MethodDelete, leases + ns + "/leases/n1", nil},
		{"node", node, http.MethodGet, leases + ns + "/leases", nil}, // no list of the other nodes
		{"node", node, http.MethodGet, sandboxPath(users, ""), nil},
		{"node", node, http.MethodPut, sandboxPath(users, "s") + "/status", &s},
		{"node", node, http.MethodPost, sandboxPath(users, ""), sbx},
		{"controller", ctl, http.MethodPost, leases + ns + "/leases", nil},
		{"controller", ctl, http.MethodPut, leases + ns + "/leases/n1", nil},
		{"controller", ctl, http.MethodPost, sandboxPath(users, ""), sbx},
		{"controller", ctl, http.MethodPut, sandboxPath(users, "s"), &s},
		{"controller", ctl, http.MethodDelete, sandboxPath(users, "s"), nil},
		{"controller", ctl, http.MethodGet, "/api/v1/namespaces/" + ns + "/secrets", nil},
	} {
		body := tc.body
		if body == nil && tc.method != http.MethodGet && tc.method != http.MethodDelete {
			body = map[string]any{}
		}
		if err := tc.c.Do(t.Context(), tc.method, tc.path, body, nil); !kube.IsCode(err, http.StatusForbidden) {
			t.Errorf("%s %s %s: want 403, got %v", tc.who, tc.method, tc.path, err)
		}
	}
}
