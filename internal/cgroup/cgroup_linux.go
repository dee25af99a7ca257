package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// killTimeout bounds Kill (and the kill step of Destroy).
var killTimeout = 5 * time.Second

// dirOf returns the cgroup's directory holding controller ctrl, or "".
func (c *Cgroup) dirOf(ctrl string) string {
	if i := c.m.hierOf(ctrl); i >= 0 {
		return c.dirs[i]
	}
	return ""
}

// SetLimits replaces the cgroup's limits (zero fields become unlimited).
func (c *Cgroup) SetLimits(l Limits) error {
	if err := c.m.checkLimits(l); err != nil {
		return err
	}
	if err := c.setLimits(l, false); err != nil {
		return fmt.Errorf("cgroup: set limits of %q: %w", c.name, err)
	}
	return nil
}

// setLimits writes l. With skipZero (a fresh cgroup) zero fields are not
// written: the kernel's defaults are already unlimited.
func (c *Cgroup) setLimits(l Limits, skipZero bool) error {
	if c.m.mode == ModeV1 {
		return c.setV1(l, skipZero)
	}
	return c.setV2(l, skipZero)
}

func (c *Cgroup) setV1(l Limits, skipZero bool) error {
	if d := c.dirOf("memory"); d != "" && !(skipZero && l.MemoryBytes == 0) {
		lim, want := int64(-1), int64(math.MaxInt64)
		if l.MemoryBytes > 0 {
			lim, want = l.MemoryBytes, l.MemoryBytes
		}
		limit := filepath.Join(d, "memory.limit_in_bytes")
		memsw := filepath.Join(d, "memory.memsw.limit_in_bytes")
		cur, hasSwap, err := readInt(memsw)
		if err != nil {
			return err
		}
		// The kernel requires limit_in_bytes <= memsw.limit_in_bytes at all
		// times: lower the memory limit first, raise memsw first.
		order := []string{limit, memsw}
		if !hasSwap {
			order = order[:1]
		} else if want > cur {
			order = []string{memsw, limit}
		}
		for _, f := range order {
			if err := writeFile(f, strconv.FormatInt(lim, 10)); err != nil {
				return err
			}
		}
	}
	if d := c.dirOf("cpu"); d != "" && !(skipZero && l.CPUs == 0) {
		quota := int64(-1)
		if l.CPUs > 0 {
			quota = int64(math.Round(l.CPUs * cpuPeriodUs))
			if p, _, err := readInt(filepath.Join(d, "cpu.cfs_period_us")); err != nil {
				return err
			} else if p != cpuPeriodUs {
				if err := writeFile(filepath.Join(d, "cpu.cfs_period_us"), strconv.Itoa(cpuPeriodUs)); err != nil {
					return err
				}
			}
		}
		if err := writeFile(filepath.Join(d, "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10)); err != nil {
			return err
		}
	}
	if d := c.dirOf("pids"); d != "" && c.split {
		if err := c.setSplitPids(d, l); err != nil {
			return err
		}
	} else if d != "" && !(skipZero && l.PidsMax == 0) {
		if err := writeFile(filepath.Join(d, "pids.max"), maxOr(l.PidsMax)); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cgroup) setV2(l Limits, skipZero bool) error {
	d := c.dirs[0]
	if c.m.hierOf("memory") >= 0 && !(skipZero && l.MemoryBytes == 0) {
		if err := writeFile(filepath.Join(d, "memory.max"), maxOr(l.MemoryBytes)); err != nil {
			return err
		}
		swap := "max"
		if l.MemoryBytes > 0 {
			swap = "0"
		}
		if err := writeFile(filepath.Join(d, "memory.swap.max"), swap); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if c.m.hierOf("cpu") >= 0 && !(skipZero && l.CPUs == 0) {
		quota := "max"
		if l.CPUs > 0 {
			quota = strconv.FormatInt(int64(math.Round(l.CPUs*cpuPeriodUs)), 10)
		}
		if err := writeFile(filepath.Join(d, "cpu.max"), quota+" "+strconv.Itoa(cpuPeriodUs)); err != nil {
			return err
		}
	}
	if c.m.hierOf("pids") >= 0 && c.split {
		if err := c.setSplitPids(d, l); err != nil {
			return err
		}
	} else if c.m.hierOf("pids") >= 0 && !(skipZero && l.PidsMax == 0) {
		if err := writeFile(filepath.Join(d, "pids.max"), maxOr(l.PidsMax)); err != nil {
			return err
		}
	}
	return nil
}

// SetIdle puts the cgroup in (or takes it out of) the scheduler's idle
// class (cpu.idle, Linux 5.15+, v1 and v2): its processes run only when
// nothing else wants the CPU. ErrControllerUnavailable when the cpu
// controller or the file is missing.
func (c *Cgroup) SetIdle(idle bool) error {
	d := c.dirOf("cpu")
	if d == "" {
		if err := c.m.controllerErr("cpu"); err != nil {
			return err
		}
		return &controllerError{ctrl: "cpu", reason: "not enabled for this cgroup"}
	}
	v := "0"
	if idle {
		v = "1"
	}
	err := writeFile(filepath.Join(d, "cpu.idle"), v)
	if errors.Is(err, fs.ErrNotExist) {
		// A cgroup that is gone has no cpu.idle either: not a kernel
		// without the file.
		if _, serr := os.Stat(d); serr != nil {
			return fmt.Errorf("cgroup: set idle of %q: %w", c.name, serr)
		}
		return &controllerError{ctrl: "cpu", reason: "no cpu.idle (Linux 5.15 or later)"}
	}
	return err
}

func maxOr(v int64) string {
	if v <= 0 {
		return "max"
	}
	return strconv.FormatInt(v, 10)
}

// Stats reads the cgroup's counters.
func (c *Cgroup) Stats() (Stats, error) {
	var s Stats
	if _, err := os.Stat(c.dirs[0]); err != nil {
		return s, fmt.Errorf("cgroup: stats of %q: %w", c.name, err)
	}
	var errs []error
	num := func(dst *int64, dir, file string, scale int64) {
		if dir == "" {
			return
		}
		v, _, err := readInt(filepath.Join(dir, file))
		errs = append(errs, err)
		*dst = v * scale
	}
	keyed := func(dir, file string) map[string]int64 {
		if dir == "" {
			return nil
		}
		m, err := readKeyed(filepath.Join(dir, file))
		errs = append(errs, err)
		return m
	}
	if c.m.mode == ModeV1 {
		mem := c.dirOf("memory")
		num(&s.MemoryBytes, mem, "memory.usage_in_bytes", 1)
		num(&s.MemoryPeak, mem, "memory.max_usage_in_bytes", 1)
		s.OOMKills = keyed(mem, "memory.oom_control")["oom_kill"]
		num(&s.CPUUsageNs, c.dirOf("cpuacct"), "cpuacct.usage", 1)
		cs := keyed(c.dirOf("cpu"), "cpu.stat")
		s.ThrottledPeriods, s.ThrottledNs = cs["nr_throttled"], cs["throttled_time"]
		num(&s.PidsCurrent, c.dirOf("pids"), "pids.current", 1)
	} else {
		d := c.dirs[0]
		num(&s.MemoryBytes, d, "memory.current", 1)
		num(&s.MemoryPeak, d, "memory.peak", 1)
		s.OOMKills = keyed(d, "memory.events")["oom_kill"]
		cs := keyed(d, "cpu.stat")
		s.CPUUsageNs = cs["usage_usec"] * 1000
		s.ThrottledPeriods, s.ThrottledNs = cs["nr_throttled"], cs["throttled_usec"]*1000
		num(&s.PidsCurrent, d, "pids.current", 1)
	}
	if err := errors.Join(errs...); err != nil {
		return s, fmt.Errorf("cgroup: stats of %q: %w", c.name, err)
	}
	return s, nil
}

// Procs returns the pids of the processes in the cgroup and its descendant
// cgroups, in every hierarchy, sorted. The daemon's own pid is never
// reported (in v1 it shows up while a thread of it is inside, as the tests'
// spawn helper puts one).
func (c *Cgroup) Procs() ([]int, error) {
	pids, err := c.procs()
	if err != nil {
		return nil, fmt.Errorf("cgroup: procs of %q: %w", c.name, err)
	}
	return pids, nil
}

func (c *Cgroup) procs() ([]int, error) {
	self := os.Getpid()
	var out []int
	for _, d := range c.dirs {
		err := walkDirs(d, func(dir string) error {
			ps, err := readPids(filepath.Join(dir, "cgroup.procs"))
			for _, p := range ps {
				if p != self {
					out = append(out, p)
				}
			}
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// Add moves an existing process into the cgroup (every hierarchy; the
// agent's leaf of a split one). Prefer
// a spawn into a SpawnTarget: a process added after it started has already
// run outside.
func (c *Cgroup) Add(pid int) error {
	for _, d := range c.dirs {
		if err := writeFile(filepath.Join(c.leafFor(d), "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			return fmt.Errorf("cgroup: add %d to %q: %w", pid, c.name, err)
		}
	}
	return nil
}

// SpawnTarget is a cgroup opened for starting a process inside it, from
// this process or from another one the files are passed to: the cgroup's
// directory on v2, its tasks files (one per hierarchy) on v1.
type SpawnTarget struct {
	V2    bool
	Files []*os.File
}

// Close closes the target's files.
func (t SpawnTarget) Close() {
	for _, f := range t.Files {
		_ = f.Close()
	}
}

// OpenSpawnTarget opens the cgroup so that a process can be started inside
// it (package spawner passes the files to warren-spawner, which clones into
// the v2 directory or writes its child's pid to each v1 tasks file before
// the child runs); the caller closes it.
func (c *Cgroup) OpenSpawnTarget() (SpawnTarget, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := SpawnTarget{V2: c.m.mode == ModeV2}
	for _, d := range c.dirs {
		d = c.leafFor(d)
		p, flag := filepath.Join(d, "tasks"), os.O_WRONLY
		if t.V2 {
			p, flag = d, os.O_RDONLY|unix.O_DIRECTORY
		}
		f, err := os.OpenFile(p, flag, 0) //nolint:gosec // p is a cgroupfs path built by this package from its own layout
		if err != nil {
			t.Close()
			return SpawnTarget{}, fmt.Errorf("cgroup: spawn in %q: %w", c.name, err)
		}
		t.Files = append(t.Files, f)
		if t.V2 {
			break // one unified hierarchy
		}
	}
	return t, nil
}

// Kill SIGKILLs every process in the cgroup and waits (bounded) until none
// is left. v2 uses cgroup.kill; otherwise Kill freezes the cgroup where it
// can (v2's cgroup.freeze, v1's freezer hierarchy) so
// nothing can fork or exit meanwhile, signals every member, thaws, and
// repeats until the cgroup is empty. Sandboxes do not depend on it: a stop
// kills the sandbox's pid namespace.
func (c *Cgroup) Kill() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.kill()
}

func (c *Cgroup) kill() error {
	deadline := time.Now().Add(killTimeout)
	wait := time.Millisecond
	pause := func() {
		time.Sleep(wait)
		wait = min(2*wait, 20*time.Millisecond)
	}
	useKillFile := false
	if c.m.mode == ModeV2 {
		_, err := os.Stat(filepath.Join(c.dirs[0], "cgroup.kill"))
		useKillFile = err == nil
	}
	freeze, thaw := c.freezer()
	for {
		pids, err := c.procs()
		if err != nil {
			thaw()
			return fmt.Errorf("cgroup: kill %q: %w", c.name, err)
		}
		if len(pids) == 0 {
			thaw()
			return nil
		}
		if time.Now().After(deadline) {
			thaw()
			return fmt.Errorf("cgroup: kill %q: processes %v still alive after %v", c.name, pids, killTimeout)
		}
		if useKillFile {
			if err := writeFile(filepath.Join(c.dirs[0], "cgroup.kill"), "1"); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("cgroup: kill %q: %w", c.name, err)
			}
		} else {
			if freeze() {
				if pids, err = c.procs(); err != nil {
					thaw()
					return fmt.Errorf("cgroup: kill %q: %w", c.name, err)
				}
			}
			for _, p := range pids {
				c.signalMember(p)
			}
			thaw()
		}
		pause()
	}
}

// freezer returns functions freezing and thawing the cgroup; freeze reports
// whether the cgroup reached the frozen state. Without a freezer both are
// no-ops.
func (c *Cgroup) freezer() (freeze func() bool, thaw func()) {
	f, ok := c.freezeFiles()
	if !ok {
		return func() bool { return false }, func() {}
	}
	freeze = func() bool { return c.freezeWait(f, 200*time.Millisecond) == nil }
	thaw = func() { _ = writeFile(f.file, f.off) }
	return freeze, thaw
}

// freezeFiles name the cgroup's freezer: the file written to freeze and
// thaw, and the file that says when freezing is done.
type freezeFiles struct {
	file, on, off     string
	stateFile, frozen string // the line of stateFile when frozen
}

// freezeFiles returns the cgroup's freezer files; false when it has none
// (v1 without the freezer hierarchy).
func (c *Cgroup) freezeFiles() (freezeFiles, bool) {
	if c.m.mode == ModeV1 {
		d := c.dirOf("freezer")
		if d == "" {
			return freezeFiles{}, false
		}
		f := filepath.Join(d, "freezer.state")
		return freezeFiles{file: f, on: "FROZEN", off: "THAWED", stateFile: f, frozen: "FROZEN"}, true
	}
	d := c.dirs[0]
	return freezeFiles{file: filepath.Join(d, "cgroup.freeze"), on: "1", off: "0",
		stateFile: filepath.Join(d, "cgroup.events"), frozen: "frozen 1"}, true
}

// freezeWait asks the kernel to freeze the cgroup and waits until every
// task is frozen, at most timeout. It checks without sleeping for the first
// millisecond (an idle cgroup freezes in tens of microseconds, less than a
// sleep takes to come back), then at growing intervals.
func (c *Cgroup) freezeWait(f freezeFiles, timeout time.Duration) error {
	if err := writeFile(f.file, f.on); err != nil {
		return err
	}
	start := time.Now()
	end := start.Add(timeout)
	wait := 50 * time.Microsecond
	for {
		b, err := os.ReadFile(f.stateFile) //nolint:gosec // stateFile is a cgroupfs path built by this package from its own layout
		if err != nil {
			return err
		}
		if slices.Contains(strings.Split(strings.TrimSpace(string(b)), "\n"), f.frozen) {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("not frozen after %v (%s: %q)", timeout, filepath.Base(f.stateFile), strings.TrimSpace(string(b)))
		}
		if time.Since(start) < time.Millisecond {
			runtime.Gosched()
			continue
		}
		time.Sleep(wait)
		wait = min(2*wait, 5*time.Millisecond)
	}
}

// Freeze stops every process of the cgroup (and of its descendants) where
// it is, through the freezer (v1 freezer.state, v2 cgroup.freeze): they
// keep their memory and get no CPU until Thaw. It returns once all are
// frozen; if that takes longer than timeout it thaws the cgroup again and
// fails. ErrControllerUnavailable without a freezer.
func (c *Cgroup) Freeze(timeout time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, err := c.freezeFilesOrErr()
	if err != nil {
		return err
	}
	c.m.anchorFreezer()
	if err := c.freezeWait(f, timeout); err != nil {
		_ = writeFile(f.file, f.off)
		return fmt.Errorf("cgroup: freeze %q: %w", c.name, err)
	}
	return nil
}

// Thaw lets the processes of a frozen cgroup run again (nothing happens to
// one that is not frozen).
func (c *Cgroup) Thaw() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, err := c.freezeFilesOrErr()
	if err != nil {
		return err
	}
	if err := writeFile(f.file, f.off); err != nil {
		return fmt.Errorf("cgroup: thaw %q: %w", c.name, err)
	}
	return nil
}

// Frozen reports whether the cgroup was asked to freeze and not thawed
// since: by this process or an earlier one, so a restarted daemon finds a
// paused sandbox paused. A freeze still under way counts as frozen.
func (c *Cgroup) Frozen() (bool, error) {
	f, err := c.freezeFilesOrErr()
	if err != nil {
		return false, err
	}
	b, err := os.ReadFile(f.file) //nolint:gosec // f.file is a cgroupfs path built by this package from its own layout
	if err != nil {
		return false, fmt.Errorf("cgroup: freezer state of %q: %w", c.name, err)
	}
	return strings.TrimSpace(string(b)) != f.off, nil
}

func (c *Cgroup) freezeFilesOrErr() (freezeFiles, error) {
	f, ok := c.freezeFiles()
	if c.noFreeze {
		return f, &controllerError{ctrl: "freezer", reason: "this cgroup's processes started outside the freezer's hierarchy (a sandbox started by an earlier version: stop and start it)"}
	}
	if !ok {
		if err := c.m.controllerErr("freezer"); err != nil {
			return f, err
		}
		return f, &controllerError{ctrl: "freezer", reason: "not enabled for this cgroup"}
	}
	return f, nil
}

// signalMember SIGKILLs pid if it is (still) in this cgroup. A pidfd pins the
// pid while membership is checked, so a recycled pid is never signalled.
func (c *Cgroup) signalMember(pid int) {
	if pid == os.Getpid() || pid <= 1 {
		return
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err == unix.ENOSYS {
		_ = unix.Kill(pid, unix.SIGKILL)
		return
	}
	if err != nil {
		return // gone
	}
	defer unix.Close(fd)
	if !c.isMember(pid) {
		return
	}
	_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
}

// isMember reports whether /proc/<pid>/cgroup places pid in this cgroup (or
// below) in any hierarchy.
func (c *Cgroup) isMember(pid int) bool {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return false
	}
	cg, err := ParseProcSelf(f)
	_ = f.Close()
	if err != nil {
		return false
	}
	for i, h := range c.m.hiers {
		key := ""
		if c.m.mode == ModeV1 {
			key = h.ctrls[0]
		}
		p, want := cg[key], c.procPath(i)
		if p == want || strings.HasPrefix(p, want+"/") {
			return true
		}
	}
	return false
}

// Destroy kills what is left in the cgroup and removes its directories
// (descendants first) in every hierarchy. Destroying a cgroup that is
// already gone returns nil.
func (c *Cgroup) Destroy() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	// The usual case, a cgroup whose processes have exited and that has
	// no children, goes with one rmdir per hierarchy: the kernel refuses
	// (EBUSY, ENOTEMPTY) a cgroup that still has either, and the full
	// walk below then kills and removes what is there.
	empty := true
	for _, d := range c.dirs {
		if c.split && d == c.splitDir() {
			removeSplit(d)
		}
		if err := unix.Rmdir(d); err != nil && err != unix.ENOENT {
			empty = false
		}
	}
	if empty {
		return nil
	}
	var last error
	for attempt := 0; attempt < 2; attempt++ {
		var errs []error
		if pids, err := c.procs(); err != nil {
			errs = append(errs, err)
		} else if len(pids) > 0 {
			if err := c.kill(); err != nil {
				errs = append(errs, err)
			}
		}
		for _, d := range c.dirs {
			if err := removeTree(d, rmdirTimeout); err != nil {
				errs = append(errs, err)
			}
		}
		if last = errors.Join(errs...); last == nil {
			return nil
		}
	}
	return fmt.Errorf("cgroup: destroy %q: %w", c.name, last)
}

// Rename gives the cgroup a new name under the same prefix, in every
// hierarchy, processes and limits unchanged. A rename moves no process, so
// unlike Add it never waits for the kernel's cgroup-migration lock (on v1 a
// grace period per migration, milliseconds on an idle machine): a process
// spawned ahead of time into a cgroup of its own can be handed to a sandbox
// by renaming. An existing cgroup of the new name is an error matching
// fs.ErrExist; a failed rename leaves the old name in place.
//
// Only cgroup v1 can rename: the kernel refuses to rename a cgroup v2
// directory (EPERM; cgroup2 has no rename operation), so on v2 Rename
// changes nothing and returns ErrRenameUnsupported (which matches
// errors.ErrUnsupported). Manager.CanRename tells beforehand.
func (c *Cgroup) Rename(name string) error {
	if err := validName(name); err != nil {
		return err
	}
	if !c.m.CanRename() {
		return fmt.Errorf("cgroup: rename %q to %q: %w", c.name, name, ErrRenameUnsupported)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	to := make([]string, len(c.dirs))
	for i, d := range c.dirs {
		to[i] = filepath.Join(filepath.Dir(d), name)
		if _, err := os.Stat(to[i]); err == nil {
			return fmt.Errorf("cgroup: rename %q to %q: %w", c.name, name, fs.ErrExist)
		}
	}
	for i, d := range c.dirs {
		if err := os.Rename(d, to[i]); err != nil {
			for j := i - 1; j >= 0; j-- {
				_ = os.Rename(to[j], c.dirs[j])
			}
			return fmt.Errorf("cgroup: rename %q to %q: %w", c.name, name, err)
		}
	}
	c.name, c.dirs = name, to
	return nil
}

// OOMKills is the number of processes the memory limit has killed, read
// from the one file that counts them: cheap enough for every exec.
func (c *Cgroup) OOMKills() (int64, error) {
	f := filepath.Join(c.dirs[0], "memory.events")
	key := "oom_kill"
	if c.m.mode == ModeV1 {
		d := c.dirOf("memory")
		if d == "" {
			return 0, nil
		}
		f = filepath.Join(d, "memory.oom_control")
	}
	m, err := readKeyed(f)
	if err != nil {
		return 0, fmt.Errorf("cgroup: oom kills of %q: %w", c.name, err)
	}
	return m[key], nil
}
