package main

import (
	"context"
	"fmt"
)

const pauseAbout = `
Pauses a running sandbox of a running server: its processes stop where
they are, keeping their memory, and use no CPU until 'warren resume'.
Requests that need it running are refused meanwhile (or resume it, with
'warren exec --resume' or "resume": true in the API).`

const resumeAbout = `
Lets a paused sandbox of a running server run again.`

func pauseCmd(ctx context.Context, args []string) error {
	return pauseOp(ctx, args, "pause", pauseAbout)
}

func resumeCmd(ctx context.Context, args []string) error {
	return pauseOp(ctx, args, "resume", resumeAbout)
}

// pauseOp runs sandbox.pause or sandbox.resume (op) on the sandbox named in
// args and prints its state.
func pauseOp(ctx context.Context, args []string, op, about string) error {
	fs := newFlagSet("warren "+op, "warren "+op+" [--namespace NS] NAME", about)
	c, ns := clientFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := wantArgs(fs, fs.Args(), "NAME (the sandbox)"); err != nil {
		return err
	}
	var out struct {
		Name  string `json:"name"`
		State string `json:"state"`
	}
	if err := c.call(ctx, "sandbox."+op, map[string]any{"namespace": *ns, "sandbox": fs.Arg(0)}, &out); err != nil {
		return err
	}
	fmt.Printf("%s %s\n", out.Name, out.State)
	return nil
}
