package crashtest

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite" // the database is read as the server writes it

	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/cgroup"
	"github.com/warren-sandbox/warren/internal/netplumb"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// server is one data and run directory and the `warren serve` on it,
// restarted as often as a test likes.
type server struct {
	t          *testing.T
	dir        string // holds data and run (or the test's own data dir)
	data, run  string
	key        string
	extra      []string // more serve flags
	log        *os.File // the servers' stderr, one after the other
	logPath    string
	agent, spn string

	mu   sync.Mutex
	cmd  *exec.Cmd
	url  string
	down bool // killed or stopped: requests failing to connect are expected
}

// newServer prepares directories and an API key; data, when not empty, is
// the data directory to use (a file system the test made).
func newServer(t *testing.T, data string, extra ...string) *server {
	t.Helper()
	testenv.RequireRoot(t)
	dir := testenv.SearchableDir(t, "warren-crash-")
	s := &server{t: t, dir: dir, data: filepath.Join(dir, "data"), run: filepath.Join(dir, "run"), extra: extra,
		agent: testenv.AgentBinary(t), spn: testenv.SpawnerBinary(t), down: true}
	if data != "" {
		s.data = data
	}
	s.logPath = filepath.Join(dir, "serve.log")
	f, err := os.Create(s.logPath)
	if err != nil {
		t.Fatal(err)
	}
	s.log = f
	t.Cleanup(func() {
		s.kill()
		s.reapHost()
		_ = f.Close()
		if t.Failed() {
			b, _ := os.ReadFile(s.logPath)
			var keep []string // the access log's lines say little
			for _, l := range strings.Split(string(b), "\n") {
				if !strings.Contains(l, `"msg":"http"`) {
					keep = append(keep, l)
				}
			}
			t.Logf("server log (tail, without the access log):\n%s", strings.Join(keep[max(0, len(keep)-150):], "\n"))
		}
	})
	out, err := s.warren("key", "create", "--namespace", "*", "--expire", "1d").Output()
	if err != nil {
		t.Fatalf("key create: %v", err)
	}
	s.key = strings.TrimSpace(string(out))
	return s
}

// warren is a warren command on the server's directories.
func (s *server) warren(args ...string) *exec.Cmd {
	cmd := exec.Command(testenv.WarrenBinary(s.t), args...) //nolint:gosec // the binary this test built
	// WARREN_DISK_POOL=off: no disk pool (a mount outliving the server)
	// on the test's directory.
	cmd.Env = append(os.Environ(), "WARREN_AGENT="+s.agent, "WARREN_SPAWNER="+s.spn,
		"WARREN_DATA_DIR="+s.data, "WARREN_RUN_DIR="+s.run, "WARREN_DISK_POOL=off")
	return cmd
}

// start runs `warren serve` on a free loopback port; with wait, it returns
// once the server answers.
func (s *server) start(wait bool) {
	s.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	fmt.Fprintf(s.log, "--- warren serve on %s at %s\n", addr, time.Now().Format(time.RFC3339Nano))
	// --keep-file-max: the test leaves the host's fs.file-max as it is.
	cmd := s.warren(append([]string{"serve", "--listen", addr, "--prewarm", "1", "--keep-file-max"}, s.extra...)...)
	cmd.Stderr = s.log
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.mu.Lock()
	s.cmd, s.url, s.down = cmd, "http://"+addr, false
	s.mu.Unlock()
	if !wait {
		return
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/api/v1/health")
		if err == nil {
			_ = resp.Body.Close()
			return
		}
		if time.Now().After(deadline) || cmd.ProcessState != nil {
			s.t.Fatalf("the server did not come up within 60 s (log: %s)", s.logPath)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill ends the server with SIGKILL (nothing of it runs on).
func (s *server) kill() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd, s.down = nil, true
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
}

// stop ends the server with SIGTERM, as an operator does.
func (s *server) stop() {
	s.t.Helper()
	s.mu.Lock()
	cmd := s.cmd
	s.cmd, s.down = nil, true
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			s.t.Errorf("warren serve exited with %v on SIGTERM", err)
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		s.t.Error("warren serve did not stop within 30 s of SIGTERM")
	}
}

func (s *server) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

func (s *server) isDown() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.down
}

// rpcError is an error answer of the API.
type rpcError struct {
	Status  int
	Kind    string
	Message string
}

func (e *rpcError) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Kind, e.Message) }

// kindOf is err's API kind, "" for a transport error (no answer).
func kindOf(err error) string {
	var re *rpcError
	if errors.As(err, &re) {
		return re.Kind
	}
	return ""
}

var httpClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}

// call sends one JSON-RPC request; out, when not nil, receives the result.
func (s *server) call(ctx context.Context, method string, params map[string]any, out any) error {
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method, "params": params, "id": 1})
	return s.do(ctx, http.MethodPost, "/api/v1/rpc", "application/json", body, out)
}

// putTar uploads a tar stream under dir of ns/name.
func (s *server) putTar(ctx context.Context, ns, name, dir string, tarball []byte) error {
	return s.do(ctx, http.MethodPut, "/api/v1/sandboxes/"+ns+"/"+name+"/tar?path="+dir, "application/x-tar", tarball, nil)
}

func (s *server) do(ctx context.Context, method, path, ctype string, body []byte, out any) error {
	s.mu.Lock()
	url := s.url
	s.mu.Unlock()
	req, err := http.NewRequestWithContext(ctx, method, url+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", ctype)
	req.Header.Set("Authorization", "Bearer "+s.key)
	resp, err := httpClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var r struct {
		Result json.RawMessage `json:"result"`
		OK     bool            `json:"ok"`
		Error  *struct {
			Message string `json:"message"`
			Data    struct {
				Kind string `json:"kind"`
			} `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return fmt.Errorf("answer %d is not JSON: %.200q", resp.StatusCode, raw)
	}
	if r.Error != nil {
		return &rpcError{Status: resp.StatusCode, Kind: r.Error.Data.Kind, Message: r.Error.Message}
	}
	if resp.StatusCode != http.StatusOK {
		return &rpcError{Status: resp.StatusCode, Kind: "?", Message: string(raw)}
	}
	if out != nil {
		return json.Unmarshal(r.Result, out)
	}
	return nil
}

// sandboxInfo is the part of SandboxInfo the checks read.
type sandboxInfo struct {
	Name  string `json:"name"`
	State string `json:"state"`
	Error string `json:"error"`
}

func (s *server) list(ctx context.Context, ns string) ([]sandboxInfo, error) {
	var out struct {
		Sandboxes []sandboxInfo `json:"sandboxes"`
	}
	err := s.call(ctx, "sandbox.list", map[string]any{"namespace": ns}, &out)
	return out.Sandboxes, err
}

// execOut runs argv in ns/name and returns its stdout; a nonzero exit is
// an error.
func (s *server) execOut(ctx context.Context, ns, name string, argv ...string) (string, error) {
	var r struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
	}
	if err := s.call(ctx, "sandbox.exec", map[string]any{"namespace": ns, "sandbox": name, "argv": argv}, &r); err != nil {
		return "", err
	}
	if r.ExitCode != 0 {
		return r.Stdout, fmt.Errorf("%q exited %d: %s", argv, r.ExitCode, r.Stderr)
	}
	return r.Stdout, nil
}

// cgroupPrefix is the cgroup prefix the native backend uses for run dir.
func cgroupPrefix(run string) string { return native.InstancePrefix(run) }

// reapHost ends what the server's sandboxes left running once the server
// is gone: sandboxes outlive their server by design, and a test that ends
// without removing every sandbox (a failed one, one that does not check)
// must not leave agents, cgroups or network plumbing on the host.
func (s *server) reapHost() {
	prefix := cgroupPrefix(s.run)
	v := s.hostView(s.t)
	for _, pids := range v.procs {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if cg, err := cgroup.New(prefix); err == nil {
		deadline := time.Now().Add(10 * time.Second)
		for _, id := range v.cgroups {
			for cg.Destroy(id) != nil && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond) // the killed are still exiting
			}
		}
		_ = cg.Close()
	}
	_ = netplumb.RemoveInstance(prefix)
}

// hostView is what the host holds for the server's sandboxes: the kernel's
// and the file system's view, to hold against the database.
type hostView struct {
	cgroups  []string         // cgroups under the server's prefix
	procs    map[string][]int // pids by the cgroup (sandbox id) they are in
	mounts   []string         // mountinfo lines naming the test's directories
	dirs     []string         // data/sandboxes entries
	runs     []string         // run dir entries named like sandboxes
	logs     []string         // ids with a log file
	removing []string         // data/sandboxes/.removed entries
}

func (s *server) hostView(t *testing.T) hostView {
	t.Helper()
	var v hostView
	prefix := cgroupPrefix(s.run)
	cg, err := cgroup.New(prefix)
	if err != nil {
		t.Fatalf("cgroups: %v", err)
	}
	v.cgroups, err = cg.List()
	if err != nil {
		t.Fatalf("cgroups: %v", err)
	}
	_ = cg.Close() // the prefix directories, when empty
	v.procs = map[string][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cgroup")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			// "N:controllers:/.../prefix/id[/...]"
			i := strings.Index(line, "/"+prefix+"/")
			if i < 0 {
				continue
			}
			id, _, _ := strings.Cut(line[i+len(prefix)+2:], "/")
			if !slices.Contains(v.procs[id], pid) {
				v.procs[id] = append(v.procs[id], pid)
			}
		}
	}
	mountLines := func(p string) {
		f, err := os.Open(p)
		if err != nil {
			return
		}
		defer func() { _ = f.Close() }()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if strings.Contains(sc.Text(), s.dir) || (s.data != "" && strings.Contains(sc.Text(), s.data+"/")) {
				v.mounts = append(v.mounts, p+": "+sc.Text())
			}
		}
	}
	mountLines("/proc/self/mountinfo")
	if pid := s.pid(); pid > 0 {
		mountLines(fmt.Sprintf("/proc/%d/mountinfo", pid))
	}
	names := func(dir string, keep func(string) bool) []string {
		var out []string
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if keep(e.Name()) {
				out = append(out, e.Name())
			}
		}
		return out
	}
	isID := func(n string) bool { return strings.HasPrefix(n, "sb-") }
	v.dirs = names(filepath.Join(s.data, "sandboxes"), func(n string) bool { return n != ".removed" })
	v.removing = names(filepath.Join(s.data, "sandboxes", ".removed"), func(string) bool { return true })
	v.runs = names(s.run, isID)
	for _, n := range names(filepath.Join(s.data, "logs"), func(n string) bool { return strings.HasSuffix(n, ".log") }) {
		v.logs = append(v.logs, strings.TrimSuffix(n, ".log"))
	}
	return v
}

// dbRow is a sandboxes row.
type dbRow struct{ ID, Namespace, Name, State string }

// readDB checks the database's integrity and returns its sandboxes rows,
// read beside the server as another process would.
func (s *server) readDB(t *testing.T) (map[string]dbRow, error) {
	t.Helper()
	db, err := openDB(s)
	if err != nil {
		return nil, err
	}
	defer func() { _ = db.Close() }()
	var problems []string
	rows, err := db.Query(`PRAGMA integrity_check`)
	if err != nil {
		return nil, fmt.Errorf("integrity_check: %w", err)
	}
	for rows.Next() {
		var p string
		_ = rows.Scan(&p)
		if p != "ok" {
			problems = append(problems, p)
		}
	}
	_ = rows.Close()
	rows, err = db.Query(`PRAGMA foreign_key_check`)
	if err != nil {
		return nil, fmt.Errorf("foreign_key_check: %w", err)
	}
	if rows.Next() {
		problems = append(problems, "foreign key violations")
	}
	_ = rows.Close()
	if len(problems) > 0 {
		return nil, fmt.Errorf("database damaged: %q", problems)
	}
	out := map[string]dbRow{}
	rows, err = db.Query(`SELECT id, namespace, name, state FROM sandboxes`)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var r dbRow
		if err := rows.Scan(&r.ID, &r.Namespace, &r.Name, &r.State); err != nil {
			return nil, err
		}
		out[r.ID] = r
	}
	return out, rows.Err()
}

// openDB opens the server's database beside it.
func openDB(s *server) (*sql.DB, error) {
	return sql.Open("sqlite", "file:"+filepath.Join(s.data, "warren.db")+"?_pragma=busy_timeout(20000)")
}

// eventually retries check until it returns nil or d passes, for what
// the server finishes in the background (a stopped sandbox's cgroup, a
// removed one's files).
func eventually(d time.Duration, check func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := check()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkHost holds the host's view against the database's rows: every
// sandbox the host holds has a row, processes run only in running
// sandboxes, nothing is mounted, and removals have finished.
func (s *server) checkHost(t *testing.T, rows map[string]dbRow) error {
	t.Helper()
	v := s.hostView(t)
	var errs []error
	known := func(what string, ids []string) {
		for _, id := range ids {
			if strings.HasPrefix(id, ".") {
				continue // the warm pool's
			}
			if _, ok := rows[id]; !ok {
				errs = append(errs, fmt.Errorf("%s %s has no database row", what, id))
			}
		}
	}
	known("sandbox directory", v.dirs)
	known("runtime directory", v.runs)
	known("cgroup", v.cgroups)
	known("log", v.logs)
	for id, pids := range v.procs {
		if strings.HasPrefix(id, ".") {
			continue
		}
		if r, ok := rows[id]; !ok || r.State != "running" {
			errs = append(errs, fmt.Errorf("processes %v run in sandbox %s, which is %q in the database", pids, id, r.State))
		}
	}
	for _, r := range rows {
		if r.State == "running" && len(v.procs[r.ID]) == 0 {
			errs = append(errs, fmt.Errorf("sandbox %s is running in the database, but no process runs in its cgroup", r.ID))
		}
	}
	if len(v.removing) > 0 {
		errs = append(errs, fmt.Errorf("removed sandboxes' files not deleted: %q", v.removing))
	}
	if len(v.mounts) > 0 {
		errs = append(errs, fmt.Errorf("mounts under the test's directories: %q", v.mounts))
	}
	return errors.Join(errs...)
}
