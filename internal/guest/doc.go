// Package guest is the in-sandbox side of Warren: the code of warren-agent,
// which runs as PID 1 in every sandbox. It sets the sandbox up from the
// parts of an OCI runtime spec it applies (Setup, from a boot.Config), reaps
// orphans (Reaper), and serves the host over the agent protocol (Server):
// exec, background processes, files and REPLs.
//
// The agent is not trusted by the host: limits, timeouts and kills are
// enforced from outside. It is kept small and static (CGO_ENABLED=0). The
// host never links this package; what the two share at start is in package
// boot.
package guest
