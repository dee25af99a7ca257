package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os/exec"
	"strconv"
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

// TestEgressAndPortsListings: egress get/set/log and ports print for
// scripts as every listing does (--json, -q, --format), with the flags
// after the sandbox's name too.
func TestEgressAndPortsListings(t *testing.T) {
	_, client, _ := serverClient(t)
	if r := client("", "create", "--egress", "pypi.org", "box"); r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	defer client("", "rm", "-f", "box")
	for _, tc := range []struct {
		args   []string
		stdout string
	}{
		{[]string{"egress", "get", "box"}, "pypi.org\n"},
		{[]string{"egress", "get", "box", "--json"}, "[\n  \"pypi.org\"\n]\n"},
		{[]string{"egress", "set", "-q", "box", "a.example", "10.0.0.0/8:*"}, "a.example\n10.0.0.0/8:*\n"},
		{[]string{"egress", "get", "box", "--format", "rule {{.}}"}, "rule a.example\nrule 10.0.0.0/8:*\n"},
		{[]string{"egress", "log", "box", "-q"}, "1\n"},
		{[]string{"egress", "log", "box", "--format", "{{.Seq}} {{.Kind}} {{.Verdict}} {{.Reason}}"}, "1 policy set 2 rules\n"},
		{[]string{"ports", "box", "--json"}, "[]\n"},
	} {
		if r := client("", tc.args...); r.code != 0 || r.stdout != tc.stdout {
			t.Errorf("warren %s: %+v, want stdout %q", strings.Join(tc.args, " "), r, tc.stdout)
		}
	}
	if r := client("", "egress", "log", "box", "--json"); r.code != 0 || !strings.HasPrefix(r.stdout, "[\n  {\n    \"seq\": 1,\n") {
		t.Errorf("egress log --json: %+v", r)
	}
	r := client("", "ports", "expose", "box", "80")
	if r.code != 0 || !strings.Contains(r.stdout, "expose  yes") {
		t.Fatalf("ports expose: %+v", r)
	}
	host := strings.TrimSpace(client("", "ports", "-q", "box").stdout)
	var ports []portInfo
	r = client("", "ports", "box", "--json")
	if err := json.Unmarshal([]byte(r.stdout), &ports); err != nil || len(ports) != 1 || ports[0].GuestPort != 80 || strconv.Itoa(ports[0].HostPort) != host {
		t.Fatalf("ports -q %q and --json %+v: %v", host, r, err)
	}
	if r := client("", "ports", "box", "--format", "{{.GuestPort}} {{.Origin}} {{.Published}}"); r.stdout != "80 expose true\n" {
		t.Errorf("ports --format: %+v", r)
	}
}

// TestWorkspacePushPull: a tar pushed into a workspace comes back from
// pull with its file, and a workspace that does not exist is the server's
// error.
func TestWorkspacePushPull(t *testing.T) {
	_, client, _ := serverClient(t)
	if r := client("", "workspace", "create", "w"); r.code != 0 {
		t.Fatalf("workspace create: %+v", r)
	}
	defer client("", "workspace", "rm", "w")
	var in bytes.Buffer
	tw := tar.NewWriter(&in)
	if err := tw.WriteHeader(&tar.Header{Name: "hello.txt", Mode: 0o644, Size: 3, Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write([]byte("hi\n")); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if r := client(in.String(), "workspace", "push", "w"); r.code != 0 {
		t.Fatalf("push: %+v", r)
	}
	r := client("", "workspace", "pull", "w")
	if r.code != 0 {
		t.Fatalf("pull: %+v", r)
	}
	tr := tar.NewReader(strings.NewReader(r.stdout))
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("pull's tar has no hello.txt: %v", err)
		}
		if strings.TrimPrefix(h.Name, "./") == "hello.txt" {
			if b, _ := io.ReadAll(tr); string(b) != "hi\n" {
				t.Fatalf("hello.txt: %q", b)
			}
			break
		}
	}
	if r := client("", "workspace", "pull", "nosuch"); r.code != 1 || !strings.Contains(r.stderr, "nosuch") {
		t.Errorf("pull of a missing workspace: %+v", r)
	}
}
