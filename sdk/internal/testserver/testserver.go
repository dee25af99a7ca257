// Package testserver runs a real `warren serve --dev` for the SDK's
// runnable examples, so `go test` executes them against real sandboxes and
// checks their // Output: lines.
//
// The server binary is $WARREN_BIN, else bin/warren in the repository that
// contains this module (`make build` puts it there). It needs root. Without
// a binary or root the examples are left out and only the unit tests run,
// except under WARREN_TEST_PRIVILEGED=1 (CI), where that is a failure.
package testserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Main runs m with MSB_SERVER_URL pointing at a fresh server, and removes
// every sandbox and the server's state afterwards. Use it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(testserver.Main(m)) }
func Main(m *testing.M) int {
	flag.Parse()
	srv, err := start()
	if err != nil {
		if os.Getenv("WARREN_TEST_PRIVILEGED") == "1" {
			fmt.Fprintf(os.Stderr, "testserver: the examples need a warren server: %v\n", err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "testserver: examples not run (%v); unit tests only\n", err)
		if f := flag.Lookup("test.run"); f != nil && f.Value.String() == "" {
			_ = flag.Set("test.run", "^Test")
		}
		return m.Run()
	}
	code := m.Run()
	if err := srv.stop(); err != nil {
		fmt.Fprintf(os.Stderr, "testserver: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

type server struct {
	dir string
	url string
	cmd *exec.Cmd
	log *bytes.Buffer
}

// findBinary returns $WARREN_BIN or bin/warren above the working directory.
func findBinary() (string, error) {
	if p := os.Getenv("WARREN_BIN"); p != "" {
		return p, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, "bin", "warren")
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no bin/warren above the working directory and WARREN_BIN unset (run make build)")
		}
		dir = parent
	}
}

func start() (*server, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("warren serve needs root")
	}
	bin, err := findBinary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "warren-sdk-examples-")
	if err != nil {
		return nil, err
	}
	// Sandbox root is an unprivileged uid that must reach the data dir.
	if err := os.Chmod(dir, 0o711); err != nil { //nolint:gosec // 0711 for the uid range named above
		_ = os.RemoveAll(dir)
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	addr := l.Addr().String()
	_ = l.Close()
	s := &server{dir: dir, url: "http://" + addr, log: new(bytes.Buffer)}
	s.cmd = exec.Command(bin, "serve", "--dev", "--listen", addr, "--prewarm", "1", //nolint:gosec // bin is the warren binary of this checkout (or WARREN_BIN); the arguments are fixed
		"--data-dir", filepath.Join(dir, "data"), "--run-dir", filepath.Join(dir, "run"))
	// The tests leave the host's fs.file-max as it is, and make no disk
	// pool (a loop-mounted image that outlives the server).
	s.cmd.Env = append(os.Environ(), "WARREN_KEEP_FILE_MAX=1", "WARREN_DISK_POOL=off")
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(s.url + "/api/v1/health")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			_ = s.stop()
			return nil, fmt.Errorf("%s serve did not become healthy in 30s; its log:\n%s", bin, s.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := os.Setenv("MSB_SERVER_URL", s.url); err != nil {
		_ = s.stop()
		return nil, err
	}
	return s, nil
}

// call sends one JSON-RPC request and decodes its result into out.
func (s *server) call(method string, params, out any) error {
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": "1", "method": method, "params": params})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/api/v1/rpc", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	var r struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return fmt.Errorf("%s: %d: %w", method, resp.StatusCode, err)
	}
	if r.Error != nil {
		return fmt.Errorf("%s: %s", method, r.Error.Message)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(r.Result, out)
}

// stop removes every sandbox (they would outlive the server: a daemon's
// sandboxes survive its restarts), stops the server and deletes its state.
func (s *server) stop() error {
	var errs []error
	var list struct {
		Sandboxes []struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"sandboxes"`
	}
	if err := s.call("sandbox.list", map[string]any{}, &list); err != nil {
		errs = append(errs, err)
	}
	for _, sb := range list.Sandboxes {
		if err := s.call("sandbox.remove", map[string]any{"sandbox": sb.Name, "namespace": sb.Namespace}, nil); err != nil {
			errs = append(errs, err)
		}
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
		errs = append(errs, errors.New("the server did not stop within 15s of SIGTERM"))
	}
	if err := os.RemoveAll(s.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
