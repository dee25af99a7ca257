package rpc_test

import (
	"archive/tar"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/user"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/warren-sandbox/warren/internal/sandbox"
)

// TestExtendedExec: exec and shell in a real sandbox: the sandbox's env
// (from sandbox.create) under the request's, the working directory and
// stdin reach a real process (TestExtendedMethods has the rest).
func TestExtendedExec(t *testing.T) {
	e := newEnv(t, true, nil)
	e.must("sandbox.create", map[string]any{"name": "ext", "env": []string{"GREETING=hi"}}, nil)
	var res struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
	}
	e.must("sandbox.exec", map[string]any{"sandbox": "ext", "argv": []string{"sh", "-c", "cat; echo $GREETING $EXTRA; pwd"}, "stdin": "in:", "env": []string{"EXTRA=there"}, "cwd": "/tmp"}, &res)
	if res.Stdout != "in:hi there\n/tmp\n" || res.ExitCode != 0 {
		t.Fatalf("exec: %+v", res)
	}
	e.must("sandbox.shell", map[string]any{"sandbox": "ext", "script": "echo out; echo err >&2; exit 7"}, &res)
	if res.Stdout != "out\n" || res.Stderr != "err\n" || res.ExitCode != 7 {
		t.Fatalf("shell: %+v", res)
	}
}

// TestExtendedMethods drives Warren's own methods end to end: exec,
// shell, files, tars, processes, logs. TestSandboxMethods has the methods
// on sandboxes themselves, TestExtendedExec what needs real processes.
func TestExtendedMethods(t *testing.T) {
	e := newFakeEnv(t, true, nil)
	e.must("sandbox.create", map[string]any{"name": "ext"}, nil)

	type execResult struct {
		ExitCode  int    `json:"exit_code"`
		Stdout    string `json:"stdout"`
		Stderr    string `json:"stderr"`
		TimedOut  bool   `json:"timed_out"`
		Truncated bool   `json:"truncated"`
	}
	var res execResult
	e.must("sandbox.exec", map[string]any{"sandbox": "ext", "argv": []string{"cat"}, "stdin": "in:"}, &res)
	if res.Stdout != "in:" || res.ExitCode != 0 {
		t.Fatalf("exec: %+v", res)
	}
	e.must("sandbox.shell", map[string]any{"sandbox": "ext", "script": "echo out; echo err >&2; exit 7"}, &res)
	if res.Stdout != "out\n" || res.Stderr != "err\n" || res.ExitCode != 7 {
		t.Fatalf("shell: %+v", res)
	}
	e.must("sandbox.shell", map[string]any{"sandbox": "ext", "script": "sleep 10", "timeout": 0.2}, &res)
	if !res.TimedOut {
		t.Fatalf("shell timeout: %+v", res)
	}
	e.must("sandbox.exec", map[string]any{"sandbox": "ext", "argv": []string{"spew", "100000"}, "output_limit": 1000, "binary": true}, &res)
	if b, _ := base64.StdEncoding.DecodeString(res.Stdout); len(b) != 1000 || !res.Truncated {
		t.Fatalf("output limit: %d bytes, truncated %v", len(b), res.Truncated)
	}
	if r := e.call("sandbox.exec", map[string]any{"sandbox": "ext", "argv": []string{"/nope"}}); r.kind() != "exec_failed" {
		t.Fatalf("exec not found: %s", r.Raw)
	}

	// Files.
	e.must("sandbox.file.mkdir", map[string]any{"sandbox": "ext", "path": "/work/sub", "parents": true}, nil)
	e.must("sandbox.file.write", map[string]any{"sandbox": "ext", "path": "/work/sub/a.bin", "data": base64.StdEncoding.EncodeToString([]byte{0, 1, 0xff})}, nil)
	var rd struct {
		Data string `json:"data"`
		Size int    `json:"size"`
	}
	e.must("sandbox.file.read", map[string]any{"sandbox": "ext", "path": "/work/sub/a.bin"}, &rd)
	if b, _ := base64.StdEncoding.DecodeString(rd.Data); !bytes.Equal(b, []byte{0, 1, 0xff}) || rd.Size != 3 {
		t.Fatalf("read: %+v", rd)
	}
	var ents struct {
		Entries []struct {
			Name string `json:"name"`
			Type string `json:"type"`
		} `json:"entries"`
	}
	e.must("sandbox.file.list", map[string]any{"sandbox": "ext", "path": "/work/sub"}, &ents)
	if len(ents.Entries) != 1 || ents.Entries[0].Name != "a.bin" {
		t.Fatalf("list: %+v", ents)
	}
	e.must("sandbox.file.move", map[string]any{"sandbox": "ext", "from": "/work/sub/a.bin", "to": "/work/b.bin"}, nil)
	var st struct {
		Size int64  `json:"size"`
		Type string `json:"type"`
	}
	e.must("sandbox.file.stat", map[string]any{"sandbox": "ext", "path": "/work/b.bin"}, &st)
	if st.Size != 3 || st.Type != "file" {
		t.Fatalf("stat: %+v", st)
	}
	// A path with ".." is refused, whatever it would resolve to. The
	// check of the data is meaningful: the sandbox's /etc/passwd, where a
	// ".." walk stopped at the root would land, says "root:".
	readText := func(r *rpcReply) string {
		t.Helper()
		var rd struct {
			Data string `json:"data"`
		}
		if err := json.Unmarshal(r.Result, &rd); err != nil {
			t.Fatalf("file.read result %s: %v", r.Result, err)
		}
		b, err := base64.StdEncoding.DecodeString(rd.Data)
		if err != nil {
			t.Fatalf("file.read data is not base64: %v", err)
		}
		return string(b)
	}
	e.must("sandbox.file.write", map[string]any{"sandbox": "ext", "path": "/etc/passwd", "data": base64.StdEncoding.EncodeToString([]byte("root:x:0:0::/root:/bin/sh\n"))}, nil)
	if r := e.call("sandbox.file.read", map[string]any{"sandbox": "ext", "path": "/etc/passwd"}); r.Status != 200 || !strings.Contains(readText(r), "root:") {
		t.Fatalf("the sandbox's /etc/passwd has no root: %d %s", r.Status, r.Raw)
	}
	for _, p := range []string{"../../etc/passwd", "/proc/../../../etc/shadow", "/work/../etc/passwd"} {
		r := e.call("sandbox.file.read", map[string]any{"sandbox": "ext", "path": p})
		if r.Status == 200 && strings.Contains(readText(r), "root:") {
			t.Fatalf("read %s: a path with \"..\" was followed", p)
		}
		if r.kind() != "invalid_params" || !strings.Contains(r.Error.Message, `".."`) && !strings.Contains(r.Error.Message, "not absolute") {
			t.Fatalf("read %s: %d %s, want invalid_params refusing the \"..\"", p, r.Status, r.Raw)
		}
	}
	for _, m := range []string{"sandbox.file.read", "sandbox.file.list", "sandbox.file.remove"} {
		if r := e.call(m, map[string]any{"sandbox": "ext", "path": "etc/passwd"}); r.kind() != "invalid_params" || !strings.Contains(r.Error.Message, "not absolute") {
			t.Fatalf("%s of a relative path: %d %s, want invalid_params saying it is not absolute", m, r.Status, r.Raw)
		}
	}
	if r := e.call("sandbox.file.read", map[string]any{"sandbox": "ext", "path": "/x", "recursive": true}); r.kind() != "invalid_params" {
		t.Fatalf("field of another method accepted: %s", r.Raw)
	}
	e.must("sandbox.file.remove", map[string]any{"sandbox": "ext", "path": "/work", "recursive": true}, nil)
	if r := e.call("sandbox.file.stat", map[string]any{"sandbox": "ext", "path": "/work"}); r.Status != 404 {
		t.Fatalf("removed dir: %s", r.Raw)
	}

	// Tar up and down over HTTP.
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	_ = tw.WriteHeader(&tar.Header{Name: "dir/hello.txt", Mode: 0o644, Size: 5, Typeflag: tar.TypeReg})
	_, _ = tw.Write([]byte("hello"))
	_ = tw.Close()
	req, _ := http.NewRequest("PUT", e.url+"/api/v1/sandboxes/default/ext/tar?path=/up", &tb)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("upload: %d %s", resp.StatusCode, b)
	}
	e.must("sandbox.file.read", map[string]any{"sandbox": "ext", "path": "/up/dir/hello.txt"}, &rd)
	if b, _ := base64.StdEncoding.DecodeString(rd.Data); string(b) != "hello" {
		t.Fatalf("uploaded file: %q", b)
	}
	resp, err = http.Get(e.url + "/api/v1/sandboxes/default/ext/tar?path=/up")
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(resp.Body)
	found := false
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if strings.HasSuffix(h.Name, "hello.txt") {
			found = true
		}
	}
	_ = resp.Body.Close()
	if !found {
		t.Fatal("download tar lacks hello.txt")
	}

	// Background processes outlive the request that started them.
	var pi struct {
		ID      string `json:"id"`
		Running bool   `json:"running"`
		Exit    *struct {
			Code int `json:"code"`
		} `json:"exit"`
	}
	e.must("sandbox.process.start", map[string]any{"sandbox": "ext", "argv": []string{"cat"}, "stdin": "first\n"}, &pi)
	var out struct {
		Data       string `json:"data"`
		NextOffset int64  `json:"next_offset"`
		EOF        bool   `json:"eof"`
	}
	e.must("sandbox.process.output", map[string]any{"sandbox": "ext", "id": pi.ID, "wait": 5}, &out)
	if out.Data != "first\n" {
		t.Fatalf("output: %+v", out)
	}
	e.must("sandbox.process.stdin", map[string]any{"sandbox": "ext", "id": pi.ID, "data": "line\n", "close": true}, nil)
	e.must("sandbox.process.wait", map[string]any{"sandbox": "ext", "id": pi.ID, "timeout": 10}, &pi)
	if pi.Running || pi.Exit == nil || pi.Exit.Code != 0 {
		t.Fatalf("wait: %+v", pi)
	}
	e.must("sandbox.process.output", map[string]any{"sandbox": "ext", "id": pi.ID, "offset": out.NextOffset}, &out)
	if out.Data != "line\n" || !out.EOF {
		t.Fatalf("output from offset: %+v", out)
	}
	e.must("sandbox.process.start", map[string]any{"sandbox": "ext", "argv": []string{"sh", "-c", "exit 4"}}, &pi)
	e.must("sandbox.process.wait", map[string]any{"sandbox": "ext", "id": pi.ID, "timeout": 10}, &pi)
	if pi.Running || pi.Exit == nil || pi.Exit.Code != 4 {
		t.Fatalf("wait for exit 4: %+v", pi)
	}
	e.must("sandbox.process.start", map[string]any{"sandbox": "ext", "argv": []string{"sleep", "60"}}, &pi)
	var procs struct {
		Processes []struct {
			ID string `json:"id"`
		} `json:"processes"`
	}
	e.must("sandbox.process.list", map[string]any{"sandbox": "ext"}, &procs)
	if len(procs.Processes) != 3 {
		t.Fatalf("process list: %+v", procs)
	}
	e.must("sandbox.process.signal", map[string]any{"sandbox": "ext", "id": pi.ID, "signal": "SIGTERM"}, nil)
	e.must("sandbox.process.wait", map[string]any{"sandbox": "ext", "id": pi.ID, "timeout": 10}, &pi)
	if pi.Running {
		t.Fatal("signalled process still runs")
	}

	// Logs record what happened.
	var logs struct {
		Lines []string `json:"lines"`
	}
	e.must("sandbox.logs", map[string]any{"sandbox": "ext"}, &logs)
	joined := strings.Join(logs.Lines, "\n")
	for _, want := range []string{"started", "exec cat", "shell /bin/sh -c", "process"} {
		if !strings.Contains(joined, want) {
			t.Fatalf("logs lack %q:\n%s", want, joined)
		}
	}
	e.must("sandbox.logs", map[string]any{"sandbox": "ext", "tail": 2}, &logs)
	if len(logs.Lines) != 2 {
		t.Fatalf("tail 2: %d lines", len(logs.Lines))
	}
}

// TestSandboxMethods: sandbox.create answers the sandbox as created and
// refuses a second one of the name and what the server cannot honour;
// sandbox.list filters by label and state; sandbox.remove is idempotent.
func TestSandboxMethods(t *testing.T) {
	e := newFakeEnv(t, true, nil)
	var info struct {
		Namespace string            `json:"namespace"`
		Name      string            `json:"name"`
		State     string            `json:"state"`
		Labels    map[string]string `json:"labels"`
		MemoryMiB int64             `json:"memory_mib"`
	}
	e.must("sandbox.create", map[string]any{"name": "ext", "labels": map[string]string{"team": "x"}, "memory_mib": 256, "env": []string{"GREETING=hi"}}, &info)
	if info.State != "running" || info.Labels["team"] != "x" || info.MemoryMiB != 256 || info.Namespace != "default" {
		t.Fatalf("create: %+v", info)
	}
	if r := e.call("sandbox.create", map[string]any{"name": "ext"}); r.Status != 409 || r.kind() != "conflict" {
		t.Fatalf("create twice: %s", r.Raw)
	}
	if r := e.call("sandbox.create", map[string]any{"name": "pol", "secrets": []string{"db"}}); r.kind() != "forbidden" || !strings.Contains(r.Error.Message, `secret "db" is not granted`) {
		t.Fatalf("secrets: %s", r.Raw)
	}
	e.must("sandbox.create", map[string]any{"name": "other", "labels": map[string]string{"team": "y"}}, nil)

	var list struct {
		Sandboxes []struct {
			Name string `json:"name"`
		} `json:"sandboxes"`
	}
	e.must("sandbox.list", map[string]any{"labels": map[string]string{"team": "x"}}, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].Name != "ext" {
		t.Fatalf("label filter: %+v", list)
	}
	e.must("sandbox.list", map[string]any{"state": "stopped"}, &list)
	if len(list.Sandboxes) != 0 {
		t.Fatalf("state filter: %+v", list)
	}

	// Remove is idempotent and takes the files.
	var rm struct {
		Removed bool `json:"removed"`
	}
	e.must("sandbox.remove", map[string]any{"sandbox": "ext"}, &rm)
	if !rm.Removed {
		t.Fatal("remove said nothing was removed")
	}
	e.must("sandbox.remove", map[string]any{"sandbox": "ext"}, &rm)
	if rm.Removed {
		t.Fatal("second remove removed something")
	}
	if r := e.call("sandbox.get", map[string]any{"sandbox": "ext"}); r.Status != 404 {
		t.Fatalf("get after remove: %s", r.Raw)
	}
}

// wsMsg is a message of the WebSocket endpoint, as a client reads it.
type wsMsg struct {
	Type string `json:"type"`
	Data []byte `json:"data"`
	Exit *struct {
		Code int `json:"code"`
	} `json:"exit"`
	Message string `json:"message"`
	Kind    string `json:"kind"`
	Cause   string `json:"cause"`
}

// wsRecv reads the next message from c, within 10 s.
func wsRecv(t *testing.T, c *websocket.Conn) wsMsg {
	t.Helper()
	var m wsMsg
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if err := websocket.JSON.Receive(c, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestWebSocket streams a process's output as it is produced, takes its
// input, and does not let it outlive the socket (TestWebSocketTerminal:
// a real terminal).
func TestWebSocket(t *testing.T) {
	e := newFakeEnv(t, true, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "ws"}, nil)
	dial := func(t *testing.T) *websocket.Conn {
		c, err := e.wsDial(t, "sandbox=ws", "")
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	t.Run("stream", func(t *testing.T) {
		c := dial(t)
		defer func() { _ = c.Close() }()
		// cat answers each input as it comes: output must arrive while
		// the process runs.
		_ = websocket.JSON.Send(c, map[string]any{"argv": []string{"cat"}})
		if m := wsRecv(t, c); m.Type != "started" {
			t.Fatalf("first message %+v", m)
		}
		for _, in := range []string{"one\n", "two\n"} {
			_ = websocket.JSON.Send(c, map[string]any{"type": "stdin", "data": []byte(in)})
			if m := wsRecv(t, c); m.Type != "stdout" || string(m.Data) != in {
				t.Fatalf("%+v", m)
			}
		}
		_ = websocket.JSON.Send(c, map[string]any{"type": "eof"})
		if m := wsRecv(t, c); m.Type != "exit" || m.Exit == nil || m.Exit.Code != 0 {
			t.Fatalf("%+v", m)
		}
	})
	t.Run("stderr", func(t *testing.T) {
		c := dial(t)
		defer func() { _ = c.Close() }()
		_ = websocket.JSON.Send(c, map[string]any{"argv": []string{"sh", "-c", "echo two >&2; exit 3"}})
		if m := wsRecv(t, c); m.Type != "started" {
			t.Fatalf("first message %+v", m)
		}
		if m := wsRecv(t, c); m.Type != "stderr" || string(m.Data) != "two\n" {
			t.Fatalf("%+v", m)
		}
		if m := wsRecv(t, c); m.Type != "exit" || m.Exit == nil || m.Exit.Code != 3 {
			t.Fatalf("%+v", m)
		}
	})
	t.Run("bad first message", func(t *testing.T) {
		c := dial(t)
		defer func() { _ = c.Close() }()
		_ = websocket.JSON.Send(c, map[string]any{"argv": []string{}})
		if m := wsRecv(t, c); m.Type != "error" || !strings.Contains(m.Message, "argv") {
			t.Fatalf("%+v", m)
		}
	})
	t.Run("not found", func(t *testing.T) {
		// The agent's cause comes through, for a client's exit 127; the
		// kind stays not_found, as older clients read it.
		c := dial(t)
		defer func() { _ = c.Close() }()
		_ = websocket.JSON.Send(c, map[string]any{"argv": []string{"no-such-command"}})
		if m := wsRecv(t, c); m.Type != "error" || m.Kind != "not_found" || m.Cause != "not_found" || !strings.Contains(m.Message, "no-such-command") {
			t.Fatalf("%+v", m)
		}
	})
	t.Run("bad message", func(t *testing.T) {
		c := dial(t)
		defer func() { _ = c.Close() }()
		_ = websocket.JSON.Send(c, map[string]any{"argv": []string{"cat"}})
		wsRecv(t, c)
		_ = websocket.JSON.Send(c, map[string]any{"type": "launch"})
		if m := wsRecv(t, c); m.Type != "error" || !strings.Contains(m.Message, "launch") {
			t.Fatalf("%+v", m)
		}
	})
	t.Run("disconnect kills", func(t *testing.T) {
		c := dial(t)
		_ = websocket.JSON.Send(c, map[string]any{"argv": []string{"sleep", "300"}})
		wsRecv(t, c)
		_ = c.Close()
		deadline := time.Now().Add(10 * time.Second)
		for {
			var procs struct {
				Processes []struct {
					Argv    []string `json:"argv"`
					Running bool     `json:"running"`
				} `json:"processes"`
			}
			e.must("sandbox.process.list", map[string]any{"sandbox": "ws"}, &procs)
			alive := false
			for _, p := range procs.Processes {
				if p.Running && len(p.Argv) > 0 && p.Argv[0] == "sleep" {
					alive = true
				}
			}
			if !alive {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("process outlived its WebSocket")
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// TestWebSocketHoldsOutput: with a real agent, a process that writes far
// faster than its WebSocket client reads is held back and loses nothing:
// the client, stalled while the process writes 8 MiB, gets every byte (no
// "dropped"), then the exit.
func TestWebSocketHoldsOutput(t *testing.T) {
	e := newEnv(t, true, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "wsh"}, nil)
	c, err := e.wsDial(t, "sandbox=wsh", "")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	const total = 8 << 20
	if err := websocket.JSON.Send(c, map[string]any{"argv": []string{"sh", "-c", fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x", total)}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the process could have written it all by now
	var got int64
	for {
		var m struct {
			Type    string `json:"type"`
			Data    []byte `json:"data"`
			Dropped int64  `json:"dropped"`
			Message string `json:"message"`
			Exit    *struct {
				Code int `json:"code"`
			} `json:"exit"`
		}
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		if err := websocket.JSON.Receive(c, &m); err != nil {
			t.Fatalf("after %d bytes: %v", got, err)
		}
		switch m.Type {
		case "started":
		case "stdout":
			if bytes.ContainsFunc(m.Data, func(r rune) bool { return r != 'x' }) {
				t.Fatal("output corrupted")
			}
			got += int64(len(m.Data))
			if got < total/2 {
				time.Sleep(20 * time.Millisecond) // a slow client, all along the first half
			}
		case "exit":
			if m.Exit == nil || m.Exit.Code != 0 || got != total {
				t.Fatalf("exit %+v after %d of %d bytes", m.Exit, got, total)
			}
			return
		default:
			t.Fatalf("message %+v (after %d bytes)", m, got)
		}
	}
}

// TestWebSocketReportsDroppedOutput: with an agent that does not hold the
// process back (the fake backend's, as one of a build before HoldOutput),
// a process that writes faster than its WebSocket client reads loses the
// oldest output, and the client is told exactly how many bytes: what
// arrives plus what was reported dropped is all the process wrote.
func TestWebSocketReportsDroppedOutput(t *testing.T) {
	e := newFakeEnv(t, true, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "wsd"}, nil)
	c, err := e.wsDial(t, "sandbox=wsd", "")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	const total = 32 << 20
	if err := websocket.JSON.Send(c, map[string]any{"argv": []string{"spew", fmt.Sprint(total)}}); err != nil {
		t.Fatal(err)
	}
	// The client stalls while the process writes everything: far more
	// than the agent keeps and the socket buffers hold.
	time.Sleep(time.Second)
	var got, dropped int64
	for {
		var m struct {
			Type    string `json:"type"`
			Data    []byte `json:"data"`
			Stream  string `json:"stream"`
			Dropped int64  `json:"dropped"`
			Message string `json:"message"`
			Exit    *struct {
				Code int `json:"code"`
			} `json:"exit"`
		}
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		if err := websocket.JSON.Receive(c, &m); err != nil {
			t.Fatalf("after %d bytes and %d dropped: %v", got, dropped, err)
		}
		switch m.Type {
		case "started":
		case "stdout":
			if bytes.ContainsFunc(m.Data, func(r rune) bool { return r != 'x' }) {
				t.Fatal("output corrupted")
			}
			got += int64(len(m.Data))
		case "dropped":
			if m.Stream != "stdout" || m.Dropped <= 0 {
				t.Fatalf("dropped message %+v", m)
			}
			dropped += m.Dropped
		case "exit":
			if m.Exit == nil || m.Exit.Code != 0 {
				t.Fatalf("exit %+v", m)
			}
			if got+dropped != total {
				t.Fatalf("received %d bytes and was told of %d dropped: %d of the %d written are unaccounted for", got, dropped, total-got-dropped, total)
			}
			if dropped == 0 {
				t.Fatal("nothing was dropped: the test did not stall the client long enough to test anything")
			}
			return
		default:
			t.Fatalf("message %+v", m)
		}
	}
}

// TestRestartReattaches: a daemon restart keeps running sandboxes working,
// their processes and REPL state included, and removes orphans.
func TestRestartReattaches(t *testing.T) {
	e := newEnv(t, true, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "keep", "namespace": "n1"}, nil)
	e.must("sandbox.repl.run", map[string]any{"sandbox": "keep", "namespace": "n1", "language": "python", "code": "v = 'survived'"}, nil)
	var pi struct {
		ID string `json:"id"`
	}
	e.must("sandbox.process.start", map[string]any{"sandbox": "keep", "namespace": "n1", "argv": []string{"sleep", "300"}}, &pi)
	e.must("sandbox.start", map[string]any{"sandbox": "stopped", "namespace": "n1"}, nil)
	e.must("sandbox.stop", map[string]any{"sandbox": "stopped", "namespace": "n1"}, nil)
	// An orphan: on the host, unknown to the database.
	img, _ := e.be.HostImage()
	orphan, err := e.be.Create(t.Context(), backendConfig("sb-orphan", img))
	if err != nil {
		t.Fatal(err)
	}
	if err := orphan.Start(t.Context()); err != nil {
		t.Fatal(err)
	}

	e.restart()

	var info struct {
		State string `json:"state"`
	}
	e.must("sandbox.get", map[string]any{"sandbox": "keep", "namespace": "n1"}, &info)
	if info.State != "running" {
		t.Fatalf("after restart: %s", info.State)
	}
	var repl struct {
		Result *string `json:"result"`
	}
	e.must("sandbox.repl.run", map[string]any{"sandbox": "keep", "namespace": "n1", "language": "python", "code": "v"}, &repl)
	if repl.Result == nil || *repl.Result != "'survived'" {
		t.Fatalf("REPL state after restart: %+v", repl)
	}
	var p2 struct {
		Running bool `json:"running"`
	}
	e.must("sandbox.process.get", map[string]any{"sandbox": "keep", "namespace": "n1", "id": pi.ID}, &p2)
	if !p2.Running {
		t.Fatal("background process lost in the restart")
	}
	e.must("sandbox.get", map[string]any{"sandbox": "stopped", "namespace": "n1"}, &info)
	if info.State != "stopped" {
		t.Fatalf("stopped sandbox after restart: %s", info.State)
	}
	e.must("sandbox.start", map[string]any{"sandbox": "stopped", "namespace": "n1"}, nil)
	select {
	case <-orphan.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("orphan still runs after the restart")
	}
	ids, _ := e.backend.IDs()
	for _, id := range ids {
		if id == "sb-orphan" {
			t.Fatal("orphan's files survived the restart")
		}
	}
	e.must("sandbox.stop", map[string]any{"sandbox": "keep", "namespace": "n1"}, nil)
}

// TestIdleAndLifetime: idle sandboxes stop, old ones stop, stopped ones are
// removed after the retention.
func TestIdleAndLifetime(t *testing.T) {
	e := newFakeEnv(t, true, func(o *sandbox.Options) { o.StoppedRetention = 1500 * time.Millisecond })
	e.must("sandbox.create", map[string]any{"name": "idle", "idle_timeout": 0.5}, nil)
	idle, err := e.mgr.Get("default", "idle")
	if err != nil {
		t.Fatal(err)
	}
	e.must("sandbox.create", map[string]any{"name": "short", "max_lifetime": 1}, nil)
	e.must("sandbox.create", map[string]any{"name": "busy", "idle_timeout": 0.5}, nil)
	// A command running longer than the idle timeout keeps its sandbox.
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.must("sandbox.command.run", map[string]any{"sandbox": "busy", "command": "sleep", "args": []string{"1.5"}}, nil)
	}()
	state := func(name string) string {
		r := e.call("sandbox.get", map[string]any{"sandbox": name})
		if r.Status == 404 {
			return "gone"
		}
		var info struct {
			State string `json:"state"`
		}
		_ = json.Unmarshal(r.Result, &info)
		return info.State
	}
	waitState := func(name, want string, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for state(name) != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: state %s, want %s", name, state(name), want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitState("idle", "stopped", 5*time.Second)
	<-done
	waitState("short", "stopped", 5*time.Second)
	waitState("idle", "gone", 5*time.Second)
	// Removal took its files.
	ids, err := e.backend.IDs()
	if err != nil || slices.Contains(ids, idle.ID) {
		t.Fatalf("the removed sandbox's files remain: %v %v", ids, err)
	}
}

// TestExecUser: "user" runs a command as that uid and gid, given as
// numbers or as names from the sandbox's own /etc/passwd and /etc/group
// (not the host's), with no supplementary groups left over from root; an
// unknown user or group is not_found, and nothing runs.
func TestExecUser(t *testing.T) {
	e := newEnv(t, true, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "usr"}, nil)
	// A user and a group only this sandbox has.
	if _, err := user.Lookup("warrenuser"); err == nil {
		t.Fatal("the host has a user warrenuser: the test could not tell whose /etc/passwd is read")
	}
	e.must("sandbox.shell", map[string]any{"sandbox": "usr", "script": "echo 'warrenuser:x:4242:4343::/tmp:/bin/sh' >> /etc/passwd && echo 'warrengrp:x:4545:' >> /etc/group"}, nil)
	var nobody struct {
		Stdout string `json:"stdout"`
	}
	e.must("sandbox.exec", map[string]any{"sandbox": "usr", "argv": []string{"sh", "-c", "grep ^nobody: /etc/passwd | cut -d: -f3,4"}}, &nobody)
	nobodyUID, nobodyGID, ok := strings.Cut(strings.TrimSpace(nobody.Stdout), ":")
	if !ok || nobodyUID == "0" {
		t.Fatalf("the sandbox's /etc/passwd has no usable nobody: %q", nobody.Stdout)
	}
	const ids = "echo $(id -u) $(id -g) $(id -G)"
	for _, c := range []struct{ user, want string }{
		{"", "0 0 0"},
		{"1234", "1234 1234 1234"},
		{"1234:4321", "1234 4321 4321"},
		{"nobody", nobodyUID + " " + nobodyGID + " " + nobodyGID},
		{"warrenuser", "4242 4343 4343"},
		{"warrenuser:warrengrp", "4242 4545 4545"},
		{"warrenuser:99", "4242 99 99"},
	} {
		var res struct {
			ExitCode int    `json:"exit_code"`
			Stdout   string `json:"stdout"`
			Stderr   string `json:"stderr"`
		}
		e.must("sandbox.exec", map[string]any{"sandbox": "usr", "argv": []string{"sh", "-c", ids}, "user": c.user}, &res)
		if got := strings.TrimSpace(res.Stdout); res.ExitCode != 0 || got != c.want {
			t.Errorf("sandbox.exec as %q: %q (stderr %q, exit %d), want %q", c.user, got, res.Stderr, res.ExitCode, c.want)
		}
		e.must("sandbox.shell", map[string]any{"sandbox": "usr", "script": ids, "user": c.user}, &res)
		if got := strings.TrimSpace(res.Stdout); got != c.want {
			t.Errorf("sandbox.shell as %q: %q, want %q", c.user, got, c.want)
		}
	}
	// A background process too.
	var pi struct {
		ID string `json:"id"`
	}
	e.must("sandbox.process.start", map[string]any{"sandbox": "usr", "argv": []string{"sh", "-c", ids}, "user": "warrenuser"}, &pi)
	e.must("sandbox.process.wait", map[string]any{"sandbox": "usr", "id": pi.ID, "timeout": 10}, nil)
	var out struct {
		Data string `json:"data"`
	}
	e.must("sandbox.process.output", map[string]any{"sandbox": "usr", "id": pi.ID}, &out)
	if strings.TrimSpace(out.Data) != "4242 4343 4343" {
		t.Errorf("process as warrenuser: %q", out.Data)
	}
	// Unknown names: not_found, saying which, and the command never ran.
	for _, c := range []struct{ method, user, msg string }{
		{"sandbox.exec", "nosuchuser", `user "nosuchuser" not found in /etc/passwd`},
		{"sandbox.shell", "nosuchuser", `user "nosuchuser" not found in /etc/passwd`},
		{"sandbox.exec", "nobody:nosuchgroup", `group "nosuchgroup" not found in /etc/group`},
		{"sandbox.process.start", "nosuchuser", `user "nosuchuser" not found in /etc/passwd`},
	} {
		params := map[string]any{"sandbox": "usr", "user": c.user}
		if c.method == "sandbox.shell" {
			params["script"] = "touch /tmp/ran"
		} else {
			params["argv"] = []string{"touch", "/tmp/ran"}
		}
		r := e.call(c.method, params)
		if r.Status != 404 || r.kind() != "not_found" || !strings.Contains(r.Error.Message, c.msg) {
			t.Errorf("%s as %q: %d %s, want not_found saying %s", c.method, c.user, r.Status, r.Raw, c.msg)
		}
	}
	if r := e.call("sandbox.file.stat", map[string]any{"sandbox": "usr", "path": "/tmp/ran"}); r.Status != 404 {
		t.Errorf("a command with an unknown user ran: %s", r.Raw)
	}
}

// wsDial opens the WebSocket endpoint with query q and, when key is not
// empty, that API key.
func (e *env) wsDial(t *testing.T, q, key string) (*websocket.Conn, error) {
	t.Helper()
	cfg, err := websocket.NewConfig(strings.Replace(e.url, "http", "ws", 1)+"/api/v1/ws?"+q, e.url)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		cfg.Header.Set("Authorization", "Bearer "+key)
	}
	return websocket.DialConfig(cfg)
}

// wsRun sends start on c and collects the process's output until its exit;
// onOutput sees the output so far after every message and may send.
func wsRun(t *testing.T, c *websocket.Conn, start map[string]any, onOutput func(string)) (string, int) {
	t.Helper()
	if err := websocket.JSON.Send(c, start); err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	for {
		var m struct {
			Type    string `json:"type"`
			Data    []byte `json:"data"`
			Message string `json:"message"`
			Exit    *struct {
				Code int `json:"code"`
			} `json:"exit"`
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if err := websocket.JSON.Receive(c, &m); err != nil {
			t.Fatalf("%v; output so far %q", err, got.String())
		}
		switch m.Type {
		case "started":
		case "stdout", "stderr":
			got.Write(m.Data)
			if onOutput != nil {
				onOutput(got.String())
			}
		case "exit":
			return got.String(), m.Exit.Code
		default:
			t.Fatalf("message %+v; output so far %q", m, got.String())
		}
	}
}

// TestWebSocketTerminal drives a real terminal over the WebSocket: the
// size asked for at the start, a resize message (stty size before and
// after) and input read by a shell.
func TestWebSocketTerminal(t *testing.T) {
	e := newEnv(t, true, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "rs"}, nil)
	c, err := e.wsDial(t, "sandbox=rs", "")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	resized := false
	out, code := wsRun(t, c, map[string]any{"argv": []string{"sh", "-c", "stty size; read x; stty size; echo got $x"}, "tty": true, "rows": 24, "cols": 80},
		func(got string) {
			if !resized && strings.Contains(got, "24 80") {
				resized = true
				// In order: the resize is applied before the line that
				// lets the second stty run.
				_ = websocket.JSON.Send(c, map[string]any{"type": "resize", "rows": 50, "cols": 132})
				_ = websocket.JSON.Send(c, map[string]any{"type": "stdin", "data": []byte("abc\n")})
			}
		})
	// The terminal echoes the input line: 24 80, abc, 50 132, got abc.
	lines := strings.Fields(strings.ReplaceAll(out, "\r", ""))
	if code != 0 || strings.Join(lines, " ") != "24 80 abc 50 132 got abc" {
		t.Fatalf("terminal sizes before and after the resize, and the input: %q (exit %d), want 24 80, abc, then 50 132 and got abc", out, code)
	}
}

// TestWebSocketAuth: with API keys (not --dev), the WebSocket handshake
// needs a valid key for the sandbox's namespace: none, a bad or revoked
// one is 401, another namespace's is 403, and the right one gets a
// socket that runs a command and streams its output.
func TestWebSocketAuth(t *testing.T) {
	e := newFakeEnv(t, false, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "wa", "namespace": "team-a"}, nil)
	keyA, _, err := e.keys.Create(t.Context(), "team-a", time.Hour, "")
	if err != nil {
		t.Fatal(err)
	}
	keyB, _, err := e.keys.Create(t.Context(), "team-b", time.Hour, "")
	if err != nil {
		t.Fatal(err)
	}
	revoked, rec, err := e.keys.Create(t.Context(), "team-a", time.Hour, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.keys.Revoke(t.Context(), rec.ID); err != nil {
		t.Fatal(err)
	}
	// The handshake's answer, as a client sees it.
	handshake := func(q, key string) (int, string) {
		req, _ := http.NewRequest("GET", e.url+"/api/v1/ws?"+q, nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		req.Header.Set("Sec-WebSocket-Version", "13")
		req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		req.Header.Set("Origin", e.url)
		resp := e.do(t, req, key)
		defer func() { _ = resp.Body.Close() }()
		if resp.StatusCode == http.StatusSwitchingProtocols {
			return resp.StatusCode, "" // the socket: nothing to read
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return resp.StatusCode, string(body)
	}
	for _, c := range []struct {
		what, q, key string
		status       int
		kind         string
	}{
		{"no key", "namespace=team-a&sandbox=wa", "", 401, "unauthorized"},
		{"a malformed key", "namespace=team-a&sandbox=wa", "msb_nonsense", 401, "unauthorized"},
		{"a revoked key", "namespace=team-a&sandbox=wa", revoked, 401, "unauthorized"},
		{"another namespace's key", "namespace=team-a&sandbox=wa", keyB, 403, "forbidden"},
		{"another namespace's key, no namespace", "sandbox=wa", keyB, 404, "not_found"},
		{"the right key", "namespace=team-a&sandbox=wa", keyA, 101, ""},
		{"the right key, no namespace", "sandbox=wa", keyA, 101, ""},
		{"the admin key", "namespace=team-a&sandbox=wa", e.admin, 101, ""},
	} {
		status, body := handshake(c.q, c.key)
		if status != c.status || (c.kind != "" && !strings.Contains(body, `"kind":"`+c.kind+`"`)) {
			t.Errorf("WebSocket with %s: %d %.300s, want %d %s", c.what, status, body, c.status, c.kind)
		}
	}
	// Refused clients never get a socket.
	if _, err := e.wsDial(t, "namespace=team-a&sandbox=wa", keyB); err == nil {
		t.Fatal("a team-b key opened a WebSocket to a team-a sandbox")
	}
	if _, err := e.wsDial(t, "namespace=team-a&sandbox=wa", ""); err == nil {
		t.Fatal("a WebSocket opened without a key")
	}
	// The right key's socket (no namespace named: the key's) runs a
	// command.
	c, err := e.wsDial(t, "sandbox=wa", keyA)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if out, code := wsRun(t, c, map[string]any{"argv": []string{"echo", "in team-a"}}, nil); code != 0 || out != "in team-a\n" {
		t.Fatalf("WebSocket with the right key: %q, exit %d", out, code)
	}
}
