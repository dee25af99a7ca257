// Command warren runs untrusted code in isolated, resource-limited sandboxes.
//
// Subcommands are listed by `warren help`.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string) error
}

func commands() []command {
	return []command{
		{"run", "run one command in a fresh sandbox, no daemon needed", runCmd},
		{"serve", "serve the sandbox API (microsandbox-compatible JSON-RPC, MCP)", serveCmd},
		{"key", "create, list and revoke API keys", keyCmd},
		{"audit", "query, export and verify the audit log (reads the data directory)", auditCmd},
		{"ps", "list a server's sandboxes", psCmd},
		{"logs", "print a sandbox's log from a server", logsCmd},
		{"egress", "show or change a server sandbox's network rules, print its connection log", egressCmd},
		{"ports", "list, publish and unpublish a server sandbox's ports on the host", portsCmd},
		{"ns", "list a server's namespaces with their use of their quotas", nsCmd},
		{"exec", "run a command in a server's sandbox", execCmd},
		{"create", "create and start a sandbox on a server", createCmd},
		{"start", "start stopped sandboxes of a server again", startCmd},
		{"stop", "stop running sandboxes of a server (files kept)", stopCmd},
		{"rm", "remove sandboxes of a server (-f: running ones too)", rmCmd},
		{"inspect", "print a server's sandboxes as JSON", inspectCmd},
		{"shell", "open an interactive shell in a server's sandbox", shellCmd},
		{"cp", "copy files and directories between the host and a server's sandbox", cpCmd},
		{"top", "list the processes running in a server's sandbox", topCmd},
		{"stats", "show the live CPU, memory and disk use of a server's sandboxes", statsCmd},
		{"pause", "pause a server's sandbox (memory kept, no CPU)", pauseCmd},
		{"resume", "resume a paused sandbox of a server", resumeCmd},
		{"workspace", "create, list, inspect, remove, upload and download a server's workspaces", workspaceCmd},
		{"snapshot", "checkpoint sandboxes into snapshots, restore and fork them (isolation gvisor)", snapshotCmd},
		{"controller", "place Kubernetes Sandbox resources on Warren nodes (docs/kubernetes.md)", controllerCmd},
		{"doctor", "report which kernel features Warren can use here, and why not", doctorCmd},
		{"image", "import, list and remove images in the local store", imageCmd},
		{"bench", "measure sandbox start, exec and REPL latency against baselines; soak a server", benchCmd},
		{"version", "print the version and commit of this build", versionCmd},
		{"completion", "print a bash, zsh or fish script completing commands and names", completionCmd},
		// Hidden (a name starting with "_"): what the completion scripts call.
		{"__complete", "", completeCmd},
		{"help", "print the help of a command", helpCmd},
	}
}

// exitError carries an exit code out of a command without printing.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

func main() {
	args, err := globalFlags(os.Args[1:])
	if err != nil {
		os.Exit(exitCode("", err))
	}
	if len(args) == 0 {
		usage(os.Stderr)
		os.Exit(2)
	}
	c, err := lookup(args[0])
	if err != nil {
		os.Exit(exitCode("", err))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = c.run(ctx, args[1:])
	stop()
	os.Exit(exitCode(c.name, err))
}
