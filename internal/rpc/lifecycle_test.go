package rpc_test

import (
	"archive/tar"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/sandbox"
)

// TestRefusedStartLeavesNoRecord: a create or start the server refuses as
// invalid (here: an image the store lacks) leaves nothing: no record to
// get or list, no name taken, nothing counted against --max-sandboxes, no
// row that comes back after a restart, nothing on the host.
func TestRefusedStartLeavesNoRecord(t *testing.T) {
	e := newFakeEnv(t, true, func(o *sandbox.Options) { o.MaxSandboxes = 1 })
	for range 3 {
		r := e.call("sandbox.create", map[string]any{"name": "img1", "image": "nope:latest"})
		if r.Status != 400 || r.kind() != "invalid_params" || !strings.Contains(r.Error.Message, "nope:latest") {
			t.Fatalf("create from a missing image: %d %s", r.Status, r.Raw)
		}
		r = e.call("sandbox.start", map[string]any{"sandbox": "img2", "config": map[string]any{"image": "nope:latest"}})
		if r.Status != 400 || r.kind() != "invalid_params" {
			t.Fatalf("start from a missing image: %d %s", r.Status, r.Raw)
		}
	}
	check := func(when string) {
		t.Helper()
		for _, name := range []string{"img1", "img2"} {
			if r := e.call("sandbox.get", map[string]any{"sandbox": name}); r.Status != 404 {
				t.Fatalf("%s: sandbox.get %s: %d %s", when, name, r.Status, r.Raw)
			}
		}
		var list struct {
			Sandboxes []json.RawMessage `json:"sandboxes"`
		}
		e.must("sandbox.list", map[string]any{"namespace": "*"}, &list)
		if len(list.Sandboxes) != 0 {
			t.Fatalf("%s: refused starts left records: %s", when, list.Sandboxes)
		}
		if ids, err := e.backend.IDs(); err != nil || len(ids) != 0 {
			t.Fatalf("%s: refused starts left sandboxes on the host: %v %v", when, ids, err)
		}
	}
	check("after the refusals")
	e.restart()
	check("after a restart")
	// The name is free, and so is the server's only place.
	e.must("sandbox.create", map[string]any{"name": "img1"}, nil)
}

// TestStopDuringCommand: a command or code that a stop cuts short (the
// sandbox's maximum lifetime, a concurrent sandbox.stop or remove) is a
// conflict that says what happened, not an internal error with a
// transport message.
func TestStopDuringCommand(t *testing.T) {
	e := newFakeEnv(t, true, nil)
	t.Run("max lifetime", func(t *testing.T) {
		e.must("sandbox.create", map[string]any{"name": "life", "max_lifetime": 1.5}, nil)
		r := e.call("sandbox.command.run", map[string]any{"sandbox": "life", "command": "sleep", "args": []string{"30"}})
		wantStopped(t, r, "the command ran", "maximum lifetime 1.5s reached")
	})
	t.Run("stop", func(t *testing.T) {
		e.must("sandbox.start", map[string]any{"sandbox": "st"}, nil)
		wg := e.stopSoon("sandbox.stop", "st")
		r := e.call("sandbox.command.run", map[string]any{"sandbox": "st", "command": "sleep", "args": []string{"30"}})
		wg.Wait()
		wantStopped(t, r, "the command ran", "a stop was requested")
		// The sandbox itself is fine: it starts again and runs commands.
		e.must("sandbox.start", map[string]any{"sandbox": "st"}, nil)
		e.must("sandbox.command.run", map[string]any{"sandbox": "st", "command": "true"}, nil)
	})
	t.Run("exec and remove", func(t *testing.T) {
		e.must("sandbox.start", map[string]any{"sandbox": "rm"}, nil)
		wg := e.stopSoon("sandbox.remove", "rm")
		r := e.call("sandbox.exec", map[string]any{"sandbox": "rm", "argv": []string{"sleep", "30"}})
		wg.Wait()
		wantStopped(t, r, "the command ran", "it was removed")
	})
	t.Run("code and stop", func(t *testing.T) {
		e.must("sandbox.start", map[string]any{"sandbox": "rp"}, nil)
		wg := e.stopSoon("sandbox.stop", "rp")
		r := e.call("sandbox.repl.run", map[string]any{"sandbox": "rp", "language": "python", "code": "import time\ntime.sleep(30)"})
		wg.Wait()
		wantStopped(t, r, "the code ran", "a stop was requested")
	})
}

// TestStopDuringTarUpload: a tar upload that a stop cuts short is a
// conflict that says so, like a command (TestStopDuringCommand). The body
// trickles in, so the stop lands while the agent is still unpacking.
func TestStopDuringTarUpload(t *testing.T) {
	e := newEnv(t, true, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "up"}, nil)
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		if err := tw.WriteHeader(&tar.Header{Name: "big", Mode: 0o644, Size: 1 << 30, Typeflag: tar.TypeReg}); err != nil {
			pw.CloseWithError(err)
			return
		}
		chunk := make([]byte, 64<<10)
		for {
			if _, err := tw.Write(chunk); err != nil {
				pw.CloseWithError(err)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	wg := e.stopSoon("sandbox.stop", "up")
	req, _ := http.NewRequest("PUT", e.url+"/api/v1/sandboxes/default/up/tar?path=/tmp", pr)
	resp := e.do(t, req, "")
	wg.Wait()
	_ = pr.CloseWithError(io.ErrClosedPipe) // the writer stops
	defer func() { _ = resp.Body.Close() }()
	raw, _ := io.ReadAll(resp.Body)
	var r rpcReply
	r.Status, r.Raw = resp.StatusCode, raw
	var body struct {
		Error json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(raw, &body); err != nil || json.Unmarshal(body.Error, &r.Error) != nil {
		t.Fatalf("answer %d %q: not a JSON-RPC error", resp.StatusCode, raw)
	}
	wantStopped(t, &r, "the tar was uploaded", "a stop was requested")
}

// wantStopped fails the test unless r is the conflict of a run (what)
// that a stop (why) cut short.
func wantStopped(t *testing.T, r *rpcReply, what, why string) {
	t.Helper()
	if r.Status != 409 || r.kind() != "conflict" || !strings.Contains(r.Error.Message, "was stopped while "+what) ||
		!strings.Contains(r.Error.Message, why) || strings.Contains(r.Error.Message, "EOF") {
		t.Fatalf("answer %d %s, want a conflict saying the sandbox was stopped while %s (%s)", r.Status, r.Raw, what, why)
	}
}

// stopSoon calls method (sandbox.stop or remove) on name a second from now.
func (e *env) stopSoon(method, name string) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Go(func() {
		time.Sleep(time.Second)
		e.must(method, map[string]any{"sandbox": name}, nil)
	})
	return &wg
}

// sbInfo is the part of SandboxInfo the lifecycle tests read.
type sbInfo struct {
	State     string     `json:"state"`
	Error     string     `json:"error"`
	StartedAt *time.Time `json:"started_at"`
	StoppedAt *time.Time `json:"stopped_at"`
}

// get describes ns/name ("" = default), or fails the test.
func (e *env) get(ns, name string) sbInfo {
	e.t.Helper()
	var in sbInfo
	params := map[string]any{"sandbox": name}
	if ns != "" {
		params["namespace"] = ns
	}
	e.must("sandbox.get", params, &in)
	return in
}

// waitState polls ns/name until it is in state want.
func (e *env) waitState(ns, name, want string, within time.Duration) sbInfo {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		in := e.get(ns, name)
		if in.State == want {
			return in
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s/%s: state %s (%q) after %v, want %s", ns, name, in.State, in.Error, within, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// agentOf finds the host pid of ns/name's agent, the sandbox's PID 1, as
// an operator would: it starts a process no other could be mistaken for,
// finds it among the host's processes and walks up its parents to the one
// that is PID 1 in its own pid namespace.
func (e *env) agentOf(ns, name string) int {
	e.t.Helper()
	marker := fmt.Sprintf("%d.%d", 100000+markerSeq.Add(1), os.Getpid()) // seconds of a sleep
	e.must("sandbox.process.start", map[string]any{"sandbox": name, "namespace": ns, "argv": []string{"sleep", marker}}, nil)
	want := "sleep\x00" + marker + "\x00"
	deadline := time.Now().Add(5 * time.Second)
	for {
		dirs, _ := filepath.Glob("/proc/[0-9]*")
		for _, d := range dirs {
			if b, err := os.ReadFile(d + "/cmdline"); err != nil || string(b) != want {
				continue
			}
			pid, _ := strconv.Atoi(filepath.Base(d))
			for pid > 1 {
				nspid, ppid := procStatus(pid)
				if len(nspid) > 1 && nspid[len(nspid)-1] == "1" {
					return pid
				}
				pid = ppid
			}
			e.t.Fatalf("%s/%s: no PID 1 of a pid namespace above the process %q", ns, name, marker)
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s/%s: the process %q is not among the host's processes", ns, name, marker)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var markerSeq atomic.Int64

// procStatus reads a process's pid in each pid namespace it is in
// (outermost first) and its parent's pid.
func procStatus(pid int) (nspid []string, ppid int) {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		switch k {
		case "NSpid":
			nspid = strings.Fields(v)
		case "PPid":
			ppid, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return nspid, ppid
}

// killAgent kills a sandbox's PID 1 from the host, as the OOM killer or an
// operator would, and waits until it is dead.
func (e *env) killAgent(pid int) {
	e.t.Helper()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		e.t.Fatalf("kill agent %d: %v", pid, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		// Gone, or a zombie: "pid (comm) Z ...".
		if err != nil || strings.Contains(string(b), ") Z ") {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("agent %d still runs 5 s after SIGKILL", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAgentDeathIsError: a sandbox whose PID 1 dies on its own goes to
// state error with the reason kept: get, list and the conflict of a
// command in it say why, a daemon restart keeps it, and a start brings
// the sandbox back (TestAgentKilledFromHost: a real PID 1 killed).
func TestAgentDeathIsError(t *testing.T) {
	e := newFakeEnv(t, true, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "victim"}, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "bystander"}, nil)
	e.must("sandbox.file.write", map[string]any{"sandbox": "victim", "path": "/tmp/f", "data": base64.StdEncoding.EncodeToString([]byte("kept\n"))}, nil)
	e.fake.Sandbox(e.id("", "victim")).Die()

	const why = "the sandbox's init exited unexpectedly"
	in := e.waitState("", "victim", "error", 5*time.Second)
	if in.Error != why || in.StoppedAt == nil {
		t.Fatalf("after its agent died: %+v, want error %q and a stop time", in, why)
	}
	var list struct {
		Sandboxes []struct {
			Name  string `json:"name"`
			Error string `json:"error"`
		} `json:"sandboxes"`
	}
	e.must("sandbox.list", map[string]any{"state": "error"}, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].Name != "victim" || list.Sandboxes[0].Error != why {
		t.Fatalf("sandbox.list state=error: %+v", list)
	}
	r := e.call("sandbox.command.run", map[string]any{"sandbox": "victim", "command": "true"})
	if r.Status != 409 || r.kind() != "conflict" || !strings.Contains(r.Error.Message, "is error ("+why+")") {
		t.Fatalf("command in the dead sandbox: %d %s", r.Status, r.Raw)
	}
	var logs struct {
		Lines []string `json:"lines"`
	}
	e.must("sandbox.logs", map[string]any{"sandbox": "victim"}, &logs)
	if !strings.Contains(strings.Join(logs.Lines, "\n"), "init exited unexpectedly") {
		t.Fatalf("log does not say the init died: %q", logs.Lines)
	}
	if in := e.get("", "bystander"); in.State != "running" {
		t.Fatalf("the other sandbox: %+v", in)
	}

	// The reason survives a daemon restart.
	e.restart()
	if in := e.get("", "victim"); in.State != "error" || in.Error != why {
		t.Fatalf("after a restart: %+v", in)
	}
	// A start brings it back, files kept, the reason cleared.
	e.must("sandbox.start", map[string]any{"sandbox": "victim"}, nil)
	if in := e.get("", "victim"); in.State != "running" || in.Error != "" {
		t.Fatalf("after a new start: %+v", in)
	}
	var rd struct {
		Data string `json:"data"`
	}
	e.must("sandbox.file.read", map[string]any{"sandbox": "victim", "path": "/tmp/f"}, &rd)
	if b, _ := base64.StdEncoding.DecodeString(rd.Data); string(b) != "kept\n" {
		t.Fatalf("files after the restart: %q", b)
	}
}

// TestRestartFindsAgentDead: a sandbox whose agent died while no daemon
// ran is marked error by the next daemon, with a reason saying so; the
// sandboxes whose agents live are reattached, and a start brings the dead
// one back.
func TestRestartFindsAgentDead(t *testing.T) {
	e := newFakeEnv(t, true, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "dead", "namespace": "n1"}, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "alive", "namespace": "n1"}, nil)
	dead := e.fake.Sandbox(e.id("n1", "dead"))
	// The daemon goes away; the agent dies while none runs.
	e.http.Close()
	e.mgr.Close()
	dead.Die()
	e.start()

	in := e.get("n1", "dead")
	if in.State != "error" || !strings.Contains(in.Error, "agent was not running when the daemon restarted") || in.StoppedAt == nil {
		t.Fatalf("a sandbox whose agent died while the daemon was down: %+v", in)
	}
	r := e.call("sandbox.exec", map[string]any{"sandbox": "dead", "namespace": "n1", "argv": []string{"true"}})
	if r.Status != 409 || r.kind() != "conflict" || !strings.Contains(r.Error.Message, in.Error) {
		t.Fatalf("exec in it: %d %s", r.Status, r.Raw)
	}
	if in := e.get("n1", "alive"); in.State != "running" {
		t.Fatalf("the live sandbox after the restart: %+v", in)
	}
	e.must("sandbox.exec", map[string]any{"sandbox": "alive", "namespace": "n1", "argv": []string{"true"}}, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "dead", "namespace": "n1"}, nil)
	if in := e.get("n1", "dead"); in.State != "running" || in.Error != "" {
		t.Fatalf("after a new start: %+v", in)
	}
	e.must("sandbox.exec", map[string]any{"sandbox": "dead", "namespace": "n1", "argv": []string{"true"}}, nil)
}

// TestAgentKilledFromHost: the native backend sees a real PID 1 die,
// killed from the host as the OOM killer or an operator would: while the
// daemon runs (state error, then a start brings it back with its files)
// and while none runs (the next daemon marks it error).
// TestAgentDeathIsError and TestRestartFindsAgentDead have the rest.
func TestAgentKilledFromHost(t *testing.T) {
	e := newEnv(t, true, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "victim"}, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "later"}, nil)
	e.must("sandbox.shell", map[string]any{"sandbox": "victim", "script": "echo kept > /tmp/f"}, nil)
	e.killAgent(e.agentOf("default", "victim"))
	if in := e.waitState("", "victim", "error", 5*time.Second); in.Error != "the sandbox's init exited unexpectedly" {
		t.Fatalf("after its agent died: %+v", in)
	}
	e.must("sandbox.start", map[string]any{"sandbox": "victim"}, nil)
	var res struct {
		Stdout string `json:"stdout"`
	}
	e.must("sandbox.exec", map[string]any{"sandbox": "victim", "argv": []string{"cat", "/tmp/f"}}, &res)
	if res.Stdout != "kept\n" {
		t.Fatalf("files after the restart: %q", res.Stdout)
	}

	pid := e.agentOf("default", "later")
	e.http.Close()
	e.mgr.Close()
	e.killAgent(pid)
	e.start()
	if in := e.get("", "later"); in.State != "error" || !strings.Contains(in.Error, "agent was not running when the daemon restarted") {
		t.Fatalf("a sandbox whose agent died while the daemon was down: %+v", in)
	}
	if in := e.get("", "victim"); in.State != "running" {
		t.Fatalf("the live sandbox after the restart: %+v", in)
	}
	e.must("sandbox.start", map[string]any{"sandbox": "later"}, nil)
	e.must("sandbox.exec", map[string]any{"sandbox": "later", "argv": []string{"true"}}, nil)
}

// id is the backend id of ns/name ("" = default).
func (e *env) id(ns, name string) string {
	e.t.Helper()
	if ns == "" {
		ns = "default"
	}
	in, err := e.mgr.Get(ns, name)
	if err != nil {
		e.t.Fatal(err)
	}
	return in.ID
}

// TestServerDefaultTimeouts: a sandbox that asks for no idle timeout or
// maximum lifetime gets the server's (--idle-timeout, --max-lifetime),
// and one that asks for its own keeps it, longer ones included.
func TestServerDefaultTimeouts(t *testing.T) {
	const idle, life = 700 * time.Millisecond, 2 * time.Second
	e := newFakeEnv(t, true, func(o *sandbox.Options) { o.IdleTimeout, o.MaxLifetime = idle, life })
	e.must("sandbox.start", map[string]any{"sandbox": "idle"}, nil)
	e.must("sandbox.create", map[string]any{"name": "own", "idle_timeout": 60, "max_lifetime": 60}, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "old"}, nil)
	// "old" is kept busy past the lifetime: no idle stop, only the
	// lifetime's, which cuts its command short.
	done := make(chan *rpcReply, 1)
	go func() {
		done <- e.call("sandbox.command.run", map[string]any{"sandbox": "old", "command": "sleep", "args": []string{"30"}})
	}()
	// logSays waits a little for the line: the manager logs a stop just
	// after the state says stopped.
	logSays := func(name, want string) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for {
			var logs struct {
				Lines []string `json:"lines"`
			}
			e.must("sandbox.logs", map[string]any{"sandbox": name}, &logs)
			if strings.Contains(strings.Join(logs.Lines, "\n"), want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: log %q does not say %q", name, logs.Lines, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	in := e.waitState("", "idle", "stopped", 3*time.Second)
	if ran := in.StoppedAt.Sub(*in.StartedAt); ran < idle {
		t.Fatalf("idle sandbox stopped after %v, before the server's idle timeout %v", ran, idle)
	}
	logSays("idle", "stopped: idle for 700ms")
	select {
	case r := <-done:
		if r.Status != 409 || r.kind() != "conflict" || !strings.Contains(r.Error.Message, "maximum lifetime 2s reached") {
			t.Fatalf("command cut short by the lifetime: %d %s", r.Status, r.Raw)
		}
	case <-time.After(life + 3*time.Second):
		t.Fatal("the server's maximum lifetime did not stop a busy sandbox")
	}
	in = e.waitState("", "old", "stopped", time.Second)
	if ran := in.StoppedAt.Sub(*in.StartedAt); ran < life {
		t.Fatalf("sandbox stopped after %v, before the server's maximum lifetime %v", ran, life)
	}
	logSays("old", "stopped: maximum lifetime 2s reached")
	// Its own, longer values win over the server's.
	if in := e.get("", "own"); in.State != "running" {
		t.Fatalf("a sandbox with its own idle timeout and lifetime: %+v", in)
	}
}

// TestServerLimits: --max-running and --max-sandboxes refuse the start
// or create beyond them with kind limit (429), leave no record of a
// refused new sandbox, and let it through once one is stopped (running)
// or removed (sandboxes); concurrent starts cannot overshoot.
func TestServerLimits(t *testing.T) {
	e := newFakeEnv(t, true, func(o *sandbox.Options) { o.MaxSandboxes, o.MaxRunning = 2, 1 })
	refused := func(r *rpcReply, msg string) {
		t.Helper()
		if r.Status != 429 || r.kind() != "limit" || r.Error.Code != -32006 || r.Error.Message != msg {
			t.Fatalf("answer %d %s, want 429, kind limit, code -32006 and message %q", r.Status, r.Raw, msg)
		}
	}
	const tooManyRunning = "1 sandboxes are running, this server's maximum; stop some"
	const tooMany = "this server holds 2 sandboxes, its maximum; remove some"
	e.must("sandbox.start", map[string]any{"sandbox": "a"}, nil)
	refused(e.call("sandbox.start", map[string]any{"sandbox": "b"}), tooManyRunning)
	refused(e.call("sandbox.create", map[string]any{"name": "b"}), tooManyRunning)
	if r := e.call("sandbox.get", map[string]any{"sandbox": "b"}); r.Status != 404 {
		t.Fatalf("a refused start left a record: %d %s", r.Status, r.Raw)
	}
	e.must("sandbox.stop", map[string]any{"sandbox": "a"}, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "b"}, nil)
	// Restarting a stopped sandbox counts too.
	refused(e.call("sandbox.start", map[string]any{"sandbox": "a"}), tooManyRunning)
	if in := e.get("", "a"); in.State != "stopped" {
		t.Fatalf("a refused restart changed the sandbox: %+v", in)
	}
	// Two sandboxes, stopped ones included, are the most this server holds.
	e.must("sandbox.stop", map[string]any{"sandbox": "b"}, nil)
	refused(e.call("sandbox.create", map[string]any{"name": "c"}), tooMany)
	refused(e.call("sandbox.start", map[string]any{"sandbox": "c"}), tooMany)
	e.must("sandbox.remove", map[string]any{"sandbox": "a"}, nil)
	e.must("sandbox.create", map[string]any{"name": "c"}, nil)
	e.must("sandbox.exec", map[string]any{"sandbox": "c", "argv": []string{"true"}}, nil)

	// Racing starts: exactly as many win as there is room for.
	e.must("sandbox.remove", map[string]any{"sandbox": "b"}, nil)
	e.must("sandbox.remove", map[string]any{"sandbox": "c"}, nil)
	var wg sync.WaitGroup
	replies := make([]*rpcReply, 4)
	for i := range replies {
		wg.Go(func() { replies[i] = e.call("sandbox.start", map[string]any{"sandbox": fmt.Sprintf("r%d", i)}) })
	}
	wg.Wait()
	won := 0
	for _, r := range replies {
		switch {
		case r.Status == 200:
			won++
		case r.kind() != "limit":
			t.Fatalf("racing start: %d %s", r.Status, r.Raw)
		}
	}
	if won != 1 {
		t.Fatalf("%d of 4 racing starts won with --max-running 1", won)
	}
}
