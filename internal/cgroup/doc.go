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
// controllers (cpuset, blkio, devices, ...) are not touched: sandboxes
// inherit the daemon's cgroup there. In hybrid mode the cgroup2 hierarchy is
// not used. Probe reports a hybrid host's cgroup2 mount all the same.
//
// # Freezing
//
// Cgroup.Freeze stops every process of a cgroup where it is (v1
// freezer.state, v2 cgroup.freeze) and waits, bounded, until the kernel says
// all are frozen; Thaw lets them go on; Frozen reads the state back from the
// kernel, so a later process sees what an earlier one froze. Kill thaws
// after it signals: a frozen process dies only once it runs.
//
// Every sandbox cgroup lives at <own>/<prefix>/<name> in each hierarchy, where
// <own> is this process's own cgroup in that hierarchy (never the hierarchy
// root unless the process itself sits at the root). In v2 mode New enables the
// available controllers in cgroup.subtree_control of <own> and of every
// directory of <prefix>.
//
// On v2 a cgroup other than the root that holds processes can enable no
// domain controller (memory) for its children ("no internal processes"), and
// enabling a threaded one (cpu, pids) there makes it a thread root, below
// which no cgroup can hold a process. <own> holds this process, so unless it
// is the root, New enables nothing in it. If its parent is delegated to it
// (systemd: Delegate=yes with DelegateSubgroup=, which puts the service's
// processes in a leaf and marks the service's cgroup with the
// trusted.delegate or user.delegate xattr), <own> is taken to be that parent:
// the sandbox cgroups go beside the leaf, with every controller the service
// was given. Otherwise (a login shell's session scope, a service without
// delegation, a container's cgroup namespace root) the sandbox cgroups go
// below <own> without controllers: sandboxes without limits still run, and
// Probe and a Create that needs a controller report why it is unusable.
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
// With Limits.AgentPids a cgroup is split in the pids controller into a
// leaf for the sandbox's agent and one for its workload, each with a
// pids.max of its own (split_linux.go says how, on v1 and v2).
//
// Cgroup.Rename works on v1 only: the kernel cannot rename a cgroup v2
// directory, and Rename returns ErrRenameUnsupported there
// (Manager.CanRename). Create makes the prefix directories again (and on v2
// enables the controllers in them again) when another Manager's Close
// removed them.
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
// pids and cpu quota enforcement, Kill of a setsid'd tree. For
// v2 they verify there, on the controller-less cgroup2 mount: Create and
// Destroy with zero limits, spawns through CLONE_INTO_CGROUP, Kill through
// cgroup.kill, and the error of a Create that asks for an absent controller.
// The v2 path with controllers (enablement in cgroup.subtree_control, the
// populated-<own> and delegated layouts, memory.max, memory.swap.max,
// cpu.max, cpu.idle, pids.max, memory.events, cpu.stat throttling) runs in
// scripts/v2vm.sh's virtual machine, whose kernel has a pure cgroup v2
// hierarchy: there WARREN_TEST_CGROUP_V2=1 makes every test fail unless the
// Manager is in v2 mode with memory, cpu and pids usable.
package cgroup
