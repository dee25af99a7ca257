package main

import (
	"context"
	"fmt"
	"runtime"

	"github.com/warren-sandbox/warren/internal/buildinfo"
)

const versionAbout = `
Prints this build's version and commit (set by 'make build'; a plain 'go
build' says dev and the commit Go recorded), Go version and platform. A
server tells its own at /api/v1/health, in the MCP handshake and as the
warren_build_info metric.`

func versionCmd(_ context.Context, args []string) error {
	fs := newFlagSet("warren version", "warren version", versionAbout)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := wantArgs(fs, fs.Args()); err != nil {
		return err
	}
	fmt.Printf("warren %s (commit %s, %s, %s/%s)\n", buildinfo.Version(), buildinfo.Commit(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}
