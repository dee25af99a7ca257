package egresstest

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/warren-sandbox/warren/internal/rpc"
)

// said is who made an answer's bytes, which says what of the secret values
// they may hold.
type said int

const (
	// byServer: the server's own words (results, errors, metrics, log
	// lines, records). No value, ever.
	byServer said = iota
	// bySandbox: what the sandbox's processes printed, as the server
	// passed it on. An env-mode value may be there (the sandbox has it,
	// and it is its to print: docs/policy.md); a proxy-mode value never.
	bySandbox
	// byGrantHost: what a grant's host answered the sandbox. The fake
	// internet's echo server reflects the request it got, value included
	// (the documented limit of proxy mode). Not scanned.
	byGrantHost
)

// answers collects what the server answered, by who said it.
type answers struct {
	mu     sync.Mutex
	by     [3]bytes.Buffer
	called map[string]bool // the JSON-RPC methods called
	routes map[string]bool // the HTTP routes beside them used
}

func newAnswers() *answers {
	return &answers{called: map[string]bool{}, routes: map[string]bool{}}
}

func (a *answers) add(by said, b []byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.by[by].Write(b)
	a.by[by].WriteByte('\n')
}

// sandboxOutput are the methods whose results carry what the sandbox's
// processes printed (or a file they wrote).
var sandboxOutput = map[string]bool{
	"sandbox.exec": true, "sandbox.shell": true, "sandbox.command.run": true, "sandbox.repl.run": true,
	"sandbox.process.output": true, "sandbox.file.read": true,
}

// notScanned are the server's methods the secrets scenario does not call,
// each with the reason. A method the server adds is in neither list, and
// fails TestSecrets until it is driven or listed here.
var notScanned = map[string]string{}

// everyMethod calls every JSON-RPC method of the server (rpc.MethodNames)
// on the running sandbox "sec" and around it, streams its processes over
// the WebSocket (pipes and a terminal) and uses the HTTP routes (tar down
// and up, a port, MCP). The sandbox prints its env-mode value in several
// of them (which must reach the client: it is the sandbox's to print) and
// its placeholder; what the server said is scanned later.
func everyMethod(t *testing.T, s *server, ans *answers, call func(key, method string, params any) (json.RawMessage, error), envValue, placeholderPrefix, clientSends string) {
	sb := func(extra map[string]any) map[string]any {
		m := map[string]any{"sandbox": "sec", "namespace": ns}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	must := func(method string, params any) json.RawMessage {
		t.Helper()
		r, err := call(s.key, method, params)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		return r
	}
	// Called for their answers (and records) alone: an error is an answer
	// too, scanned like any.
	try := func(key, method string, params any) {
		t.Helper()
		if _, err := call(key, method, params); err != nil {
			t.Logf("%s: %v", method, err)
		}
	}
	printed := func(what string, out []byte) {
		t.Helper()
		if !bytes.Contains(out, []byte(envValue)) || !bytes.Contains(out, []byte(placeholderPrefix)) {
			t.Errorf("%s: the sandbox printed its env-mode value and placeholder, which did not reach the client: %.300s", what, out)
		}
	}
	const show = `echo "$DB_PASSWORD $OPENAI_API_KEY"`

	// Runs.
	printed("sandbox.exec", must("sandbox.exec", sb(map[string]any{"argv": []string{"sh", "-c", show}, "timeout": 30})))
	printed("sandbox.shell", must("sandbox.shell", sb(map[string]any{"script": show, "timeout": 30})))
	printed("sandbox.command.run", must("sandbox.command.run", sb(map[string]any{"command": "env", "timeout": 30})))
	printed("sandbox.repl.run", must("sandbox.repl.run", sb(map[string]any{"language": "python", "timeout": 30,
		"code": `import os; print(os.environ["DB_PASSWORD"], os.environ["OPENAI_API_KEY"])`})))

	// A client that sends values itself, in a command's input: the
	// audit record of the call has them scrubbed (the server knows the
	// values it read, and looks for them in every record).
	must("sandbox.exec", sb(map[string]any{"argv": []string{"wc", "-c"}, "stdin": clientSends, "timeout": 30}))

	// A process, through every process method.
	var pi struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(must("sandbox.process.start", sb(map[string]any{"argv": []string{"sh", "-c", "read x; " + show + "; echo $x"}})), &pi)
	must("sandbox.process.list", sb(nil))
	must("sandbox.process.get", sb(map[string]any{"id": pi.ID}))
	must("sandbox.process.stdin", sb(map[string]any{"id": pi.ID, "data": base64.StdEncoding.EncodeToString([]byte("go\n")), "close": true}))
	must("sandbox.process.wait", sb(map[string]any{"id": pi.ID, "timeout": 30}))
	printed("sandbox.process.output", must("sandbox.process.output", sb(map[string]any{"id": pi.ID, "stream": "stdout", "wait": 5})))
	must("sandbox.process.remove", sb(map[string]any{"id": pi.ID}))
	_ = json.Unmarshal(must("sandbox.process.start", sb(map[string]any{"argv": []string{"cat"}, "tty": true, "rows": 24, "cols": 80})), &pi)
	must("sandbox.process.resize", sb(map[string]any{"id": pi.ID, "rows": 50, "cols": 132}))
	must("sandbox.process.signal", sb(map[string]any{"id": pi.ID, "signal": "SIGKILL"}))
	must("sandbox.process.wait", sb(map[string]any{"id": pi.ID, "timeout": 30}))
	must("sandbox.process.remove", sb(map[string]any{"id": pi.ID}))

	// Files: the sandbox writes its environment to one, read back.
	must("sandbox.exec", sb(map[string]any{"argv": []string{"sh", "-c", "mkdir -p /tmp/s && " + show + " > /tmp/s/env"}, "timeout": 30}))
	var file struct {
		Data []byte `json:"data"`
	}
	_ = json.Unmarshal(must("sandbox.file.read", sb(map[string]any{"path": "/tmp/s/env"})), &file)
	printed("sandbox.file.read", file.Data)
	must("sandbox.file.write", sb(map[string]any{"path": "/tmp/s/w", "data": base64.StdEncoding.EncodeToString([]byte("w")), "mode": 0o644}))
	must("sandbox.file.mkdir", sb(map[string]any{"path": "/tmp/s/d/e", "parents": true}))
	must("sandbox.file.list", sb(map[string]any{"path": "/tmp/s"}))
	must("sandbox.file.stat", sb(map[string]any{"path": "/tmp/s/env"}))
	must("sandbox.file.move", sb(map[string]any{"from": "/tmp/s/w", "to": "/tmp/s/d/w"}))

	// The HTTP routes beside the methods.
	route := func(by said, name, method, path string, body io.Reader) []byte {
		t.Helper()
		req, _ := http.NewRequest(method, s.url+path, body)
		req.Header.Set("Authorization", "Bearer "+s.key)
		resp, err := s.client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s: %d %.300s", name, resp.StatusCode, b)
		}
		ans.add(by, b)
		ans.routes[name] = true
		return b
	}
	tarball := route(bySandbox, "tar.download", "GET", "/api/v1/sandboxes/"+ns+"/sec/tar?path=/tmp/s", nil)
	printed("tar.download", tarball)
	route(byServer, "tar.upload", "PUT", "/api/v1/sandboxes/"+ns+"/sec/tar?path=/tmp/up", bytes.NewReader(tarball))
	must("sandbox.file.remove", sb(map[string]any{"path": "/tmp/s", "recursive": true}))
	must("sandbox.file.remove", sb(map[string]any{"path": "/tmp/up", "recursive": true}))
	// A port: a server in the sandbox answers with its environment, once
	// straight through the route and once exposed on the host.
	_ = json.Unmarshal(must("sandbox.process.start", sb(map[string]any{"argv": []string{"python3", "-c", `
import http.server, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = (os.environ["DB_PASSWORD"] + " " + os.environ["OPENAI_API_KEY"]).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
http.server.HTTPServer(("0.0.0.0", 8000), H).serve_forever()
`}})), &pi)
	var served []byte
	for i := 0; i < 100; i++ {
		req, _ := http.NewRequest("GET", s.url+"/api/v1/sandboxes/"+ns+"/sec/ports/8000/", nil)
		req.Header.Set("Authorization", "Bearer "+s.key)
		if resp, err := s.client.Do(req); err == nil {
			served, _ = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	ans.add(bySandbox, served)
	ans.routes["port.proxy"] = true
	printed("port.proxy", served)
	var port struct {
		HostPort int `json:"host_port"`
	}
	_ = json.Unmarshal(must("sandbox.port.expose", sb(map[string]any{"guest": 8000})), &port)
	must("sandbox.port.list", sb(nil))
	must("sandbox.port.unexpose", sb(map[string]any{"host": port.HostPort}))
	must("sandbox.process.signal", sb(map[string]any{"id": pi.ID, "signal": "SIGKILL"}))
	must("sandbox.process.remove", sb(map[string]any{"id": pi.ID}))

	// The WebSocket, with pipes and with a terminal.
	printed("ws", wsRun(t, s, ans, map[string]any{"argv": []string{"sh", "-c", "read x; " + show}}, "go\n"))
	printed("ws (tty)", wsRun(t, s, ans, map[string]any{"argv": []string{"sh"}, "tty": true, "rows": 24, "cols": 80}, show+"; exit\n"))

	// MCP: a tool call runs a method on the caller's behalf.
	mcpBody := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sandbox_shell","arguments":{"sandbox":"sec","namespace":"` + ns + `","script":"` + strings.ReplaceAll(show, `"`, `\"`) + `"}}}`
	req, _ := http.NewRequest("POST", s.url+"/mcp", strings.NewReader(mcpBody))
	req.Header.Set("Authorization", "Bearer "+s.key)
	req.Header.Set("Content-Type", "application/json")
	if resp, err := s.client.Do(req); err == nil {
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		ans.add(bySandbox, b)
		ans.routes["mcp"] = true
		printed("mcp", b)
	} else {
		t.Error(err)
	}

	// Snapshots: a sandbox with secrets is not checkpointed (the values
	// would be in the snapshot); the refusals are scanned like answers.
	try(s.key, "sandbox.checkpoint", sb(map[string]any{"snapshot": "scan"}))
	try(s.key, "sandbox.fork", sb(map[string]any{"count": 1}))
	try(s.key, "sandbox.restore", map[string]any{"snapshot": "scan", "name": "scan-copy", "namespace": ns})
	try(s.key, "snapshot.get", map[string]any{"snapshot": "scan", "namespace": ns})
	try(s.key, "snapshot.remove", map[string]any{"snapshot": "scan", "namespace": ns})
	must("snapshot.list", map[string]any{"namespace": ns})

	// Paused and resumed: the answers (its info, paused) scanned too.
	must("sandbox.pause", sb(nil))
	must("sandbox.get", sb(nil))
	must("sandbox.resume", sb(nil))

	// What the server says about the sandbox.
	for _, m := range []string{"sandbox.get", "sandbox.logs", "sandbox.egress.get", "sandbox.egress.log", "sandbox.metrics.get"} {
		must(m, sb(nil))
	}
	must("sandbox.egress.set", sb(map[string]any{"rules": []string{"allowed.test", "*.wild.test"}}))
	must("sandbox.list", map[string]any{"namespace": ns})
	must("namespace.usage", map[string]any{"namespace": ns})
	must("image.list", map[string]any{})
	try(s.admin, "image.pull", map[string]any{"ref": "127.0.0.1:1/x:latest", "name": "x"})
	try(s.key, "workspace.create", map[string]any{"name": "scan", "namespace": ns})
	try(s.key, "workspace.list", map[string]any{"namespace": ns})
	try(s.key, "workspace.get", map[string]any{"workspace": "scan", "namespace": ns})
	try(s.key, "workspace.sync", map[string]any{"workspace": "scan", "namespace": ns})
	try(s.key, "workspace.remove", map[string]any{"workspace": "scan", "namespace": ns})
	var key struct {
		ID string `json:"id"`
	}
	r, err := call(s.admin, "key.create", map[string]any{"namespace": ns, "expire": 3600, "description": "scan"})
	if err != nil {
		t.Fatalf("key.create: %v", err)
	}
	_ = json.Unmarshal(r, &key)
	try(s.admin, "key.list", map[string]any{})
	try(s.admin, "key.revoke", map[string]any{"id": key.ID})
	// A second sandbox, env mode alone, removed.
	must("sandbox.create", map[string]any{"name": "sec2", "namespace": ns, "secrets": []string{"db"}})
	must("sandbox.exec", map[string]any{"sandbox": "sec2", "namespace": ns, "argv": []string{"true"}})
	must("sandbox.remove", map[string]any{"sandbox": "sec2", "namespace": ns})
}

// wsRun runs one process over the WebSocket with first as its first
// message, sends input, and returns every frame it got to its exit.
func wsRun(t *testing.T, s *server, ans *answers, first map[string]any, input string) []byte {
	t.Helper()
	cfg, err := websocket.NewConfig("ws://"+s.addr+"/api/v1/ws?namespace="+ns+"&sandbox=sec", s.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Header.Set("Authorization", "Bearer "+s.key)
	c, err := websocket.DialConfig(cfg)
	if err != nil {
		t.Fatalf("ws: %v", err)
	}
	defer func() { _ = c.Close() }()
	ans.routes["ws"] = true
	if err := websocket.JSON.Send(c, first); err != nil {
		t.Fatal(err)
	}
	var frames []byte
	sent := false
	for {
		var raw []byte
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		if err := websocket.Message.Receive(c, &raw); err != nil {
			t.Fatalf("ws: %v (after %s)", err, frames)
		}
		// Frames carry output base64-encoded: scanned decoded too.
		var m struct {
			Type string `json:"type"`
			Data []byte `json:"data"`
		}
		_ = json.Unmarshal(raw, &m)
		frames = append(append(append(frames, raw...), m.Data...), '\n')
		switch m.Type {
		case "started":
			if !sent {
				sent = true
				if err := websocket.JSON.Send(c, map[string]any{"type": "stdin", "data": []byte(input)}); err != nil {
					t.Fatal(err)
				}
			}
		case "exit":
			ans.add(bySandbox, frames)
			return frames
		case "error":
			t.Fatalf("ws: %s", raw)
		}
	}
}

// scanEverything looks for the secret values in everything the server
// said and wrote: its answers, its log, its audit log (record by record),
// its metrics and every file of its data and run directories (the
// database included). envValues may be in what the sandbox printed, and
// there alone. It also checks that every method of the server's was
// called (or is listed in notScanned) and recorded in the audit log.
func scanEverything(t *testing.T, s *server, ans *answers, values, envValues []string) {
	t.Helper()
	var missing []string
	for _, m := range rpc.MethodNames() {
		if !ans.called[m] && notScanned[m] == "" {
			missing = append(missing, m)
		}
	}
	if len(missing) > 0 {
		t.Errorf("methods the secrets scenario does not call: %v (call them in everyMethod, or list them in notScanned with the reason)", missing)
	}
	for m := range notScanned {
		if !slices.Contains(rpc.MethodNames(), m) {
			t.Errorf("notScanned lists %s, which the server does not serve", m)
		}
	}

	scanned := map[string][]byte{"answers of the server": ans.by[byServer].Bytes(), "server log": []byte(s.log.String())}
	for _, root := range []string{s.data, s.run} {
		dev := devOf(root)
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil //nolint:nilerr // a file gone meanwhile holds nothing to scan
			}
			if d.IsDir() && devOf(p) != dev {
				return filepath.SkipDir // a mount: a sandbox's root
			}
			if info, err := d.Info(); err == nil && info.Mode().IsRegular() && info.Size() < 256<<20 {
				if b, err := os.ReadFile(p); err == nil {
					scanned[p] = b
				}
			}
			return nil
		})
	}
	dbs := 0
	for name, b := range scanned {
		if strings.Contains(name, ".db") {
			dbs++
		}
		for _, v := range values {
			if holds(b, v) {
				t.Errorf("a secret value (%.7s...) is in %s", v, name)
			}
		}
	}
	if dbs == 0 || ans.by[byServer].Len() == 0 {
		t.Errorf("scanned %d database files and %d bytes of answers", dbs, ans.by[byServer].Len())
	}
	// What the sandbox printed: its env-mode values (it printed them),
	// no proxy-mode value.
	out := ans.by[bySandbox].Bytes()
	for _, v := range values {
		if holds(out, v) != slices.Contains(envValues, v) {
			t.Errorf("the secret value %.7s... in what the sandbox printed: %v, want %v", v, holds(out, v), slices.Contains(envValues, v))
		}
	}

	// The audit log, record by record: none holds a value, and every
	// method called has its record.
	segs, _ := filepath.Glob(filepath.Join(s.data, "audit", "*.jsonl"))
	records, kinds, methods, scrubbed := 0, map[string]int{}, map[string]bool{}, 0
	for _, p := range segs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			var r struct {
				Seq  uint64 `json:"seq"`
				Kind string `json:"kind"`
				Call *struct {
					Method string `json:"method"`
				} `json:"call"`
				Exec *struct {
					Via string `json:"via"`
				} `json:"exec"`
			}
			if err := json.Unmarshal(line, &r); err != nil {
				t.Errorf("%s: a line that is no record: %.200s", p, line)
				continue
			}
			records++
			kinds[r.Kind]++
			scrubbed += bytes.Count(line, []byte("[secret]"))
			if r.Call != nil {
				methods[r.Call.Method] = true
			}
			if r.Exec != nil {
				methods["exec via "+r.Exec.Via] = true
			}
			for _, v := range values {
				if holds(line, v) {
					t.Errorf("audit record %d (%s) holds a secret value (%.7s...)", r.Seq, r.Kind, v)
				}
			}
		}
	}
	for m := range ans.called {
		if !methods[m] {
			t.Errorf("no audit record of the call of %s", m)
		}
	}
	for _, m := range []string{"ws", "exec via ws", "tar.download", "tar.upload", "port.proxy"} {
		if !methods[m] {
			t.Errorf("no audit record of %s", m)
		}
	}
	if scrubbed == 0 {
		t.Error("no value was scrubbed from the audit log: the client's stdin holding values is recorded as it is")
	}
	if kinds["egress"] == 0 || kinds["usage"] == 0 {
		t.Errorf("audit records by kind: %v, want egress and usage records too", kinds)
	}
	t.Logf("scanned %d files, %d bytes of the server's answers, %d of the sandbox's output, %d audit records %v; methods called: %d, routes: %v",
		len(scanned), ans.by[byServer].Len(), len(out), records, kinds, len(ans.called), keys(ans.routes))
}

// holds reports whether b holds v as it is or base64-encoded (file
// contents and binary output travel so), at any alignment.
func holds(b []byte, v string) bool {
	if bytes.Contains(b, []byte(v)) {
		return true
	}
	for pad, skip := range []int{0, 2, 3} {
		enc := base64.StdEncoding.EncodeToString(append(make([]byte, pad), v...))
		// The characters that depend on v alone: past those mixed with
		// the padding, before the last group's.
		if core := enc[skip : len(enc)-4]; bytes.Contains(b, []byte(core)) {
			return true
		}
	}
	return false
}

func keys(m map[string]bool) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return fmt.Sprint(ks)
}
