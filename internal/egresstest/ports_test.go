package egresstest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// app serves, in the sandbox on port 8001, the request's headers as JSON
// and a one-message WebSocket echo at /ws (the standard library has no
// WebSocket; the handshake and one small frame are a few lines).
const app = `
import base64, hashlib, json, struct, http.server
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def do_GET(self):
        if self.headers.get('Upgrade', '').lower() == 'websocket':
            key = self.headers['Sec-WebSocket-Key']
            acc = base64.b64encode(hashlib.sha1((key + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').encode()).digest()).decode()
            self.send_response(101)
            self.send_header('Upgrade', 'websocket')
            self.send_header('Connection', 'Upgrade')
            self.send_header('Sec-WebSocket-Accept', acc)
            self.end_headers()
            self.wfile.flush()
            b0, b1 = self.rfile.read(2)
            n = b1 & 127
            mask = self.rfile.read(4)
            data = bytes(c ^ mask[i % 4] for i, c in enumerate(self.rfile.read(n)))
            self.wfile.write(bytes([0x81, len(data)]) + data)
            self.wfile.flush()
            self.close_connection = True
            return
        body = json.dumps({k.lower(): v for k, v in self.headers.items()}).encode()
        self.send_response(200)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.ThreadingHTTPServer(('0.0.0.0', 8001), H).serve_forever()
`

// TestPorts: a real server publishes a sandbox's ports (sandbox.start's
// and sandbox.port.expose's) on loopback, reaching python's http.server
// in the sandbox from the host; the HTTP route proxies to a sandbox port
// with a key for its namespace only, never passing the key on, WebSocket
// included; a taken host port fails a start clearly, leaving nothing; a
// stop closes the ports, and the next start publishes them again, the one
// exposed live (with warren ports) too, on the same host port.
func TestPorts(t *testing.T) { testPorts(t, "native") }

// TestPortsGvisor: the same with the sandbox in the gvisor tier.
func TestPortsGvisor(t *testing.T) { testPorts(t, "gvisor") }

func testPorts(t *testing.T, tier string) {
	s := startServer(t, tierFlags(t, tier)...)
	hp := freePort(t)
	start := func(name string, ports []string) error {
		return s.call(s.key, "sandbox.start", map[string]any{"sandbox": name, "namespace": ns,
			"config": map[string]any{"image": "python", "memory": 256, "cpus": 1, "ports": ports}}, nil)
	}
	if err := start("web", []string{fmt.Sprintf("%d:8000", hp)}); err != nil {
		t.Fatal(err)
	}
	if r, err := s.exec("web", []string{"sh", "-c", "mkdir -p /tmp/www && echo hello-from-sandbox > /tmp/www/index.html && cat > /tmp/app.py"}, app, nil, 30); err != nil || r.ExitCode != 0 {
		t.Fatalf("write the files: %v %+v", err, r)
	}
	for _, argv := range [][]string{{"python3", "-m", "http.server", "8000", "--bind", "0.0.0.0", "--directory", "/tmp/www"}, {"python3", "/tmp/app.py"}} {
		if err := s.call(s.key, "sandbox.process.start", map[string]any{"sandbox": "web", "namespace": ns, "argv": argv}, nil); err != nil {
			t.Fatalf("start %q: %v", argv, err)
		}
	}
	direct := fmt.Sprintf("http://127.0.0.1:%d/index.html", hp)
	if body := waitGet(t, direct); body != "hello-from-sandbox\n" {
		t.Fatalf("GET %s through the published port: %q", direct, body)
	}

	// Exposed live, on any free port; listed; unexposed.
	var x struct {
		HostAddress string `json:"host_address"`
		HostPort    int    `json:"host_port"`
		GuestPort   int    `json:"guest_port"`
	}
	if err := s.call(s.key, "sandbox.port.expose", map[string]any{"sandbox": "web", "namespace": ns, "guest": 8000}, &x); err != nil {
		t.Fatal(err)
	}
	if x.HostAddress != "127.0.0.1" || x.HostPort == 0 || x.GuestPort != 8000 {
		t.Fatalf("expose answered %+v", x)
	}
	exposed := fmt.Sprintf("http://127.0.0.1:%d/index.html", x.HostPort)
	if body := waitGet(t, exposed); body != "hello-from-sandbox\n" {
		t.Fatalf("GET %s through the exposed port: %q", exposed, body)
	}
	var list struct {
		Ports []struct {
			HostPort int    `json:"host_port"`
			Origin   string `json:"origin"`
		} `json:"ports"`
	}
	if err := s.call(s.key, "sandbox.port.list", map[string]any{"sandbox": "web", "namespace": ns}, &list); err != nil || len(list.Ports) != 2 {
		t.Fatalf("port.list: %+v %v, want 2 ports", list, err)
	}
	if err := s.call(s.key, "sandbox.port.unexpose", map[string]any{"sandbox": "web", "namespace": ns, "host": x.HostPort}, nil); err != nil {
		t.Fatal(err)
	}
	if listens(x.HostPort) {
		t.Errorf("unexposed port %d still listens", x.HostPort)
	}

	// The HTTP route: the caller's key for the namespace, never passed on.
	route := s.url + "/api/v1/sandboxes/" + ns + "/web/ports/"
	other := s.newKey("other")
	for _, c := range []struct {
		key    string
		status int
	}{{"", 401}, {other, 403}, {s.key, 200}, {s.admin, 200}} {
		status, body := get(t, route+"8000/index.html", c.key)
		if status != c.status || (status == 200 && body != "hello-from-sandbox\n") {
			t.Errorf("route with key %q: %d %q, want %d", c.key[:min(len(c.key), 12)], status, body, c.status)
		}
	}
	status, body := get(t, route+"8001/headers?x=1", s.key)
	var hdr map[string]string
	if status != 200 || json.Unmarshal([]byte(body), &hdr) != nil {
		t.Fatalf("headers through the route: %d %q", status, body)
	}
	if _, ok := hdr["authorization"]; ok || strings.Contains(body, s.key) {
		t.Errorf("the sandbox saw the caller's key: %s", strings.ReplaceAll(body, s.key, "KEY"))
	}
	if hdr["x-forwarded-prefix"] != "/api/v1/sandboxes/"+ns+"/web/ports/8001" {
		t.Errorf("X-Forwarded-Prefix %q", hdr["x-forwarded-prefix"])
	}
	if status, _ := get(t, route+"8002/", s.key); status != http.StatusBadGateway {
		t.Errorf("route to a port nothing listens on: %d, want 502", status)
	}
	if msg, err := wsEcho(s, "/api/v1/sandboxes/"+ns+"/web/ports/8001/ws", "hello-ws"); err != nil || msg != "hello-ws" {
		t.Errorf("WebSocket through the route: %q %v", msg, err)
	}

	// A taken host port: a conflict naming it, nothing left.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	taken := ln.Addr().(*net.TCPAddr).Port
	err = start("web2", []string{fmt.Sprintf("%d:8000", taken)})
	var re *rpcError
	if !asRPC(err, &re) || re.Kind != "conflict" || !strings.Contains(re.Message, strconv.Itoa(taken)) {
		t.Errorf("start with a taken port: %v, want a conflict naming %d", err, taken)
	}
	if err := s.call(s.key, "sandbox.get", map[string]any{"sandbox": "web2", "namespace": ns}, nil); !asRPC(err, &re) || re.Kind != "not_found" {
		t.Errorf("a start refused for its port left a sandbox: %v", err)
	}

	// Exposed with the CLI; listed by it.
	cli := func(args ...string) (string, error) {
		cmd := s.command(append([]string{"ports"}, args...)...)
		cmd.Env = append(cmd.Env, "MSB_SERVER_URL="+s.url, "MSB_API_KEY="+s.key)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return string(out), fmt.Errorf("warren ports %q: %w: %s", args, err, stderr.String())
		}
		return string(out), nil
	}
	out, err := cli("expose", "web", "8000", "--namespace", ns)
	rows := strings.Fields(out)
	if err != nil || len(rows) != 10 || rows[5] != "127.0.0.1" || rows[7] != "8000" || rows[8] != "expose" || rows[9] != "yes" {
		t.Fatalf("warren ports expose: %q %v", out, err)
	}
	yp, _ := strconv.Atoi(rows[6])
	if body := waitGet(t, fmt.Sprintf("http://127.0.0.1:%d/index.html", yp)); body != "hello-from-sandbox\n" {
		t.Fatalf("GET through the port warren ports exposed: %q", body)
	}
	if out, err := cli("web", "--namespace", ns); err != nil || strings.Count(out, "\n") != 3 || !strings.Contains(out, strconv.Itoa(yp)) {
		t.Errorf("warren ports web: %q %v, want a header and 2 ports", out, err)
	}
	if _, err := cli("expose", "web", fmt.Sprintf("%d:8000", yp), "--namespace", ns); err == nil || !strings.Contains(err.Error(), "is taken") {
		t.Errorf("warren ports expose on a host port taken: %v", err)
	}

	// A stop closes the published port (and what is open through it).
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", hp))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if err := s.call(s.key, "sandbox.stop", map[string]any{"sandbox": "web", "namespace": ns}, nil); err != nil {
		t.Fatal(err)
	}
	if listens(hp) {
		t.Errorf("port %d listens after the sandbox stopped", hp)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a connection through the port outlived the stop: %v", err)
	}
	if out, err := cli("web", "--namespace", ns); err != nil || strings.Count(out, " no\n") != 2 || listens(yp) {
		t.Errorf("stopped: warren ports web %q %v (exposed port listening: %v), want 2 ports unpublished", out, err, listens(yp))
	}

	// Started again as it last ran: both ports are back.
	if err := s.call(s.key, "sandbox.start", map[string]any{"sandbox": "web", "namespace": ns}, nil); err != nil {
		t.Fatal(err)
	}
	if r, err := s.exec("web", []string{"sh", "-c", "mkdir -p /tmp/www && echo hello-again > /tmp/www/index.html"}, "", nil, 30); err != nil || r.ExitCode != 0 {
		t.Fatalf("write the files: %v %+v", err, r)
	}
	if err := s.call(s.key, "sandbox.process.start", map[string]any{"sandbox": "web", "namespace": ns,
		"argv": []string{"python3", "-m", "http.server", "8000", "--bind", "0.0.0.0", "--directory", "/tmp/www"}}, nil); err != nil {
		t.Fatal(err)
	}
	for _, port := range []int{hp, yp} {
		if body := waitGet(t, fmt.Sprintf("http://127.0.0.1:%d/index.html", port)); body != "hello-again\n" {
			t.Errorf("after a restart, GET through port %d: %q", port, body)
		}
	}
	if _, err := cli("unexpose", "web", strconv.Itoa(yp), "--namespace", ns); err != nil || listens(yp) {
		t.Errorf("warren ports unexpose: %v (still listening: %v)", err, listens(yp))
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port
}

func listens(port int) bool {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 2*time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// get fetches url with key ("" none): status and body.
func get(t *testing.T, url, key string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	c := http.Client{Timeout: 30 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// waitGet fetches url until it answers 200 (the server in the sandbox is
// starting), for at most 30 s.
func waitGet(t *testing.T, url string) string {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := c.Get(url)
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			_ = resp.Body.Close()
			if resp.StatusCode == 200 {
				return string(b)
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %v", url, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// wsEcho opens a WebSocket at path through the server with its key,
// sends msg (a short text frame) and returns the one frame it gets back.
func wsEcho(s *server, path, msg string) (string, error) {
	c, err := net.DialTimeout("tcp", s.addr, 10*time.Second)
	if err != nil {
		return "", err
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", path, s.addr, s.key)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return "", err
	}
	// A 101's body is empty; the connection is the WebSocket's.
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Sec-WebSocket-Accept") != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
		return "", fmt.Errorf("handshake: %s %v", resp.Status, resp.Header)
	}
	mask := []byte{1, 2, 3, 4}
	frame := []byte{0x81, 0x80 | byte(len(msg))}
	frame = append(frame, mask...)
	for i := range len(msg) {
		frame = append(frame, msg[i]^mask[i%4])
	}
	if _, err := c.Write(frame); err != nil {
		return "", err
	}
	head := make([]byte, 2)
	if _, err := io.ReadFull(br, head); err != nil {
		return "", err
	}
	data := make([]byte, head[1]&127)
	if _, err := io.ReadFull(br, data); err != nil {
		return "", err
	}
	if !bytes.Equal(head[:1], []byte{0x81}) {
		return "", fmt.Errorf("frame %x", head)
	}
	return string(data), nil
}
