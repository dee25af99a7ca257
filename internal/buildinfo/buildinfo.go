// Package buildinfo says which build of Warren is running, for
// 'warren version', the MCP handshake, /api/v1/health and the
// warren_build_info metric.
//
// The Makefile sets the version and commit at link time:
//
//	-ldflags "-X github.com/warren-sandbox/warren/internal/buildinfo.version=V
//	          -X github.com/warren-sandbox/warren/internal/buildinfo.commit=C"
//
// A build without them (go build, go test) says version "dev" and the
// commit the Go toolchain recorded, if any.
package buildinfo

import (
	"runtime/debug"
	"sync"
)

var (
	version string
	commit  string
)

// Version is the build's version ("dev" when not set at link time).
func Version() string {
	if version == "" {
		return "dev"
	}
	return version
}

// Commit is the commit the build was made from, "+dirty" appended when the
// work tree had changes, or "unknown".
func Commit() string {
	if commit != "" {
		return commit
	}
	return vcsCommit()
}

var vcsCommit = sync.OnceValue(func() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "unknown"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "+dirty"
	}
	return rev
})
