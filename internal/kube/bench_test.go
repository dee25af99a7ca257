package kube_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/kube"
)

// BenchmarkPlace1000 is the design's target: the controller places 1000
// Sandboxes across 8 nodes (≤ 10 s), against the real API server. Each
// iteration's Sandboxes are created with the timer stopped; the time is
// the passes until all are placed. make test-kube's API server:
//
//	WARREN_TEST_KUBE=1 go test -run '^$' -bench Place1000 -benchtime 3x ./internal/kube
func BenchmarkPlace1000(b *testing.B) {
	if cluster == nil {
		b.Skip("needs a real API server: WARREN_TEST_KUBE=1")
	}
	c, err := kube.Load(cluster.Kubeconfig)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		leases, ns := namespace(b, c), namespace(b, c)
		for n := range 8 {
			r := &kube.Registrar{Client: c, Namespace: leases, Node: fmt.Sprintf("node-%d", n),
				Info: kube.NodeInfo{MemoryMiB: 128 << 10, CPUs: 64, Sandboxes: 200, Tiers: []string{"native", "gvisor"}}}
			if err := r.Register(b.Context()); err != nil {
				b.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		errs := make(chan error, 1000)
		sem := make(chan struct{}, 16)
		for j := range 1000 {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				obj := map[string]any{"apiVersion": kube.APIVersion, "kind": "Sandbox", "metadata": map[string]any{"name": fmt.Sprintf("s%d", j)},
					"spec": map[string]any{"image": "python", "resources": map[string]any{"memoryMiB": 256 * (1 + j%4), "cpus": 0.25}}}
				if err := c.Do(b.Context(), http.MethodPost, sandboxPath(ns, ""), obj, nil); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		ctl := &kube.Controller{Client: c, Namespace: leases, SandboxNamespace: ns}
		b.StartTimer()
		start := time.Now()
		for passes := 1; ; passes++ {
			if err := ctl.Reconcile(b.Context()); err != nil {
				b.Fatal(err)
			}
			var l kube.SandboxList
			b.StopTimer()
			if err := c.Do(b.Context(), http.MethodGet, sandboxPath(ns, ""), nil, &l); err != nil {
				b.Fatal(err)
			}
			placed := 0
			for _, s := range l.Items {
				if s.Status.Phase == kube.PhasePlaced {
					placed++
				}
			}
			b.StartTimer()
			if placed == 1000 {
				b.ReportMetric(float64(passes), "passes")
				b.Logf("1000 sandboxes placed on 8 nodes in %v (%d passes)", time.Since(start).Round(time.Millisecond), passes)
				break
			}
			if passes > 20 {
				b.Fatalf("only %d of 1000 placed after 20 passes", placed)
			}
		}
	}
}
