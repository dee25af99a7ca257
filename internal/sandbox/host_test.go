package sandbox

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/testenv"
)

func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, text := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// kernel is a /proc of a 24 GiB host with the kernel's default limits.
var kernel = map[string]string{
	"meminfo":                "MemTotal:       24683620 kB\nMemFree:  1 kB\n",
	"sys/kernel/pid_max":     "32768\n",
	"sys/kernel/threads-max": "192729\n",
	"sys/kernel/pty/max":     "4096\n",
	"sys/kernel/pty/reserve": "1024\n",
	"sys/fs/file-max":        "2466160\n",
	"sys/fs/nr_open":         "1048576\n",
}

// TestReadHost: the host's figures come from /proc, lowered by the
// limits of the cgroup the server runs in or one above it, on cgroup v1
// and v2.
func TestReadHost(t *testing.T) {
	for _, tc := range []struct {
		name   string
		groups string
		cg     map[string]string
		mem    int64
		cpus   float64
	}{
		{"no limits", "0::/\n", nil, 24683620 << 10, float64(runtime.NumCPU())},
		{"v2, limits above", "0::/svc/warren\n", map[string]string{
			"svc/warren/memory.max": "max\n", "svc/memory.max": "4294967296\n",
			"svc/warren/cpu.max": "50000 100000\n", "cpu.max": "max 100000\n",
		}, 4 << 30, min(0.5, float64(runtime.NumCPU()))},
		{"v1", "4:memory:/warren\n1:cpu,cpuacct:/warren\n0::/\n", map[string]string{
			"memory/warren/memory.limit_in_bytes": "2147483648\n", "memory/memory.limit_in_bytes": "9223372036854771712\n",
			"cpu,cpuacct/warren/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/warren/cpu.cfs_period_us": "100000\n",
		}, 2 << 30, float64(runtime.NumCPU())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proc, cg := t.TempDir(), t.TempDir()
			writeFiles(t, proc, kernel)
			writeFiles(t, proc, map[string]string{"self/cgroup": tc.groups})
			writeFiles(t, cg, tc.cg)
			h, err := readHost(proc, cg)
			if err != nil {
				t.Fatal(err)
			}
			want := Host{MemoryBytes: tc.mem, CPUs: tc.cpus, Pids: 32768, Ptys: 3072, FileMax: 2466160, NrOpen: 1048576}
			if h != want {
				t.Errorf("host %+v, want %+v", h, want)
			}
		})
	}
	t.Run("missing figure", func(t *testing.T) {
		proc := t.TempDir()
		writeFiles(t, proc, map[string]string{"meminfo": kernel["meminfo"]})
		if _, err := readHost(proc, t.TempDir()); err == nil {
			t.Error("a /proc without the limits was read without an error")
		}
	})
}

// TestHostCapacityAndLimits: an eighth of each figure is kept for the
// host; the default caps and settings follow from the rest.
func TestHostCapacityAndLimits(t *testing.T) {
	h := Host{MemoryBytes: 24 << 30, CPUs: 2, Pids: 32768, Ptys: 3072, FileMax: 2466160, NrOpen: 1048576}
	c := h.Capacity(DefaultCPUOvercommit)
	want := Capacity{MemoryBytes: 21 << 30, CPUs: 16, Pids: 28672, Ptys: 2688, Files: 2466160 - 2466160/8}
	if c != want {
		t.Errorf("capacity %+v, want %+v", c, want)
	}
	// 2157890 files over 28672 pids: 75 per pid, raised to the floor of 128.
	l := h.Limits()
	if wantL := (Limits{MaxMemoryMiB: 21 << 10 / 4, MaxCPUs: 2, Pids: 1024, OpenFiles: 128}); l != wantL {
		t.Errorf("limits %+v, want %+v", l, wantL)
	}
	if n := h.FileMaxNeeded(); n != 24<<30/FileBytes {
		t.Errorf("file-max needed: %d", n)
	}
	h.FileMax = 1 << 40
	if l := h.Limits(); l.OpenFiles != 1024 {
		t.Errorf("open files on a host with files to spare: %d, want the ceiling 1024", l.OpenFiles)
	}
}

// TestWriteFileMax: SetFileMax's write lands in fs.file-max, as a number.
func TestWriteFileMax(t *testing.T) {
	root := t.TempDir()
	writeFiles(t, root, kernel)
	if err := writeFileMax(root, 1<<27); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "sys/fs/file-max")); string(b) != "134217728" {
		t.Errorf("fs.file-max: %q", b)
	}
	if err := writeFileMax(filepath.Join(root, "none"), 1); err == nil {
		t.Error("a missing fs.file-max: no error")
	}
}

// TestKernelLimitsNeeded: the pty and pid figures the server raises the
// kernel's to hold exactly --max-running sandboxes once the host's eighth
// is kept; the write adds the kernel's pty reserve and refuses past the
// kernel's largest.
func TestKernelLimitsNeeded(t *testing.T) {
	for _, n := range []int64{1, 7, 8, 4096, 16000, 294912} {
		f := Needed(n)
		if keep := f - f/HostReserve; keep < n || f > 1 && (f-1)-(f-1)/HostReserve >= n {
			t.Errorf("Needed(%d) = %d: keeps %d; want the least figure keeping %d", n, f, keep, n)
		}
	}
	h := Host{Ptys: PtysNeeded(256), Pids: PidsNeeded(1000, 32)}
	if c := h.Capacity(1); c.Ptys != 256*16 || c.Pids != 1000*(32+128) {
		t.Errorf("capacity at the figures needed: ptys %d (want %d), pids %d (want %d)", c.Ptys, 256*16, c.Pids, 1000*160)
	}
	root := t.TempDir()
	writeFiles(t, root, kernel)
	n, err := writePtyMax(root, PtysNeeded(256))
	if b, _ := os.ReadFile(filepath.Join(root, "sys/kernel/pty/max")); err != nil || n != 5705 || strings.TrimSpace(string(b)) != "5705" {
		t.Errorf("kernel.pty.max for 256 sandboxes: wrote %d %q, %v; want 5705 (4681 and the reserve of 1024)", n, b, err)
	}
	if _, err := writePtyMax(root, MaxPtyMax); err == nil {
		t.Error("kernel.pty.max past the kernel's largest: no error")
	}
}

// TestFileBytesIsTheLeast: FileBytes is no more than what a struct file
// costs on this kernel (its filp slab object), so that FileMaxNeeded is
// never below what sandboxes' memory can hold open.
func TestFileBytesIsTheLeast(t *testing.T) {
	testenv.RequireRoot(t)
	b, err := os.ReadFile("/proc/slabinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		// name active_objs num_objs objsize ...
		if f := strings.Fields(l); len(f) > 3 && f[0] == "filp" {
			size, err := strconv.Atoi(f[3])
			if err != nil || size < FileBytes {
				t.Fatalf("a struct file costs %q bytes here, less than FileBytes %d: %s", f[3], FileBytes, l)
			}
			return
		}
	}
	t.Fatal("no filp cache in /proc/slabinfo")
}
