// Command warren runs untrusted code in isolated, resource-limited sandboxes.
//
// Subcommands are listed by `warren help`.
package main

import (
	"context"
	"errors"
	"flag"
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
		{"doctor", "report which kernel features Warren can use here, and why not", doctorCmd},
		{"image", "import, list and remove images in the local store", imageCmd},
		{"bench", "measure sandbox start, exec and REPL latency against baselines; soak a server", benchCmd},
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `warren: sandboxes for untrusted code

Usage:
  warren <command> [flags] [args]

Commands:
`)
	for _, c := range commands() {
		fmt.Fprintf(os.Stderr, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprint(os.Stderr, `
Run 'warren <command> --help' for a command's flags.
`)
}

// exitError carries an exit code out of a command without printing.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	name := os.Args[1]
	if name == "help" || name == "-h" || name == "--help" {
		usage()
		return
	}
	for _, c := range commands() {
		if c.name != name {
			continue
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := c.run(ctx, os.Args[2:])
		stop()
		var ee exitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			os.Exit(ee.code)
		case errors.Is(err, flag.ErrHelp):
			os.Exit(0)
		default:
			fmt.Fprintf(os.Stderr, "warren %s: %v\n", name, err)
			os.Exit(1)
		}
		return
	}
	fmt.Fprintf(os.Stderr, "warren: unknown command %q\n\n", name)
	usage()
	os.Exit(2)
}
