package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/rpc"
)

const topAbout = `
Lists the processes running in a sandbox of a running server, as 'docker
top' does: ps inside the sandbox, with PS_OPTIONS if given (default -eo
pid,user,etime,time,args). In a sandbox without ps, the processes' ids and
command lines are read from its /proc.`

// procScript lists processes from /proc for sandboxes without ps.
const procScript = `echo "PID CMD"; for d in /proc/[0-9]*; do c=$(tr '\0' ' ' <"$d/cmdline" 2>/dev/null); ` +
	`[ -n "$c" ] || c="[$(cat "$d/comm" 2>/dev/null)]"; echo "${d#/proc/} $c"; done`

func topCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren top", "warren top [--namespace NS] NAME [PS_OPTIONS...]", topAbout)
	c, ns := clientFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() < 1 {
		return argsError(fs, "NAME is missing")
	}
	psArgs := fs.Args()[1:]
	if len(psArgs) == 0 {
		psArgs = []string{"-eo", "pid,user,etime,time,args"}
	}
	exec := func(argv []string) (code int, stdout, stderr string, err error) {
		var out struct {
			ExitCode int    `json:"exit_code"`
			Stdout   string `json:"stdout"`
			Stderr   string `json:"stderr"`
		}
		err = c.call(ctx, "sandbox.exec", map[string]any{"namespace": *ns, "sandbox": fs.Arg(0), "argv": argv, "binary": true, "timeout": 30}, &out)
		o, _ := base64.StdEncoding.DecodeString(out.Stdout)
		e, _ := base64.StdEncoding.DecodeString(out.Stderr)
		return out.ExitCode, string(o), string(e), err
	}
	code, stdout, stderr, err := exec(append([]string{"ps"}, psArgs...))
	var re *rpcError
	if errors.As(err, &re) && re.Data["kind"] == "exec_failed" {
		// No ps in the sandbox.
		code, stdout, stderr, err = exec([]string{"/bin/sh", "-c", procScript})
	}
	if err != nil {
		return err
	}
	fmt.Print(stdout)
	if code != 0 {
		return fmt.Errorf("ps in the sandbox exited %d: %s", code, strings.TrimSpace(stderr))
	}
	return nil
}

const statsAbout = `
Shows the live use of a running server's sandboxes (sandbox.metrics.get):
CPU (100% = one core, over the last second), memory, disk and its limit,
refreshed every 2 seconds until interrupted, or once with --no-stream.
Without NAME, every sandbox of the namespace ('*': all the key may see).`

func statsCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren stats", "warren stats [--namespace NS|'*'] [--no-stream] [--json|-q|--format T] [NAME...]", statsAbout)
	c, ns := clientFlags(fs)
	once := fs.Bool("no-stream", false, "print the figures once and exit")
	interval := fs.Duration("interval", 2*time.Second, "time between refreshes")
	var lf listFlags
	lf.register(fs, "names")
	names, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if *interval < 100*time.Millisecond {
		return fmt.Errorf("--interval %s: want at least 100ms", *interval)
	}
	// A screen that updates in place: a table on a terminal only.
	redraw := isTerminal(os.Stdout) && !*once && lf == (listFlags{})
	for {
		rows, err := c.metrics(ctx, *ns, names)
		if errors.Is(ctx.Err(), context.Canceled) {
			return nil
		}
		if err != nil {
			return err
		}
		if redraw {
			fmt.Print("\x1b[H\x1b[2J")
		}
		err = printList(&lf, rows, func(r rpc.SandboxMetrics) string { return r.Name }, "NAMESPACE\tNAME\tSTATE\tCPU %\tMEMORY\tDISK\tDISK LIMIT",
			func(r rpc.SandboxMetrics) string {
				return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s", r.Namespace, r.Name, r.State(),
					figure(r.CPUUsage, func(v float64) string { return fmt.Sprintf("%.1f", v) }),
					figure(r.MemoryUsage, func(v int64) string { return fmt.Sprintf("%d MiB", v) }),
					figure(r.DiskUsage, bytesText), figure(r.DiskLimit, bytesText))
			})
		if err != nil || *once {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(*interval):
		}
	}
}

// metrics returns the figures of names (all of ns when none).
func (c *apiClient) metrics(ctx context.Context, ns string, names []string) ([]rpc.SandboxMetrics, error) {
	var rows []rpc.SandboxMetrics
	if len(names) == 0 {
		names = []string{""}
	}
	for _, n := range names {
		var out struct {
			Sandboxes []rpc.SandboxMetrics `json:"sandboxes"`
		}
		p := map[string]any{"namespace": ns}
		if n != "" {
			p["sandbox"] = n
		}
		if err := c.call(ctx, "sandbox.metrics.get", p, &out); err != nil {
			return nil, err
		}
		rows = append(rows, out.Sandboxes...)
	}
	return rows, nil
}

// figure is f(*v), "-" when v could not be measured.
func figure[T any](v *T, f func(T) string) string {
	if v == nil {
		return "-"
	}
	return f(*v)
}
