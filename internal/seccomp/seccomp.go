//go:build linux

// Package seccomp owns Warren's system call filter: the default profile every
// sandbox gets (DefaultProfile), the compiler that turns an OCI seccomp section
// into a classic BPF program for the running architecture (Compile), and the
// installer that applies that program to every thread of the calling process
// (Install).
//
// It is pure Go (no cgo, no libseccomp) because it runs inside the in-sandbox
// agent, a static binary. Syscall tables exist for linux/amd64 and
// linux/arm64; on other architectures Compile returns an error. The default
// profile and the reasons behind each entry are documented in docs/seccomp.md.
package seccomp

import (
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// deniedSyscalls fail with EPERM under the default profile. Keep this list and
// docs/seccomp.md in step. Names that exist on only one of amd64 and arm64
// (iopl, ioperm, create_module, ...) are skipped by Compile on the other.
var deniedSyscalls = []string{
	// Mounting and namespaces: escape or rearrange the sandbox's view.
	"mount", "umount2", "pivot_root", "unshare", "setns",
	"fsopen", "fsconfig", "fsmount", "fspick", "move_mount",
	"open_tree", "open_tree_attr", "mount_setattr",
	// Loading code into the kernel.
	"kexec_load", "kexec_file_load", "init_module", "finit_module",
	"delete_module", "create_module", "get_kernel_syms", "query_module",
	// Kernel attack surface that sandboxed code has no need for.
	"bpf", "keyctl", "add_key", "request_key", "perf_event_open",
	"userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
	"lookup_dcookie", "lsm_set_self_attr",
	// Host-wide state: time, swap, power, accounting, kernel log, I/O ports,
	// quotas.
	"settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
	"swapon", "swapoff", "reboot", "acct", "syslog", "iopl", "ioperm",
	"quotactl", "quotactl_fd", "vhangup",
	// Handle-based file access: open_by_handle_at is the "shocker" escape.
	"open_by_handle_at", "name_to_handle_at",
	// Obsolete interfaces kept only for old binaries.
	"nfsservctl", "uselib", "ustat", "_sysctl", "sysfs",
}

// allowedPersonalities are the personality(2) values the default profile
// allows: PER_LINUX, PER_LINUX32, UNAME26, PER_LINUX32|UNAME26 and the
// 0xffffffff query. Everything else (READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE, ...)
// fails with EPERM.
var allowedPersonalities = []uint64{0x0, 0x8, 0x20000, 0x20008, 0xffffffff}

// allowedSocketFamilies are the address families socket(2) and
// socketpair(2) may name: local sockets, IPv4, IPv6 and netlink (which
// interface listings and `ip` need), all of them per network namespace.
// Every other family fails with EAFNOSUPPORT, as on a kernel built without
// it. AF_VSOCK is why this is an allowlist: its port space is the host's,
// not the network namespace's, so a sandbox could bind a port a VM host's
// control agent needs; families added to the kernel later are refused until
// someone decides otherwise.
var allowedSocketFamilies = []uint64{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK}

// namespaceCloneFlags are the clone(2) flags that create namespaces. On both
// amd64 and arm64 the flags are clone's first argument.
const namespaceCloneFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
	unix.CLONE_NEWCGROUP | unix.CLONE_NEWTIME

// DefaultProfile returns Warren's default filter as an OCI seccomp section:
// default action allow, and a deny list of dangerous syscalls (EPERM).
// Additionally clone with any CLONE_NEW* flag fails with EPERM, clone3 fails
// with ENOSYS so that libc falls back to clone (clone3's flags live in memory
// a filter cannot read), personality is limited to harmless values, and
// sockets to the address families in allowedSocketFamilies.
//
// Entries are ordered: for each syscall Compile applies the first matching
// entry, so the conditional allows come before the unconditional denials.
// Each call returns a fresh profile the caller may modify.
func DefaultProfile() *specs.LinuxSeccomp {
	p := &specs.LinuxSeccomp{DefaultAction: specs.ActAllow}
	for _, v := range allowedPersonalities {
		// The kernel takes personality's argument as an unsigned int, so
		// compare only the low 32 bits, as the kernel does.
		p.Syscalls = append(p.Syscalls, specs.LinuxSyscall{
			Names:  []string{"personality"},
			Action: specs.ActAllow,
			Args:   []specs.LinuxSeccompArg{{Index: 0, Value: 0xffffffff, ValueTwo: v, Op: specs.OpMaskedEqual}},
		})
	}
	for _, f := range allowedSocketFamilies {
		// The domain is an int to the kernel: compare the low 32 bits.
		p.Syscalls = append(p.Syscalls, specs.LinuxSyscall{
			Names:  []string{"socket", "socketpair"},
			Action: specs.ActAllow,
			Args:   []specs.LinuxSeccompArg{{Index: 0, Value: 0xffffffff, ValueTwo: f, Op: specs.OpMaskedEqual}},
		})
	}
	p.Syscalls = append(p.Syscalls,
		errnoRule([]string{"socket", "socketpair"}, unix.EAFNOSUPPORT),
		errnoRule([]string{"personality"}, unix.EPERM),
		specs.LinuxSyscall{
			Names:  []string{"clone"},
			Action: specs.ActAllow,
			Args:   []specs.LinuxSeccompArg{{Index: 0, Value: namespaceCloneFlags, ValueTwo: 0, Op: specs.OpMaskedEqual}},
		},
		errnoRule([]string{"clone"}, unix.EPERM),
		errnoRule([]string{"clone3"}, unix.ENOSYS),
		errnoRule(slices.Clone(deniedSyscalls), unix.EPERM),
	)
	return p
}

// errnoRule fails the named syscalls with errno.
func errnoRule(names []string, errno unix.Errno) specs.LinuxSyscall {
	ret := uint(errno)
	return specs.LinuxSyscall{Names: names, Action: specs.ActErrno, ErrnoRet: &ret}
}
