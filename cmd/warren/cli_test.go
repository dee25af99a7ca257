package main

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// TestHelpAndErrors drives the binary's help and usage errors as a user
// meets them: help on stdout with exit 0 when asked for, for every command
// and subcommand; one line on stderr with exit 2 for a command line that
// cannot run, naming what is missing or suggesting what was meant.
func TestHelpAndErrors(t *testing.T) {
	dir := t.TempDir()
	// Help: stdout, exit 0, stderr empty, and the right command's text.
	for _, tc := range []struct {
		args []string
		has  string
	}{
		{[]string{"-h"}, "Commands:"},
		{[]string{"--help"}, "Global flags"},
		{[]string{"help"}, "doctor"},
		{[]string{"help", "run"}, "Usage: warren run"},
		{[]string{"help", "image", "ls"}, "Usage: warren image ls"},
		{[]string{"help", "help"}, "Usage: warren help"},
		{[]string{"run", "-h"}, "--memory"},
		{[]string{"-v", "run", "--help"}, "Usage: warren run"},
		{[]string{"serve", "-h"}, "--listen"},
		{[]string{"ps", "-h"}, "-json"},
		{[]string{"exec", "-h"}, "Usage: warren exec"},
		{[]string{"image", "-h"}, "warren image import"},
		{[]string{"image", "ls", "-h"}, "Usage: warren image ls"},
		{[]string{"image", "import", "-h"}, "RepoTags"},
		{[]string{"image", "pull", "-h"}, "--platform"},
		{[]string{"image", "build-base", "-h"}, "mmdebstrap"},
		{[]string{"image", "prune", "-h"}, "Usage: warren image prune"},
		{[]string{"image", "inspect", "-h"}, "Usage: warren image inspect"},
		{[]string{"image", "rm", "-h"}, "Usage: warren image rm"},
		{[]string{"key", "-h"}, "Subcommands:"},
		{[]string{"key", "create", "-h"}, "--expire"},
		{[]string{"key", "list", "-h"}, "-json"},
		{[]string{"key", "revoke", "-h"}, "Usage: warren key revoke ID"},
		{[]string{"workspace", "-h"}, "warren workspace push"},
		{[]string{"workspace", "ls", "-h"}, "Usage: warren workspace ls"},
		{[]string{"workspace", "get", "-h"}, "Usage: warren workspace get"},
		{[]string{"egress", "-h"}, "warren egress log"},
		{[]string{"egress", "set", "-h"}, "Usage: warren egress set"},
		{[]string{"ports", "-h"}, "warren ports expose NAME"},
		{[]string{"ports", "expose", "-h"}, "Usage: warren ports expose"},
		{[]string{"ns", "-h"}, "quotas"},
		{[]string{"audit", "-h"}, "audit log"},
		{[]string{"audit", "verify", "-h"}, "--anchor"},
		{[]string{"pause", "-h"}, "Usage: warren pause"},
		{[]string{"logs", "-h"}, "--tail"},
		{[]string{"doctor", "-h"}, "Usage: warren doctor"},
		{[]string{"bench", "-h"}, "Usage: warren bench"},
		{[]string{"bench", "soak", "-h"}, "-clients"},
		{[]string{"version", "-h"}, "Usage: warren version"},
		{[]string{"completion", "-h"}, "source <(warren completion bash)"},
		{[]string{"completion", "bash"}, "complete -o default -F _warren warren"},
		{[]string{"completion", "zsh"}, "#compdef warren"},
		{[]string{"completion", "fish"}, "complete -c warren"},
	} {
		r := run(t, warren(t, dir, tc.args...), "")
		if r.code != 0 || !strings.Contains(r.stdout, tc.has) || r.stderr != "" {
			t.Errorf("warren %s: exit %d, stdout %.200q, stderr %q; want exit 0 and stdout with %q", strings.Join(tc.args, " "), r.code, r.stdout, r.stderr, tc.has)
		}
	}
	// Errors: exactly one line on stderr, nothing on stdout, exit 2.
	for _, tc := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"rn"}, `warren: unknown command "rn" (did you mean run?); see 'warren -h'`},
		{[]string{"frobnicate"}, `warren: unknown command "frobnicate"; see 'warren -h'`},
		{[]string{"help", "imgae"}, `warren: unknown command "imgae" (did you mean image?); see 'warren -h'`},
		{[]string{"--servr", "x", "ps"}, `warren: unknown flag --servr (did you mean --server?); see 'warren -h'`},
		{[]string{"--server"}, `warren: flag --server needs a value; see 'warren -h'`},
		{[]string{"run", "--memroy", "1G", "--", "true"}, `warren run: unknown flag --memroy (did you mean --memory?); see 'warren run -h'`},
		{[]string{"run", "--zzz", "--", "true"}, `warren run: unknown flag --zzz; see 'warren run -h'`},
		{[]string{"run", "--image"}, `warren run: flag needs an argument: -image; see 'warren run -h'`},
		{[]string{"run"}, `warren run: missing CMD (what to run; the host image has no default command); see 'warren run -h'`},
		{[]string{"-v", "run"}, `warren run: missing CMD (what to run; the host image has no default command); see 'warren run -h'`},
		{[]string{"logs"}, `warren logs: missing NAME (the sandbox); see 'warren logs -h'`},
		{[]string{"exec", "box"}, `warren exec: missing CMD (what to run); see 'warren exec -h'`},
		{[]string{"ps", "extra"}, `warren ps: unexpected argument "extra"; see 'warren ps -h'`},
		{[]string{"key"}, `warren key: missing a subcommand: create, list, revoke; see 'warren key -h'`},
		{[]string{"key", "revoke"}, `warren key revoke: missing ID (the key's, from 'warren key list'); see 'warren key revoke -h'`},
		{[]string{"key", "create"}, `warren key create: missing --namespace NS (use '*' for a key that may use every namespace); see 'warren key create -h'`},
		{[]string{"key", "lst"}, `warren key: unknown subcommand "lst" (did you mean list?); see 'warren key -h'`},
		{[]string{"image"}, `warren image: missing a subcommand: import, pull, build-base, ls, inspect, rm, prune; see 'warren image -h'`},
		{[]string{"image", "inspect"}, `warren image inspect: missing REF (an image name or id); see 'warren image inspect -h'`},
		{[]string{"image", "import"}, `warren image import: missing SRC (a tarball or directory); see 'warren image import -h'`},
		{[]string{"image", "ls", "extra"}, `warren image ls: unexpected argument "extra"; see 'warren image ls -h'`},
		{[]string{"image", "pull", "a", "b", "c"}, `warren image pull: unexpected argument "c"; see 'warren image pull -h'`},
		{[]string{"workspace", "get"}, `warren workspace get: missing NAME (the workspace); see 'warren workspace get -h'`},
		{[]string{"egress", "sett", "box"}, `warren egress: unknown subcommand "sett" (did you mean set?); see 'warren egress -h'`},
		{[]string{"ports"}, `warren ports: missing NAME (the sandbox); see 'warren ports -h'`},
		{[]string{"ports", "expose", "web"}, `warren ports expose: missing [HOST:]GUEST (the port to publish); see 'warren ports expose -h'`},
		{[]string{"completion"}, `warren completion: missing SHELL (bash, zsh or fish); see 'warren completion -h'`},
		{[]string{"completion", "bsh"}, `warren completion: unknown shell "bsh" (did you mean bash?): want bash, zsh or fish; see 'warren completion -h'`},
		{[]string{"version", "x"}, `warren version: unexpected argument "x"; see 'warren version -h'`},
		{[]string{"audit", "verfy"}, `warren audit: unknown subcommand "verfy" (did you mean verify?) (or none, to query); see 'warren audit -h'`},
	} {
		r := run(t, warren(t, dir, tc.args...), "")
		if r.code != 2 || r.stdout != "" || r.stderr != tc.stderr+"\n" {
			t.Errorf("warren %s: exit %d, stdout %q, stderr %q; want exit 2 and stderr %q", strings.Join(tc.args, " "), r.code, r.stdout, r.stderr, tc.stderr)
		}
	}
}

func TestDidYouMean(t *testing.T) {
	for _, tc := range []struct {
		s    string
		want string
	}{
		{"rn", "run"}, {"memroy", "memory"}, {"insp", "inspect"}, {"servr", "server"},
		{"x", ""}, {"zzzzzz", ""}, {"workspce", "workspace"}, {"", ""},
	} {
		got := didYouMean(tc.s, []string{"run", "memory", "inspect", "server", "workspace", "v"}, "")
		want := ""
		if tc.want != "" {
			want = " (did you mean " + tc.want + "?)"
		}
		if got != want {
			t.Errorf("didYouMean(%q) = %q, want %q", tc.s, got, want)
		}
	}
}

// TestCLIAgainstServer: the client commands against a real server, with a
// key for one namespace: that namespace is every command's default; ps
// shows what is up unless -a; the listings' --json, -q and --format; the
// global flags before the command; the build's version everywhere.
func TestCLIAgainstServer(t *testing.T) {
	testenv.RequireRoot(t)
	dir := stateDir(t)
	kc := run(t, warren(t, dir, "key", "create", "--namespace", "team"), "")
	if kc.code != 0 {
		t.Fatalf("key create: %+v", kc)
	}
	key := strings.TrimSpace(kc.stdout)
	url, srv, stderr := startServe(t, dir)
	defer stopServe(t, srv)
	call := rpcCaller(t, url, key)
	for _, m := range []struct{ method, name string }{{"sandbox.start", "up"}, {"sandbox.start", "down"}, {"sandbox.stop", "down"}} {
		if r := call(m.method, map[string]any{"sandbox": m.name}); r.Error != nil {
			t.Fatalf("%s %s: %+v\n%s", m.method, m.name, r.Error, stderr)
		}
	}
	defer func() {
		for _, n := range []string{"up", "down"} {
			call("sandbox.remove", map[string]any{"sandbox": n})
		}
	}()
	client := func(args ...string) result {
		cmd := warren(t, dir, args...)
		cmd.Env = append(cmd.Env, "MSB_SERVER_URL="+url, "MSB_API_KEY="+key)
		return run(t, cmd, "")
	}
	for _, tc := range []struct {
		args   []string
		stdout string // exact, or a prefix when it ends in "..."
	}{
		{[]string{"ps", "-q"}, "up\n"},
		{[]string{"ps", "-a", "-q"}, "down\nup\n"},
		{[]string{"ps", "-aq"}, "down\nup\n"}, // one-letter flags together, as docker takes them
		{[]string{"ps", "-qa"}, "down\nup\n"},
		{[]string{"stats", "--no-stream", "-q"}, "down\nup\n"},
		{[]string{"stats", "--no-stream", "up", "--format", "{{.Name}} {{.State}} {{.Running}}"}, "up running true\n"},
		{[]string{"stats", "--no-stream", "--json", "down"}, "[\n  {\n    \"namespace\": \"team\",\n    \"name\": \"down\",\n    \"running\": false,..."},
		{[]string{"ports", "up", "--json"}, "[]\n"},
		{[]string{"ports", "-q", "up"}, ""},
		{[]string{"ports", "up"}, "ADDRESS  HOST  GUEST  ORIGIN  PUBLISHED\n"},
		{[]string{"ps", "--state", "stopped", "-q"}, "down\n"},
		{[]string{"ps", "-a", "--format", `{{.Namespace}}/{{.Name}}\t{{.State}}`}, "team/down\tstopped\nteam/up\trunning\n"},
		{[]string{"ps", "--json"}, "[\n  {\n    \"namespace\": \"team\",\n    \"name\": \"up\",\n    \"state\": \"running\",..."},
		{[]string{"ps"}, "NAMESPACE  NAME  STATE    IMAGE   MEMORY  CPUS  UP\nteam       up    running  ..."},
		{[]string{"ns", "-q"}, "team\n"},
		{[]string{"ns", "--format", "{{.Namespace}} {{.Running}} {{.Sandboxes}}"}, "team 1 2\n"},
		{[]string{"workspace", "ls", "--json"}, "[]\n"},
		{[]string{"exec", "up", "--", "echo", "hi"}, "hi\n"},
		{[]string{"--namespace", "team", "-v", "exec", "up", "--", "echo", "hi"}, "hi\n"},
		{[]string{"version"}, "warren dev (commit ..."},
		{[]string{"--version"}, "warren dev (commit ..."},
	} {
		r := client(tc.args...)
		prefix, isPrefix := strings.CutSuffix(tc.stdout, "...")
		if r.code != 0 || (!isPrefix && r.stdout != tc.stdout) || (isPrefix && !strings.HasPrefix(r.stdout, prefix)) {
			t.Errorf("warren %s: exit %d, stdout %q, stderr %q; want stdout %q", strings.Join(tc.args, " "), r.code, r.stdout, r.stderr, tc.stdout)
		}
	}
	// The global flags before the command take the place of the
	// environment's.
	bare := func(args ...string) result {
		cmd := warren(t, dir, args...)
		cmd.Env = append(cmd.Env, "MSB_SERVER_URL=http://127.0.0.1:1", "MSB_API_KEY=")
		return run(t, cmd, "")
	}
	if r := bare("--server", url, "--key", key, "-v", "ps", "-q"); r.code != 0 || r.stdout != "up\n" || !strings.Contains(r.stderr, "sandbox.list: 200 OK") {
		t.Errorf("global flags: %+v", r)
	}
	if r := bare("ps", "--server="+url, "--key", key, "-q"); r.code != 0 || r.stdout != "up\n" {
		t.Errorf("global flags after the command: %+v", r)
	}
	if r := client("--namespace", "other", "ps"); r.code != 1 || !strings.Contains(r.stderr, `this API key is for namespace "team", not "other"`) {
		t.Errorf("another namespace: %+v", r)
	}
	if r := client("ps", "--json", "-q"); r.code != 1 || !strings.Contains(r.stderr, "exclude each other") {
		t.Errorf("--json and -q: %+v", r)
	}
	if r := client("ps", "-aqz"); r.code != 2 || !strings.Contains(r.stderr, "warren ps: unknown flag -z; see 'warren ps -h'") {
		t.Errorf("-aqz: %+v", r)
	}
	if r := client("ps", "--format", "{{.Nope}}"); r.code != 1 || !strings.Contains(r.stderr, "--format") {
		t.Errorf("a template naming no field: %+v", r)
	}
	// Completion: the server's sandbox names where a command takes one,
	// through the bash script as a shell runs it.
	for _, tc := range []struct {
		words []string
		want  string
	}{
		{[]string{"exec", ""}, "down\nup\n"},
		{[]string{"egress", "get", "u"}, "up\n"},
		{[]string{"ports", ""}, "expose\nunexpose\ndown\nup\n"},
		{[]string{"-v", "ex"}, "exec\n"},
		{[]string{"image", "i"}, "import\ninspect\n"},
		{[]string{"run", "--image", "h"}, "host\n"},
		{[]string{"--server", url, "pause", "d"}, "down\n"},
		// Flags, from each command's (and subcommand's) flag set.
		{[]string{"ps", "--j"}, "--json\n"},
		{[]string{"run", "--mem"}, "--memory\n"},
		{[]string{"exec", "-"}, "-e\n--env\n-i\n--key\n--namespace\n--resume\n--server\n-t\n--timeout\n-u\n--user\n-v\n-w\n--workdir\n"},
		{[]string{"egress", "log", "up", "--li"}, "--limit\n"},
		{[]string{"image", "ls", "--f"}, "--format\n"},
		{[]string{"completion", "-"}, ""},
	} {
		if r := client(append([]string{"__complete"}, tc.words...)...); r.code != 0 || r.stdout != tc.want {
			t.Errorf("__complete %q: %+v, want %q", tc.words, r, tc.want)
		}
	}
	script := client("completion", "bash").stdout
	cmd := warren(t, dir)
	cmd.Path, cmd.Args = "/bin/bash", []string{"bash", "-c", script + `COMP_WORDS=(warren logs ""); COMP_CWORD=2; _warren; printf '%s\n' "${COMPREPLY[@]}"`}
	cmd.Env = append(cmd.Env, "MSB_SERVER_URL="+url, "MSB_API_KEY="+key, "PATH="+filepath.Dir(warrenBin)+":/usr/bin:/bin")
	if r := run(t, cmd, ""); r.code != 0 || r.stdout != "down\nup\n" {
		t.Errorf("bash completion of logs: %+v", r)
	}
	cmd = warren(t, dir)
	cmd.Path, cmd.Args = "/bin/bash", []string{"bash", "-c", script + `COMP_WORDS=(warren run --me); COMP_CWORD=2; _warren; printf '%s\n' "${COMPREPLY[@]}"`}
	cmd.Env = append(cmd.Env, "PATH="+filepath.Dir(warrenBin)+":/usr/bin:/bin")
	if r := run(t, cmd, ""); r.code != 0 || r.stdout != "--memory\n" {
		t.Errorf("bash completion of run's flags: %+v", r)
	}
	// The server's build, as /api/v1/health says it.
	resp, err := http.Get(url + "/api/v1/health")
	if err != nil {
		t.Fatal(err)
	}
	var h struct{ Message, Version, Commit string }
	err = json.NewDecoder(resp.Body).Decode(&h)
	_ = resp.Body.Close()
	if err != nil || h.Message != "Service is healthy" || h.Version != "dev" || h.Commit == "" {
		t.Errorf("health: %+v %v", h, err)
	}
}
