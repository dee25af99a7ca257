// Package guest is the in-sandbox side of Warren: the code of warren-agent,
// which runs as PID 1 in every sandbox. It sets the sandbox up from an OCI
// runtime spec (Setup), reaps orphans (Reaper), and serves the host over the
// agent protocol (Server): exec, background processes, files and REPLs.
//
// The agent is not trusted by the host: limits, timeouts and kills are
// enforced from outside. It is kept small and static (CGO_ENABLED=0).
package guest

import specs "github.com/opencontainers/runtime-spec/specs-go"

// Config is what the host hands the agent at start, on an inherited socket
// (see ReadConfig).
type Config struct {
	// Spec describes the sandbox. Spec.Root.Path is where the root filesystem
	// is assembled; Spec.Mounts are made inside it in order.
	Spec *specs.Spec `json:"spec"`
	// SeccompFilter is Spec.Linux.Seccomp compiled to classic BPF
	// (seccomp.Encode), so the agent installs it without compiling; the
	// host sends the spec without its seccomp section.
	SeccompFilter []byte `json:"seccomp_filter,omitempty"`
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
	FDLifeline = 6 // read, when Config.Lifeline: EOF means the host is gone
)
