// Package oci describes a Warren sandbox as an OCI runtime spec: the
// namespaces, mounts, masked paths, capabilities, seccomp filter, rlimits and
// cgroup limits. The spec is the one description of a sandbox that backends
// read: the native backend's agent applies its process and mounts, and the
// backend sets its cgroup from the spec's resources (Limits); a later
// backend can hand the same spec to an OCI runtime such as runsc.
package oci

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/warren-sandbox/warren/internal/seccomp"
)

// IDMap maps sandbox ids [0, Size) to host ids [Host, Host+Size).
type IDMap struct {
	Host uint32
	Size uint32
}

// Params are the inputs of a sandbox's spec.
type Params struct {
	RootPath string // where the root filesystem is assembled
	Hostname string
	Env      []string
	Cwd      string
	// ImageMounts are the image's own mounts (the host image's read-only
	// binds of /usr and friends), made before the standard ones.
	ImageMounts []specs.Mount
	// Volumes are the caller's binds, made after the standard mounts.
	Volumes []specs.Mount
	// UserNS, when non-nil, puts the sandbox in a user namespace with this
	// mapping for both uids and gids.
	UserNS *IDMap
	// Limits; zero means unlimited.
	MemoryBytes int64
	CPUs        float64
	PidsMax     int64
	// NoFile is the open-files limit (default DefaultNoFile).
	NoFile uint64
	// ReadOnlyRoot makes the root file system read-only but for
	// WritablePaths, each bound onto itself (a bind whose source is
	// relative names a path inside the root) before the volumes.
	ReadOnlyRoot  bool
	WritablePaths []string
}

// DefaultCapabilities is the capability set of a sandbox's processes:
// Docker's default set minus CAP_NET_RAW (no raw sockets or ping floods),
// CAP_MKNOD (no device nodes) and CAP_AUDIT_WRITE.
var DefaultCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_SETGID",
	"CAP_SETUID", "CAP_SETPCAP", "CAP_SETFCAP", "CAP_NET_BIND_SERVICE",
	"CAP_KILL", "CAP_SYS_CHROOT",
}

// MaskedPaths hide kernel state that leaks host information or gives attack
// surface (as Docker does): files are covered with /dev/null, directories
// with an empty read-only tmpfs.
var MaskedPaths = []string{
	"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys",
	"/proc/latency_stats", "/proc/sched_debug", "/proc/scsi", "/proc/timer_list",
	"/proc/timer_stats", "/sys/firmware", "/sys/devices/virtual/powercap",
	"/sys/kernel/debug", "/sys/kernel/security",
	// Beyond Docker's list: the host's boot command line (root device,
	// sometimes credentials or tokens passed to the kernel), its build
	// configuration and the crash-dump note's kernel addresses.
	"/proc/cmdline", "/proc/config.gz", "/sys/kernel/vmcoreinfo",
}

// ReadonlyPaths may be read but never written.
var ReadonlyPaths = []string{
	"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
}

// Devices bound from the host into the sandbox's private /dev.
var Devices = []string{"null", "zero", "full", "random", "urandom", "tty"}

// DefaultEnv is the environment of a sandbox when the image sets none.
var DefaultEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root", "LANG=C.UTF-8", "TERM=xterm",
}

// DefaultNoFile is a sandbox process's RLIMIT_NOFILE unless one is given.
const DefaultNoFile = 65536

// CPUPeriod is the CFS period used for cpu quotas, in microseconds.
const CPUPeriod = 100000

// Build returns the spec for p.
func Build(p Params) (*specs.Spec, error) {
	if p.RootPath == "" {
		return nil, fmt.Errorf("oci: root path is empty")
	}
	if p.CPUs < 0 || p.MemoryBytes < 0 || p.PidsMax < 0 {
		return nil, fmt.Errorf("oci: negative limit")
	}
	env := p.Env
	if len(env) == 0 {
		env = DefaultEnv
	}
	cwd := p.Cwd
	if cwd == "" {
		cwd = "/"
	}
	nofile := p.NoFile
	if nofile == 0 {
		nofile = DefaultNoFile
	}
	s := &specs.Spec{
		Version:  specs.Version,
		Root:     &specs.Root{Path: p.RootPath},
		Hostname: p.Hostname,
		Process: &specs.Process{
			Cwd:             cwd,
			Env:             env,
			NoNewPrivileges: true,
			Capabilities:    ProcessCapabilities(),
			Rlimits: []specs.POSIXRlimit{
				{Type: "RLIMIT_NOFILE", Soft: nofile, Hard: nofile},
				{Type: "RLIMIT_CORE", Soft: 0, Hard: 0},
			},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.MountNamespace},
				{Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.NetworkNamespace}, {Type: specs.CgroupNamespace},
			},
			MaskedPaths:   MaskedPaths,
			ReadonlyPaths: ReadonlyPaths,
			Seccomp:       seccomp.DefaultProfile(),
			Resources:     resources(p),
		},
	}
	if p.UserNS != nil {
		s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace})
		m := []specs.LinuxIDMapping{{ContainerID: 0, HostID: p.UserNS.Host, Size: p.UserNS.Size}}
		s.Linux.UIDMappings, s.Linux.GIDMappings = m, m
	}
	s.Mounts = append(append([]specs.Mount(nil), p.ImageMounts...), StandardMounts()...)
	if p.ReadOnlyRoot {
		s.Root.Readonly = true
		s.Mounts = append(s.Mounts, writableBinds(p.WritablePaths)...)
	}
	s.Mounts = append(s.Mounts, p.Volumes...)
	return s, nil
}

// writableBinds binds each of paths (absolute and clean) onto itself,
// parents before children, once each: a write there reaches the sandbox's
// writable layer whatever the root's read-only flag.
func writableBinds(paths []string) []specs.Mount {
	ps := slices.Clone(paths)
	slices.Sort(ps) // "/a" sorts before "/a/b"
	ps = slices.Compact(ps)
	ms := make([]specs.Mount, 0, len(ps))
	for _, p := range ps {
		ms = append(ms, specs.Mount{Destination: p, Type: "bind", Source: strings.TrimPrefix(p, "/"), Options: []string{"bind", "nosuid", "nodev"}})
	}
	return ms
}

// ProcessCapabilities are a sandbox process's capabilities: the default
// set bounding, effective and permitted (a fresh value each call).
func ProcessCapabilities() *specs.LinuxCapabilities {
	caps := append([]string(nil), DefaultCapabilities...)
	return &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}
}

// MaxPtys is how many pseudo-terminals one sandbox may hold open. The
// kernel's are one pool for the whole host (kernel.pty.max, 4096 by
// default, of which kernel.pty.reserve are kept for the host's own
// devpts): without a cap per devpts instance one sandbox could hold every
// terminal the others and the host's containers may open. Admission
// control reserves this many per running sandbox: 16 (a shell session
// takes one) lets ~170 sandboxes run on a default kernel, where 64 held a
// 2-CPU host to 42.
const MaxPtys = 16

// StandardMounts are every sandbox's /proc, /dev and /sys, in the order
// they are mounted (a fresh slice each call).
func StandardMounts() []specs.Mount {
	ptsOpts := []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5", "max=" + strconv.Itoa(MaxPtys)}
	ms := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: ptsOpts},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
	}
	// A bound device node cannot be executed or be setuid, so nosuid and
	// noexec would only cost a remount each.
	for _, d := range Devices {
		ms = append(ms, specs.Mount{Destination: "/dev/" + d, Type: "bind", Source: "/dev/" + d, Options: []string{"bind"}})
	}
	return ms
}

func resources(p Params) *specs.LinuxResources {
	r := &specs.LinuxResources{}
	if p.MemoryBytes > 0 {
		m := p.MemoryBytes
		r.Memory = &specs.LinuxMemory{Limit: &m, Swap: &m}
	}
	if p.CPUs > 0 {
		// Rounded, not truncated: 0.29 CPUs is a 29000 µs quota.
		q := int64(math.Round(p.CPUs * CPUPeriod))
		per := uint64(CPUPeriod)
		r.CPU = &specs.LinuxCPU{Quota: &q, Period: &per}
	}
	if p.PidsMax > 0 {
		n := p.PidsMax
		r.Pids = &specs.LinuxPids{Limit: &n}
	}
	return r
}

// Limits are the cgroup limits a spec's resources describe; zero means
// unlimited.
type Limits struct {
	MemoryBytes int64
	CPUs        float64 // quota per period
	PidsMax     int64
}

// ResourceLimits reads back the limits Build wrote into r: what a backend
// that sets up cgroups itself applies.
func ResourceLimits(r *specs.LinuxResources) Limits {
	var l Limits
	if r == nil {
		return l
	}
	if r.Memory != nil && r.Memory.Limit != nil {
		l.MemoryBytes = *r.Memory.Limit
	}
	if c := r.CPU; c != nil && c.Quota != nil && c.Period != nil && *c.Period > 0 && *c.Quota > 0 {
		l.CPUs = float64(*c.Quota) / float64(*c.Period)
	}
	if r.Pids != nil && r.Pids.Limit != nil {
		l.PidsMax = *r.Pids.Limit
	}
	return l
}
