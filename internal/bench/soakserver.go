package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/warren-sandbox/warren/internal/backend/native"
)

// SoakServer is a `warren serve` started for a soak: API keys on, its own
// data and run directories in a temporary directory, loopback on a free
// port.
type SoakServer struct {
	URL      string
	Key      string // for namespace "soak"
	AdminKey string // for '*': reads /metrics whole
	Pid      int
	dir      string
	cmd      *exec.Cmd
	done     chan error
}

// StartSoakServer runs binary (a warren) with env added to this process's
// environment: `warren key create` twice, then `warren serve` with
// serveArgs after its own (a flag given twice takes the last value), and
// waits until it answers.
func StartSoakServer(ctx context.Context, binary string, env []string, prewarm int, serveArgs ...string) (_ *SoakServer, err error) {
	dir, err := os.MkdirTemp("", "warren-soak-")
	if err != nil {
		return nil, err
	}
	s := &SoakServer{dir: dir}
	defer func() {
		if err != nil {
			_ = s.Stop()
			s.Close()
		}
	}()
	// The sandboxes' root must reach the data directory below.
	if err := os.Chmod(dir, 0o711); err != nil { //nolint:gosec // 0711: traversable, not listable, by the sandboxes' uids
		return nil, err
	}
	warren := func(args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, binary, args...) //nolint:gosec // binary is the warren the caller chose; the arguments are fixed here
		// No disk pool: it outlives the server by design, and the soak
		// checks that nothing does.
		cmd.Env = append(append(os.Environ(), env...), "WARREN_DATA_DIR="+s.dataDir(), "WARREN_RUN_DIR="+s.runDir(), "WARREN_DISK_POOL=off")
		return cmd
	}
	for _, k := range []struct {
		ns  string
		out *string
	}{{"soak", &s.Key}, {"*", &s.AdminKey}} {
		out, err := warren("key", "create", "--namespace", k.ns, "--expire", "1d", "--description", "soak").Output()
		if err != nil {
			return nil, fmt.Errorf("warren key create: %w", err)
		}
		*k.out = strings.TrimSpace(string(out))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	log, err := os.Create(filepath.Join(dir, "serve.log")) //nolint:gosec // dir is the temporary directory made above
	if err != nil {
		return nil, err
	}
	defer func() { _ = log.Close() }()
	// Dense on purpose, as an operator running many small sandboxes
	// would set it: up to two sandboxes per client, each with 128 pids
	// of 64 open files and half a CPU, must fit the admission sums of a
	// 2-CPU host (pid_max 32768, fs.file-max ~2M).
	s.cmd = warren(append([]string{"serve", "--listen", addr, "--prewarm", strconv.Itoa(prewarm),
		"--pids", "128", "--open-files", "64", "--cpu-overcommit", "40",
		// The soak leaves the host's fs.file-max as it is.
		"--keep-file-max"}, serveArgs...)...)
	s.cmd.Cancel = func() error { return s.cmd.Process.Signal(syscall.SIGTERM) }
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	s.Pid = s.cmd.Process.Pid
	s.done = make(chan error, 1)
	go func() { s.done <- s.cmd.Wait() }()
	s.URL = "http://" + addr
	for deadline := time.Now().Add(30 * time.Second); ; {
		resp, err := http.Get(s.URL + "/api/v1/health") //nolint:gosec // the URL is the loopback address chosen above
		if err == nil {
			_ = resp.Body.Close()
			break
		}
		select {
		case err := <-s.done:
			s.done <- err
			return nil, fmt.Errorf("warren serve exited (%w): %s", err, s.logTail())
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("warren serve did not answer within 30s: %s", s.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return s, nil
}

func (s *SoakServer) dataDir() string { return filepath.Join(s.dir, "data") }
func (s *SoakServer) runDir() string  { return filepath.Join(s.dir, "run") }

// logTail is the end of the server's log, for an error.
func (s *SoakServer) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "serve.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Sample reads the server's resident memory and open files from /proc
// (goroutines: -1, the soak reads them from /metrics).
func (s *SoakServer) Sample() Reading { return ProcSample(s.Pid) }

// ProcSample reads pid's resident memory and open files; -1 for what
// cannot be read.
func ProcSample(pid int) Reading {
	out := Reading{RSS: -1, FDs: -1, Goroutines: -1}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
				if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil {
					out.RSS = kb << 10
				}
			}
		}
	}
	if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		out.FDs = len(ents)
	}
	return out
}

// Stop ends the server (SIGTERM, then SIGKILL after 30 s); an exit other
// than a clean one is an error.
func (s *SoakServer) Stop() error {
	if s.cmd == nil || s.cmd.Process == nil {
		return nil
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-s.done:
		s.done <- err
		if err != nil {
			return fmt.Errorf("warren serve: %w: %s", err, s.logTail())
		}
		return nil
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		return errors.New("warren serve did not stop within 30s of SIGTERM")
	}
}

// Close deletes the server's directory (after Stop).
func (s *SoakServer) Close() {
	for _, d := range s.CgroupDirs() {
		_ = os.Remove(d)
	}
	_ = os.RemoveAll(s.dir)
}

// Leftovers lists what the server holds for sandboxes once every sandbox
// is removed: their directories, mounts, cgroups and processes. With
// pool, the warm pool's agents count as well (after Stop). Removed
// sandboxes' files are deleted in the background, so it waits up to wait
// for the list to empty.
func (s *SoakServer) Leftovers(pool bool, wait time.Duration) []string {
	var left []string
	for deadline := time.Now().Add(wait); ; {
		left = s.leftovers(pool)
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(time.Second)
	}
}

func (s *SoakServer) leftovers(pool bool) []string {
	var left []string
	dirEntries := func(d string, keep func(string) bool) {
		ents, err := os.ReadDir(d)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			left = append(left, err.Error())
		}
		for _, e := range ents {
			if !keep(e.Name()) {
				left = append(left, filepath.Join(d, e.Name()))
			}
		}
	}
	notDot := func(n string) bool { return strings.HasPrefix(n, ".") }
	sandboxes := filepath.Join(s.dataDir(), "sandboxes")
	dirEntries(sandboxes, notDot)
	dirEntries(filepath.Join(sandboxes, ".removed"), func(string) bool { return false })
	dirEntries(s.runDir(), func(n string) bool {
		return strings.HasPrefix(n, ".") || strings.HasSuffix(n, ".log") || (!pool && n == "spawner.sock")
	})
	if !pool {
		// The pool's agents stay until the server stops.
		dirEntries(filepath.Join(s.runDir(), ".pool"), func(string) bool { return true })
	}
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if fs := strings.Fields(sc.Text()); len(fs) > 4 && strings.HasPrefix(fs[4], s.dir+"/") {
				left = append(left, "mount "+fs[4])
			}
		}
		_ = f.Close()
	}
	inPool := func(name string) bool { return strings.HasPrefix(name, ".pool-") }
	for _, d := range s.CgroupDirs() {
		dirEntries(d, func(n string) bool {
			fi, err := os.Stat(filepath.Join(d, n))
			return err != nil || !fi.IsDir() || (!pool && inPool(n))
		})
	}
	// Processes in the server's sandbox cgroups.
	prefix := "/" + s.cgroupPrefix() + "/"
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == s.Pid {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cgroup"))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if _, rest, ok := strings.Cut(l, prefix); ok && (pool || !inPool(rest)) {
				left = append(left, fmt.Sprintf("process %d in cgroup %s", pid, l))
				break
			}
		}
	}
	return left
}

// cgroupPrefix is the native backend's cgroup for this run directory
// (native.Options.CgroupPrefix's default).
func (s *SoakServer) cgroupPrefix() string {
	return native.InstancePrefix(s.runDir())
}

// CgroupDirs are the server's sandbox cgroup directories in each
// hierarchy: its prefix below this process's own cgroup, which the server
// inherited.
func (s *SoakServer) CgroupDirs() []string {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil
	}
	seen := map[string]bool{}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		roots := []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"}
		if f[1] != "" {
			roots = nil
			for _, c := range strings.Split(f[1], ",") {
				roots = append(roots, "/sys/fs/cgroup/"+strings.TrimPrefix(c, "name="))
			}
		}
		for _, r := range roots {
			d := filepath.Join(r, f[2], s.cgroupPrefix())
			real, err := filepath.EvalSymlinks(d)
			if err != nil || seen[real] {
				continue
			}
			seen[real] = true
			out = append(out, real)
		}
	}
	return out
}
