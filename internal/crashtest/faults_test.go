package crashtest

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// agentPid is the host pid of the agent (PID 1) of sandbox ns/name.
func (s *server) agentPid(t *testing.T, name string) int {
	t.Helper()
	rows, err := s.readDB(t)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.Namespace == ns && r.Name == name {
			b, err := os.ReadFile(filepath.Join(s.run, r.ID, "agent.pid"))
			if err != nil {
				t.Fatal(err)
			}
			pid, err := strconv.Atoi(strings.Fields(string(b))[0])
			if err != nil {
				t.Fatal(err)
			}
			return pid
		}
	}
	t.Fatalf("no sandbox %s in the database", name)
	return 0
}

func (s *server) mustStart(t *testing.T, name string) {
	t.Helper()
	if err := s.call(t.Context(), "sandbox.start", map[string]any{"namespace": ns, "sandbox": name}, nil); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
}

func (s *server) mustAnswer(t *testing.T, name, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if out, err := s.execOut(ctx, ns, name, "echo", "ok"); err != nil || out != "ok\n" {
		t.Errorf("%s: %s does not answer an exec: %q %v", what, name, out, err)
	}
}

// clearError checks err is an answer of a kind a client can act on, with
// no Go error text that only a developer could read.
func clearError(t *testing.T, what string, err error, kinds ...string) {
	t.Helper()
	k := kindOf(err)
	if err == nil || k == "" || k == "internal" || !containsAny(k, kinds) {
		t.Errorf("%s: answered %v; want an error of kind %v", what, err, kinds)
	}
}

func containsAny(k string, kinds []string) bool {
	for _, w := range kinds {
		if k == w {
			return true
		}
	}
	return false
}

// TestAgentKilledMidRequest: the agent (PID 1) of a sandbox killed from
// the host while an exec, a tar upload and a REPL run are in flight. Each
// request ends promptly with a clear error, the sandbox shows the crash
// (state error, as docs/api.md says of an init that exited on its own),
// starts again, and the server and another sandbox carry on.
func TestAgentKilledMidRequest(t *testing.T) {
	s := newServer(t, "")
	s.start(true)
	defer s.stop()
	s.mustStart(t, "bystander")
	for _, tc := range []struct {
		what string
		send func(ctx context.Context, name string, inFlight chan<- struct{}) error
	}{
		{"exec", func(ctx context.Context, name string, inFlight chan<- struct{}) error {
			close(inFlight)
			_, err := s.execOut(ctx, ns, name, "sleep", "60")
			return err
		}},
		{"tar upload", func(ctx context.Context, name string, inFlight chan<- struct{}) error {
			pr, pw := io.Pipe()
			go func() {
				tw := tar.NewWriter(pw)
				_ = tw.WriteHeader(&tar.Header{Name: "tmp/big", Mode: 0o644, Size: 64 << 20, Typeflag: tar.TypeReg})
				chunk := bytes.Repeat([]byte("x"), 64<<10)
				for i := 0; i < 1024; i++ {
					if i == 16 {
						close(inFlight)
						time.Sleep(time.Second) // the kill lands now
					}
					if _, err := tw.Write(chunk); err != nil {
						_ = pw.CloseWithError(err)
						return
					}
				}
				_ = tw.Close()
				_ = pw.Close()
			}()
			s.mu.Lock()
			url := s.url
			s.mu.Unlock()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPut, url+"/api/v1/sandboxes/"+ns+"/"+name+"/tar?path=/", pr)
			req.Header.Set("Authorization", "Bearer "+s.key)
			resp, err := httpClient.Do(req)
			if err != nil {
				return err
			}
			defer func() { _ = resp.Body.Close() }()
			raw, _ := io.ReadAll(resp.Body)
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			var r struct {
				Error struct {
					Message string `json:"message"`
					Data    struct {
						Kind string `json:"kind"`
					} `json:"data"`
				} `json:"error"`
			}
			_ = json.Unmarshal(raw, &r)
			return &rpcError{Status: resp.StatusCode, Kind: r.Error.Data.Kind, Message: r.Error.Message}
		}},
		{"repl run", func(ctx context.Context, name string, inFlight chan<- struct{}) error {
			close(inFlight)
			return s.call(ctx, "sandbox.repl.run", map[string]any{"namespace": ns, "sandbox": name, "language": "python",
				"code": "import time\ntime.sleep(60)"}, nil)
		}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			name := "victim-" + strings.ReplaceAll(tc.what, " ", "-")
			s.mustStart(t, name)
			pid := s.agentPid(t, name)
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			inFlight := make(chan struct{})
			res := make(chan error, 1)
			go func() { res <- tc.send(ctx, name, inFlight) }()
			<-inFlight
			time.Sleep(700 * time.Millisecond) // the request has reached the agent
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			var err error
			select {
			case err = <-res:
			case <-time.After(20 * time.Second):
				t.Fatalf("%s: no answer 20 s after the sandbox's agent was killed", tc.what)
			}
			t.Logf("%s answered in %v: %v", tc.what, time.Since(killed).Round(time.Millisecond), err)
			clearError(t, tc.what+" whose agent was killed", err, "conflict", "unavailable")
			var in sandboxInfo
			if err := eventually(10*time.Second, func() error {
				if err := s.call(t.Context(), "sandbox.get", map[string]any{"namespace": ns, "sandbox": name}, &in); err != nil {
					return err
				}
				if in.State != "error" || !strings.Contains(in.Error, "exited unexpectedly") {
					return fmt.Errorf("state %q (%s)", in.State, in.Error)
				}
				return nil
			}); err != nil {
				t.Errorf("%s: the sandbox does not show its agent's crash: %v", tc.what, err)
			}
			s.mustStart(t, name)
			s.mustAnswer(t, name, "after its agent was killed and it was started again")
			s.mustAnswer(t, "bystander", "beside a sandbox whose agent was killed")
			if err := s.call(t.Context(), "sandbox.remove", map[string]any{"namespace": ns, "sandbox": name}, nil); err != nil {
				t.Error(err)
			}
		})
	}
	rows, err := s.readDB(t)
	if err != nil {
		t.Fatal(err)
	}
	if err := eventually(15*time.Second, func() error { return s.checkHost(t, rows) }); err != nil {
		t.Error(err)
	}
}

// TestDatabaseBusy: another process holds the database's write lock. A
// request that must write waits for it within the store's busy timeout and
// then succeeds; held longer, the request fails with a clear, retryable
// answer (unavailable) instead of an internal error, and once the lock is
// gone everything works and nothing acknowledged is lost.
func TestDatabaseBusy(t *testing.T) {
	s := newServer(t, "")
	s.start(true)
	defer s.stop()
	s.mustStart(t, "before")
	if err := s.call(t.Context(), "sandbox.file.write", map[string]any{"namespace": ns, "sandbox": "before", "path": "/tmp/kept",
		"data": base64.StdEncoding.EncodeToString([]byte("kept"))}, nil); err != nil {
		t.Fatal(err)
	}
	hold := func(d time.Duration) (release func()) {
		// The sqlite3 shell would do; a second connection of our own
		// holds the same lock without needing it installed.
		db, err := openDB(s)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := db.Conn(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.ExecContext(t.Context(), "BEGIN IMMEDIATE"); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		timer := time.AfterFunc(d, func() {
			_, _ = conn.ExecContext(context.Background(), "ROLLBACK")
			_ = conn.Close()
			_ = db.Close()
			close(done)
		})
		return func() {
			if timer.Stop() {
				_, _ = conn.ExecContext(context.Background(), "ROLLBACK")
				_ = conn.Close()
				_ = db.Close()
				return
			}
			<-done
		}
	}

	// Held for 3 s: the start waits and succeeds.
	release := hold(3 * time.Second)
	t0 := time.Now()
	err := s.call(t.Context(), "sandbox.start", map[string]any{"namespace": ns, "sandbox": "waits"}, nil)
	release()
	if err != nil {
		t.Errorf("a start while the database was locked for 3 s: %v", err)
	}
	t.Logf("a start behind a 3 s lock took %v", time.Since(t0).Round(time.Millisecond))
	s.mustAnswer(t, "waits", "started behind a lock")

	// Held past the busy timeout: a clear, retryable refusal that leaves
	// nothing behind.
	release = hold(25 * time.Second)
	t0 = time.Now()
	err = s.call(t.Context(), "sandbox.start", map[string]any{"namespace": ns, "sandbox": "refused"}, nil)
	took := time.Since(t0)
	s.mustAnswer(t, "before", "while the database is locked")
	release()
	clearError(t, "a start while the database stays locked", err, "unavailable")
	if took > 20*time.Second {
		t.Errorf("the refused start took %v: longer than the store's busy timeout allows", took)
	}
	t.Logf("refused after %v: %v", took.Round(time.Millisecond), err)

	// All is well afterwards.
	s.mustStart(t, "refused")
	s.mustAnswer(t, "refused", "started once the lock was gone")
	var r struct {
		Data string `json:"data"`
	}
	if err := s.call(t.Context(), "sandbox.file.read", map[string]any{"namespace": ns, "sandbox": "before", "path": "/tmp/kept"}, &r); err != nil || r.Data != base64.StdEncoding.EncodeToString([]byte("kept")) {
		t.Errorf("a file uploaded before the lock: %q %v", r.Data, err)
	}
	s.stop()
	s.start(true)
	list, err := s.list(t.Context(), ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 {
		t.Errorf("after a restart: %+v, want before, waits and refused", list)
	}
	for _, in := range list {
		if in.State != "running" {
			t.Errorf("%s is %s after a restart", in.Name, in.State)
		}
	}
	checkState(t, s, nil, &stats{})
	for _, in := range list {
		_ = s.call(t.Context(), "sandbox.remove", map[string]any{"namespace": ns, "sandbox": in.Name}, nil)
	}
}

// TestDataDirFull: the data directory on a small file system of its own,
// filled up. Starts and writes fail with a clear answer, the server stays
// up, a running sandbox keeps answering, and once space is freed everything
// works again with the database intact.
func TestDataDirFull(t *testing.T) {
	mnt := filepath.Join(testenv.SearchableDir(t, "warren-crash-full-"), "data")
	if err := os.Mkdir(mnt, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=96m,mode=0711"); err != nil {
		t.Fatalf("mount a tmpfs for the data directory: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount the data directory: %v", err)
		}
	})
	s := newServer(t, mnt)
	s.start(true)
	defer s.stop()
	s.mustStart(t, "running")

	// Fill it from the host.
	filler := filepath.Join(mnt, "filler")
	out, err := exec.Command("dd", "if=/dev/zero", "of="+filler, "bs=1M", "count=200").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "No space left") {
		t.Fatalf("filling the data directory: %v %s", err, out)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	err = s.call(ctx, "sandbox.file.write", map[string]any{"namespace": ns, "sandbox": "running", "path": "/tmp/big",
		"data": base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("y"), 1<<20))}, nil)
	clearError(t, "a file write with the data directory full", err, "limit", "too_large", "unavailable")
	if err != nil && !strings.Contains(err.Error(), "space") {
		t.Errorf("a file write with the data directory full does not say why: %v", err)
	}
	err = s.call(ctx, "sandbox.start", map[string]any{"namespace": ns, "sandbox": "new"}, nil)
	clearError(t, "a start with the data directory full", err, "limit", "unavailable")
	s.mustAnswer(t, "running", "with the data directory full")
	if resp, err := http.Get(s.url + "/api/v1/health"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("health with the data directory full: %v %v", resp, err)
	} else {
		_ = resp.Body.Close()
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	s.mustStart(t, "new")
	s.mustAnswer(t, "new", "once space was freed")
	if err := s.call(ctx, "sandbox.file.write", map[string]any{"namespace": ns, "sandbox": "running", "path": "/tmp/big",
		"data": base64.StdEncoding.EncodeToString([]byte("fits now"))}, nil); err != nil {
		t.Errorf("a file write once space was freed: %v", err)
	}
	checkState(t, s, nil, &stats{})
	for _, name := range []string{"running", "new"} {
		if err := s.call(ctx, "sandbox.remove", map[string]any{"namespace": ns, "sandbox": name}, nil); err != nil {
			t.Error(err)
		}
	}
	s.stop()
	if _, err := s.readDB(t); err != nil {
		t.Errorf("the database after the data directory was full: %v", err)
	}
}
