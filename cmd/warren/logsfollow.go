package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// logsPoll is how often 'warren logs -f' asks for new lines, and
// logsFollowTail how many it asks for each time.
const (
	logsPoll       = 500 * time.Millisecond
	logsFollowTail = 1000
)

// followLogs prints a sandbox's log as 'warren logs' does, then its new
// lines as they are written, until interrupted or the sandbox is removed.
//
// The API has no cursor: each poll takes the last lines, and those after
// the last one printed are new. Lines start with their time (RFC 3339), so
// when the last printed line has left the window (more than
// logsFollowTail new lines in one poll), the later ones are printed and a
// line says some may be missing.
func followLogs(ctx context.Context, c *apiClient, ns, name string, tail int) error {
	var last string
	var lastTime time.Time
	for first := true; ; first = false {
		n := logsFollowTail
		if first {
			n = tail
		}
		var out struct {
			Lines []string `json:"lines"`
		}
		err := c.call(ctx, "sandbox.logs", map[string]any{"namespace": ns, "sandbox": name, "tail": n}, &out)
		if errors.Is(ctx.Err(), context.Canceled) {
			return exitError{130}
		}
		if err != nil {
			return err
		}
		start := 0
		if !first {
			start = newLines(out.Lines, last, lastTime)
		}
		for _, l := range out.Lines[start:] {
			fmt.Println(l)
		}
		if k := len(out.Lines); k > start {
			last = out.Lines[k-1]
			lastTime = lineTime(last)
		}
		select {
		case <-ctx.Done():
			return exitError{130}
		case <-time.After(logsPoll):
		}
	}
}

// newLines returns the index of the first line of lines after last.
func newLines(lines []string, last string, lastTime time.Time) int {
	if last == "" {
		return 0
	}
	for i := len(lines) - 1; i >= 0; i-- {
		if lines[i] == last {
			return i + 1
		}
	}
	for i, l := range lines {
		if lineTime(l).After(lastTime) {
			fmt.Printf("(warren logs: more lines than %d were written in %s; some may be missing here)\n", logsFollowTail, logsPoll)
			return i
		}
	}
	return len(lines)
}

// lineTime is the time a log line starts with (zero if none).
func lineTime(l string) time.Time {
	ts, _, _ := strings.Cut(l, " ")
	t, _ := time.Parse(time.RFC3339Nano, ts)
	return t
}
