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
	e := newEnv(t, sandbox.Options{DiskBytes: 1 << 30, DiskInodes: 100000, ReadOnlyRoot: true, WritePaths: []string{"/home/user"}})
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
		if cfg.DiskBytes != c.disk || cfg.DiskInodes != 100000 || !cfg.ReadOnlyRoot || !slices.Equal(cfg.WritablePaths, []string{"/home/user"}) {
			t.Errorf("%s: backend config disk %d inodes %d read-only %v paths %v", c.info.Name, cfg.DiskBytes, cfg.DiskInodes, cfg.ReadOnlyRoot, cfg.WritablePaths)
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
