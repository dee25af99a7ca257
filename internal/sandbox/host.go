package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/oci"
)

// Host is what the machine offers sandboxes, read once at start-up.
type Host struct {
	// MemoryBytes is MemTotal, or the memory limit of the cgroup this
	// process runs in (or of one above it) when lower: sandbox cgroups
	// are made beneath it, so that limit is theirs too.
	MemoryBytes int64
	// CPUs is the CPUs this process may run on, or its cgroup's CPU quota
	// when lower.
	CPUs float64
	// Pids is kernel.pid_max, or kernel.threads-max when lower.
	Pids int64
	// Ptys is kernel.pty.max less kernel.pty.reserve, which the kernel
	// keeps for the host's own devpts: what every other devpts instance
	// (each sandbox has one) shares.
	Ptys int64
	// FileMax is fs.file-max, the open files of the whole host.
	FileMax int64
	// NrOpen is fs.nr_open, the largest RLIMIT_NOFILE the kernel allows.
	NrOpen int64
}

// HostReserve is the part of each host figure kept out of the sandboxes'
// capacity, for the host and the server itself: one eighth.
const HostReserve = 8

// DefaultCPUOvercommit is the default factor between the CPUs granted to
// running sandboxes together and the host's. A CPU limit is a ceiling,
// not a reservation: sandboxes that are busy at once share the CPUs, and
// none fails for it. The factor bounds how much they share: with 8, every
// sandbox still gets at least an eighth of its limit when all are busy.
const DefaultCPUOvercommit = 8

// ReadHost reads the host's figures from /proc and the cgroup file
// system.
func ReadHost() (Host, error) { return readHost("/proc", "/sys/fs/cgroup") }

func readHost(proc, cgroupRoot string) (Host, error) {
	var h Host
	var errs []error
	num := func(path string) int64 {
		n, err := readInt(filepath.Join(proc, path))
		if err != nil {
			errs = append(errs, err)
		}
		return n
	}
	h.MemoryBytes = memTotal(filepath.Join(proc, "meminfo"), &errs)
	h.Pids = min(num("sys/kernel/pid_max"), num("sys/kernel/threads-max"))
	h.Ptys = num("sys/kernel/pty/max") - num("sys/kernel/pty/reserve")
	h.FileMax = num("sys/fs/file-max")
	h.NrOpen = num("sys/fs/nr_open")
	h.CPUs = float64(runtime.NumCPU())
	if err := errors.Join(errs...); err != nil {
		return Host{}, fmt.Errorf("read the host's limits: %w", err)
	}
	// The cgroup's limits only lower the figures; one that cannot be read
	// leaves them as the kernel's.
	if groups, err := os.ReadFile(filepath.Join(proc, "self/cgroup")); err == nil { //nolint:gosec // G304: /proc/self/cgroup
		if l := cgroupMemoryLimit(cgroupRoot, string(groups)); l > 0 && l < h.MemoryBytes {
			h.MemoryBytes = l
		}
		if q := cgroupCPUQuota(cgroupRoot, string(groups)); q > 0 && q < h.CPUs {
			h.CPUs = q
		}
	}
	return h, nil
}

// Capacity is what h offers the running sandboxes together: each figure
// less HostReserve, and the CPUs times overcommit. Open files are the
// smaller of fs.file-max's part and what the pids can hold.
func (h Host) Capacity(overcommit float64) Capacity {
	keep := func(n int64) int64 { return n - n/HostReserve }
	return Capacity{
		MemoryBytes: keep(h.MemoryBytes),
		CPUs:        h.CPUs * overcommit,
		Pids:        keep(h.Pids),
		Ptys:        keep(h.Ptys),
		Files:       keep(h.FileMax),
	}
}

// MaxPtyMax and MaxPidMax are the largest kernel.pty.max and
// kernel.pid_max the kernel takes (NR_UNIX98_PTY_MAX, PID_MAX_LIMIT).
const (
	MaxPtyMax = 1 << 20
	MaxPidMax = 1 << 22
)

// Needed is the host figure whose Capacity part (the figure less
// HostReserve) is at least n.
func Needed(n int64) int64 {
	f := n + n/(HostReserve-1)
	for f > n && (f-1)-(f-1)/HostReserve >= n {
		f--
	}
	for f-f/HostReserve < n {
		f++
	}
	return f
}

// PtysNeeded is the Ptys figure at which maxRunning sandboxes, each
// holding every terminal its devpts instance allows (oci.MaxPtys), fit the
// capacity. Below it admission refuses starts on ptys before --max-running
// is reached (the boot default, 4096, holds 168).
func PtysNeeded(maxRunning int) int64 { return Needed(int64(maxRunning) * oci.MaxPtys) }

// PidsNeeded is the Pids figure at which maxRunning sandboxes of pids
// each (and their agents' backend.AgentPids) fit the capacity.
func PidsNeeded(maxRunning int, pids int64) int64 {
	return Needed(int64(maxRunning) * (pids + backend.AgentPids))
}

// SetPtyMax sets kernel.pty.max so that the Ptys figure is ptys (the
// kernel's reserve for the host's own devpts comes on top), and returns
// the value written.
func SetPtyMax(ptys int64) (int64, error) { return writePtyMax("/proc", ptys) }

func writePtyMax(proc string, ptys int64) (int64, error) {
	reserve, err := readInt(filepath.Join(proc, "sys/kernel/pty/reserve"))
	if err != nil {
		return 0, err
	}
	n := ptys + reserve
	if n > MaxPtyMax {
		return 0, fmt.Errorf("kernel.pty.max would be %d, above the kernel's largest, %d", n, MaxPtyMax)
	}
	return n, writeSysctl(filepath.Join(proc, "sys/kernel/pty/max"), n)
}

// SetPidMax sets kernel.pid_max to n, at most MaxPidMax, and returns the
// value written.
func SetPidMax(n int64) (int64, error) {
	n = min(n, MaxPidMax)
	return n, writeSysctl("/proc/sys/kernel/pid_max", n)
}

// FileBytes is the least memory an open file costs the sandbox that holds
// it, however it holds it (by a descriptor, as the mapping of a file it
// closed, in flight on a socket): its struct file, a filp slab object of
// 192 bytes on the development kernel (grep '^filp ' /proc/slabinfo),
// which the kernel charges to the memory cgroup of the process that opened
// the file. A descriptor adds its slot, a mapping its vm_area_struct (a
// sandbox pinned a mapped file per 500 bytes of its memory, hostile attempt
// limits/file-table). RLIMIT_NOFILE bounds descriptors only; a sandbox's
// memory limit bounds all of its files.
const FileBytes = 192

// FileMaxNeeded is the fs.file-max at which the host's memory, were it all
// sandboxes' holding open files, could not exhaust the host's open files.
// Running sandboxes are granted at most the memory capacity, so at least a
// HostReserve part of the table stays for the host's own processes, which
// without CAP_SYS_ADMIN (unprivileged users, daemons that dropped it) the
// kernel refuses a file past fs.file-max as it does a sandbox.
func (h Host) FileMaxNeeded() int64 { return h.MemoryBytes / FileBytes }

// SetFileMax raises fs.file-max to n.
func SetFileMax(n int64) error { return writeFileMax("/proc", n) }

func writeFileMax(proc string, n int64) error {
	return writeSysctl(filepath.Join(proc, "sys/fs/file-max"), n)
}

// writeSysctl writes n to the file p of /proc/sys.
func writeSysctl(p string, n int64) error {
	f, err := os.OpenFile(p, os.O_WRONLY, 0) //nolint:gosec // G304: a fixed file under /proc
	if err != nil {
		return err
	}
	_, err = f.WriteString(strconv.FormatInt(n, 10))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}

// Limits are the default caps and settings on h:
//   - a sandbox may ask for a quarter of the memory capacity (at least
//     the default limit), so no one sandbox takes the host, and for
//     every CPU;
//   - it gets backend.DefaultPids pids;
//   - its processes get the open files the host has per pid (fs.file-max
//     over pid_max, between 128 and 1024): a sandbox holds at most pids ×
//     that, so the host's files run out no sooner than its pids, unless
//     the floor of 128 is above the host's share (then the files are
//     what limits the running sandboxes first).
func (h Host) Limits() Limits {
	c := h.Capacity(1)
	l := Limits{
		MaxMemoryMiB: max(c.MemoryBytes/4>>20, backend.DefaultMemoryBytes>>20),
		MaxCPUs:      max(math.Floor(h.CPUs), 1),
		Pids:         backend.DefaultPids,
		OpenFiles:    128,
	}
	if c.Pids > 0 {
		l.OpenFiles = min(max(c.Files/c.Pids, 128), 1024)
	}
	return l
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path) //nolint:gosec // G304: a fixed file under /proc or the cgroup file system
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		// fs.file-max may be larger than an int64 can hold.
		if u, uerr := strconv.ParseUint(s, 10, 64); uerr == nil && u > math.MaxInt64 {
			return math.MaxInt64, nil
		}
		return 0, fmt.Errorf("%s: %q is not a number", path, s)
	}
	return n, nil
}

func memTotal(path string, errs *[]error) int64 {
	f, err := os.Open(path) //nolint:gosec // G304: /proc/meminfo
	if err != nil {
		*errs = append(*errs, err)
		return 0
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	*errs = append(*errs, fmt.Errorf("%s: no MemTotal", path))
	return 0
}

// cgroupDirs are the directories of this process's cgroup and those
// above it, innermost first, in the hierarchy of controller (v1) or the
// unified one (v2; controller ""), from /proc/self/cgroup's text.
func cgroupDirs(root, groups, controller string) []string {
	for _, line := range strings.Split(groups, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var base string
		switch {
		case controller == "" && parts[0] == "0" && parts[1] == "":
			base = root
		case controller != "" && slices.Contains(strings.Split(parts[1], ","), controller):
			base = filepath.Join(root, parts[1])
		default:
			continue
		}
		var dirs []string
		for p := filepath.Clean("/" + parts[2]); ; p = filepath.Dir(p) {
			dirs = append(dirs, filepath.Join(base, p))
			if p == "/" {
				return dirs
			}
		}
	}
	return nil
}

// cgroupMemoryLimit is the lowest memory limit on this process's cgroup
// and those above it; 0 = none.
func cgroupMemoryLimit(root, groups string) int64 {
	var lowest int64
	note := func(n int64, err error) {
		// v1 writes "no limit" as a page-rounded huge number.
		if err == nil && n > 0 && n < 1<<60 && (lowest == 0 || n < lowest) {
			lowest = n
		}
	}
	for _, d := range cgroupDirs(root, groups, "memory") {
		note(readInt(filepath.Join(d, "memory.limit_in_bytes")))
	}
	for _, d := range cgroupDirs(root, groups, "") {
		note(readInt(filepath.Join(d, "memory.max"))) // "max" is no number: no limit
	}
	return lowest
}

// cgroupCPUQuota is the lowest CPU quota (CPUs) on this process's cgroup
// and those above it; 0 = none.
func cgroupCPUQuota(root, groups string) float64 {
	var lowest float64
	note := func(quota, period int64) {
		if quota > 0 && period > 0 {
			if q := float64(quota) / float64(period); lowest == 0 || q < lowest {
				lowest = q
			}
		}
	}
	for _, d := range cgroupDirs(root, groups, "cpu") {
		q, err1 := readInt(filepath.Join(d, "cpu.cfs_quota_us"))
		p, err2 := readInt(filepath.Join(d, "cpu.cfs_period_us"))
		if err1 == nil && err2 == nil {
			note(q, p)
		}
	}
	for _, d := range cgroupDirs(root, groups, "") {
		b, err := os.ReadFile(filepath.Join(d, "cpu.max")) //nolint:gosec // G304: the cgroup file system
		if f := strings.Fields(string(b)); err == nil && len(f) == 2 {
			q, err1 := strconv.ParseInt(f[0], 10, 64) // "max" is no number: no quota
			p, err2 := strconv.ParseInt(f[1], 10, 64)
			if err1 == nil && err2 == nil {
				note(q, p)
			}
		}
	}
	return lowest
}
