package main

import (
	"bufio"
	"os"
	"strings"
	"testing"
	"time"
)

// TestTopStatsLogsFollow: top lists the sandbox's processes (with ps, and
// PS_OPTIONS), stats its figures once, and logs -f prints what happens
// in the sandbox while it runs.
func TestTopStatsLogsFollow(t *testing.T) {
	_, client, cmd := serverClient(t)
	if r := client("", "create", "box"); r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	defer client("", "rm", "-f", "box")
	c := cmd("exec", "box", "--", "sh", "-c", "exec sleep 123")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Process.Kill(); _ = c.Wait() }()
	waitUntil(t, func() bool { return strings.Contains(client("", "top", "box").stdout, "sleep 123") })
	if r := client("", "top", "box", "-o", "pid,args"); r.code != 0 || !strings.HasPrefix(strings.TrimSpace(r.stdout), "PID COMMAND") ||
		!strings.Contains(r.stdout, "sleep 123") {
		t.Fatalf("top with PS_OPTIONS: %+v", r)
	}
	if r := client("", "stats", "--no-stream"); r.code != 0 || !strings.Contains(r.stdout, "CPU %") ||
		!strings.Contains(r.stdout, "box") || !strings.Contains(r.stdout, "running") || !strings.Contains(r.stdout, "MiB") {
		t.Fatalf("stats: %+v", r)
	}
	if r := client("", "stats", "--no-stream", "nosuch"); r.code != 1 || !strings.Contains(r.stderr, "nosuch") {
		t.Fatalf("stats of a missing sandbox: %+v", r)
	}

	f := cmd("logs", "-f", "--tail", "1", "box")
	out, err := f.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Start(); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(out)
	if _, err := readLineWithin(br, 10*time.Second); err != nil {
		t.Fatalf("the last line: %v", err)
	}
	if r := client("", "exec", "box", "--", "echo", "followed"); r.code != 0 {
		t.Fatalf("exec: %+v", r)
	}
	for {
		line, err := readLineWithin(br, 10*time.Second)
		if err != nil {
			t.Fatalf("logs -f did not show the new exec: %v", err)
		}
		if strings.Contains(line, `"echo" "followed"`) {
			break
		}
	}
	_ = f.Process.Signal(os.Interrupt)
	if err := f.Wait(); procExitCode(err) != 130 {
		t.Fatalf("logs -f after Ctrl-C: %v, want 130", err)
	}
}
