// Package cgroup creates, limits, inspects, kills and removes one cgroup per
// sandbox, on cgroup v2 hosts, cgroup v1 hosts and hybrid hosts, behind one API.
//
// # Layout
//
// New reads /proc/self/mountinfo and /proc/self/cgroup. If a cgroup2 mount
// offers at least one of the memory, cpu or pids controllers to this process's
// own cgroup, the Manager runs in "v2" mode. Otherwise, if cgroup v1
// hierarchies are mounted (pure v1, or hybrid with an empty or near-empty
// cgroup2 mount at /sys/fs/cgroup/unified), it runs in "v1" mode and uses the
// v1 hierarchies of the memory, cpu, cpuacct, pids and freezer controllers
// (co-mounted hierarchies such as cpu,cpuacct count once). Other v1
// controllers (cpuset, blkio, devices, ...) are not touched: sandboxes inherit
// the daemon's cgroup there. In hybrid mode the cgroup2 hierarchy is not used.
//
// Every sandbox cgroup lives at <own>/<prefix>/<name> in each hierarchy, where
// <own> is this process's own cgroup in that hierarchy (never the hierarchy
// root unless the process itself sits at the root). In v2 mode New enables the
// available controllers in cgroup.subtree_control of <own> and of every
// directory of <prefix>. The kernel refuses that (EBUSY) when <own> holds
// processes and is not the root ("no internal processes"); the controllers are
// then reported unusable by Probe, with the reason, and a Create that needs
// them fails. Run the daemon in a delegated cgroup whose processes sit in a
// leaf (systemd: Delegate=yes with DelegateSubgroup=) to avoid that.
//
// # Limits
//
// A zero field of Limits means unlimited and needs no controller. A non-zero
// field whose controller is unusable makes Create and SetLimits fail with an
// error that names the controller and matches ErrControllerUnavailable; a
// limit is never silently dropped. The memory limit also caps memory+swap at
// the same value where the kernel accounts swap (v1
// memory.memsw.limit_in_bytes, v2 memory.swap.max=0).
//
// # Starting processes inside a cgroup
//
// SpawnInto starts a process that is born inside the cgroup, from the
// descriptors OpenSpawnTarget opened (possibly in another process: the
// server's spawner). In v2 mode it uses clone3(CLONE_INTO_CGROUP) through
// syscall.SysProcAttr.UseCgroupFD. In v1 mode it migrates a dedicated,
// locked OS thread into the cgroup through the tasks files, forks from it
// and lets the Go runtime destroy the thread (a migration back would wait
// for another RCU grace period). While that thread is inside the cgroup it
// counts against pids.max (a PidsMax of 1 therefore cannot spawn in v1
// mode) and makes the spawning process's pid appear in v1 cgroup.procs;
// Procs and Kill always ignore this process's own pid.
//
// # What is verified where
//
// The tests run against real cgroups. On the project's build machine (hybrid:
// v1 controllers plus a cgroup2 mount with no memory/cpu/pids controllers)
// they verify the whole v1 path: Create/Open/List/Reap/Destroy with rollback,
// spawn placement and thread hygiene, memory (OOM kill and oom_kill count),
// pids and cpu quota enforcement, freezer-based Kill of a setsid'd tree. For
// v2 they verify, on the controller-less cgroup2 mount: Create and Destroy with
// zero limits, spawns through CLONE_INTO_CGROUP, Kill through cgroup.kill, and
// the error of a Create that asks for an absent controller. Controller
// enablement in cgroup.subtree_control and the v2 limit and statistics files
// (memory.max, memory.swap.max, cpu.max, pids.max, memory.events, cpu.stat
// throttling) are exercised only on a pure cgroup v2 host, where the same
// tests run in v2 mode.
package cgroup
