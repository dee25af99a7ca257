// Package guest holds the in-sandbox side of Warren: the code of
// warren-agent, which runs as PID 1 in every sandbox. Its packages, by role:
//
//   - setup: PID 1's work, before anything is served: staging, the
//     sandbox's root and limits from the host's boot.Config, the launcher
//     thread, reaping orphans;
//   - service: the agent protocol's server: exec and background processes
//     (one process lifecycle), files and REPLs;
//   - confined: the file API, confined to the sandbox's root;
//   - repl: the Python and Node engines;
//   - httpd: the agent's small HTTP/1.1 server.
//
// cmd/warren-agent wires them. The agent is not trusted by the host: limits,
// timeouts and kills are enforced from outside. It is kept small and static
// (CGO_ENABLED=0). The host never links these packages (cmd/warren's
// TestNoAgentCode); what the two share at start is package boot.
package guest
