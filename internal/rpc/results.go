package rpc

import (
	"time"

	"github.com/warren-sandbox/warren/internal/wire"
)

// The API's own shapes of what the agent reports. They are written out
// here, not borrowed from internal/wire, so that the agent protocol can
// change without changing the public API by accident (and the reverse);
// testdata/results.golden pins every result type.

// outputLine is one line of a command's or a REPL run's output.
type outputLine struct {
	Stream string `json:"stream"`
	Text   string `json:"text"`
}

// exitStatus is how a background process ended.
type exitStatus struct {
	Code       int     `json:"code"`
	Signal     string  `json:"signal,omitempty"`
	TimedOut   bool    `json:"timed_out,omitempty"`
	Truncated  bool    `json:"truncated,omitempty"`
	DurationMs float64 `json:"duration_ms"`
	Error      string  `json:"error,omitempty"`
}

func toExitStatus(e *wire.ExitStatus) *exitStatus {
	if e == nil {
		return nil
	}
	return &exitStatus{Code: e.Code, Signal: e.Signal, TimedOut: e.TimedOut, Truncated: e.Truncated,
		DurationMs: e.DurationMs, Error: e.Error}
}

// processInfo describes a background process.
type processInfo struct {
	ID        string      `json:"id"`
	Argv      []string    `json:"argv"`
	Pid       int         `json:"pid"`
	Running   bool        `json:"running"`
	StartedAt time.Time   `json:"started_at"`
	Exit      *exitStatus `json:"exit,omitempty"`
}

func toProcessInfo(p wire.ProcessInfo) processInfo {
	return processInfo{ID: p.ID, Argv: p.Argv, Pid: p.Pid, Running: p.Running, StartedAt: p.StartedAt, Exit: toExitStatus(p.Exit)}
}

// fileInfo describes one file in a sandbox.
type fileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"`
	Type    string    `json:"type"`
	ModTime time.Time `json:"mod_time"`
	Target  string    `json:"target,omitempty"`
}

func toFileInfo(f wire.FileInfo) fileInfo {
	return fileInfo{Name: f.Name, Path: f.Path, Size: f.Size, Mode: f.Mode, Type: f.Type, ModTime: f.ModTime, Target: f.Target}
}

// done is the answer of a method that has nothing to say but that it
// succeeded.
type done struct{}
