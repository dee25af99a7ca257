package netplumb_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/bench"
	"github.com/warren-sandbox/warren/internal/testenv"
	"github.com/warren-sandbox/warren/internal/timerslack"
	"github.com/warren-sandbox/warren/internal/wire"
)

// BenchmarkColdCycleNetwork is the cold-create target measured
// before the backend is wired: create → start → exec true → remove on the
// native backend, alternately as today (loopback only) and with Attach
// after the start and Detach before the remove, on the critical path.
// plain-ms and net-ms are the medians, ratio their quotient.
//
//	go test -run XXX -bench ColdCycleNetwork -benchtime 200x ./internal/netplumb
func BenchmarkColdCycleNetwork(b *testing.B) {
	requireNet(b)
	if err := timerslack.Coarsen(timerslack.Coarse); err != nil {
		b.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "warren-netbench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		b.Fatal(err)
	}
	be, err := native.New(native.Options{DataDir: filepath.Join(dir, "data"), RunDir: filepath.Join(dir, "run"),
		AgentPath: testenv.AgentBinary(b), SpawnerPath: testenv.SpawnerBinary(b), CgroupPrefix: "warren-netbench", ExitWithHost: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = be.Close() })
	img, err := be.HostImage()
	if err != nil {
		b.Fatal(err)
	}
	h := openHost(b, newServices(b).config(""))
	ctx := context.Background()
	seq := 0
	cycle := func(network bool) error {
		seq++
		id := fmt.Sprintf("netbench-%d-%d", os.Getpid(), seq)
		sb, err := be.Create(ctx, backend.Config{ID: id, Image: img, MemoryBytes: backend.DefaultMemoryBytes, CPUs: backend.DefaultCPUs, PidsMax: backend.DefaultPids})
		if err != nil {
			return err
		}
		defer func() { _ = sb.Remove(ctx) }()
		if err := sb.Start(ctx); err != nil {
			return err
		}
		if network {
			ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", sb.(*native.Sandbox).Pid()))
			if err != nil {
				return err
			}
			_, err = h.Attach(id, ns)
			_ = ns.Close()
			if err != nil {
				return err
			}
			defer func() { _ = h.Detach(id) }()
		}
		st, err := sb.Agent().Exec(ctx, &wire.ExecRequest{Argv: []string{"/bin/true"}}, nil)
		if err == nil && st.Code != 0 {
			err = fmt.Errorf("/bin/true exited %d", st.Code)
		}
		return err
	}
	b.ResetTimer()
	plain, withNet, err := bench.Paired(b.N, func() error { return cycle(false) }, func() error { return cycle(true) })
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if err := h.Wait(); err != nil {
		b.Fatal(err)
	}
	p, n := bench.Median(plain), bench.Median(withNet)
	b.ReportMetric(float64(p.Microseconds())/1000, "plain-ms")
	b.ReportMetric(float64(n.Microseconds())/1000, "net-ms")
	b.ReportMetric(float64(n)/float64(p), "ratio")
}
