package main

import (
	"context"
	"os"
)

const shellAbout = `
Opens an interactive shell in a running sandbox of a running server, on a
terminal of its own that follows the local one's size (as 'warren exec -it
NAME -- SHELL'): bash when the sandbox has it, else sh. The shell's exit code
is warren's.`

// shellScript starts the best shell the sandbox has, as a login shell.
const shellScript = `if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l`

func shellCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren shell", "warren shell [flags] NAME", shellAbout)
	c, ns := clientFlags(fs)
	o := streamOptions{tty: true, stdin: true}
	shell := fs.String("shell", "", "run this shell instead (a path in the sandbox, like /bin/zsh)")
	fs.StringVar(&o.cwd, "workdir", "", "working directory in the sandbox")
	fs.StringVar(&o.user, "user", "", "user to run as (name, uid or uid:gid)")
	fs.BoolVar(&o.resume, "resume", false, "resume the sandbox first if it is paused")
	fs.Var((*stringList)(&o.env), "env", "set an environment variable K=V (repeatable)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return argsError(fs, "want one NAME, got %d arguments", len(pos))
	}
	o.ns, o.name, o.argv = *ns, pos[0], []string{"/bin/sh", "-c", shellScript}
	if *shell != "" {
		o.argv = []string{*shell}
	}
	if !isTerminal(os.Stdin) {
		// Commands piped to the shell: no terminal to mirror.
		o.tty = false
	}
	return c.stream(ctx, o)
}
