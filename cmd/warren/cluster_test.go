package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/kube"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// TestServeCluster: two real 'warren serve' processes in node mode
// register with a real API server, each with its capacity and endpoint;
// 'warren controller' places a Sandbox on the one its selector names; the
// node stopped by SIGTERM stops renewing, and the controller marks its
// sandbox lost. make test-kube runs it.
func TestServeCluster(t *testing.T) {
	if !testenv.KubeEnabled() {
		t.Skip("needs a real API server: run make test-kube (WARREN_TEST_KUBE=1)")
	}
	k, err := testenv.StartKube()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := k.Close(); err != nil {
			t.Error(err)
		}
	})
	c, err := kube.Load(k.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ns := "warren-nodes"
	if err := c.Do(t.Context(), http.MethodPost, "/api/v1/namespaces", map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}}, nil); err != nil {
		t.Fatal(err)
	}
	urls := map[string]string{}
	var stopA func()
	for _, name := range []string{"node-a", "node-b"} {
		url, srv, _ := startServe(t, stateDir(t), "--dev", "--cluster", k.Kubeconfig, "--cluster-namespace", ns,
			"--node-name", name, "--node-label", "zone="+name, "--lease-duration", "2s")
		urls[name] = strings.TrimPrefix(url, "http://")
		var stopped bool
		stop := func() {
			if !stopped {
				stopped = true
				stopServe(t, srv)
			}
		}
		t.Cleanup(stop) // also when the test fails before stopping it
		if name == "node-a" {
			stopA = stop
		}
	}
	for name, endpoint := range urls {
		var l kube.Lease
		if err := c.Do(t.Context(), http.MethodGet, "/apis/coordination.k8s.io/v1/namespaces/"+ns+"/leases/"+name, nil, &l); err != nil {
			t.Fatal(err)
		}
		var info kube.NodeInfo
		if err := json.Unmarshal([]byte(l.Metadata.Annotations[kube.CapacityAnnotation]), &info); err != nil {
			t.Fatal(err)
		}
		if l.Spec.HolderIdentity != name || l.Spec.LeaseDurationSeconds != 2 || info.Endpoint != endpoint || info.MemoryMiB <= 0 || info.CPUs <= 0 ||
			info.Sandboxes <= 0 || !slices.Contains(info.Tiers, "native") || info.Labels["zone"] != name {
			t.Fatalf("%s: lease %+v, info %+v", name, l.Spec, info)
		}
	}
	// The Sandbox CRD is not needed to register; the controller needs it.
	if err := k.Apply(t.Context(), "packaging/kubernetes/sandbox-crd.yaml"); err != nil {
		t.Fatal(err)
	}
	sb := map[string]any{"apiVersion": kube.APIVersion, "kind": "Sandbox", "metadata": map[string]any{"name": "on-a"},
		"spec": map[string]any{"image": "python", "nodeSelector": map[string]any{"zone": "node-a"}}}
	if err := c.Do(t.Context(), http.MethodPost, "/apis/warren.dev/v1alpha1/namespaces/default/sandboxes", sb, nil); err != nil {
		t.Fatal(err)
	}
	// The controller as it is deployed: 'warren controller', a process.
	ctl := warren(t, stateDir(t), "controller", "--cluster", k.Kubeconfig, "--cluster-namespace", ns, "--period", "200ms")
	if err := ctl.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopServe(t, ctl) })
	status := func() kube.SandboxStatus {
		var s kube.Sandbox
		if err := c.Do(t.Context(), http.MethodGet, "/apis/warren.dev/v1alpha1/namespaces/default/sandboxes/on-a", nil, &s); err != nil {
			t.Fatal(err)
		}
		return s.Status
	}
	waitFor(t, 10*time.Second, "the sandbox placed", func() error {
		if s := status(); s.Phase == "" {
			return errors.New("no status yet")
		}
		return nil
	})
	if s := status(); s.Phase != kube.PhasePlaced || s.Node != "node-a" || s.Tier != "native" {
		t.Fatalf("placed: %+v", s)
	}
	stopA()
	start := time.Now()
	waitFor(t, 10*time.Second, "the stopped node's sandbox marked lost", func() error {
		if s := status(); s.Phase != kube.PhaseLost {
			return fmt.Errorf("status %+v", s)
		}
		return nil
	})
	t.Logf("a stopped node's sandbox marked lost %v after SIGTERM (lease 2s)", time.Since(start).Round(10*time.Millisecond))
}

func waitFor(t *testing.T, limit time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, limit, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestClusterFlags: node mode's flags are checked before the server
// starts anything, every problem at once.
func TestClusterFlags(t *testing.T) {
	ok := clusterFlags{kubeconfig: "k", node: "node-a", namespace: "warren-system", lease: 10 * time.Second, labels: stringList{"zone=a", "gpu="}}
	labels, err := ok.validate()
	if err != nil || labels["zone"] != "a" || labels["gpu"] != "" || len(labels) != 2 {
		t.Fatalf("valid flags: %v %v", labels, err)
	}
	if labels, err := (&clusterFlags{node: "Bad Name"}).validate(); err != nil || labels != nil {
		t.Fatalf("node mode off: nothing is checked: %v %v", labels, err)
	}
	bad := clusterFlags{kubeconfig: "k", node: "Node_A", namespace: "-x", lease: 500 * time.Millisecond, labels: stringList{"novalue", "=v", "k=" + strings.Repeat("v", 64)}}
	_, err = bad.validate()
	for _, want := range []string{`--node-name "Node_A"`, `--cluster-namespace "-x"`, "--lease-duration 500ms", `--node-label "novalue"`, `--node-label "=v"`, `--node-label "k=vvv`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %s", err, want)
		}
	}
	// The server refuses to start, saying why.
	r := run(t, warren(t, stateDir(t), "serve", "--dev", "--listen", "127.0.0.1:0", "--keep-file-max", "--cluster", "/nonexistent", "--node-name", "Bad_Name"), "")
	if r.code == 0 || !strings.Contains(r.stderr, `--node-name "Bad_Name"`) {
		t.Fatalf("serve with a bad node name: %+v", r)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"controller"}, "--cluster is required"},
		{[]string{"controller", "--cluster", "k", "--period", "1ms"}, "--period 1ms: want 10ms to 1h"},
		{[]string{"controller", "--cluster", "/nonexistent"}, "--cluster: kubeconfig: open /nonexistent"},
	} {
		if r := run(t, warren(t, stateDir(t), c.args...), ""); r.code == 0 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("warren %q: %+v, want an error with %q", c.args, r, c.want)
		}
	}
	if got := tierNames("gvisor", map[string]sandbox.Tier{"native": {}, "gvisor": {}}); !slices.Equal(got, []string{"gvisor", "native"}) {
		t.Errorf("tier names %v: want the default first", got)
	}
}
