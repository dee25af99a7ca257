package main

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// TestServeIsolationTiers: a real server with both tiers (the pinned
// runsc) makes a native and a gvisor sandbox over HTTP and says which
// each got; a namespace that requires gvisor gets it and is forbidden
// native; the gvisor sandbox pauses (a command is then a conflict, or
// resumes it on request) and a workspace mounts in one, its writes landing
// in the workspace's host directory; what gvisor lacks is unsupported,
// naming the alternative. A
// server killed with SIGKILL leaves no runsc behind, and the next one
// shows the gvisor sandbox stopped with the reason, its runtime state
// gone. A server with a bogus runsc refuses the gvisor tier (and will
// not start with it as its default); warren run takes a tier, and warren
// doctor lists both.
func TestServeIsolationTiers(t *testing.T) {
	testenv.RequireRoot(t)
	runsc := testenv.RunscBinary(t)
	dir := stateDir(t)
	conf := filepath.Join(dir, "warren.toml")
	if err := os.WriteFile(conf, []byte("[namespaces.strict]\nisolation = [\"gvisor\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"WARREN_RUNSC=" + runsc}
	flags := []string{"--dev", "--config", conf, "--network", "off"}
	url, srv, stderr := startServeEnv(t, dir, env, flags...)
	call := rpcCaller(t, url, "")
	type info struct {
		State     string `json:"state"`
		Error     string `json:"error"`
		Isolation string `json:"isolation"`
	}
	create := func(ns, name string, extra map[string]any) rpcReply {
		t.Helper()
		p := map[string]any{"namespace": ns, "name": name}
		for k, v := range extra {
			p[k] = v
		}
		return call("sandbox.create", p)
	}
	get := func(ns, name string) info {
		t.Helper()
		r := call("sandbox.get", map[string]any{"namespace": ns, "sandbox": name})
		var in info
		if r.Error != nil || json.Unmarshal(r.Result, &in) != nil {
			t.Fatalf("get %s/%s: %+v", ns, name, r.Error)
		}
		return in
	}
	wantErr := func(what string, r rpcReply, kind, says string) {
		t.Helper()
		if r.Error == nil || r.Error.Data.Kind != kind || !strings.Contains(r.Error.Message, says) {
			t.Errorf("%s: %d %+v, want %s saying %q", what, r.status, r.Error, kind, says)
		}
	}
	for _, c := range []struct{ ns, name, iso, want string }{
		{"default", "n", "", "native"},
		{"default", "g", "gvisor", "gvisor"},
		{"strict", "s", "", "gvisor"},
	} {
		r := create(c.ns, c.name, map[string]any{"isolation": c.iso})
		var in info
		if r.Error != nil || json.Unmarshal(r.Result, &in) != nil {
			t.Fatalf("create %s/%s: %+v\n%s", c.ns, c.name, r.Error, stderr.String())
		}
		if in.Isolation != c.want || get(c.ns, c.name).Isolation != c.want {
			t.Errorf("%s/%s got isolation %q, want %q", c.ns, c.name, in.Isolation, c.want)
		}
	}
	// The gvisor sandbox's kernel is gVisor's, the native one's the host's.
	hostVersion, err := os.ReadFile("/proc/version")
	if err != nil {
		t.Fatal(err)
	}
	version := func(ns, name string) string {
		t.Helper()
		r := call("sandbox.command.run", map[string]any{"namespace": ns, "sandbox": name, "command": "cat", "args": []string{"/proc/version"}})
		if r.Error != nil {
			t.Fatalf("exec in %s/%s: %+v", ns, name, r.Error)
		}
		return string(r.Result)
	}
	hostKernel := strings.Fields(string(hostVersion))[2]
	if v := version("default", "n"); !strings.Contains(v, hostKernel) {
		t.Errorf("native sandbox's kernel: %s, want the host's %s", v, hostKernel)
	}
	if v := version("default", "g"); strings.Contains(v, hostKernel) {
		t.Errorf("gvisor sandbox's kernel is the host's: %s", v)
	}
	var ms struct {
		Sandboxes []struct {
			Name      string `json:"name"`
			Isolation string `json:"isolation"`
		} `json:"sandboxes"`
	}
	if r := call("sandbox.metrics.get", map[string]any{"namespace": "default", "sandbox": "g"}); r.Error != nil || json.Unmarshal(r.Result, &ms) != nil || len(ms.Sandboxes) != 1 || ms.Sandboxes[0].Isolation != "gvisor" {
		t.Errorf("metrics of g: %+v %s", r.Error, r.Result)
	}
	// Paused over HTTP as a native sandbox is: a command is a conflict,
	// or resumes it when it says so.
	if r := call("sandbox.pause", map[string]any{"namespace": "default", "sandbox": "g"}); r.Error != nil || get("default", "g").State != "paused" {
		t.Fatalf("pause the gvisor sandbox: %+v", r.Error)
	}
	wantErr("a command in a paused gvisor sandbox", call("sandbox.command.run", map[string]any{"namespace": "default", "sandbox": "g", "command": "true"}), "conflict", "resume it first")
	if r := call("sandbox.command.run", map[string]any{"namespace": "default", "sandbox": "g", "command": "true", "resume": true}); r.Error != nil || get("default", "g").State != "running" {
		t.Errorf("a command with resume in a paused gvisor sandbox: %+v", r.Error)
	}
	// A workspace (a volume at /workspace) mounts in a gvisor sandbox.
	if r := call("workspace.create", map[string]any{"namespace": "default", "name": "proj"}); r.Error != nil {
		t.Fatalf("workspace.create: %+v", r.Error)
	}
	if r := create("default", "w", map[string]any{"isolation": "gvisor", "workspace": "proj"}); r.Error != nil {
		t.Fatalf("a gvisor sandbox with a workspace: %+v\n%s", r.Error, stderr.String())
	}
	if r := call("sandbox.command.run", map[string]any{"namespace": "default", "sandbox": "w", "command": "sh", "args": []string{"-c", "echo in-ws > /workspace/note && cat /workspace/note"}}); r.Error != nil || !strings.Contains(string(r.Result), "in-ws") {
		t.Errorf("write in the workspace of a gvisor sandbox: %+v %s", r.Error, r.Result)
	}
	// On the host, in the workspace's directory (not the sandbox's layer).
	var onHost []string
	_ = filepath.WalkDir(filepath.Join(dir, "data", "workspaces"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == "note" {
			onHost = append(onHost, p)
		}
		return nil
	})
	if len(onHost) != 1 {
		t.Errorf("the workspace's note on the host: %q, want one under %s", onHost, filepath.Join(dir, "data", "workspaces"))
	}
	if r := call("sandbox.remove", map[string]any{"namespace": "default", "sandbox": "w"}); r.Error != nil {
		t.Errorf("remove w: %+v", r.Error)
	}
	wantErr("strict asking for native", create("strict", "x", map[string]any{"isolation": "native"}), "forbidden", `isolation "native" is not among namespace "strict"'s isolation tiers (gvisor)`)
	// Disk limits are off on this server (WARREN_DISK_POOL=off): refused
	// as for native (TestServeDiskLimit has them on for both tiers).
	wantErr("gvisor with a disk limit", create("default", "d", map[string]any{"isolation": "gvisor", "disk_mib": 64}), "invalid_params", "this server has no disk limits")
	wantErr("unknown tier", create("default", "k", map[string]any{"isolation": "kvm"}), "invalid_params", "want one of native, gvisor")

	// SIGKILL: the server's runsc processes die with it.
	runDir := filepath.Join(dir, "run", ".gvisor")
	if err := srv.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = srv.Wait()
	runscLeft := func() []string {
		var left []string
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if err == nil && strings.Contains(string(b), runDir) {
				left = append(left, e.Name()+": "+strings.ReplaceAll(string(b), "\x00", " "))
			}
		}
		return left
	}
	for t0 := time.Now(); len(runscLeft()) > 0; time.Sleep(50 * time.Millisecond) {
		if time.Since(t0) > 10*time.Second {
			t.Fatalf("runsc outlived its killed server by 10 s: %q", runscLeft())
		}
	}
	url, srv, stderr = startServeEnv(t, dir, env, flags...)
	call = rpcCaller(t, url, "")
	if in := get("default", "g"); in.State != "error" || !strings.Contains(in.Error, "do not outlive the server") || in.Isolation != "gvisor" {
		t.Errorf("gvisor sandbox after a server's SIGKILL: %+v", in)
	}
	if in := get("default", "n"); in.State != "running" || in.Isolation != "native" {
		t.Errorf("native sandbox after a server's SIGKILL: %+v", in)
	}
	// What runsc kept of the sandboxes (state files, bundles) is gone;
	// their files stay for a restart.
	if ents, err := os.ReadDir(filepath.Join(runDir, ".runsc")); err != nil || len(ents) > 1 { // "null-netns" at most
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("runsc state after the restart: %v %v", names, err)
	}
	if r := call("sandbox.start", map[string]any{"namespace": "default", "sandbox": "g"}); r.Error != nil {
		t.Errorf("restart g: %+v\n%s", r.Error, stderr.String())
	} else if in := get("default", "g"); in.State != "running" || in.Isolation != "gvisor" {
		t.Errorf("g restarted: %+v", in)
	}
	for _, k := range [][2]string{{"default", "n"}, {"default", "g"}, {"strict", "s"}} {
		if r := call("sandbox.remove", map[string]any{"namespace": k[0], "sandbox": k[1]}); r.Error != nil {
			t.Errorf("remove %v: %+v", k, r.Error)
		}
	}
	stopServe(t, srv)
	if left := runscLeft(); len(left) > 0 {
		t.Errorf("runsc left after a clean stop: %q", left)
	}
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err != nil || strings.Contains(string(mi), dir) {
		t.Errorf("mounts left under %s after a clean stop (%v):\n%s", dir, err, mi)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "data", "gvisor", "sandboxes")); len(ents) > 0 {
		t.Errorf("gvisor sandboxes' files left after their removal: %v", ents)
	}

	// A bogus runsc: the tier is refused, saying why; as the default the
	// server does not start.
	bogus := []string{"WARREN_RUNSC=" + filepath.Join(dir, "no-runsc")}
	url, srv, _ = startServeEnv(t, dir, bogus, flags...)
	call = rpcCaller(t, url, "")
	wantErr("gvisor without runsc", create("default", "g2", map[string]any{"isolation": "gvisor"}), "unavailable", "gvisor: runsc "+filepath.Join(dir, "no-runsc"))
	wantErr("strict without runsc", create("strict", "s2", nil), "unavailable", "install it with scripts/runsc.sh")
	start := call("sandbox.start", map[string]any{"namespace": "default", "sandbox": "g3", "config": map[string]any{"warren": map[string]any{"isolation": "gvisor"}}})
	wantErr("sandbox.start's warren.isolation without runsc", start, "unavailable", "isolation \"gvisor\" cannot run on this server")
	if r := create("default", "n2", nil); r.Error != nil {
		t.Errorf("native beside a bogus runsc: %+v", r.Error)
	}
	call("sandbox.remove", map[string]any{"namespace": "default", "sandbox": "n2"})
	stopServe(t, srv)
	cmd := warren(t, dir, "serve", "--dev", "--listen", "127.0.0.1:0", "--isolation", "gvisor", "--network", "off")
	cmd.Env = append(cmd.Env, bogus...)
	if r := run(t, cmd, ""); r.code == 0 || !strings.Contains(r.stderr, "--isolation gvisor: the gvisor tier cannot run here") {
		t.Errorf("serve --isolation gvisor with a bogus runsc: %+v", r)
	}

	// warren run takes a tier too.
	wr := warren(t, dir, "run", "--isolation", "gvisor", "--", "cat", "/proc/version")
	wr.Env = append(wr.Env, env...)
	if r := run(t, wr, ""); r.code != 0 || r.stdout == "" || strings.Contains(r.stdout, hostKernel) {
		t.Errorf("warren run --isolation gvisor: %+v", r)
	}
	wr = warren(t, dir, "run", "--isolation", "gvisor", "--", "true")
	wr.Env = append(wr.Env, bogus...)
	if r := run(t, wr, ""); r.code == 0 || !strings.Contains(r.stderr, "--isolation gvisor: runsc "+filepath.Join(dir, "no-runsc")) {
		t.Errorf("warren run --isolation gvisor with a bogus runsc: %+v", r)
	}

	// The doctor lists both tiers.
	doc := warren(t, dir, "doctor")
	doc.Env = append(doc.Env, env...)
	r := run(t, doc, "")
	for _, want := range []string{"ok    isolation tier native", "ok    isolation tier gvisor"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("doctor lacks %q:\n%s%s", want, r.stdout, r.stderr)
		}
	}
	doc = warren(t, dir, "doctor")
	doc.Env = append(doc.Env, bogus...)
	if r := run(t, doc, ""); !strings.Contains(r.stdout, "warn  isolation tier gvisor: does not work here: runsc "+filepath.Join(dir, "no-runsc")) {
		t.Errorf("doctor with a bogus runsc:\n%s", r.stdout)
	}
}
