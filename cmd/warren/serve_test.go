package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// startServe runs 'warren serve' on a free loopback port and waits until
// it answers; it returns the URL and the server's stderr so far.
func startServe(t *testing.T, dir string, extra ...string) (string, *exec.Cmd, *bytes.Buffer) {
	t.Helper()
	return startServeEnv(t, dir, nil, extra...)
}

// startServeEnv is startServe with env added to the server's environment
// (a variable set to "" is removed).
func startServeEnv(t *testing.T, dir string, env []string, extra ...string) (string, *exec.Cmd, *bytes.Buffer) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	// --keep-file-max: tests leave the host's fs.file-max as they found it
	// (TestServeRaisesFileMax restores what it changes).
	cmd := warren(t, dir, append([]string{"serve", "--listen", addr, "--prewarm", "1", "--keep-file-max"}, extra...)...)
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		cmd.Env = slices.DeleteFunc(cmd.Env, func(e string) bool { return strings.HasPrefix(e, k+"=") })
		if v != "" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// A test that does not stop its server (or fails first) still leaves
	// none running: one left would hold its sandboxes, mounts and ports.
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			stopServe(t, cmd)
		}
	})
	url := "http://" + addr
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(url + "/api/v1/health")
		if err == nil {
			_ = resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("server did not come up: %s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return url, cmd, &stderr
}

func stopServe(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve exited with %v", err)
		}
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("serve did not stop on SIGTERM")
	}
}

// TestServeKeysAndClientCommands: a real 'warren serve' with key auth,
// keys made by 'warren key', and 'warren ps/exec/logs' against it, across a
// server restart.
func TestServeKeysAndClientCommands(t *testing.T) {
	dir := stateDir(t)
	create := run(t, warren(t, dir, "key", "create", "--namespace", "*", "--expire", "1d", "--description", "cli test"), "")
	if create.code != 0 || !strings.HasPrefix(create.stdout, "msb_") {
		t.Fatalf("key create: %+v", create)
	}
	key := strings.TrimSpace(create.stdout)
	secretPath := filepath.Join(dir, "data", "secret.key")
	fi, err := os.Stat(secretPath)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("secret file: %v %v", fi, err)
	}
	secret, _ := os.ReadFile(secretPath)

	url, srv, stderr := startServe(t, dir)
	client := func(args ...string) result {
		cmd := warren(t, dir, args...)
		cmd.Env = append(cmd.Env, "MSB_SERVER_URL="+url, "MSB_API_KEY="+key)
		return run(t, cmd, "")
	}
	post := func(method string, params map[string]any) int {
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method, "params": params, "id": 1})
		req, _ := http.NewRequest("POST", url+"/api/v1/rpc", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("sandbox.start", map[string]any{"sandbox": "box"}); code != 200 {
		t.Fatalf("start: %d", code)
	}
	if r := client("exec", "box", "--", "sh", "-c", "echo out; echo err >&2; exit 3"); r.code != 3 || r.stdout != "out\n" || r.stderr != "err\n" {
		t.Fatalf("exec: %+v", r)
	}
	if r := client("ps"); r.code != 0 || !strings.Contains(r.stdout, "box") || !strings.Contains(r.stdout, "running") {
		t.Fatalf("ps: %+v", r)
	}
	if r := client("logs", "box"); r.code != 0 || !strings.Contains(r.stdout, `started over WebSocket: ["sh" "-c"`) {
		t.Fatalf("logs: %+v", r)
	}
	noKey := warren(t, dir, "exec", "box", "--", "true")
	noKey.Env = append(noKey.Env, "MSB_SERVER_URL="+url, "MSB_API_KEY=")
	if r := run(t, noKey, ""); r.code == 0 || !strings.Contains(r.stderr, "API key") {
		t.Fatalf("exec without a key: %+v", r)
	}

	stopServe(t, srv)
	url2, srv2, stderr2 := startServe(t, dir)
	url = url2
	if r := client("exec", "box", "--", "echo", "still here"); r.code != 0 || r.stdout != "still here\n" {
		t.Fatalf("exec after restart: %+v\n%s", r, stderr2.String())
	}
	// Revocation through the CLI takes effect on the running server.
	list := run(t, warren(t, dir, "key", "list"), "")
	sc := bufio.NewScanner(strings.NewReader(list.stdout))
	var id string
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 0 && strings.Contains(sc.Text(), "cli test") {
			id = f[0]
		}
	}
	if id == "" {
		t.Fatalf("key list: %+v", list)
	}
	if r := run(t, warren(t, dir, "key", "revoke", id), ""); r.code != 0 {
		t.Fatalf("revoke: %+v", r)
	}
	if r := client("ps"); r.code == 0 || !strings.Contains(r.stderr, "revoked") {
		t.Fatalf("ps with a revoked key: %+v", r)
	}
	stopServe(t, srv2)
	for _, logs := range []string{stderr.String(), stderr2.String()} {
		if bytes.Contains([]byte(logs), bytes.TrimSpace(secret)) || strings.Contains(logs, key) {
			t.Fatal("the signing secret or a key reached the server's log")
		}
		if !strings.Contains(logs, `"request_id"`) {
			t.Fatalf("logs are not JSON with request ids:\n%s", logs)
		}
	}
	// Clean up the sandbox the servers left running (they keep running by design).
	url3, srv3, _ := startServe(t, dir, "--dev")
	body := `{"jsonrpc":"2.0","method":"sandbox.remove","params":{"sandbox":"box"},"id":1}`
	resp, err := http.Post(url3+"/api/v1/rpc", "application/json", strings.NewReader(body))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("remove: %v %v", err, resp)
	}
	_ = resp.Body.Close()
	stopServe(t, srv3)
}

// TestServeLimitAndTimeoutFlags: warren serve's --max-running,
// --max-sandboxes, --idle-timeout and --max-lifetime reach the server: the
// start beyond a limit is refused (429, kind limit) until a sandbox is
// stopped or removed, and sandboxes that ask for no timeouts of their own
// stop after the server's.
func TestServeLimitAndTimeoutFlags(t *testing.T) {
	testenv.RequireRoot(t)
	dir := stateDir(t)
	url, srv, stderr := startServe(t, dir, "--dev", "--max-running", "1", "--max-sandboxes", "2",
		"--idle-timeout", "1s", "--max-lifetime", "3s")
	defer stopServe(t, srv)
	call := rpcCaller(t, url, "")
	must := func(method string, params map[string]any) rpcReply {
		t.Helper()
		r := call(method, params)
		if r.status != 200 {
			t.Fatalf("%s %v: %d %+v\n%s", method, params, r.status, r.Error, stderr.String())
		}
		return r
	}
	refused := func(r rpcReply, msg string) {
		t.Helper()
		if r.status != 429 || r.Error == nil || r.Error.Data.Kind != "limit" || !strings.Contains(r.Error.Message, msg) {
			t.Fatalf("answer %d %+v, want 429, kind limit, %q", r.status, r.Error, msg)
		}
	}
	state := func(name string) string {
		var in struct {
			State string `json:"state"`
		}
		_ = json.Unmarshal(must("sandbox.get", map[string]any{"sandbox": name}).Result, &in)
		return in.State
	}
	defer func() {
		for _, name := range []string{"a", "b"} {
			call("sandbox.remove", map[string]any{"sandbox": name})
		}
	}()

	must("sandbox.start", map[string]any{"sandbox": "a"})
	refused(call("sandbox.start", map[string]any{"sandbox": "b"}), "1 sandboxes are running, this server's maximum")
	must("sandbox.stop", map[string]any{"sandbox": "a"})
	must("sandbox.start", map[string]any{"sandbox": "b"})
	// b, left alone, stops after --idle-timeout (the janitor looks every
	// second).
	t0 := time.Now()
	for state("b") != "stopped" {
		if time.Since(t0) > 5*time.Second {
			t.Fatal("--idle-timeout 1s did not stop an idle sandbox within 5 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if time.Since(t0) < time.Second {
		t.Fatalf("an idle sandbox stopped after %v, before --idle-timeout 1s", time.Since(t0))
	}
	var logs struct {
		Lines []string `json:"lines"`
	}
	_ = json.Unmarshal(must("sandbox.logs", map[string]any{"sandbox": "b"}).Result, &logs)
	if !strings.Contains(strings.Join(logs.Lines, "\n"), "stopped: idle for 1s") {
		t.Fatalf("the idle sandbox's log does not say --idle-timeout stopped it: %q", logs.Lines)
	}
	// Stopped sandboxes count against --max-sandboxes.
	refused(call("sandbox.create", map[string]any{"name": "c"}), "this server holds 2 sandboxes, its maximum")
	// a, kept busy, stops after --max-lifetime, cutting its command short.
	must("sandbox.start", map[string]any{"sandbox": "a"})
	r := call("sandbox.command.run", map[string]any{"sandbox": "a", "command": "sleep", "args": []string{"30"}})
	if r.status != 409 || r.Error == nil || !strings.Contains(r.Error.Message, "maximum lifetime 3s reached") {
		t.Fatalf("a command past --max-lifetime 3s: %d %+v", r.status, r.Error)
	}
}

// TestServeOwnsItsDataDir: a second 'warren serve' on the same data
// directory is refused with a clear error (it would "recover" the first
// one's sandboxes), and a 'warren run' in progress on that directory is not
// an orphan to a server that starts meanwhile.
func TestServeOwnsItsDataDir(t *testing.T) {
	dir := stateDir(t)
	// A command that outlives the server's start.
	runCmd := warren(t, dir, "run", "--", "sh", "-c", "echo started; sleep 8; echo done")
	var runOut, runErr bytes.Buffer
	runCmd.Stderr = &runErr
	pr, pw, _ := os.Pipe()
	runCmd.Stdout = pw
	if err := runCmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = pw.Close()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil || line != "started\n" {
		t.Fatalf("warren run did not start: %q %v %s", line, err, runErr.String())
	}

	_, srv, stderr := startServe(t, dir)
	second := warren(t, dir, "serve", "--listen", "127.0.0.1:0", "--prewarm", "0", "--keep-file-max")
	// Should it serve after all, it is stopped after a while (and fails).
	timer := time.AfterFunc(30*time.Second, func() { _ = second.Process.Kill() })
	r := run(t, second, "")
	timer.Stop()
	if r.code == 0 || !strings.Contains(r.stderr, "in use by another warren serve") {
		t.Errorf("a second serve on the same data directory: %+v", r)
	}

	_, _ = runOut.ReadFrom(pr)
	if err := runCmd.Wait(); err != nil || runOut.String() != "done\n" {
		t.Errorf("warren run failed after a server started on its data directory: %v %q\n%s", err, runOut.String(), runErr.String())
	}
	stopServe(t, srv) // its log is complete (and no longer written) once it has exited
	if strings.Contains(stderr.String(), "orphan") {
		t.Errorf("the server took the running 'warren run' for an orphan:\n%s", stderr.String())
	}
}

// TestServeImageNames: as warren serve resolves image names by default, the
// language names run microsandbox's commands on the host image, an image
// the store lacks is pulled only from public registries, and --pull=false
// refuses it with a clear answer.
func TestServeImageNames(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireFile(t, "/usr/bin/pip3")
	// Nothing listens here: the address is refused before any connection.
	const loopImage = "127.0.0.1:9/test/app:1"
	rpcCall := func(url, method string, params map[string]any) (int, string) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method, "params": params, "id": 1})
		resp, err := http.Post(url+"/api/v1/rpc", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}

	dir := stateDir(t)
	url, srv, stderr := startServe(t, dir, "--dev")
	if st, body := rpcCall(url, "sandbox.start", map[string]any{"sandbox": "py", "config": map[string]any{"image": "microsandbox/python"}}); st != 200 {
		t.Fatalf("start microsandbox/python: %d %s\n%s", st, body, stderr)
	}
	for _, argv := range [][]string{{"python", "-c", "print(6*7)"}, {"pip", "--version"}} {
		st, body := rpcCall(url, "sandbox.command.run", map[string]any{"sandbox": "py", "command": argv[0], "args": argv[1:]})
		if st != 200 || !strings.Contains(body, `"exit_code":0`) {
			t.Errorf("%v: %d %s", argv, st, body)
		}
	}
	rpcCall(url, "sandbox.remove", map[string]any{"sandbox": "py"})
	st, body := rpcCall(url, "sandbox.start", map[string]any{"sandbox": "loop", "config": map[string]any{"image": loopImage}})
	if st != 403 || !strings.Contains(body, "not public") {
		t.Errorf("start with an image on a loopback registry: %d %s; want 403, not public", st, body)
	}
	stopServe(t, srv)

	url, srv, stderr = startServe(t, dir, "--dev", "--pull=false")
	defer stopServe(t, srv)
	st, body = rpcCall(url, "sandbox.start", map[string]any{"sandbox": "off", "config": map[string]any{"image": loopImage}})
	if st != 400 || !strings.Contains(body, "does not pull images") {
		t.Errorf("start with a missing image, --pull=false: %d %s\n%s", st, body, stderr)
	}
}

func TestEnvBool(t *testing.T) {
	for _, tc := range []struct {
		v         string
		def, want bool
		err       bool
	}{{"", true, true, false}, {"", false, false, false}, {"false", true, false, false}, {"1", false, true, false}, {"maybe", true, false, true}} {
		t.Setenv("WARREN_TEST_BOOL", tc.v)
		got, err := envBool("WARREN_TEST_BOOL", tc.def)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("%q (default %v): %v, %v", tc.v, tc.def, got, err)
		}
	}
}

// rpcReply is a JSON-RPC answer with its HTTP status.
type rpcReply struct {
	status int
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Message string `json:"message"`
		Data    struct {
			Kind string `json:"kind"`
		} `json:"data"`
	} `json:"error"`
}

// rpcCaller returns a function that calls a method on the server at url,
// with key as the bearer token ("" for none).
func rpcCaller(t *testing.T, url, key string) func(method string, params map[string]any) rpcReply {
	return func(method string, params map[string]any) rpcReply {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method, "params": params, "id": 1})
		req, _ := http.NewRequest("POST", url+"/api/v1/rpc", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		r := rpcReply{status: resp.StatusCode}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			t.Fatal(err)
		}
		return r
	}
}
