package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// TestServeSnapshots: over HTTP against a real server with the gvisor
// tier, a sandbox with REPL state is checkpointed (it runs on), restored
// under a new name (state, files and its own hostname kept) and forked
// into two; snapshots are listed, inspected and removed; the namespace's
// max_snapshots holds; a native sandbox's checkpoint is unsupported,
// naming gvisor; the CLI drives the same methods. Nothing is left in the
// snapshot directory after.
func TestServeSnapshots(t *testing.T) {
	testenv.RequireRoot(t)
	runsc := testenv.RunscBinary(t)
	dir := stateDir(t)
	conf := filepath.Join(dir, "warren.toml")
	if err := os.WriteFile(conf, []byte("[namespaces.default]\nmax_snapshots = 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	url, _, stderr := startServeEnv(t, dir, []string{"WARREN_RUNSC=" + runsc}, "--dev", "--config", conf, "--network", "off")
	call := rpcCaller(t, url, "")
	must := func(method string, p map[string]any, out any) {
		t.Helper()
		r := call(method, p)
		if r.Error != nil {
			t.Fatalf("%s %v: %+v\n%s", method, p, r.Error, stderr.String())
		}
		if out != nil {
			if err := json.Unmarshal(r.Result, out); err != nil {
				t.Fatalf("%s: %v: %s", method, err, r.Result)
			}
		}
	}
	cli := func(args ...string) string {
		t.Helper()
		r := run(t, warren(t, dir, append([]string{"--server", url}, args...)...), "")
		if r.code != 0 {
			t.Fatalf("warren %v: exit %d: %s", args, r.code, r.stderr)
		}
		return r.stdout
	}
	wantErr := func(what string, r rpcReply, kind, says string) {
		t.Helper()
		if r.Error == nil || r.Error.Data.Kind != kind || !strings.Contains(r.Error.Message, says) {
			t.Errorf("%s: %d %+v, want %s saying %q", what, r.status, r.Error, kind, says)
		}
	}
	repl := func(name, code string) string {
		t.Helper()
		var res struct {
			Output []struct {
				Text string `json:"text"`
			} `json:"output"`
		}
		must("sandbox.repl.run", map[string]any{"sandbox": name, "language": "python", "code": code}, &res)
		var lines []string
		for _, o := range res.Output {
			lines = append(lines, o.Text)
		}
		return strings.Join(lines, "\n")
	}
	command := func(name string, argv ...string) string {
		t.Helper()
		var res struct {
			Output []struct {
				Text string `json:"text"`
			} `json:"output"`
		}
		must("sandbox.command.run", map[string]any{"sandbox": name, "command": argv[0], "args": argv[1:]}, &res)
		if len(res.Output) == 0 {
			return ""
		}
		return res.Output[0].Text
	}
	must("sandbox.create", map[string]any{"name": "g", "isolation": "gvisor"}, nil)
	must("sandbox.create", map[string]any{"name": "n", "isolation": "native"}, nil)
	repl("g", "x = 41")
	command("g", "sh", "-c", "echo kept > /tmp/f")

	var snap struct {
		Name, Source, Isolation string
		Bytes                   int64
	}
	must("sandbox.checkpoint", map[string]any{"sandbox": "g", "snapshot": "s1"}, &snap)
	if snap.Name != "s1" || snap.Source != "g" || snap.Isolation != "gvisor" || snap.Bytes <= 0 {
		t.Errorf("checkpoint: %+v", snap)
	}
	if got := repl("g", "x"); got != "41" {
		t.Errorf("source after its checkpoint: x is %q", got)
	}
	wantErr("a name taken", call("sandbox.checkpoint", map[string]any{"sandbox": "g", "snapshot": "s1"}), "conflict", "already exists")
	wantErr("native", call("sandbox.checkpoint", map[string]any{"sandbox": "n", "snapshot": "sn"}), "unsupported", "isolation gvisor")

	var info struct{ Name, State, Isolation string }
	must("sandbox.restore", map[string]any{"snapshot": "s1", "name": "r"}, &info)
	if info.State != "running" || info.Isolation != "gvisor" {
		t.Errorf("restored: %+v", info)
	}
	if got := repl("r", "x + 1"); got != "42" {
		t.Errorf("restored x + 1 = %q", got)
	}
	if got := command("r", "cat", "/tmp/f"); got != "kept" {
		t.Errorf("restored /tmp/f = %q", got)
	}
	if got := command("r", "hostname"); got != "r" {
		t.Errorf("restored hostname %q, want r", got)
	}
	wantErr("restore onto a name taken", call("sandbox.restore", map[string]any{"snapshot": "s1", "name": "g"}), "conflict", "already exists")

	var forked struct {
		Sandboxes []struct{ Name, State string } `json:"sandboxes"`
	}
	must("sandbox.fork", map[string]any{"sandbox": "g", "count": 2}, &forked)
	if len(forked.Sandboxes) != 2 {
		t.Fatalf("fork: %+v", forked)
	}
	for _, f := range forked.Sandboxes {
		if got := repl(f.Name, "x"); got != "41" {
			t.Errorf("fork %s: x = %q", f.Name, got)
		}
	}
	// The quota: s1 and s2, not a third.
	must("sandbox.checkpoint", map[string]any{"sandbox": "r", "snapshot": "s2"}, nil)
	wantErr("over max_snapshots", call("sandbox.checkpoint", map[string]any{"sandbox": "g", "snapshot": "s3"}), "limit", "max_snapshots")

	out := cli("snapshot", "ls", "-q")
	if out != "s1\ns2\n" {
		t.Errorf("snapshot ls -q: %q", out)
	}
	if out := cli("snapshot", "get", "s2"); !strings.Contains(out, `"source": "r"`) {
		t.Errorf("snapshot get s2: %s", out)
	}
	if out := cli("snapshot", "restore", "s2", "r2"); out != "r2 running\n" {
		t.Errorf("snapshot restore: %q", out)
	}
	cli("snapshot", "rm", "s1")
	var removed struct{ Removed bool }
	must("snapshot.remove", map[string]any{"snapshot": "s2"}, &removed)
	if !removed.Removed {
		t.Error("snapshot.remove s2: not removed")
	}
	wantErr("get a removed one", call("snapshot.get", map[string]any{"snapshot": "s1"}), "not_found", "no snapshot")
	for _, n := range []string{"g", "n", "r", "r2", forked.Sandboxes[0].Name, forked.Sandboxes[1].Name} {
		must("sandbox.remove", map[string]any{"sandbox": n}, nil)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "data", "snapshots", "default")); len(ents) > 0 {
		t.Errorf("left in the snapshot directory: %v", ents)
	}
}
