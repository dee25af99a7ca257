package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
)

const createAbout = `
Creates a sandbox on a running server and starts it (sandbox.create), then
prints its name. Every option of the API is a flag; those not given take the
server's defaults. Stop it with 'warren stop', start it again (files kept)
with 'warren start', remove it with 'warren rm'.

Example:
  warren create --image python --memory 1G --label team=a --env DEBUG=1 demo`

// createCmd is sandbox.create with its parameters as flags.
func createCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren create", "warren create [flags] NAME", createAbout)
	c, ns := clientFlags(fs)
	image := fs.String("image", "", "image: host, a stored image name or a language alias (python, node); default the server's")
	memory := fs.String("memory", "", "memory limit, like 512M or 2G (plain numbers are MiB); default 512M")
	cpus := fs.Float64("cpus", 0, "CPU limit in cores, like 0.5; default 1")
	disk := fs.String("disk", "", "disk limit, like 2G; default the server's")
	workdir := fs.String("workdir", "", "working directory of commands (default the image's)")
	workspace := fs.String("workspace", "", "mount this workspace of the namespace at /workspace")
	idle := fs.Duration("idle-timeout", 0, "stop (or pause) it after this long without requests; 0 = the server's --idle-timeout")
	life := fs.Duration("max-lifetime", 0, "stop it this long after its start; 0 = the server's --max-lifetime")
	idleAction := fs.String("idle-action", "", "what its idle timeout does: stop or pause (default the server's)")
	var envs, labels, volumes, ports, egress, secrets stringList
	fs.Var(&envs, "env", "environment variable K=V of its commands (repeatable)")
	fs.Var(&labels, "label", "label K=V (repeatable)")
	fs.Var(&volumes, "volume", "bind a host path: HOST:GUEST or HOST:GUEST:ro (repeatable; needs the server's --volume-root)")
	fs.Var(&ports, "publish", "publish a port on the host: HOST:GUEST or PORT (repeatable; needs the server's network)")
	fs.Var(&egress, "egress", "allow outbound traffic matching RULE (repeatable; none given: nothing leaves)")
	fs.Var(&secrets, "secret", "give it the secret NAME granted to its namespace (repeatable)")
	dockerShort(fs)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return argsError(fs, "want one NAME, got %d arguments", len(pos))
	}
	p := map[string]any{"name": pos[0], "namespace": *ns, "image": *image, "cpus": *cpus, "workdir": *workdir,
		"workspace": *workspace, "idle_action": *idleAction, "idle_timeout": idle.Seconds(), "max_lifetime": life.Seconds(),
		"env": []string(envs), "volumes": []string(volumes), "ports": []string(ports), "secrets": []string(secrets)}
	if len(egress) > 0 {
		p["egress"] = []string(egress)
	}
	if p["labels"], err = parseLabels(labels); err != nil {
		return err
	}
	for _, f := range []struct{ flag, param, val string }{{"--memory", "memory_mib", *memory}, {"--disk", "disk_mib", *disk}} {
		if f.val == "" {
			continue
		}
		b, err := parseSize(f.val)
		if err != nil {
			return fmt.Errorf("%s: %w", f.flag, err)
		}
		if b%(1<<20) != 0 {
			return fmt.Errorf("%s %s: want a whole number of MiB", f.flag, f.val)
		}
		p[f.param] = b >> 20
	}
	var out struct {
		Name string `json:"name"`
	}
	if err := c.call(ctx, "sandbox.create", p, &out); err != nil {
		return err
	}
	fmt.Println(out.Name)
	return nil
}

// argsError is a command line fs cannot run: one line naming what is
// wrong and pointing to -h, exit 2 (cli.go's usageError).
func argsError(fs *flag.FlagSet, format string, args ...any) error {
	return usageError{fs.Name(), fmt.Sprintf(format, args...)}
}

const startAbout = `
Starts stopped sandboxes of a running server again, with their files and the
configuration they last ran with (a paused one is resumed; a running one is
left as it is), and prints each name.`

const stopAbout = `
Stops running sandboxes of a running server: their processes are killed,
their files kept for 'warren start'. Prints each name.`

func startCmd(ctx context.Context, args []string) error {
	return eachSandbox(ctx, args, "start", startAbout, func(ctx context.Context, c *apiClient, ns, name string) error {
		return c.call(ctx, "sandbox.start", map[string]any{"namespace": ns, "sandbox": name}, nil)
	})
}

func stopCmd(ctx context.Context, args []string) error {
	return eachSandbox(ctx, args, "stop", stopAbout, func(ctx context.Context, c *apiClient, ns, name string) error {
		return c.call(ctx, "sandbox.stop", map[string]any{"namespace": ns, "sandbox": name}, nil)
	})
}

const rmAbout = `
Removes sandboxes of a running server, with their files. A running (or
paused) sandbox is refused unless -f, which stops it first. Prints each name
removed; a name that does not exist is an error.`

func rmCmd(ctx context.Context, args []string) error {
	var force *bool
	return eachSandboxFlags(ctx, args, "rm", "[-f]", rmAbout, func(fs flagSet) {
		force = fs.Bool("f", false, "stop running sandboxes first")
	}, func(ctx context.Context, c *apiClient, ns, name string) error {
		var info sandboxInfo
		if err := c.call(ctx, "sandbox.get", map[string]any{"namespace": ns, "sandbox": name}, &info); err != nil {
			return err
		}
		if !*force && info.State != "stopped" && info.State != "error" {
			return fmt.Errorf("sandbox %s is %s: stop it first, or remove it with -f", name, info.State)
		}
		var out struct {
			Removed bool `json:"removed"`
		}
		if err := c.call(ctx, "sandbox.remove", map[string]any{"namespace": ns, "sandbox": name}, &out); err != nil {
			return err
		}
		if !out.Removed {
			return fmt.Errorf("sandbox %s not found", name) // removed meanwhile
		}
		return nil
	})
}

// sandboxInfo is what the CLI reads of the API's SandboxInfo.
type sandboxInfo struct {
	Name  string `json:"name"`
	State string `json:"state"`
	Error string `json:"error"`
}

const inspectAbout = `
Prints what a running server knows of sandboxes (sandbox.get) as a JSON
array, one object per name, in the order given.`

func inspectCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren inspect", "warren inspect [--namespace NS] NAME...", inspectAbout)
	c, ns := clientFlags(fs)
	names, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return argsError(fs, "NAME is missing")
	}
	all := make([]json.RawMessage, 0, len(names))
	var failed error
	for _, n := range names {
		var raw json.RawMessage
		if err := c.call(ctx, "sandbox.get", map[string]any{"namespace": *ns, "sandbox": n}, &raw); err != nil {
			fmt.Fprintf(os.Stderr, "warren inspect: %s: %v\n", n, err)
			failed = exitError{1}
			continue
		}
		all = append(all, raw)
	}
	b, err := json.MarshalIndent(all, "", "  ")
	if err != nil {
		return err
	}
	fmt.Println(string(b))
	return failed
}

// flagSet is the part of *flag.FlagSet a command's extra flags need.
type flagSet interface {
	Bool(name string, value bool, usage string) *bool
}

func eachSandbox(ctx context.Context, args []string, op, about string, do func(ctx context.Context, c *apiClient, ns, name string) error) error {
	return eachSandboxFlags(ctx, args, op, "", about, nil, do)
}

// eachSandboxFlags runs do on every sandbox named in args, printing each
// name done and each failure, as docker does: one failure does not stop the
// others, and makes the exit code 1.
func eachSandboxFlags(ctx context.Context, args []string, op, synopsisFlags, about string, flags func(flagSet),
	do func(ctx context.Context, c *apiClient, ns, name string) error) error {
	fs := newFlagSet("warren "+op, strings.Join(strings.Fields("warren "+op+" [--namespace NS] "+synopsisFlags+" NAME..."), " "), about)
	c, ns := clientFlags(fs)
	if flags != nil {
		flags(fs)
	}
	names, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return argsError(fs, "NAME is missing")
	}
	var failed error
	for _, n := range names {
		if err := do(ctx, c, *ns, n); err != nil {
			if errors.Is(ctx.Err(), context.Canceled) {
				return err
			}
			fmt.Fprintf(os.Stderr, "warren %s: %s: %v\n", op, n, err)
			failed = exitError{1}
			continue
		}
		fmt.Println(n)
	}
	return failed
}
