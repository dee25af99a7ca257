package rpc_test

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

// TestPortMethods: sandbox.port.expose, .list and .unexpose on the fake
// backend (whose addresses have nothing behind them: the host's side
// only), in the caller's namespace only, with their params checked; and
// the HTTP route's front door: a key for the namespace, the sandbox
// running, a port number.
func TestPortMethods(t *testing.T) {
	e := newFakeEnv(t, false, func(o *sandbox.Options) { o.Egress = egress.NewRegistry() })
	keyA, _, err := e.keys.Create(t.Context(), "team-a", time.Hour, "")
	if err != nil {
		t.Fatal(err)
	}
	keyB, _, err := e.keys.Create(t.Context(), "team-b", time.Hour, "")
	if err != nil {
		t.Fatal(err)
	}
	if r := e.callAs(keyA, "sandbox.create", map[string]any{"name": "web"}); r.Status != 200 {
		t.Fatalf("create: %s", r.Raw)
	}
	r := e.callAs(keyA, "sandbox.port.expose", map[string]any{"sandbox": "web", "guest": 8000})
	if r.Status != 200 || !strings.Contains(string(r.Result), `"host_address":"127.0.0.1"`) || !strings.Contains(string(r.Result), `"guest_port":8000`) {
		t.Fatalf("expose: %d %s", r.Status, r.Raw)
	}
	for _, c := range []struct {
		key    string
		params map[string]any
		kind   string
	}{
		{keyB, map[string]any{"sandbox": "web", "namespace": "team-a", "guest": 8000}, "forbidden"},
		{keyB, map[string]any{"sandbox": "web", "guest": 8000}, "not_found"},
		{keyA, map[string]any{"sandbox": "web", "guest": 0}, "invalid_params"},
		{keyA, map[string]any{"sandbox": "web", "guest": 70000}, "invalid_params"},
		{keyA, map[string]any{"sandbox": "web", "guest": 80, "host": -1}, "invalid_params"},
		{keyA, map[string]any{"sandbox": "web", "guest": 80, "address": "localhost"}, "invalid_params"},
		{keyA, map[string]any{"sandbox": "web", "guest": 80, "address": "0.0.0.0"}, "forbidden"},
		{keyA, map[string]any{"sandbox": "web", "guest": 80, "bind": "x"}, "invalid_params"},
	} {
		if r := e.callAs(c.key, "sandbox.port.expose", c.params); r.kind() != c.kind {
			t.Errorf("expose %v: %d %s, want %s", c.params, r.Status, r.Raw, c.kind)
		}
	}
	var list struct {
		Ports []struct {
			HostPort int    `json:"host_port"`
			Origin   string `json:"origin"`
		} `json:"ports"`
	}
	r = e.callAs(keyA, "sandbox.port.list", map[string]any{"sandbox": "web"})
	if r.Status != 200 || json.Unmarshal(r.Result, &list) != nil || len(list.Ports) != 1 || list.Ports[0].Origin != "expose" {
		t.Fatalf("list: %s", r.Raw)
	}
	if r := e.callAs(keyB, "sandbox.port.unexpose", map[string]any{"sandbox": "web", "namespace": "team-a", "host": list.Ports[0].HostPort}); r.kind() != "forbidden" {
		t.Errorf("unexpose with another namespace's key: %s", r.Raw)
	}
	if r := e.callAs(keyA, "sandbox.port.unexpose", map[string]any{"sandbox": "web", "host": list.Ports[0].HostPort}); r.Status != 200 {
		t.Errorf("unexpose: %s", r.Raw)
	}
	if c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(list.Ports[0].HostPort)), time.Second); err == nil {
		_ = c.Close()
		t.Error("the unexposed port still listens")
	}

	// The route: a key covering the namespace, a valid port, a sandbox
	// that runs.
	for _, c := range []struct {
		key, path string
		status    int
	}{
		{"", "/api/v1/sandboxes/team-a/web/ports/8000/", 401},
		{keyB, "/api/v1/sandboxes/team-a/web/ports/8000/", 403},
		{keyA, "/api/v1/sandboxes/team-a/nope/ports/8000/x", 404},
		{keyA, "/api/v1/sandboxes/team-a/web/ports/0/", 400},
		{keyA, "/api/v1/sandboxes/team-a/web/ports/http/", 400},
		{keyA, "/api/v1/sandboxes/team-a/web/ports/65536", 400},
	} {
		req, err := http.NewRequest("GET", e.url+c.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp := e.do(t, req, c.key)
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("GET %s with key %v: %d %s, want %d", c.path, c.key != "", resp.StatusCode, b, c.status)
		}
	}
	if r := e.callAs(keyA, "sandbox.stop", map[string]any{"sandbox": "web"}); r.Status != 200 {
		t.Fatal(string(r.Raw))
	}
	req, _ := http.NewRequest("GET", e.url+"/api/v1/sandboxes/team-a/web/ports/8000/", nil)
	resp := e.do(t, req, keyA)
	_ = resp.Body.Close()
	if resp.StatusCode != 409 {
		t.Errorf("route to a stopped sandbox: %d, want 409", resp.StatusCode)
	}
}

// TestCreatePorts: sandbox.create's ports, read as sandbox.start's (one
// parser): published from the create on, listed as "config"; hostile
// lists refused naming the problem, leaving no sandbox; a taken host port
// a conflict that leaves nothing.
func TestCreatePorts(t *testing.T) {
	e := newFakeEnv(t, false, func(o *sandbox.Options) { o.Egress = egress.NewRegistry() })
	free := func() int {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = ln.Close() }()
		return ln.Addr().(*net.TCPAddr).Port
	}
	tooMany := make([]string, 65)
	for i := range tooMany {
		tooMany[i] = strconv.Itoa(20000 + i)
	}
	for _, c := range []struct {
		ports any
		want  string
	}{
		{[]string{"0:80"}, `\"0:80\"`},
		{[]string{"8080:0"}, `\"8080:0\"`},
		{[]string{"65536:80"}, `\"65536:80\"`},
		{[]string{"80:-1"}, `\"80:-1\"`},
		{[]string{"8080:80/udp"}, `\"8080:80/udp\"`},
		{[]string{"127.0.0.1:8080:80"}, `\"127.0.0.1:8080:80\"`},
		{[]string{""}, `\"\"`},
		{[]string{"18080:80", "18080:81"}, "given twice"},
		{tooMany, "at most 64"},
		{[]int{8080}, "invalid"},
	} {
		r := e.call("sandbox.create", map[string]any{"name": "bad", "ports": c.ports})
		if r.kind() != "invalid_params" || !strings.Contains(string(r.Raw), c.want) {
			t.Errorf("create with ports %v: %s, want invalid_params naming %s", c.ports, r.Raw, c.want)
		}
	}
	if r := e.call("sandbox.get", map[string]any{"sandbox": "bad"}); r.kind() != "not_found" {
		t.Errorf("a refused create left a sandbox: %s", r.Raw)
	}

	hp := free()
	if r := e.call("sandbox.create", map[string]any{"name": "web", "ports": []string{strconv.Itoa(hp) + ":8000"}}); r.Status != 200 {
		t.Fatalf("create with ports: %s", r.Raw)
	}
	var list struct {
		Ports []struct {
			HostPort  int    `json:"host_port"`
			GuestPort int    `json:"guest_port"`
			Origin    string `json:"origin"`
			Published bool   `json:"published"`
		} `json:"ports"`
	}
	r := e.call("sandbox.port.list", map[string]any{"sandbox": "web"})
	if json.Unmarshal(r.Result, &list) != nil || len(list.Ports) != 1 || list.Ports[0].HostPort != hp || list.Ports[0].GuestPort != 8000 ||
		list.Ports[0].Origin != "config" || !list.Ports[0].Published {
		t.Fatalf("list after create: %s", r.Raw)
	}
	// The same host port for another sandbox: taken.
	r = e.call("sandbox.create", map[string]any{"name": "web2", "ports": []string{strconv.Itoa(hp) + ":80"}})
	if r.kind() != "conflict" || !strings.Contains(string(r.Raw), strconv.Itoa(hp)) {
		t.Errorf("create on a taken host port: %s, want a conflict naming %d", r.Raw, hp)
	}
	if r := e.call("sandbox.get", map[string]any{"sandbox": "web2"}); r.kind() != "not_found" {
		t.Errorf("a create refused for its port left a sandbox: %s", r.Raw)
	}
}
