package sandbox_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

// TestDiskAndWritePaths: the server's disk default reaches sandboxes that
// ask for none, a spec's own disk_mib wins, and the read-only root with
// its write paths reaches every sandbox; a disk request out of bounds is
// refused before anything starts.
func TestDiskAndWritePaths(t *testing.T) {
	e := newEnv(t, sandbox.Options{DiskBytes: 1 << 30, ReadOnlyRoot: true, WritePaths: []string{"/home/user"}})
	m := e.manager(t)
	def := mustStart(t, m, "def", spec)
	own := spec
	own.DiskMiB = 64
	asked := mustStart(t, m, "own", own)
	for _, c := range []struct {
		info sandbox.Info
		disk int64
	}{{def, 1 << 30}, {asked, 64 << 20}} {
		cfg := e.be.Sandbox(c.info.ID).Config()
		if cfg.DiskBytes != c.disk || !cfg.ReadOnlyRoot || !slices.Equal(cfg.WritablePaths, []string{"/home/user"}) {
			t.Errorf("%s: backend config disk %d read-only %v paths %v", c.info.Name, cfg.DiskBytes, cfg.ReadOnlyRoot, cfg.WritablePaths)
		}
	}
	for _, mib := range []int64{-1, 1, backend.MaxDiskBytes>>20 + 1, 1 << 62} {
		bad := spec
		bad.DiskMiB = mib
		if _, err := m.Start(t.Context(), "ns", "bad", bad, false); err == nil || !strings.Contains(err.Error(), "disk") {
			t.Errorf("disk_mib %d: %v, want a disk error", mib, err)
		}
	}
}

// TestNamespaceDisk: with namespace policies, each namespace's disk and
// write-path settings (the configuration's, its defaults filled in) reach
// its sandboxes; a disk request above the namespace's is refused with
// limit, naming both.
func TestNamespaceDisk(t *testing.T) {
	pol := map[string]sandbox.NamespacePolicy{
		"ns":    {DiskBytes: 256 << 20, ReadOnlyRoot: true, WritePaths: []string{"/srv"}},
		"other": {DiskBytes: 1 << 30},
	}
	e := newEnv(t, sandbox.Options{DiskBytes: 8 << 30, Policy: func(ns string) sandbox.NamespacePolicy { return pol[ns] }})
	m := e.manager(t)
	a := mustStart(t, m, "a", spec)
	cfg := e.be.Sandbox(a.ID).Config()
	if cfg.DiskBytes != 256<<20 || !cfg.ReadOnlyRoot || !slices.Equal(cfg.WritablePaths, []string{"/srv"}) {
		t.Errorf("namespace ns: disk %d read-only %v paths %v", cfg.DiskBytes, cfg.ReadOnlyRoot, cfg.WritablePaths)
	}
	small := spec
	small.DiskMiB = 32
	b := mustStart(t, m, "b", small)
	if got := e.be.Sandbox(b.ID).Config().DiskBytes; got != 32<<20 {
		t.Errorf("a request below the namespace's disk: %d", got)
	}
	big := spec
	big.DiskMiB = 512
	_, err := m.Start(t.Context(), "ns", "big", big, true)
	if err == nil || !strings.Contains(err.Error(), `disk 512 MiB is above namespace "ns"'s disk of 256 MiB`) {
		t.Errorf("a request above the namespace's disk: %v", err)
	}
	o, err := m.Start(t.Context(), "other", "o", spec, true)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := e.be.Sandbox(o.ID).Config(); cfg.DiskBytes != 1<<30 || cfg.ReadOnlyRoot {
		t.Errorf("namespace other: disk %d read-only %v", cfg.DiskBytes, cfg.ReadOnlyRoot)
	}
}
