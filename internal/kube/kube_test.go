package kube_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/kube"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// cluster is the control plane every test against a real API server
// shares (one per test binary: ~4 s to start, ~330 MB); each test works in
// namespaces of its own.
var cluster *testenv.Kube

func TestMain(m *testing.M) {
	if testenv.KubeEnabled() {
		var err error
		if cluster, err = testenv.StartKube(); err == nil {
			err = installCRD()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "kube tests: start the control plane:", err)
			if cluster != nil {
				_ = cluster.Close()
			}
			os.Exit(1)
		}
	}
	code := m.Run()
	if cluster != nil {
		if err := cluster.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "kube tests: stop the control plane:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// needCluster skips a test that needs the API server unless the kube
// tests run (make test-kube).
func needCluster(t *testing.T) *kube.Client {
	t.Helper()
	if cluster == nil {
		t.Skip("needs a real API server: run make test-kube (WARREN_TEST_KUBE=1)")
	}
	c, err := kube.Load(cluster.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// installCRD creates the shipped Sandbox CRD.
func installCRD() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return cluster.Apply(ctx, "packaging/kubernetes/sandbox-crd.yaml")
}

var namespaces atomic.Int64

// namespace creates a namespace for the test. Without a controller
// manager namespaces are never finalized, so it is left: the control
// plane goes with the test binary.
func namespace(t testing.TB, c *kube.Client) string {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 50 {
		name = name[:50]
	}
	name = strings.Trim(name, "-") + fmt.Sprintf("-%d", namespaces.Add(1))
	ns := map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": name}}
	if err := c.Do(t.Context(), http.MethodPost, "/api/v1/namespaces", ns, nil); err != nil {
		t.Fatal(err)
	}
	return name
}

func sandboxPath(ns, name string) string {
	p := "/apis/warren.dev/v1alpha1/namespaces/" + ns + "/sandboxes"
	if name != "" {
		p += "/" + name
	}
	return p
}

// createSandbox creates a Sandbox with spec (JSON-like) and returns it.
func createSandbox(t *testing.T, c *kube.Client, ns, name string, spec map[string]any) error {
	t.Helper()
	obj := map[string]any{"apiVersion": kube.APIVersion, "kind": "Sandbox",
		"metadata": map[string]any{"name": name}, "spec": spec}
	return c.Do(t.Context(), http.MethodPost, sandboxPath(ns, ""), obj, nil)
}

func getSandbox(t *testing.T, c *kube.Client, ns, name string) kube.Sandbox {
	t.Helper()
	var s kube.Sandbox
	if err := c.Do(t.Context(), http.MethodGet, sandboxPath(ns, name), nil, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestCRDRefusesBadSpecs: the shipped schema refuses malformed requests
// at the API server, and a placed request cannot be changed.
func TestCRDRefusesBadSpecs(t *testing.T) {
	c := needCluster(t)
	ns := namespace(t, c)
	bad := map[string]map[string]any{
		"no image":          {"tier": "native"},
		"empty image":       {"image": ""},
		"image with space":  {"image": "python 3"},
		"unknown tier":      {"image": "python", "tier": "vm"},
		"memory too small":  {"image": "python", "resources": map[string]any{"memoryMiB": 1}},
		"memory not number": {"image": "python", "resources": map[string]any{"memoryMiB": "lots"}},
		"cpus too many":     {"image": "python", "resources": map[string]any{"cpus": 1000}},
		"cpus zero":         {"image": "python", "resources": map[string]any{"cpus": 0}},
		"cpus below 0.01":   {"image": "python", "resources": map[string]any{"cpus": 0.005}},
		"cpus negative":     {"image": "python", "resources": map[string]any{"cpus": -1}},
		"egress not a list": {"image": "python", "egress": map[string]any{"allow": "pypi.org"}},
		"egress too long":   {"image": "python", "egress": map[string]any{"allow": []string{strings.Repeat("a", 300)}}},
		"bad secret name":   {"image": "python", "secrets": []string{"a b"}},
		"bad workspace":     {"image": "python", "workspace": "Not_A_Name"},
		"label too long":    {"image": "python", "labels": map[string]any{"team": strings.Repeat("x", 64)}},
		"label not string":  {"image": "python", "labels": map[string]any{"team": map[string]any{}}},
	}
	i := 0
	for name, spec := range bad {
		t.Run(name, func(t *testing.T) {
			i++
			err := createSandbox(t, c, ns, fmt.Sprintf("bad-%d", i), spec)
			if !kube.IsCode(err, http.StatusUnprocessableEntity) {
				t.Fatalf("spec %v: want 422 Invalid, got %v", spec, err)
			}
		})
	}
	good := map[string]any{"image": "python", "tier": "gvisor",
		"resources": map[string]any{"memoryMiB": 512, "cpus": 0.5},
		"egress":    map[string]any{"allow": []string{"pypi.org", "10.0.0.0/8"}},
		"secrets":   []string{"OPENAI_KEY"}, "workspace": "ws-1",
		"labels": map[string]any{"team": "ml"}, "nodeSelector": map[string]any{"zone": "a"}}
	if err := createSandbox(t, c, ns, "good", good); err != nil {
		t.Fatalf("a valid spec refused: %v", err)
	}
	s := getSandbox(t, c, ns, "good")
	if s.Spec.Resources.CPUs != 0.5 || s.Spec.Egress == nil || len(s.Spec.Egress.Allow) != 2 || s.Spec.NodeSelector["zone"] != "a" {
		t.Fatalf("stored spec %+v", s.Spec)
	}
	for what, change := range map[string]func(*kube.SandboxSpec){
		"image":        func(s *kube.SandboxSpec) { s.Image = "node" },
		"tier":         func(s *kube.SandboxSpec) { s.Tier = "native" },
		"tier removed": func(s *kube.SandboxSpec) { s.Tier = "" },
		"resources":    func(s *kube.SandboxSpec) { s.Resources.MemoryMiB = 1024 },
		"workspace":    func(s *kube.SandboxSpec) { s.Workspace = "ws-2" },
	} {
		changed := s
		change(&changed.Spec)
		err := c.Do(t.Context(), http.MethodPut, sandboxPath(ns, "good"), &changed, nil)
		if !kube.IsCode(err, http.StatusUnprocessableEntity) || !strings.Contains(err.Error(), "immutable") {
			t.Errorf("changing the %s: want 422 immutable, got %v", what, err)
		}
	}
	// Labels may change.
	s.Spec.Labels["team"] = "infra"
	if err := c.Do(t.Context(), http.MethodPut, sandboxPath(ns, "good"), &s, nil); err != nil {
		t.Errorf("changing a label: %v", err)
	}
}

func lease(t *testing.T, c *kube.Client, ns, name string) kube.Lease {
	t.Helper()
	var l kube.Lease
	if err := c.Do(t.Context(), http.MethodGet, "/apis/coordination.k8s.io/v1/namespaces/"+ns+"/leases/"+name, nil, &l); err != nil {
		t.Fatal(err)
	}
	return l
}

// TestNodeRegistration: a node's Lease carries its capacity, is renewed
// while it runs, taken over by its next run, and left alone after it stops.
func TestNodeRegistration(t *testing.T) {
	c := needCluster(t)
	ns := namespace(t, c)
	info := kube.NodeInfo{Endpoint: "127.0.0.1:5555", MemoryMiB: 4096, CPUs: 4, Sandboxes: 10, Tiers: []string{"native", "gvisor"}, Labels: map[string]string{"zone": "a"}}
	r := &kube.Registrar{Client: c, Namespace: ns, Node: "node-a", Info: info, Duration: 3 * time.Second}
	if err := r.Register(t.Context()); err != nil {
		t.Fatal(err)
	}
	l := lease(t, c, ns, "node-a")
	if l.Spec.HolderIdentity != "node-a" || l.Spec.LeaseDurationSeconds != 3 || l.Metadata.Labels[kube.NodeLabel] != "true" {
		t.Fatalf("lease %+v", l)
	}
	var got kube.NodeInfo
	if err := json.Unmarshal([]byte(l.Metadata.Annotations[kube.CapacityAnnotation]), &got); err != nil || got.MemoryMiB != 4096 || got.Tiers[1] != "gvisor" || got.Labels["zone"] != "a" {
		t.Fatalf("capacity %q: %v", l.Metadata.Annotations[kube.CapacityAnnotation], err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	// Renewed every second (a third of 3 s).
	deadline := time.Now().Add(5 * time.Second)
	for lease(t, c, ns, "node-a").Metadata.ResourceVersion == l.Metadata.ResourceVersion {
		if time.Now().After(deadline) {
			t.Fatal("the lease was not renewed within 5s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	renewed := lease(t, c, ns, "node-a")
	if !renewed.Spec.RenewTime.After(l.Spec.RenewTime.Time) {
		t.Fatalf("renew time %v not after %v", renewed.Spec.RenewTime, l.Spec.RenewTime)
	}
	cancel()
	<-done
	stopped := lease(t, c, ns, "node-a")
	time.Sleep(1500 * time.Millisecond)
	if after := lease(t, c, ns, "node-a"); after.Metadata.ResourceVersion != stopped.Metadata.ResourceVersion {
		t.Fatal("the lease was renewed after Run returned")
	}
	// The node's next run takes its Lease over.
	r2 := &kube.Registrar{Client: c, Namespace: ns, Node: "node-a", Info: info, Duration: 3 * time.Second}
	if err := r2.Register(t.Context()); err != nil {
		t.Fatalf("re-register: %v", err)
	}
	for _, bad := range []*kube.Registrar{
		{Client: c, Namespace: ns, Node: "Node_A"},
		{Client: c, Namespace: "Bad NS", Node: "node-b"},
		{Client: c, Namespace: ns, Node: "node-b", Duration: time.Millisecond},
	} {
		if err := bad.Register(t.Context()); err == nil {
			t.Errorf("registrar %+v: registered", bad)
		}
	}
}
