package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// TestServePauseResume: a real server with --idle-action pause pauses an
// idle sandbox; warren exec on it is refused naming sandbox.resume, and
// with --resume runs; warren pause and warren resume; a restarted server
// finds the sandbox paused (from its cgroup: the database says running).
func TestServePauseResume(t *testing.T) {
	testenv.RequireRoot(t)
	dir := stateDir(t)
	url, srv, stderr := startServe(t, dir, "--dev", "--idle-timeout", "1s", "--idle-action", "pause")
	client := func(args ...string) result {
		cmd := warren(t, dir, args...)
		cmd.Env = append(cmd.Env, "MSB_SERVER_URL="+url)
		return run(t, cmd, "")
	}
	call := rpcCaller(t, url, "")
	state := func() string {
		var in struct {
			State string `json:"state"`
		}
		_ = json.Unmarshal(call("sandbox.get", map[string]any{"sandbox": "box"}).Result, &in)
		return in.State
	}
	if r := call("sandbox.start", map[string]any{"sandbox": "box"}); r.status != 200 {
		t.Fatalf("start: %d %+v\n%s", r.status, r.Error, stderr.String())
	}
	// Whichever server runs at the end removes the sandbox and stops.
	defer func() {
		call("sandbox.remove", map[string]any{"sandbox": "box"})
		stopServe(t, srv)
	}()
	for t0 := time.Now(); state() != "paused"; time.Sleep(100 * time.Millisecond) {
		if time.Since(t0) > 5*time.Second {
			t.Fatalf("--idle-action pause: state %s after 5 s", state())
		}
	}
	if r := client("exec", "box", "--", "true"); r.code == 0 || !strings.Contains(r.stderr, "sandbox.resume") {
		t.Fatalf("exec on a paused sandbox: %+v", r)
	}
	if r := client("exec", "--resume", "box", "--", "echo", "back"); r.code != 0 || r.stdout != "back\n" {
		t.Fatalf("exec --resume: %+v", r)
	}
	if r := client("pause", "box"); r.code != 0 || r.stdout != "box paused\n" {
		t.Fatalf("warren pause: %+v", r)
	}
	stopServe(t, srv)
	url, srv, stderr = startServe(t, dir, "--dev")
	call = rpcCaller(t, url, "")
	if r := client("ps"); r.code != 0 || !strings.Contains(r.stdout, "paused") {
		t.Fatalf("ps after a restart: %+v\n%s", r, stderr.String())
	}
	if r := client("resume", "box"); r.code != 0 || r.stdout != "box running\n" {
		t.Fatalf("warren resume: %+v", r)
	}
	if r := client("exec", "box", "--", "echo", "ok"); r.code != 0 || r.stdout != "ok\n" {
		t.Fatalf("exec after resume: %+v", r)
	}
}
