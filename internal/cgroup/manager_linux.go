package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Modes reported by Manager.Mode.
const (
	ModeV1 = "v1"
	ModeV2 = "v2"
)

// cpuPeriodUs is the CFS period used for CPU quotas (100 ms).
const cpuPeriodUs = 100000

// Controllers the Manager uses, per mode.
var (
	// The freezer pauses sandboxes (Cgroup.Freeze); v2 has it built in.
	wantV1 = []string{"memory", "cpu", "cpuacct", "pids", "freezer"}
	wantV2 = []string{"memory", "cpu", "pids"}
)

// ErrControllerUnavailable is matched (errors.Is) by errors reporting that a
// limit needs a controller this host or delegation does not offer.
var ErrControllerUnavailable = errors.New("cgroup controller not available")

type controllerError struct{ ctrl, reason string }

func (e *controllerError) Error() string {
	return "cgroup: controller " + e.ctrl + " not available: " + e.reason
}

func (e *controllerError) Is(target error) bool { return target == ErrControllerUnavailable }

// Limits are the resource limits of one sandbox. A zero field is unlimited.
type Limits struct {
	// MemoryBytes caps memory usage. It also caps memory+swap to the same
	// value (no swap) where the kernel accounts swap.
	MemoryBytes int64
	// CPUs is the CPU bandwidth in CPUs: quota = CPUs * 100ms per 100ms
	// period. The kernel's minimum quota (1ms) makes 0.01 the smallest value.
	CPUs float64
	// PidsMax caps the number of tasks (processes and threads).
	PidsMax int64
	// AgentPids, when > 0 at Create, splits the cgroup into two leaves
	// (see SplitLayout): the agent's, with this pids.max of its own, and
	// the workload's, with PidsMax, so the workload exhausting its pids
	// leaves the agent's threads alone. SetLimits of a split cgroup
	// writes both; of an unsplit one (made without it, or by an older
	// version) it is ignored.
	AgentPids int64
}

// Stats are a sandbox cgroup's counters. Fields whose controller is not
// available are zero.
type Stats struct {
	MemoryBytes      int64 // current memory usage, page cache included
	MemoryPeak       int64 // peak memory usage (v1 max_usage_in_bytes, v2 memory.peak)
	CPUUsageNs       int64 // CPU time consumed by all tasks
	PidsCurrent      int64 // tasks currently in the cgroup
	OOMKills         int64 // processes killed by the OOM killer
	ThrottledPeriods int64 // CFS periods in which the cgroup was throttled
	ThrottledNs      int64 // total time throttled
}

// Feature describes whether a capability is usable, for `warren doctor`.
type Feature struct {
	Name   string // controller or capability, e.g. "memory", "freezer", "cgroup.kill"
	Usable bool
	Reason string // why not, when !Usable
	Note   string // what it means here, when Usable (may be empty)
	Path   string // where it was looked for
}

// hierarchy is one cgroup hierarchy the Manager uses.
type hierarchy struct {
	ctrls  []string // v1: controllers used on this hierarchy; v2: nil
	mount  string   // mount point
	root   string   // root of the mount inside the hierarchy (mountinfo field 4)
	own    string   // this process's cgroup relative to the mount ("/" or "/a/b")
	parent string   // mount/own/prefix: holds the sandbox cgroups
}

// Manager creates and finds sandbox cgroups under <own cgroup>/<prefix>. It is
// safe for concurrent use.
type Manager struct {
	mode    string
	prefix  string
	hiers   []hierarchy
	unavail map[string]string // controller → why it cannot be used
	others  otherHierarchies

	anchorMu sync.Mutex
	anchored bool // the v1 freezer's anchor is in place (anchorFreezer)
}

// anchorName names the v1 freezer's anchor beside the sandbox cgroups; the
// "+" keeps it out of List (validName).
const anchorName = "freeze+anchor"

// anchorFreezer keeps an empty cgroup frozen under the prefix in the v1
// freezer's hierarchy. The v1 freezer turns a kernel static key on when a
// first cgroup starts freezing and off when the last one thaws, and each
// switch patches the kernel's code: milliseconds (5-85 ms measured on the
// build machine) on every pause and resume of the only paused sandbox.
// With the anchor frozen the key stays on and a pause plus resume takes
// tens of microseconds. It is made at the first freeze, so a server that
// never pauses does not have it; a failure only costs that time.
func (m *Manager) anchorFreezer() {
	m.anchorMu.Lock()
	defer m.anchorMu.Unlock()
	i := m.hierOf("freezer")
	if m.anchored || m.mode != ModeV1 || i < 0 {
		return
	}
	d := filepath.Join(m.hiers[i].parent, anchorName)
	if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) { //nolint:gosec // 0755: a cgroup dir holds control files whose modes the kernel sets (root-writable); listing it gives others nothing to change
		return
	}
	m.anchored = writeFile(filepath.Join(d, "freezer.state"), "FROZEN") == nil
}

// removeAnchor thaws and removes the freezer's anchor, when no sandbox
// cgroup is left under the prefix (another Manager of the same prefix may
// be pausing them).
func (m *Manager) removeAnchor() {
	i := m.hierOf("freezer")
	if m.mode != ModeV1 || i < 0 {
		return
	}
	if names, err := m.List(); err != nil || len(names) > 0 {
		return
	}
	m.anchorMu.Lock()
	defer m.anchorMu.Unlock()
	d := filepath.Join(m.hiers[i].parent, anchorName)
	if _, err := os.Stat(d); err != nil {
		return
	}
	_ = writeFile(filepath.Join(d, "freezer.state"), "THAWED")
	_ = rmdirRetry(d, rmdirTimeout)
	m.anchored = false
}

// layout is what detection (or a test) hands to newManager.
type layout struct {
	mode    string
	hiers   []hierarchy // parent is filled by newManager
	unavail map[string]string
	others  otherHierarchies
}

// otherHierarchies are mounted hierarchies v1 mode does not use, for Probe.
type otherHierarchies struct {
	// unified is the mount point of a cgroup2 hierarchy beside the v1
	// ones (a hybrid host), "" if none; unifiedCtrls are the controllers
	// it offers this process's cgroup.
	unified      string
	unifiedCtrls []string
}

// New detects the host's cgroup layout and returns a Manager whose sandbox
// cgroups live under <this process's cgroup>/<prefix> in every hierarchy it
// uses, creating those parent directories (and, on v2, enabling controllers
// in cgroup.subtree_control along the way).
func New(prefix string) (*Manager, error) {
	lay, err := detect()
	if err != nil {
		return nil, err
	}
	return newManager(lay, prefix)
}

func detect() (layout, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return layout{}, fmt.Errorf("cgroup: %w", err)
	}
	self, err := ParseProcSelf(f)
	_ = f.Close()
	if err != nil {
		return layout{}, err
	}
	mf, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return layout{}, fmt.Errorf("cgroup: %w", err)
	}
	mounts, err := parseMountinfo(mf)
	_ = mf.Close()
	if err != nil {
		return layout{}, err
	}

	// v2 if a cgroup2 mount offers one of our controllers to our cgroup.
	var v2 *hierarchy
	for _, e := range mounts {
		if e.fstype != "cgroup2" {
			continue
		}
		p, ok := self[""]
		if !ok {
			break
		}
		own, err := relTo(p, e.root)
		if err != nil {
			continue
		}
		v2 = &hierarchy{mount: e.point, root: e.root, own: own}
		break
	}
	var avail []string
	if v2 != nil {
		avail = readWords(filepath.Join(v2.mount, v2.own, "cgroup.controllers"))
		for _, c := range wantV2 {
			if slices.Contains(avail, c) {
				return layout{mode: ModeV2, hiers: []hierarchy{*v2}}, nil
			}
		}
	}

	// v1 (or hybrid): one hierarchy per mount holding a controller we use.
	lay := layout{mode: ModeV1, unavail: map[string]string{}}
	if v2 != nil {
		lay.others.unified, lay.others.unifiedCtrls = v2.mount, avail
	}
	for _, c := range wantV1 {
		var m *mountEntry
		for i := range mounts {
			if mounts[i].fstype == "cgroup" && slices.Contains(mounts[i].ctrls, c) {
				m = &mounts[i]
				break
			}
		}
		if m == nil {
			lay.unavail[c] = "no cgroup v1 hierarchy with this controller is mounted"
			continue
		}
		p, ok := self[c]
		if !ok {
			lay.unavail[c] = "controller missing from /proc/self/cgroup"
			continue
		}
		own, err := relTo(p, m.root)
		if err != nil {
			lay.unavail[c] = err.Error()
			continue
		}
		idx := slices.IndexFunc(lay.hiers, func(h hierarchy) bool { return h.mount == m.point })
		if idx < 0 {
			lay.hiers = append(lay.hiers, hierarchy{mount: m.point, root: m.root, own: own})
			idx = len(lay.hiers) - 1
		}
		lay.hiers[idx].ctrls = append(lay.hiers[idx].ctrls, c)
	}
	if len(lay.hiers) > 0 {
		return lay, nil
	}
	if v2 != nil {
		return layout{mode: ModeV2, hiers: []hierarchy{*v2}}, nil
	}
	return layout{}, errors.New("cgroup: no usable cgroup v1 or v2 hierarchy is mounted")
}

// relTo makes a /proc/self/cgroup path relative to a mount whose root is root.
func relTo(p, root string) (string, error) {
	switch {
	case root == "/":
		return p, nil
	case p == root:
		return "/", nil
	case strings.HasPrefix(p, root+"/"):
		return p[len(root):], nil
	}
	return "", fmt.Errorf("own cgroup %s is outside the mounted subtree %s", p, root)
}

func newManager(lay layout, prefix string) (*Manager, error) {
	if err := validPrefix(prefix); err != nil {
		return nil, err
	}
	m := &Manager{mode: lay.mode, prefix: prefix, unavail: map[string]string{}, others: lay.others}
	for k, v := range lay.unavail {
		m.unavail[k] = v
	}
	switch lay.mode {
	case ModeV1:
		var failed []error
		for _, h := range lay.hiers {
			h.parent = filepath.Join(h.mount, h.own, prefix)
			if err := os.MkdirAll(h.parent, 0o755); err != nil { //nolint:gosec // 0755: a cgroup dir holds control files whose modes the kernel sets (root-writable); listing it gives others nothing to change
				for _, c := range h.ctrls {
					m.unavail[c] = "cannot create " + h.parent + ": " + errno(err)
				}
				failed = append(failed, err)
				continue
			}
			m.hiers = append(m.hiers, h)
		}
		if len(m.hiers) == 0 {
			return nil, fmt.Errorf("cgroup: no v1 hierarchy is writable: %w", errors.Join(failed...))
		}
	case ModeV2:
		if len(lay.hiers) != 1 {
			return nil, errors.New("cgroup: v2 layout needs exactly one hierarchy")
		}
		h := lay.hiers[0]
		if err := m.setupV2(&h); err != nil {
			return nil, err
		}
		m.hiers = []hierarchy{h}
	default:
		return nil, fmt.Errorf("cgroup: unknown mode %q", lay.mode)
	}
	return m, nil
}

// setupV2 creates <own>/<prefix> and enables the wanted controllers in the
// subtree_control of <own> and of each directory down to the parent.
//
// A cgroup other than the root that holds processes (this one, at least)
// can enable no domain controller (memory) for its children, and enabling
// a threaded one (cpu, pids) there turns it into a thread root, under which
// no cgroup can hold a process at all. So when <own> is such a cgroup,
// nothing is enabled in it: if its parent is delegated to it (systemd's
// Delegate=yes with DelegateSubgroup=, which marks the parent with the
// trusted.delegate or user.delegate xattr) the sandbox cgroups go beside
// <own>, in that parent; otherwise they go below <own> without controllers,
// which are then reported unusable.
func (m *Manager) setupV2(h *hierarchy) error {
	ownDir := filepath.Join(h.mount, h.own)
	if !isRootCgroup(ownDir) {
		parent := path.Dir(h.own)
		if h.own != "/" && delegated(filepath.Join(h.mount, parent)) {
			h.own = parent
		} else {
			why := fmt.Sprintf("%s holds processes (this one among them), so no controller can be enabled for cgroups below it; "+
				"run warren in a cgroup delegated to it with its processes in a leaf (systemd: Delegate=yes and DelegateSubgroup=, "+
				"or systemd-run -p Delegate=yes -p DelegateSubgroup=supervisor ...)", ownDir)
			for _, c := range wantV2 {
				m.unavail[c] = why
			}
		}
		ownDir = filepath.Join(h.mount, h.own)
	}
	h.parent = filepath.Join(ownDir, m.prefix)
	offered := readWords(filepath.Join(ownDir, "cgroup.controllers"))
	var enable []string
	for _, c := range wantV2 {
		if _, bad := m.unavail[c]; bad {
			continue
		}
		if slices.Contains(offered, c) {
			enable = append(enable, c)
		} else {
			m.unavail[c] = fmt.Sprintf("not offered to %s (cgroup.controllers: %q); the parent cgroup must delegate it",
				ownDir, strings.Join(offered, " "))
		}
	}
	dir := ownDir
	comps := strings.Split(m.prefix, "/")
	for i := 0; ; i++ {
		if i > 0 {
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) { //nolint:gosec // 0755: a cgroup dir holds control files whose modes the kernel sets (root-writable); listing it gives others nothing to change
				return fmt.Errorf("cgroup: %w", err)
			}
		}
		enabled := readWords(filepath.Join(dir, "cgroup.subtree_control"))
		kept := enable[:0]
		for _, c := range enable {
			if slices.Contains(enabled, c) {
				kept = append(kept, c)
				continue
			}
			if err := writeFile(filepath.Join(dir, "cgroup.subtree_control"), "+"+c); err != nil {
				why := "cannot enable in " + dir + "/cgroup.subtree_control: " + errno(err)
				if i == 0 && errors.Is(err, errBusy) {
					why += " (the cgroup holds processes; run warren in a leaf of a delegated cgroup, e.g. systemd DelegateSubgroup=)"
				}
				m.unavail[c] = why
				continue
			}
			kept = append(kept, c)
		}
		enable = kept
		if i == len(comps) {
			return nil
		}
		dir = filepath.Join(dir, comps[i])
	}
}

// isRootCgroup reports whether dir is the root of a cgroup v2 hierarchy,
// the one cgroup that may hold processes and enable controllers for its
// children. Every other cgroup, the root of a cgroup namespace included,
// has a cgroup.type file.
func isRootCgroup(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "cgroup.type"))
	return errors.Is(err, fs.ErrNotExist)
}

// delegated reports whether systemd marked dir as delegated to the processes
// below it (Delegate=yes): xattr trusted.delegate or user.delegate "1".
func delegated(dir string) bool {
	for _, attr := range []string{"trusted.delegate", "user.delegate"} {
		buf := make([]byte, 16)
		n, err := unix.Getxattr(dir, attr, buf)
		if err == nil && string(buf[:n]) == "1" {
			return true
		}
	}
	return false
}

// restorePrefixV2 makes the prefix directories again after another
// Manager's Close removed them, enabling in <own> and in each of them the
// controllers this Manager uses, as New did.
func (m *Manager) restorePrefixV2() error {
	var use []string
	for _, c := range wantV2 {
		if _, bad := m.unavail[c]; !bad {
			use = append(use, c)
		}
	}
	h := m.hiers[0]
	dir := filepath.Join(h.mount, h.own)
	for i, comp := range append([]string{""}, strings.Split(m.prefix, "/")...) {
		if i > 0 {
			dir = filepath.Join(dir, comp)
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) { //nolint:gosec // 0755: a cgroup dir holds control files whose modes the kernel sets (root-writable); listing it gives others nothing to change
				return err
			}
		}
		enabled := readWords(filepath.Join(dir, "cgroup.subtree_control"))
		for _, c := range use {
			if slices.Contains(enabled, c) {
				continue
			}
			if err := writeFile(filepath.Join(dir, "cgroup.subtree_control"), "+"+c); err != nil {
				return err
			}
		}
	}
	return nil
}

// Mode returns "v1" or "v2".
func (m *Manager) Mode() string { return m.mode }

// ErrRenameUnsupported is returned by Cgroup.Rename on cgroup v2, whose
// kernel interface cannot rename a cgroup. It matches errors.ErrUnsupported.
var ErrRenameUnsupported = fmt.Errorf("cgroup v2 cannot rename a cgroup: %w", errors.ErrUnsupported)

// CanRename reports whether Cgroup.Rename works: on cgroup v1 only.
func (m *Manager) CanRename() bool { return m.mode == ModeV1 }

// controllerErr returns nil when controller c is usable.
func (m *Manager) controllerErr(c string) error {
	if why, ok := m.unavail[c]; ok {
		return &controllerError{ctrl: c, reason: why}
	}
	if m.mode == ModeV1 && m.hierOf(c) < 0 {
		return &controllerError{ctrl: c, reason: "not mounted"}
	}
	return nil
}

// hierOf returns the index of the hierarchy holding controller c (v1), or 0
// on v2 when c is usable; -1 otherwise.
func (m *Manager) hierOf(c string) int {
	if m.mode == ModeV2 {
		if _, bad := m.unavail[c]; bad {
			return -1
		}
		return 0
	}
	for i, h := range m.hiers {
		if slices.Contains(h.ctrls, c) {
			return i
		}
	}
	return -1
}

func (m *Manager) checkLimits(l Limits) error {
	if l.MemoryBytes < 0 {
		return fmt.Errorf("cgroup: negative MemoryBytes %d", l.MemoryBytes)
	}
	if l.PidsMax < 0 {
		return fmt.Errorf("cgroup: negative PidsMax %d", l.PidsMax)
	}
	if l.CPUs < 0 || math.IsNaN(l.CPUs) || math.IsInf(l.CPUs, 0) || l.CPUs > 1<<20 {
		return fmt.Errorf("cgroup: invalid CPUs %v", l.CPUs)
	}
	need := func(set bool, c string) error {
		if !set {
			return nil
		}
		return m.controllerErr(c)
	}
	return errors.Join(need(l.MemoryBytes > 0, "memory"), need(l.CPUs > 0, "cpu"), need(l.PidsMax > 0, "pids"))
}

// Cgroup is one sandbox's cgroup (one directory per hierarchy in v1).
type Cgroup struct {
	m     *Manager
	name  string
	dirs  []string // parallel to m.hiers
	split bool     // has the agent and workload leaves (split_linux.go)
	// noFreeze: its processes are outside the freezer's hierarchy (a
	// cgroup an older version made, Open).
	noFreeze bool
	mu       sync.Mutex
}

func (m *Manager) cgroup(name string) *Cgroup {
	c := &Cgroup{m: m, name: name}
	for _, h := range m.hiers {
		c.dirs = append(c.dirs, filepath.Join(h.parent, name))
	}
	return c
}

// Name returns the sandbox name the cgroup was created or opened with.
func (c *Cgroup) Name() string { return c.name }

// procPath is the path /proc/<pid>/cgroup shows for members of hierarchy i.
func (c *Cgroup) procPath(i int) string {
	h := c.m.hiers[i]
	return path.Join(h.root, h.own, c.m.prefix, c.name)
}

// testHookCreate, when set by tests, runs after the directories are made and
// may fail the Create to exercise rollback.
var testHookCreate func(c *Cgroup) error

// Create makes the cgroup name (one directory per hierarchy) and applies l.
// On failure it removes whatever it created. If a directory of that name
// already exists (for example left by a crashed daemon), the error matches
// errors.Is(err, fs.ErrExist) and nothing is changed; use Open or Reap.
func (m *Manager) Create(name string, l Limits) (*Cgroup, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	if err := m.checkLimits(l); err != nil {
		return nil, err
	}
	c := m.cgroup(name)
	for _, d := range c.dirs {
		fi, err := os.Lstat(d)
		if err == nil {
			if !fi.IsDir() {
				return nil, fmt.Errorf("cgroup: name %q collides with interface file %s", name, d)
			}
			return nil, fmt.Errorf("cgroup: create %q: stale cgroup %s: %w", name, d, fs.ErrExist)
		}
	}
	var made []string
	rollback := func(cause error) error {
		var errs []error
		for i := len(made) - 1; i >= 0; i-- {
			if err := removeTree(made[i], rmdirTimeout); err != nil { // with the split's leaves
				errs = append(errs, err)
			}
		}
		if len(errs) > 0 {
			return fmt.Errorf("%w (rollback failed: %w)", cause, errors.Join(errs...))
		}
		return cause
	}
	for _, d := range c.dirs {
		err := os.Mkdir(d, 0o755) //nolint:gosec // 0755: a cgroup dir holds control files whose modes the kernel sets (root-writable); listing it gives others nothing to change
		// Another Manager's Close (this process's or another's) may have
		// removed the empty prefix meanwhile: make it again. On v2 a new
		// directory has no controller enabled, so they are enabled again
		// too, or the sandbox cgroup would have no limit files.
		for try := 0; errors.Is(err, fs.ErrNotExist) && try < 3; try++ {
			if m.mode == ModeV2 {
				err = m.restorePrefixV2()
			} else {
				err = os.MkdirAll(filepath.Dir(d), 0o755) //nolint:gosec // 0755: a cgroup dir holds control files whose modes the kernel sets (root-writable); listing it gives others nothing to change
			}
			if err == nil {
				err = os.Mkdir(d, 0o755) //nolint:gosec // 0755: a cgroup dir holds control files whose modes the kernel sets (root-writable); listing it gives others nothing to change
			}
		}
		if err != nil {
			return nil, rollback(fmt.Errorf("cgroup: create %q: %w", name, err))
		}
		made = append(made, d)
	}
	if testHookCreate != nil {
		if err := testHookCreate(c); err != nil {
			return nil, rollback(err)
		}
	}
	if l.AgentPids > 0 {
		if err := c.makeSplit(); err != nil {
			return nil, rollback(fmt.Errorf("cgroup: create %q: %w", name, err))
		}
	}
	if err := c.setLimits(l, true); err != nil {
		return nil, rollback(fmt.Errorf("cgroup: create %q: %w", name, err))
	}
	return c, nil
}

// Open returns the existing cgroup name, for reattaching after a daemon
// restart. If it is missing from any hierarchy the error matches fs.ErrNotExist.
func (m *Manager) Open(name string) (*Cgroup, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	c := m.cgroup(name)
	for i, d := range c.dirs {
		fi, err := os.Stat(d)
		if errors.Is(err, fs.ErrNotExist) && slices.Equal(m.hiers[i].ctrls, []string{"freezer"}) {
			// Made by a version that did not use the freezer: its
			// processes are outside the freezer's hierarchy, so it
			// cannot be frozen, but it is the sandbox's all the same.
			if err = os.Mkdir(d, 0o755); err == nil { //nolint:gosec // 0755: a cgroup dir holds control files whose modes the kernel sets (root-writable); listing it gives others nothing to change
				c.noFreeze = true
				fi, err = os.Stat(d)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("cgroup: open %q: %w", name, err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("cgroup: open %q: %s is not a directory: %w", name, d, fs.ErrNotExist)
		}
	}
	c.split = c.hasSplit()
	return c, nil
}

// Destroy removes the cgroup name, killing its processes, in every
// hierarchy it is in: also one that Open refuses because a crash in the
// middle of Create, Rename or Destroy left it in only some of them.
func (m *Manager) Destroy(name string) error {
	if err := validName(name); err != nil {
		return err
	}
	return m.cgroup(name).Destroy()
}

// List returns the names of the cgroups under the prefix, sorted. A cgroup
// present in only some hierarchies (a crash mid-Create) is listed.
func (m *Manager) List() ([]string, error) {
	seen := map[string]bool{}
	for _, h := range m.hiers {
		ents, err := os.ReadDir(h.parent)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("cgroup: list: %w", err)
		}
		for _, e := range ents {
			if e.IsDir() && validName(e.Name()) == nil {
				seen[e.Name()] = true
			}
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

// Reap destroys every cgroup under the prefix for which keep returns false
// (orphans of a previous daemon), killing their processes. It returns the
// names removed and the errors of those it could not remove.
func (m *Manager) Reap(keep func(name string) bool) (removed []string, err error) {
	names, err := m.List()
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, n := range names {
		if keep != nil && keep(n) {
			continue
		}
		if err := m.cgroup(n).Destroy(); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, n)
	}
	return removed, errors.Join(errs...)
}

// Close removes the prefix cgroup when no sandbox cgroup is left under it,
// so a process with a prefix of its own leaves nothing behind. A prefix
// still in use (by this or another process) stays.
func (m *Manager) Close() error {
	m.removeAnchor()
	var errs []error
	for _, h := range m.hiers {
		err := unix.Rmdir(h.parent)
		if err != nil && !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("cgroup: remove %s: %w", h.parent, err))
		}
	}
	return errors.Join(errs...)
}

// removePrefix removes the (empty) prefix directories created by New. Tests
// use it to leave the host clean.
func (m *Manager) removePrefix() error {
	m.removeAnchor()
	var errs []error
	for _, h := range m.hiers {
		d := h.parent
		for range strings.Split(m.prefix, "/") {
			if err := rmdirRetry(d, rmdirTimeout); err != nil {
				errs = append(errs, err)
				break
			}
			d = filepath.Dir(d)
		}
	}
	return errors.Join(errs...)
}

// Probe reports which controllers and capabilities are usable.
func (m *Manager) Probe() []Feature {
	var out []Feature
	add := func(name, p string, err error) {
		f := Feature{Name: name, Usable: err == nil, Path: p}
		if err != nil {
			f.Reason = err.Error()
		}
		out = append(out, f)
	}
	dirOf := func(c string) string {
		if i := m.hierOf(c); i >= 0 {
			return m.hiers[i].parent
		}
		if m.mode == ModeV2 {
			return m.hiers[0].parent
		}
		return ""
	}
	fileErr := func(c, file, why string) error {
		if err := m.controllerErr(c); err != nil {
			return err
		}
		if _, err := os.Stat(filepath.Join(dirOf(c), file)); err != nil {
			return errors.New(why + ": " + errno(err))
		}
		return nil
	}
	if m.mode == ModeV1 {
		for _, c := range wantV1 {
			add(c, dirOf(c), m.controllerErr(c))
		}
		if f := &out[len(out)-1]; f.Usable {
			f.Note = "pauses sandboxes"
		} else {
			f.Reason += "; sandboxes cannot be paused"
		}
		add("memory.swap", dirOf("memory"), fileErr("memory", "memory.memsw.limit_in_bytes",
			"no swap accounting (swapaccount=0?): the memory limit does not cap swap"))
		return append(out, m.probeOthersV1()...)
	}
	for _, c := range wantV2 {
		add(c, dirOf(c), m.controllerErr(c))
	}
	add("memory.swap", dirOf("memory"), fileErr("memory", "memory.swap.max",
		"no swap accounting: the memory limit does not cap swap"))
	parent := m.hiers[0].parent
	for _, f := range []string{"cgroup.kill", "cgroup.freeze"} {
		var err error
		if _, serr := os.Stat(filepath.Join(parent, f)); serr != nil {
			err = errors.New("kernel lacks " + f + ": " + errno(serr))
		}
		add(f, parent, err)
	}
	return out
}

// probeOthersV1 describes, on a hybrid host, the cgroup2 mount beside the
// v1 hierarchies, which v1 mode leaves alone.
func (m *Manager) probeOthersV1() []Feature {
	if m.others.unified == "" {
		return nil
	}
	ctrls := strings.Join(m.others.unifiedCtrls, " ")
	if ctrls == "" {
		ctrls = "none"
	}
	return []Feature{{Name: "v2 (hybrid)", Usable: true, Path: m.others.unified,
		Note: fmt.Sprintf("%s is mounted beside the v1 hierarchies without the memory, cpu or pids controller (it offers: %s), so Warren uses v1",
			m.others.unified, ctrls)}}
}

// validName accepts [A-Za-z0-9_.-]{1,128}, except "." and "..".
func validName(name string) error {
	if name == "" || name == "." || name == ".." || len(name) > 128 {
		return fmt.Errorf("cgroup: invalid name %q", name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-') {
			return fmt.Errorf("cgroup: invalid name %q (allowed: A-Z a-z 0-9 _ . -)", name)
		}
	}
	return nil
}

// validPrefix accepts one or more valid names joined by "/".
func validPrefix(prefix string) error {
	for _, c := range strings.Split(prefix, "/") {
		if err := validName(c); err != nil {
			return fmt.Errorf("cgroup: invalid prefix %q", prefix)
		}
	}
	return nil
}
