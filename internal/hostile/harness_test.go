package hostile

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
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

	"github.com/warren-sandbox/warren/internal/diskquota"
	"github.com/warren-sandbox/warren/internal/netplumb"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// Namespaces of the suite: the attacker's, the victims', and the admin
// key's (every namespace).
const (
	nsAttacker = "mallory"
	nsVictim   = "victim"
)

// server is a real `warren serve` with API keys, on its own data and run
// directories and a random loopback port.
type server struct {
	t         *testing.T
	bin       string
	dir       string // searchable by sandbox uids, as the data dir must be
	data, run string
	url       string
	cmd       *exec.Cmd
	log       *testenv.SyncBuffer
	// Keys: one per namespace, and one for every namespace.
	attacker, victim, admin string
	client                  *http.Client
	rss                     *rssWatch
}

func (s *server) command(args ...string) *exec.Cmd {
	return testenv.WarrenCommand(s.t, s.data, s.run, args...)
}

func (s *server) key(ns string) string {
	return testenv.CreateKey(s.t, s.data, s.run, ns, "hostile "+ns)
}

// startServer starts warren serve with extra flags and waits for health.
func startServer(t *testing.T, extra ...string) *server {
	t.Helper()
	testenv.RequireRoot(t)
	// The server raises fs.file-max (finding 10); the suite leaves the
	// host's as it found it.
	if b, err := os.ReadFile("/proc/sys/fs/file-max"); err == nil {
		t.Cleanup(func() {
			if err := os.WriteFile("/proc/sys/fs/file-max", b, 0); err != nil {
				t.Errorf("restore fs.file-max: %v", err)
			}
		})
	}
	s := &server{t: t, bin: testenv.WarrenBinary(t), dir: testenv.SearchableDir(t, "warren-hostile-"), log: &testenv.SyncBuffer{},
		client: &http.Client{Timeout: 3 * time.Minute}}
	s.data, s.run = filepath.Join(s.dir, "data"), filepath.Join(s.dir, "run")
	// Registered first, so run last: the disk pool's image stays mounted
	// after the server by design; the suite takes it down.
	t.Cleanup(func() {
		if p := filepath.Join(s.data, "sandboxes"); diskquota.IsBtrfs(p) {
			if err := diskquota.Unmount(p); err != nil {
				t.Errorf("unmount the disk pool: %v", err)
			}
		}
	})
	s.attacker, s.victim, s.admin = s.key(nsAttacker), s.key(nsVictim), s.key("*")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	s.cmd = s.command(append([]string{"serve", "--listen", addr, "--prewarm", "1", "--log-text"}, extra...)...)
	s.cmd.Stderr = s.log
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.url = "http://" + addr
	deadline := time.Now().Add(60 * time.Second)
	for !s.healthy() {
		if time.Now().After(deadline) {
			_ = s.cmd.Process.Kill()
			_, _ = s.cmd.Process.Wait()
			t.Fatalf("server did not come up:\n%s", s.log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.rss = watchRSS(s.cmd.Process.Pid)
	// A test that ends early still removes every sandbox and stops the
	// server: sandboxes outlive a stopped server by design.
	t.Cleanup(func() {
		if s.cmd.ProcessState != nil {
			return
		}
		if names, err := s.sandboxes("*"); err == nil {
			for _, n := range names {
				ns, name, _ := strings.Cut(n, "/")
				_ = s.remove(s.admin, ns, name)
			}
		}
		_ = s.stop()
	})
	return s
}

// healthy: the health route answers 200 within 5 s.
func (s *server) healthy() bool {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(s.url + "/api/v1/health")
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == 200
}

// stop ends the server with SIGTERM, as an operator would.
func (s *server) stop() error {
	s.rss.stop()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(60 * time.Second):
		_ = s.cmd.Process.Kill()
		return errors.New("serve did not stop within 60 s of SIGTERM")
	}
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
	return s.post(key, body, out)
}

// post sends a raw JSON-RPC body.
func (s *server) post(key string, body []byte, out any) error {
	req, err := http.NewRequest("POST", s.url+"/api/v1/rpc", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
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
	if err := json.NewDecoder(io.LimitReader(resp.Body, 512<<20)).Decode(&ans); err != nil {
		return fmt.Errorf("%s: status %d, undecodable answer: %w", resp.Request.URL.Path, resp.StatusCode, err)
	}
	if ans.Error != nil {
		return &rpcError{Status: resp.StatusCode, Kind: ans.Error.Data.Kind, Message: ans.Error.Message}
	}
	if out != nil {
		return json.Unmarshal(ans.Result, out)
	}
	return nil
}

// kindOf is an error's wire kind, "" for success or a transport error.
func kindOf(err error) string {
	var re *rpcError
	if errors.As(err, &re) {
		return re.Kind
	}
	return ""
}

// execResult is sandbox.exec's answer.
type execResult struct {
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal"`
	TimedOut bool   `json:"timed_out"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
}

// create starts a sandbox with key in ns; extra adds sandbox.create fields.
func (s *server) create(key, ns, name string, extra map[string]any) error {
	p := map[string]any{"name": name, "namespace": ns}
	for k, v := range extra {
		p[k] = v
	}
	return s.call(key, "sandbox.create", p, nil)
}

func (s *server) remove(key, ns, name string) error {
	return s.call(key, "sandbox.remove", map[string]any{"sandbox": name, "namespace": ns}, nil)
}

// python runs a python3 program (on stdin) in a sandbox.
func (s *server) python(key, ns, name, prog string, timeout int) (execResult, error) {
	var r execResult
	err := s.call(key, "sandbox.exec", map[string]any{"sandbox": name, "namespace": ns, "argv": []string{"python3", "-"},
		"stdin": prog, "timeout": timeout}, &r)
	return r, err
}

// shell runs a /bin/sh script in a sandbox.
func (s *server) shell(key, ns, name, script string, timeout int) (execResult, error) {
	var r execResult
	err := s.call(key, "sandbox.shell", map[string]any{"sandbox": name, "namespace": ns, "script": script, "timeout": timeout}, &r)
	return r, err
}

// sandboxes lists the names of a namespace's sandboxes (admin key).
func (s *server) sandboxes(ns string) ([]string, error) {
	var out struct {
		Sandboxes []struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
		} `json:"sandboxes"`
	}
	if err := s.call(s.admin, "sandbox.list", map[string]any{"namespace": ns}, &out); err != nil {
		return nil, err
	}
	var names []string
	for _, b := range out.Sandboxes {
		names = append(names, b.Namespace+"/"+b.Name)
	}
	return names, nil
}

// cgroupPrefix is the cgroup name the native backend gives this server's
// sandboxes (under the server's own cgroup, per controller).
func (s *server) cgroupPrefix() string {
	sum := sha256.Sum256([]byte(s.run))
	return "warren-" + hex.EncodeToString(sum[:4])
}

// leftovers lists what a stopped server left behind: sandbox directories,
// mounts under its directories, cgroups under its prefix, processes in
// them.
func (s *server) leftovers() []string {
	var left []string
	entries, _ := os.ReadDir(filepath.Join(s.data, "sandboxes"))
	for _, e := range entries {
		sub, _ := os.ReadDir(filepath.Join(s.data, "sandboxes", e.Name()))
		if strings.HasPrefix(e.Name(), ".") && len(sub) == 0 {
			continue // the removal staging directory, empty
		}
		left = append(left, "sandbox directory "+e.Name())
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	pool := filepath.Join(s.data, "sandboxes")
	for _, l := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == pool {
			continue // the disk pool's image: it outlives a server by design (startServer unmounts it)
		}
		if strings.Contains(l, s.dir) {
			left = append(left, "mount "+l)
		}
	}
	prefix := s.cgroupPrefix()
	_ = filepath.WalkDir("/sys/fs/cgroup", func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil //nolint:nilerr // a cgroup that vanished while walked is no leftover
		}
		if strings.Count(p, "/") > 10 {
			return filepath.SkipDir
		}
		if strings.Contains(p, "/"+prefix+"/") {
			left = append(left, "cgroup "+p)
			return filepath.SkipDir
		}
		return nil
	})
	// The server stopped with no sandbox running: its network's table and
	// links went with it.
	if ok, err := netplumb.TableExists(prefix); err != nil || ok {
		left = append(left, fmt.Sprintf("nftables table %s (%v)", prefix, err))
	}
	if ifs, err := net.Interfaces(); err == nil {
		vp := netplumb.VethPrefixOf(prefix)
		for _, i := range ifs {
			if strings.HasPrefix(i.Name, vp) {
				left = append(left, "link "+i.Name)
			}
		}
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		cg, err := os.ReadFile("/proc/" + p.Name() + "/cgroup")
		if err == nil && bytes.Contains(cg, []byte("/"+prefix+"/")) {
			left = append(left, "process "+p.Name())
		}
	}
	return left
}

// rssWatch samples a process's resident memory every 50 ms.
type rssWatch struct {
	mu         sync.Mutex
	peak, last int64
	wpeak      int64 // the peak since window()
	done       chan struct{}
	stopped    sync.Once
}

func rss(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

func watchRSS(pid int) *rssWatch {
	w := &rssWatch{done: make(chan struct{})}
	w.peak = rss(pid)
	w.last = w.peak
	go func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.done:
				return
			case <-tick.C:
			}
			v := rss(pid)
			w.mu.Lock()
			w.last = v
			w.peak = max(w.peak, v)
			w.wpeak = max(w.wpeak, v)
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *rssWatch) stop() { w.stopped.Do(func() { close(w.done) }) }

// now and peak are the last sample and the peak so far.
func (w *rssWatch) now() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

func (w *rssWatch) max() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.peak
}

// victims run a steady exec loop in three sandboxes of the victim
// namespace and record every exec's latency, by phase. The loops run in a
// process of their own (this test binary again, victimsMain), as another
// tenant's client would: in the suite's process they shared its CPU time
// and its collector with the attackers' clients, which build and read
// bodies of tens of MiB, and a victim's exec waited on them (~850 ms once
// while the server had answered in 26 ms).
type victims struct {
	s       *server
	cmd     *exec.Cmd
	mu      sync.Mutex
	phase   int // 0 = baseline, 1 = under attack
	lat     [2][]time.Duration
	at      []time.Time // when each exec under attack ended, by lat[1]'s index
	errs    []string
	stdin   io.Closer
	drained chan struct{}
}

var victimNames = []string{"v1", "v2", "v3"}

// victimsEnv names the server and key a victims process serves execs on.
const victimsEnv = "WARREN_HOSTILE_VICTIMS"

func startVictims(t *testing.T, s *server) *victims {
	t.Helper()
	v := &victims{s: s, drained: make(chan struct{})}
	for _, n := range victimNames {
		if err := s.create(s.victim, nsVictim, n, nil); err != nil {
			t.Fatalf("victim %s: %v", n, err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	v.cmd = exec.Command(self)
	v.cmd.Env = append(os.Environ(), victimsEnv+"="+s.url+" "+s.victim)
	v.cmd.Stderr = os.Stderr
	in, err := v.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := v.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := v.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	v.stdin = in
	go v.read(out)
	t.Cleanup(func() { _ = v.cmd.Process.Kill(); _ = v.cmd.Wait() })
	return v
}

// read records what the victims process reports: a line per exec, "ok
// <nanoseconds>" or "err <what went wrong>".
func (v *victims) read(r io.Reader) {
	defer close(v.drained)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		kind, rest, _ := strings.Cut(sc.Text(), " ")
		v.mu.Lock()
		if ns, err := strconv.ParseInt(rest, 10, 64); kind == "ok" && err == nil {
			v.lat[v.phase] = append(v.lat[v.phase], time.Duration(ns))
			if v.phase == 1 {
				v.at = append(v.at, time.Now())
			}
		} else {
			v.errs = append(v.errs, rest)
		}
		v.mu.Unlock()
	}
}

// victimsMain is the victims process: an exec loop per victim until its
// stdin closes.
func victimsMain(spec string) {
	url, key, _ := strings.Cut(spec, " ")
	s := &server{url: url, victim: key, client: &http.Client{Timeout: 3 * time.Minute}}
	stop := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stop) }()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, name := range victimNames {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				want := "ok " + strconv.Itoa(i) + "\n"
				var r execResult
				start := time.Now()
				err := s.call(s.victim, "sandbox.exec", map[string]any{"sandbox": name, "namespace": nsVictim,
					"argv": []string{"echo", "ok", strconv.Itoa(i)}, "timeout": 60}, &r)
				d := time.Since(start)
				var line string
				switch {
				case err != nil:
					line = fmt.Sprintf("err %s exec %d: %v", name, i, err)
				case r.ExitCode != 0 || r.Stdout != want:
					line = fmt.Sprintf("err %s exec %d: exit %d, stdout %q", name, i, r.ExitCode, r.Stdout)
				default:
					line = fmt.Sprintf("ok %d", d.Nanoseconds())
				}
				mu.Lock()
				fmt.Println(strings.ReplaceAll(line, "\n", " "))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

func (v *victims) setPhase(p int) {
	v.mu.Lock()
	v.phase = p
	v.mu.Unlock()
}

// stop ends the loops and waits for their last reports.
func (v *victims) stop() {
	_ = v.stdin.Close()
	<-v.drained
	_ = v.cmd.Wait()
}

// percentile of a phase's latencies (nearest rank).
func (v *victims) percentile(phase int, q float64) (time.Duration, int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	l := slices.Clone(v.lat[phase])
	if len(l) == 0 {
		return 0, 0
	}
	slices.Sort(l)
	i := int(q*float64(len(l))+0.5) - 1
	return l[min(max(i, 0), len(l)-1)], len(l)
}

// window starts a new window for windowPeak.
func (w *rssWatch) window() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.wpeak = w.last
}

func (w *rssWatch) windowPeak() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.wpeak
}

// sandboxCgroup calls read with the sandbox's cgroup directories (the one
// with the internal id id under the server's prefix, in each hierarchy it
// is in), until read reports it found what it wanted.
func (s *server) sandboxCgroup(id string, read func(dir string) bool) {
	suffix := "/" + s.cgroupPrefix() + "/" + id
	done := false
	_ = filepath.WalkDir("/sys/fs/cgroup", func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() || done {
			return nil //nolint:nilerr // a cgroup that vanished while walked is not the sandbox's
		}
		if strings.Count(p, "/") > 10 {
			return filepath.SkipDir
		}
		if strings.HasSuffix(p, suffix) {
			done = read(p)
			return filepath.SkipDir
		}
		return nil
	})
}

// pidsMax reads the pids.max the host's cgroup gives the sandbox with the
// internal id: what it was granted, whatever it uses.
func (s *server) pidsMax(t *testing.T, id string) int {
	t.Helper()
	if id == "" {
		t.Fatal("pidsMax: no sandbox id")
	}
	n := 0
	s.sandboxCgroup(id, func(p string) bool {
		b, err := os.ReadFile(filepath.Join(p, "pids.max"))
		if err != nil {
			return false
		}
		if v := strings.TrimSpace(string(b)); v == "max" {
			n = math.MaxInt32
		} else {
			n, _ = strconv.Atoi(v)
		}
		return n > 0
	})
	if n == 0 {
		t.Fatalf("no pids.max for sandbox %s under the cgroup prefix %s", id, s.cgroupPrefix())
	}
	return n
}

// memoryUsage reads the memory the host's cgroup charges the sandbox with
// the internal id (memory.current, or v1's memory.usage_in_bytes); 0 when
// there is none.
func (s *server) memoryUsage(id string) int64 {
	var n int64
	s.sandboxCgroup(id, func(p string) bool {
		for _, f := range []string{"memory.current", "memory.usage_in_bytes"} {
			if b, err := os.ReadFile(filepath.Join(p, f)); err == nil {
				n, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				return n > 0
			}
		}
		return false
	})
	return n
}

// p99Since is the p99 of the execs under attack that ended after t (the
// window of one attempt), and how many there were.
func (v *victims) p99Since(t time.Time) (time.Duration, int) {
	v.mu.Lock()
	var l []time.Duration
	for i, end := range v.at {
		if end.After(t) {
			l = append(l, v.lat[1][i])
		}
	}
	v.mu.Unlock()
	if len(l) == 0 {
		return 0, 0
	}
	slices.Sort(l)
	return l[min(max(int(0.99*float64(len(l))+0.5)-1, 0), len(l)-1)], len(l)
}

// sandboxIDs lists the server's internal sandbox ids: the names of its
// sandbox directories (the API never shows them).
func (s *server) sandboxIDs() []string {
	entries, _ := os.ReadDir(filepath.Join(s.data, "sandboxes"))
	var ids []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			ids = append(ids, e.Name())
		}
	}
	return ids
}
