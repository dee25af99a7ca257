package egresstest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// ns is the namespace of the suite's sandboxes.
const ns = "egress"

// server is a real `warren serve` on its own data and run directories and
// a random loopback port, with one key for ns and one for every namespace.
type server struct {
	t         *testing.T
	bin       string
	data, run string
	addr      string // host:port of the API
	url       string
	args      []string // serve's
	cmd       *exec.Cmd
	exited    chan struct{} // closed when cmd has been waited for
	log       *testenv.SyncBuffer
	key       string // ns's key
	admin     string // every namespace's
	client    *http.Client
}

func (s *server) command(args ...string) *exec.Cmd {
	return testenv.WarrenCommand(s.t, s.data, s.run, args...)
}

func (s *server) newKey(namespace string) string {
	return testenv.CreateKey(s.t, s.data, s.run, namespace, "egress "+namespace)
}

// startServer starts warren serve with extra flags, waits for health, and
// registers its removal (every sandbox, then the server).
func startServer(t *testing.T, extra ...string) *server {
	t.Helper()
	testenv.RequireRoot(t)
	dir := testenv.SearchableDir(t, "warren-egress-")
	s := &server{t: t, bin: testenv.WarrenBinary(t), data: filepath.Join(dir, "data"), run: filepath.Join(dir, "run"),
		log: &testenv.SyncBuffer{}, client: &http.Client{Timeout: 2 * time.Minute}}
	s.key, s.admin = s.newKey(ns), s.newKey("*")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	_ = ln.Close()
	// A warm pool of two: the sandboxes take links the pool attached
	// ahead (a rename at start), the path a server's starts take.
	s.args = append([]string{"serve", "--listen", s.addr, "--prewarm", "2", "--log-text"}, extra...)
	s.url = "http://" + s.addr
	s.launch()
	t.Cleanup(func() {
		if !s.hasExited() {
			var out struct {
				Sandboxes []struct{ Namespace, Name string } `json:"sandboxes"`
			}
			if err := s.call(s.admin, "sandbox.list", map[string]any{"namespace": "*"}, &out); err == nil {
				for _, b := range out.Sandboxes {
					_ = s.call(s.admin, "sandbox.remove", map[string]any{"sandbox": b.Name, "namespace": b.Namespace}, nil)
				}
			}
			if err := s.stop(); err != nil {
				t.Errorf("stop the server: %v", err)
			}
			for _, l := range s.leftLinks() {
				t.Errorf("left behind: link %s", l)
			}
		}
		if t.Failed() {
			t.Logf("server log (tail):\n%s", tail(s.log.String(), 6000))
		}
	})
	s.waitHealthy()
	return s
}

// launch starts the server's process with s.args.
func (s *server) launch() {
	s.cmd = s.command(s.args...)
	s.cmd.Stderr = s.log
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	exited := make(chan struct{})
	s.exited = exited
	cmd := s.cmd
	go func() { _ = cmd.Wait(); close(exited) }()
}

func (s *server) waitHealthy() {
	s.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !s.healthy() {
		if s.hasExited() || time.Now().After(deadline) {
			_ = s.cmd.Process.Kill()
			<-s.exited
			s.t.Fatal("server did not come up (its log follows)")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// restart stops the server (its sandboxes keep running) and starts it
// again on the same directories, which reattaches them.
func (s *server) restart() {
	s.t.Helper()
	if err := s.stop(); err != nil {
		s.t.Fatal(err)
	}
	s.launch()
	s.waitHealthy()
}

func (s *server) healthy() bool {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(s.url + "/api/v1/health")
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == 200
}

func (s *server) hasExited() bool {
	select {
	case <-s.exited:
		return true
	default:
		return false
	}
}

// stop ends the server with SIGTERM, as an operator would.
func (s *server) stop() error {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
		if !s.cmd.ProcessState.Success() {
			return fmt.Errorf("serve exited: %v", s.cmd.ProcessState)
		}
		return nil
	case <-time.After(60 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
		return errors.New("serve did not stop within 60 s of SIGTERM")
	}
}

// instancePrefix is what the server names its host objects with (its
// cgroups, its network's table and links; native.InstancePrefix).
func (s *server) instancePrefix() string {
	sum := sha256.Sum256([]byte(s.run))
	return "warren-" + hex.EncodeToString(sum[:4])
}

// leftLinks lists the host's links the server made (their alias starts
// with its prefix) that are still there.
func (s *server) leftLinks() []string {
	// Other tests' links come and go meanwhile: a dump they interrupt is
	// taken again.
	links, err := netlink.LinkList()
	for i := 0; i < 20 && errors.Is(err, netlink.ErrDumpInterrupted); i++ {
		links, err = netlink.LinkList()
	}
	if err != nil {
		return []string{"(cannot list links: " + err.Error() + ")"}
	}
	var left []string
	for _, l := range links {
		if a := l.Attrs(); strings.HasPrefix(a.Alias, s.instancePrefix()+" ") {
			left = append(left, a.Name+" ("+a.Alias+")")
		}
	}
	return left
}

// rpcError is a JSON-RPC error answer.
type rpcError struct {
	Status  int
	Kind    string
	Message string
}

func (e *rpcError) Error() string { return fmt.Sprintf("%s (%d): %s", e.Kind, e.Status, e.Message) }

// call makes one JSON-RPC call with key; out receives the result.
func (s *server) call(key, method string, params, out any) error {
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	if err != nil {
		return err
	}
	req, err := http.NewRequest("POST", s.url+"/api/v1/rpc", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	var ans struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Message string `json:"message"`
			Data    struct {
				Kind string `json:"kind"`
			} `json:"data"`
		} `json:"error"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&ans); err != nil {
		return fmt.Errorf("%s: status %d, undecodable answer: %w", method, resp.StatusCode, err)
	}
	if ans.Error != nil {
		return &rpcError{Status: resp.StatusCode, Kind: ans.Error.Data.Kind, Message: ans.Error.Message}
	}
	if out != nil {
		return json.Unmarshal(ans.Result, out)
	}
	return nil
}

// execResult is sandbox.exec's answer.
type execResult struct {
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal"`
	TimedOut bool   `json:"timed_out"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
}

// exec runs argv in sandbox name with stdin and env ("K=V").
func (s *server) exec(name string, argv []string, stdin string, env []string, timeout int) (execResult, error) {
	var r execResult
	err := s.call(s.key, "sandbox.exec", map[string]any{"sandbox": name, "namespace": ns, "argv": argv, "stdin": stdin,
		"env": env, "timeout": timeout}, &r)
	return r, err
}

// create starts sandbox name with the egress rules.
func (s *server) create(name string, egress []string) error {
	return s.call(s.key, "sandbox.create", map[string]any{"name": name, "namespace": ns, "egress": egress}, nil)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.RemoveBuilt()
	os.Exit(code)
}
