// Package boot is the contract between the host and a starting agent: the
// Config the host hands warren-agent at start, its binary encoding, how it
// travels (SendConfig, ReadConfig), and the descriptors and environment the
// agent inherits. Both sides import it; it holds data and its encoding
// only, so the host links none of the agent's machinery (internal/guest).
package boot

import specs "github.com/opencontainers/runtime-spec/specs-go"

// Config is what the host hands the agent at start, on an inherited socket
// (see ReadConfig).
type Config struct {
	// Spec describes the sandbox. Spec.Root.Path is where the root filesystem
	// is assembled; Spec.Mounts are made inside it in order.
	Spec *Spec `json:"spec"`
	// SeccompFilter is the OCI spec's seccomp profile compiled to classic
	// BPF (seccomp.Encode); the agent installs it without compiling and
	// refuses to set up a sandbox without one.
	SeccompFilter []byte `json:"seccomp_filter"`
	// Rootfs is the overlay that becomes the root filesystem.
	Rootfs Rootfs `json:"rootfs"`
	// Python and Node are the interpreter paths the REPL engines use.
	Python string `json:"python,omitempty"`
	Node   string `json:"node,omitempty"`
	// User is the image's default user ("uid[:gid]" or a name from the
	// sandbox's /etc/passwd) for processes and interpreters that do not
	// name one; empty means root.
	User string `json:"user,omitempty"`
	// Lifeline makes the agent exit when the read end of FDLifeline reports
	// EOF, that is when the host process that started it is gone.
	Lifeline bool `json:"lifeline,omitempty"`
	// Nameserver, when set, is the IPv4 address the sandbox resolves
	// names with (the gateway of its network link, where the host's
	// resolver answers for it): the agent writes /etc/resolv.conf
	// naming it, replacing whatever the image had there.
	Nameserver string `json:"nameserver,omitempty"`
	// TrustCA, when set, is a CA certificate (PEM) the agent adds to the
	// sandbox's system trust store (package cabundle) before the root
	// turns read-only: the sandbox's own CA for proxy-mode secrets.
	TrustCA []byte `json:"trust_ca,omitempty"`
	// Procs is how many threads may run the agent's Go code at once
	// (GOMAXPROCS) once the sandbox is set up: its CPU limit rounded up, 0
	// for none (every CPU). Agents start with one, which a start's burst of
	// work runs fastest on: no handing goroutines over to other threads.
	Procs uint32 `json:"procs,omitempty"`
	// TimerSlack is the timer slack (ns) the sandbox's processes start
	// with: the host's own before it made its slack coarse (package
	// timerslack). The agent runs with a coarse one; its launcher thread,
	// which forks every sandbox process, sets this. 0 leaves the
	// launcher's.
	TimerSlack uint64 `json:"timer_slack,omitempty"`
	// BindMounts are detached mounts the host made, one per bind of
	// Spec.Mounts with an empty Source, in order: a volume, idmapped to the
	// sandbox's uid range and with the bind's flags applied. The agent
	// attaches each at its destination; it could not bind the source path
	// itself, running as the sandbox's own uids. Passed with the config
	// (ReadConfig); the agent owns them.
	BindMounts []int `json:"-"`
	// Workload, when not zero, is the descriptor through which the
	// launcher thread joins the sandbox's workload cgroup before it forks
	// anything (cgroup.Cgroup.OpenWorkload; SendWorkload passes it): the
	// agent's own threads stay in a cgroup whose pids the workload cannot
	// take.
	Workload int `json:"-"`
	// Prepared says an OCI runtime started the agent (the gvisor
	// backend's runsc): the root, its mounts, masks, hostname and
	// network exist already, and the agent applies only what concerns
	// processes (rlimits, working directory, capabilities, seccomp).
	Prepared bool `json:"prepared,omitempty"`
	// ConnsByFD says FDListener is not a listening socket but a connected
	// one on which the host sends each new connection as a descriptor
	// (SendConn; ConnListener serves them): a runtime that passes only
	// connected sockets into the sandbox cannot pass a listener.
	ConnsByFD bool `json:"conns_by_fd,omitempty"`
}

// Spec is the part of an OCI runtime spec the agent applies, under the OCI
// spec's JSON names; SpecFrom makes it from the host's spec. The rest (the
// namespaces' creation, id maps, cgroup limits, seccomp) the host applies
// or sends another way.
//
// Why not specs.Spec itself: decoding into it makes encoding/json build
// its field caches, with an encoder for every field, for the whole OCI
// type graph (hooks, Windows, VM, ...). That was 0.5 ms of CPU in every
// agent, as much as the rest of the config's decoding ten times over.
type Spec struct {
	Root     *specs.Root   `json:"root"`
	Hostname string        `json:"hostname,omitempty"`
	Mounts   []specs.Mount `json:"mounts,omitempty"`
	Process  *Process      `json:"process"`
	Linux    *Linux        `json:"linux"`
}

// Process is what the agent applies of the spec's process.
type Process struct {
	Env             []string                 `json:"env,omitempty"`
	Cwd             string                   `json:"cwd"`
	Capabilities    *specs.LinuxCapabilities `json:"capabilities,omitempty"`
	Rlimits         []specs.POSIXRlimit      `json:"rlimits,omitempty"`
	NoNewPrivileges bool                     `json:"noNewPrivileges,omitempty"`
}

// Linux is what the agent applies of the spec's linux section.
type Linux struct {
	// Namespaces tells the agent whether to enter a cgroup namespace;
	// the host created the others.
	Namespaces    []specs.LinuxNamespace `json:"namespaces,omitempty"`
	MaskedPaths   []string               `json:"maskedPaths,omitempty"`
	ReadonlyPaths []string               `json:"readonlyPaths,omitempty"`
}

// SpecFrom is the part of s the agent applies (see Spec). The fields it
// leaves out are listed in TestSpecFromKeepsWhatTheAgentApplies, which
// fails when the OCI spec the host builds gains one the agent would drop.
func SpecFrom(s *specs.Spec) *Spec {
	out := &Spec{Root: s.Root, Hostname: s.Hostname, Mounts: s.Mounts}
	if p := s.Process; p != nil {
		out.Process = &Process{Env: p.Env, Cwd: p.Cwd, Capabilities: p.Capabilities, Rlimits: p.Rlimits, NoNewPrivileges: p.NoNewPrivileges}
	}
	if l := s.Linux; l != nil {
		out.Linux = &Linux{Namespaces: l.Namespaces, MaskedPaths: l.MaskedPaths, ReadonlyPaths: l.ReadonlyPaths}
	}
	return out
}

// Rootfs names the overlay layers, as host paths visible to the agent
// before it pivots into the new root.
type Rootfs struct {
	Lower []string `json:"lower"` // top-most first
	// Dir, when set, is the directory relative Lower paths are resolved
	// from: the host links long layer paths there under short names when
	// the whole list would not fit in one page of mount options.
	Dir   string `json:"dir,omitempty"`
	Upper string `json:"upper,omitempty"`
	Work  string `json:"work,omitempty"`
	// UserXattr selects overlayfs's "userxattr" mode, required when the
	// overlay is mounted from inside a user namespace.
	UserXattr bool `json:"userxattr,omitempty"`
	// Mount, when not zero, is a detached mount of this overlay that the
	// host made and passed with the config (ReadConfig): the agent
	// attaches it instead of mounting the layers itself. The fields above
	// then only describe it.
	Mount int `json:"-"`
}

// File descriptors the host passes to the agent.
const (
	FDConfig   = 3 // a unix stream socket to read the Config from (ReadConfig)
	FDListener = 4 // the agent protocol's listening unix socket
	FDStatus   = 5 // write: "ok\n" once set up, or an error message
	// FDConn is a connection the host made at spawn (one end of a socket
	// pair), served like the listener's first: the host's first request
	// skips connect and accept.
	FDConn     = 6
	FDLifeline = 7 // read, when Config.Lifeline: EOF means the host is gone
	// FDUIDRange holds the lock of the sandbox's host uid range (package
	// uidrange), when it has one of its own: the agent keeps it open for
	// its life, and nothing it starts inherits it.
	FDUIDRange = 8
)

// EnvStage is the variable of a pooled agent's environment that names the
// host directory it stages its standard mounts on before its config
// arrives. The host sets it only for agents it spawns ahead of a start: for
// those the staging happens while they wait, off the start's path.
const EnvStage = "WARREN_STAGE"
