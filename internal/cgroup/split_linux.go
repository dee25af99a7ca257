package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// A split cgroup (Limits.AgentPids at Create) keeps the sandbox's agent and
// the sandbox's own processes (the workload) apart in the pids controller,
// so that a workload taking every pid it is granted cannot leave the agent
// without a thread (the Go runtime ends a process that fails to create one):
//
//	<name>        memory and cpu limits, pids.max = PidsMax + AgentPids
//	<name>/agent  the agent, born here (SpawnTarget, Add); pids.max = AgentPids
//	<name>/work   the workload; pids.max = PidsMax
//
// On cgroup v1 only the pids hierarchy is split; the agent and the
// workload share one cgroup in the others, as the memory and cpu limits
// are meant for both. On cgroup v2 a process's threads all sit in one
// domain cgroup, so the two leaves are threaded cgroups (cgroup.type
// "threaded") below <name>, their thread root, which keeps the domain
// controllers (memory) for both; pids and cpu are threaded controllers.
// The leaves are made whether or not the pids controller is usable on v2
// (only the placement then); on v1 they need the pids hierarchy.
//
// The agent moves the one thread it forks every sandbox process from into
// the workload leaf by writing "0" (the calling thread) to the descriptor
// OpenWorkload returns, which the host opens: the kernel checks a
// migration through cgroup.procs, cgroup.threads or tasks against the
// credentials (and on v2 the cgroup namespace) of the file's opener, not of
// the writer, so an agent in a user namespace needs no write access to
// cgroupfs. Everything that thread forks then starts in the workload leaf,
// and a cgroup namespace it enters afterwards is rooted there: the
// workload sees neither the agent's leaf nor its parent. Threads the Go
// runtime starts while that thread is locked to its goroutine come from
// the runtime's template thread, in the agent's leaf.
//
// Stats, Procs, Kill, Rename and Destroy work on <name> and everything
// below it, so they cover both leaves.
const (
	agentLeaf = "agent"
	workLeaf  = "work"
)

// Split reports whether the cgroup has the agent and workload leaves.
func (c *Cgroup) Split() bool { return c.split }

// splitDir is the directory whose leaves split the agent from the
// workload: the pids hierarchy's on v1 ("" without it), the one on v2.
func (c *Cgroup) splitDir() string {
	if c.m.mode == ModeV1 {
		return c.dirOf("pids")
	}
	return c.dirs[0]
}

// makeSplit creates the two leaves in a new, empty cgroup.
func (c *Cgroup) makeSplit() error {
	d := c.splitDir()
	if d == "" {
		return nil // v1 without a pids hierarchy: no pid budget to keep apart
	}
	for _, leaf := range []string{agentLeaf, workLeaf} {
		if err := os.Mkdir(filepath.Join(d, leaf), 0o755); err != nil { //nolint:gosec // 0755: a cgroup dir holds control files whose modes the kernel sets (root-writable); listing it gives others nothing to change
			return err
		}
		if c.m.mode == ModeV2 {
			if err := writeFile(filepath.Join(d, leaf, "cgroup.type"), "threaded"); err != nil {
				return fmt.Errorf("make %s threaded: %w", leaf, err)
			}
		}
	}
	if c.m.mode == ModeV2 && c.m.hierOf("pids") >= 0 {
		if err := writeFile(filepath.Join(d, "cgroup.subtree_control"), "+pids"); err != nil {
			return err
		}
	}
	c.split = true
	return nil
}

// hasSplit reports whether an existing cgroup has the agent's leaf: a
// cgroup made before the split existed has not, and keeps its one pids
// budget until its sandbox stops.
func (c *Cgroup) hasSplit() bool {
	d := c.splitDir()
	if d == "" {
		return false
	}
	fi, err := os.Stat(filepath.Join(d, agentLeaf))
	return err == nil && fi.IsDir()
}

// setSplitPids writes the pids limits of a split cgroup whose pids
// directory is d. The parent's is the sum, so the whole never holds more
// than what admission counted.
func (c *Cgroup) setSplitPids(d string, l Limits) error {
	parent := int64(0)
	if l.PidsMax > 0 && l.AgentPids > 0 {
		parent = l.PidsMax + l.AgentPids
	}
	for _, w := range []struct {
		dir string
		v   int64
	}{{filepath.Join(d, workLeaf), l.PidsMax}, {filepath.Join(d, agentLeaf), l.AgentPids}, {d, parent}} {
		if err := writeFile(filepath.Join(w.dir, "pids.max"), maxOr(w.v)); err != nil {
			return err
		}
	}
	return nil
}

// leafFor is where a process of the agent goes in hierarchy directory d:
// the agent's leaf when d is split, d itself otherwise.
func (c *Cgroup) leafFor(d string) string {
	if c.split && d == c.splitDir() {
		return filepath.Join(d, agentLeaf)
	}
	return d
}

// OpenWorkload opens, for writing, the file through which a thread joins
// the workload leaf: the leaf's tasks file on v1, its cgroup.threads on v2.
// A thread that writes "0" to it moves itself (see the split's comment
// above). It returns nil and no error when the cgroup is not split.
func (c *Cgroup) OpenWorkload() (*os.File, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.split {
		return nil, nil
	}
	file := "tasks"
	if c.m.mode == ModeV2 {
		file = "cgroup.threads"
	}
	p := filepath.Join(c.splitDir(), workLeaf, file)
	f, err := os.OpenFile(p, os.O_WRONLY|unix.O_CLOEXEC, 0) //nolint:gosec // p is a cgroupfs path built by this package from its own layout
	if err != nil {
		return nil, fmt.Errorf("cgroup: open the workload of %q: %w", c.name, err)
	}
	return f, nil
}

// removeSplit removes the leaves of d when they are empty (Destroy's quick
// path); anything else is left to the full walk.
func removeSplit(d string) {
	for _, leaf := range []string{agentLeaf, workLeaf} {
		if err := unix.Rmdir(filepath.Join(d, leaf)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return
		}
	}
}
