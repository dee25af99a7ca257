package main

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// serverClient starts a dev-mode server for the test and returns a
// function that runs the CLI against it (stdin "" for none).
func serverClient(t *testing.T, extra ...string) (dir string, client func(stdin string, args ...string) result, cmd func(args ...string) *exec.Cmd) {
	t.Helper()
	testenv.RequireRoot(t)
	dir = stateDir(t)
	url, srv, _ := startServe(t, dir, append([]string{"--dev"}, extra...)...)
	t.Cleanup(func() { stopServe(t, srv) })
	cmd = func(args ...string) *exec.Cmd {
		c := warren(t, dir, args...)
		c.Env = append(c.Env, "MSB_SERVER_URL="+url)
		return c
	}
	client = func(stdin string, args ...string) result {
		t.Helper()
		return run(t, cmd(args...), stdin)
	}
	return dir, client, cmd
}

// TestLifecycleCommands: create with options, inspect, stop, start (files
// and options kept), rm of a running one refused without -f, rm of several
// names with one missing.
func TestLifecycleCommands(t *testing.T) {
	_, client, _ := serverClient(t)
	if r := client("", "create", "--memory", "256M", "--cpus", "0.5", "--label", "team=a", "--env", "GREETING=hi there",
		"--workdir", "/tmp", "--idle-timeout", "10m", "box"); r.code != 0 || r.stdout != "box\n" {
		t.Fatalf("create: %+v", r)
	}
	defer client("", "rm", "-f", "box", "two")
	inspect := func() map[string]any {
		t.Helper()
		r := client("", "inspect", "box")
		var out []map[string]any
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &out) != nil || len(out) != 1 {
			t.Fatalf("inspect: %+v", r)
		}
		return out[0]
	}
	in := inspect()
	if in["state"] != "running" || in["memory_mib"] != 256.0 || in["cpus"] != 0.5 || in["idle_timeout"] != 600.0 ||
		in["labels"].(map[string]any)["team"] != "a" {
		t.Fatalf("inspect after create: %v", in)
	}
	if r := client("", "exec", "box", "--", "sh", "-c", `echo "$GREETING" > f; pwd`); r.code != 0 || r.stdout != "/tmp\n" {
		t.Fatalf("exec with the created env and workdir: %+v", r)
	}
	for _, tc := range []struct {
		args      []string
		code      int
		stdout    string
		stderrHas string
	}{
		{[]string{"create", "box"}, 1, "", "already exists"},
		{[]string{"create"}, 2, "", "want one NAME"},
		{[]string{"create", "--memory", "1.5K", "x"}, 1, "", "whole number of MiB"},
		{[]string{"create", "--idle-action", "sleep", "x"}, 1, "", "idle_action"},
		{[]string{"rm", "box"}, 1, "", "box is running: stop it first, or remove it with -f"},
		{[]string{"stop"}, 2, "", "NAME is missing"},
		{[]string{"stop", "box", "nosuch"}, 1, "box\n", `sandbox "nosuch" in namespace "default" does not exist`},
		{[]string{"inspect", "nosuch"}, 1, "[]\n", "nosuch"},
	} {
		if r := client("", tc.args...); r.code != tc.code || r.stdout != tc.stdout || !strings.Contains(r.stderr, tc.stderrHas) {
			t.Errorf("%v: %+v, want code %d stdout %q stderr with %q", tc.args, r, tc.code, tc.stdout, tc.stderrHas)
		}
	}
	if in := inspect(); in["state"] != "stopped" {
		t.Fatalf("after stop: %v", in["state"])
	}
	if r := client("", "start", "box"); r.code != 0 || r.stdout != "box\n" {
		t.Fatalf("start: %+v", r)
	}
	if in := inspect(); in["state"] != "running" || in["memory_mib"] != 256.0 {
		t.Fatalf("after start: %v", in)
	}
	if r := client("", "exec", "box", "--", "cat", "/tmp/f"); r.code != 0 || r.stdout != "hi there\n" {
		t.Fatalf("files after a restart: %+v", r)
	}
	if r := client("", "create", "two"); r.code != 0 {
		t.Fatalf("create two: %+v", r)
	}
	if r := client("", "rm", "-f", "box", "nosuch", "two"); r.code != 1 || r.stdout != "box\ntwo\n" || !strings.Contains(r.stderr, "nosuch") {
		t.Fatalf("rm -f of three, one missing: %+v", r)
	}
	if r := client("", "ps", "--namespace", "*"); strings.Contains(r.stdout, "box") || strings.Contains(r.stdout, "two") {
		t.Fatalf("ps after rm: %+v", r)
	}
}
