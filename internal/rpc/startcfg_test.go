package rpc_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/sandbox"
)

// TestStartConfig: sandbox.start honours microsandbox's depends_on, shell,
// scripts and exec: a stopped dependency is started first, the start
// command runs as a background process once per start of a stopped
// sandbox, exec wins over the start script (TestStartConfigRefused: and
// rejects what it cannot honour with clear errors; TestStartConfigShell:
// in real shells).
func TestStartConfig(t *testing.T) {
	e := newFakeEnv(t, true, nil)
	state := func(name string) string {
		var info struct {
			State string `json:"state"`
		}
		e.must("sandbox.get", map[string]any{"sandbox": name}, &info)
		return info.State
	}
	// processes lists the argv of name's background processes: a start
	// command is one of them, and a new agent has none of an old one's.
	processes := func(name string) string {
		var procs struct {
			Processes []struct {
				Argv []string `json:"argv"`
			} `json:"processes"`
		}
		e.must("sandbox.process.list", map[string]any{"sandbox": name}, &procs)
		var out []string
		for _, p := range procs.Processes {
			out = append(out, strings.Join(p.Argv, " "))
		}
		return strings.Join(out, ", ")
	}

	e.must("sandbox.start", map[string]any{"sandbox": "db", "config": map[string]any{"envs": []string{"ROLE=db"}}}, nil)
	e.must("sandbox.stop", map[string]any{"sandbox": "db"}, nil)
	cfg := map[string]any{
		"depends_on": []string{"db", "db"},
		"shell":      "/bin/sh",
		"scripts":    map[string]string{"start": "sleep 600", "test": "exit 3"},
	}
	e.must("sandbox.start", map[string]any{"sandbox": "app", "config": cfg}, nil)
	if got := state("db"); got != "running" {
		t.Fatalf("dependency is %s, want running", got)
	}
	const script = "/bin/sh -c sleep 600"
	if got := processes("app"); got != script {
		t.Fatalf("processes after the start: %q, want the start script %q", got, script)
	}
	// Starting the running sandbox again does not run it again, nor when
	// that start starts a stopped dependency, which the log records.
	e.must("sandbox.start", map[string]any{"sandbox": "app", "config": cfg}, nil)
	e.must("sandbox.stop", map[string]any{"sandbox": "db"}, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "app", "config": cfg}, nil)
	if got := processes("app"); got != script {
		t.Fatalf("start script ran again on a start of a running sandbox: %q", got)
	}
	var logs struct {
		Lines []string `json:"lines"`
	}
	e.must("sandbox.logs", map[string]any{"sandbox": "app"}, &logs)
	if all := strings.Join(logs.Lines, "\n"); strings.Count(all, `started "db", which it depends on`) != 2 {
		t.Fatalf("app's log does not record both starts of its dependency:\n%s", all)
	}
	// A restart after a stop runs it again.
	e.must("sandbox.stop", map[string]any{"sandbox": "app"}, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "app", "config": cfg}, nil)
	if got := processes("app"); got != script {
		t.Fatalf("start script did not run on restart: %q", got)
	}

	// exec wins over the start script.
	e.must("sandbox.start", map[string]any{"sandbox": "ex", "config": map[string]any{
		"exec": "sleep 601", "scripts": map[string]string{"start": "sleep 602"},
	}}, nil)
	if got := processes("ex"); got != "/bin/sh -c sleep 601" {
		t.Fatalf("exec vs start script: %q", got)
	}

	// A start command whose shell the sandbox lacks is exec_failed, the
	// sandbox started before its command failed (TestStartConfigRefused
	// has the configs refused before anything starts).
	r := e.call("sandbox.start", map[string]any{"sandbox": "bad", "config": map[string]any{"shell": "/no/such/shell", "exec": "true"}})
	if r.Error == nil || r.kind() != "exec_failed" || !strings.Contains(r.Error.Message, "/no/such/shell") {
		t.Errorf("shell not in the sandbox: want kind exec_failed mentioning %q, got %d %s", "/no/such/shell", r.Status, r.Raw)
	}
	var list struct {
		Sandboxes []json.RawMessage `json:"sandboxes"`
	}
	e.must("sandbox.list", map[string]any{}, &list)
	if len(list.Sandboxes) != 4 {
		t.Errorf("want 4 sandboxes (db, app, ex, bad), got %d", len(list.Sandboxes))
	}
}

// TestStartConfigShell: the start script runs in the sandbox's real shell,
// once, and a dependency started again gets its own config (its env).
func TestStartConfigShell(t *testing.T) {
	e := newEnv(t, true, nil)
	// stdout runs a shell script in sandbox name until it prints something
	// (the start command runs in the background) or 10s have passed.
	stdout := func(name, script string) string {
		deadline := time.Now().Add(10 * time.Second)
		for {
			var res struct {
				Output []struct{ Stream, Text string } `json:"output"`
			}
			e.must("sandbox.command.run", map[string]any{"sandbox": name, "command": "sh", "args": []string{"-c", script}}, &res)
			var lines []string
			for _, o := range res.Output {
				if o.Stream == "stdout" {
					lines = append(lines, o.Text)
				}
			}
			if len(lines) > 0 || time.Now().After(deadline) {
				return strings.Join(lines, "\n")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	e.must("sandbox.start", map[string]any{"sandbox": "db", "config": map[string]any{"envs": []string{"ROLE=db"}}}, nil)
	e.must("sandbox.stop", map[string]any{"sandbox": "db"}, nil)
	cfg := map[string]any{
		"depends_on": []string{"db"},
		"shell":      "/bin/sh",
		"scripts":    map[string]string{"start": "echo started-$$ >> /tmp/marks"},
	}
	e.must("sandbox.start", map[string]any{"sandbox": "app", "config": cfg}, nil)
	if got := stdout("db", "echo $ROLE"); got != "db" {
		t.Errorf("dependency restarted without its config: %q", got)
	}
	if got := stdout("app", "cat /tmp/marks 2>/dev/null"); !strings.HasPrefix(got, "started-") {
		t.Fatalf("start script output %q", got)
	}
	e.must("sandbox.start", map[string]any{"sandbox": "app", "config": cfg}, nil)
	time.Sleep(300 * time.Millisecond)
	if got := stdout("app", "cat /tmp/marks 2>/dev/null"); strings.Count(got, "started-") != 1 {
		t.Fatalf("start script ran again on a start of a running sandbox: %q", got)
	}
	e.must("sandbox.stop", map[string]any{"sandbox": "app"}, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "app", "config": cfg}, nil)
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(stdout("app", "cat /tmp/marks 2>/dev/null"), "started-") != 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := stdout("app", "cat /tmp/marks 2>/dev/null"); strings.Count(got, "started-") != 2 {
		t.Fatalf("start script did not run on restart: %q", got)
	}
}

// TestStartConfigRefused: a start config sandbox.start cannot honour is
// refused with a clear error, and starts no dependency.
func TestStartConfigRefused(t *testing.T) {
	e := newFakeEnv(t, true, nil)
	// dep2 is stopped; a config refused for another reason must not start it.
	e.must("sandbox.start", map[string]any{"sandbox": "dep2"}, nil)
	e.must("sandbox.stop", map[string]any{"sandbox": "dep2"}, nil)
	bad := []struct {
		name   string
		config map[string]any
		kind   string
		want   string
	}{
		{"missing dependency", map[string]any{"depends_on": []string{"nowhere"}}, "not_found", "nowhere"},
		{"invalid config with a dependency", map[string]any{"depends_on": []string{"dep2"}, "memory": 1}, "invalid_params", "memory"},
		{"self dependency", map[string]any{"depends_on": []string{"bad"}}, "invalid_params", "itself"},
		{"bad dependency name", map[string]any{"depends_on": []string{"../x"}}, "invalid_params", "depends_on"},
		{"relative shell", map[string]any{"shell": "bash", "exec": "true"}, "invalid_params", "shell"},
		{"bad script name", map[string]any{"scripts": map[string]string{"a b": "true"}}, "invalid_params", "scripts"},
		{"NUL in exec", map[string]any{"exec": "echo \x00"}, "invalid_params", "NUL"},
		{"huge script", map[string]any{"scripts": map[string]string{"start": strings.Repeat("x", 70<<10)}}, "invalid_params", "at most"},
	}
	for _, c := range bad {
		r := e.call("sandbox.start", map[string]any{"sandbox": "bad", "config": c.config})
		if r.Error == nil || r.kind() != c.kind || !strings.Contains(r.Error.Message, c.want) {
			t.Errorf("%s: want kind %s mentioning %q, got %d %s", c.name, c.kind, c.want, r.Status, r.Raw)
		}
	}
	if got := e.get("", "dep2").State; got != "stopped" {
		t.Errorf("a refused config started its dependency: %s", got)
	}
	// Rejected configs started nothing.
	var list struct {
		Sandboxes []json.RawMessage `json:"sandboxes"`
	}
	e.must("sandbox.list", map[string]any{}, &list)
	if len(list.Sandboxes) != 1 {
		t.Errorf("want 1 sandbox (dep2), got %d", len(list.Sandboxes))
	}
}

// TestVolumes: sandbox.start binds host paths beneath the server's
// --volume-root directories (TestVolumesRefused: and refuses everything
// else).
func TestVolumes(t *testing.T) {
	root, data := volumeRoot(t)
	e := newEnv(t, true, func(o *sandbox.Options) { o.VolumeRoots = []string{root} })
	vols := []string{data + ":/data", data + ":/ro:ro"}
	e.must("sandbox.start", map[string]any{"sandbox": "v", "config": map[string]any{"volumes": vols}}, nil)
	var res struct {
		ExitCode int `json:"exit_code"`
		Output   []struct{ Stream, Text string }
	}
	e.must("sandbox.command.run", map[string]any{"sandbox": "v", "command": "sh", "args": []string{"-c", "echo hi > /data/f && cat /ro/f && ! touch /ro/g 2>/dev/null"}}, &res)
	if res.ExitCode != 0 || len(res.Output) != 1 || res.Output[0].Text != "hi" {
		t.Fatalf("volumes in the sandbox: %+v", res)
	}
	if b, err := os.ReadFile(filepath.Join(data, "f")); err != nil || string(b) != "hi\n" {
		t.Fatalf("on the host: %q %v", b, err)
	}
	// A restart binds them again, from the stored config.
	e.must("sandbox.stop", map[string]any{"sandbox": "v"}, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "v", "config": map[string]any{"volumes": vols}}, nil)
	e.must("sandbox.command.run", map[string]any{"sandbox": "v", "command": "cat", "args": []string{"/ro/f"}}, &res)
	if len(res.Output) != 1 || res.Output[0].Text != "hi" {
		t.Fatalf("after restart: %+v", res)
	}

	// sandbox.create takes them too.
	e.must("sandbox.create", map[string]any{"name": "vc", "volumes": []string{data + ":/d:ro"}}, nil)
	e.must("sandbox.command.run", map[string]any{"sandbox": "vc", "command": "cat", "args": []string{"/d/f"}}, &res)
	if len(res.Output) != 1 || res.Output[0].Text != "hi" {
		t.Fatalf("volume of sandbox.create: %+v", res)
	}
}

// TestVolumesRefused: a volume outside the server's --volume-root
// directories, or not a clean HOST:GUEST[:ro|rw], is refused.
func TestVolumesRefused(t *testing.T) {
	root, data := volumeRoot(t)
	e := newFakeEnv(t, true, func(o *sandbox.Options) { o.VolumeRoots = []string{root} })
	for _, c := range []struct{ vol, want string }{
		{"/etc:/x", "not allowed"},
		{filepath.Join(root, "etc-link") + ":/x", "symlink"},
		{filepath.Join(root, "missing") + ":/x", "no such file"},
		{root + "/data/../data:/x", "clean"},
		{data + ":/proc/x", "/proc"},
		{data + ":relative", "absolute"},
		{data, "HOST:GUEST"},
		{data + ":/x:rx", "ro or rw"},
	} {
		r := e.call("sandbox.start", map[string]any{"sandbox": "bad", "config": map[string]any{"volumes": []string{c.vol}}})
		if r.Status != 400 || r.kind() != "invalid_params" || !strings.Contains(r.Error.Message, c.want) {
			t.Errorf("volume %q: want invalid_params mentioning %q, got %d %s", c.vol, c.want, r.Status, r.Raw)
		}
	}
}

// volumeRoot makes a volume root holding data, a directory anyone may
// write, and etc-link, a symlink to /etc.
func volumeRoot(t *testing.T) (root, data string) {
	root = t.TempDir()
	for _, d := range []string{filepath.Dir(root), root} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data = filepath.Join(root, "data")
	if err := os.Mkdir(data, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(data, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", filepath.Join(root, "etc-link")); err != nil {
		t.Fatal(err)
	}
	return root, data
}
