// Package bench measures what Warren promises to be fast, next to baselines
// run in the same process at the same time (the machine is shared and
// noisy, so only same-run ratios mean anything): the fork+exec floor,
// bubblewrap and crun when installed, the python interpreter on the host.
// `warren bench` prints a table; the package's testing.B benchmarks run the
// same measurements under `go test -bench`.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/timerslack"
	"github.com/warren-sandbox/warren/internal/wire"
)

// Env is what the sandbox measurements run against.
type Env struct {
	Backend backend.Backend
	Image   *image.Image
	// HostPid returns the host pid of a sandbox's agent (for its RSS).
	HostPid func(backend.Sandbox) int
	// Network is the sandboxes' backend.Config.Network ("": loopback only).
	Network string
	// DiskBytes is the sandboxes' disk limit (0: none).
	DiskBytes int64
}

var seq atomic.Int64

// ForkExec runs /bin/true once from this process: the floor for any sandbox.
func ForkExec() error { return exec.Command("/bin/true").Run() }

// PythonHost runs python3 -c 'print(1)' on the host.
func PythonHost() error { return exec.Command("/usr/bin/python3", "-c", "print(1)").Run() }

// ColdCycle creates a sandbox, runs /bin/true in it and removes it.
func (e *Env) ColdCycle(ctx context.Context) error {
	sb, err := e.Backend.Create(ctx, backend.Config{
		ID: fmt.Sprintf("bench-%d-%d", os.Getpid(), seq.Add(1)), Image: e.Image,
		MemoryBytes: backend.DefaultMemoryBytes, CPUs: backend.DefaultCPUs, PidsMax: backend.DefaultPids,
		Network: e.Network, DiskBytes: e.DiskBytes,
	})
	if err != nil {
		return err
	}
	if err := sb.Start(ctx); err != nil {
		_ = sb.Remove(ctx)
		return err
	}
	st, err := sb.Agent().Exec(ctx, &wire.ExecRequest{Argv: []string{"/bin/true"}}, nil)
	if rerr := sb.Remove(ctx); err == nil {
		err = rerr
	}
	if err == nil && st.Code != 0 {
		err = fmt.Errorf("/bin/true exited %d: %s", st.Code, st.Error)
	}
	return err
}

// PooledStart waits (untimed, up to 10 s) for settled, typically a warm
// pool's being full with no refill under way, then times a sandbox's
// create, start and first exec of /bin/true; the removal is untimed: what
// a pooled start costs, apart from the refill it sets off.
func (e *Env) PooledStart(ctx context.Context, settled func() bool) (time.Duration, error) {
	for deadline := time.Now().Add(10 * time.Second); !settled(); {
		if time.Now().After(deadline) {
			return 0, errors.New("warm pool not refilled within 10s")
		}
		time.Sleep(200 * time.Microsecond)
	}
	t0 := time.Now()
	sb, err := e.Backend.Create(ctx, backend.Config{
		ID: fmt.Sprintf("bench-%d-%d", os.Getpid(), seq.Add(1)), Image: e.Image,
		MemoryBytes: backend.DefaultMemoryBytes, CPUs: backend.DefaultCPUs, PidsMax: backend.DefaultPids,
		Network: e.Network,
	})
	if err != nil {
		return 0, err
	}
	if err := sb.Start(ctx); err != nil {
		_ = sb.Remove(ctx)
		return 0, err
	}
	st, err := sb.Agent().Exec(ctx, &wire.ExecRequest{Argv: []string{"/bin/true"}}, nil)
	d := time.Since(t0)
	if rerr := sb.Remove(ctx); err == nil {
		err = rerr
	}
	if err == nil && st.Code != 0 {
		err = fmt.Errorf("/bin/true exited %d: %s", st.Code, st.Error)
	}
	return d, err
}

// Warm starts a sandbox for the in-sandbox measurements; stop removes it.
func (e *Env) Warm(ctx context.Context) (sb backend.Sandbox, stop func(), err error) {
	sb, err = e.Backend.Create(ctx, backend.Config{ID: fmt.Sprintf("bench-warm-%d-%d", os.Getpid(), seq.Add(1)), Image: e.Image, MemoryBytes: backend.DefaultMemoryBytes, CPUs: backend.DefaultCPUs, Network: e.Network})
	if err != nil {
		return nil, nil, err
	}
	if err := sb.Start(ctx); err != nil {
		_ = sb.Remove(ctx)
		return nil, nil, err
	}
	return sb, func() { _ = sb.Remove(context.WithoutCancel(ctx)) }, nil
}

// Exec runs argv in a running sandbox and checks it succeeded.
func Exec(ctx context.Context, sb backend.Sandbox, argv ...string) error {
	st, err := sb.Agent().Exec(ctx, &wire.ExecRequest{Argv: argv}, nil)
	if err == nil && st.Code != 0 {
		err = fmt.Errorf("%s exited %d: %s", argv[0], st.Code, st.Error)
	}
	return err
}

// Repl runs 1+1 in the sandbox's Python REPL and checks the answer.
func Repl(ctx context.Context, sb backend.Sandbox) error {
	res, err := sb.Agent().Repl(ctx, wire.ReplRequest{Language: "python", Code: "1+1"})
	if err != nil {
		return err
	}
	if res.Result == nil || *res.Result != "2" {
		return fmt.Errorf("1+1 = %v (%s)", res.Result, res.Error)
	}
	return nil
}

// AgentRSS is the resident memory of an idle agent, in bytes.
func (e *Env) AgentRSS(sb backend.Sandbox) (int64, error) {
	if e.HostPid == nil {
		return 0, errors.New("no host pid for this backend")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", e.HostPid(sb)))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("VmRSS not found")
}

// Bwrap returns a bubblewrap baseline doing what a cold sandbox does (all
// namespaces, read-only /usr, fresh /proc, /dev and /tmp, run /bin/true), or
// nil when bwrap is not installed.
func Bwrap() func() error {
	path, err := exec.LookPath("bwrap")
	if err != nil {
		return nil
	}
	args := []string{"--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr"}
	for _, d := range []string{"bin", "sbin", "lib", "lib64"} {
		if t, err := os.Readlink("/" + d); err == nil {
			args = append(args, "--symlink", t, "/"+d)
		}
	}
	args = append(args, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "/bin/true")
	return func() error {
		out, err := exec.Command(path, args...).CombinedOutput() //nolint:gosec // path is the baseline runtime found by LookPath; the arguments are fixed here
		if err != nil {
			return fmt.Errorf("bwrap: %w: %s", err, out)
		}
		return nil
	}
}

// Crun returns a crun baseline (same rootfs shape as Bwrap) and a cleanup,
// or nil when crun is not installed. On hosts whose cgroup2 mount holds no
// controllers next to v1 ones (hybrid), crun refuses to run; it is then run
// from a private mount namespace with that mount removed, on a dedicated
// thread that is discarded afterwards.
func Crun(dir string) (run func() error, cleanup func(), err error) {
	return OCIRuntime(installed("crun"), dir)
}

// OCIRuntime is Crun for any OCI runtime at path (crun, runc, runsc, with
// their global flags in global): nil when path is "".
func OCIRuntime(path, dir string, global ...string) (run func() error, cleanup func(), err error) {
	if path == "" {
		return nil, func() {}, nil
	}
	name := filepath.Base(path)
	bundle := filepath.Join(dir, name+"-bundle")
	if err := Rootfs(filepath.Join(bundle, "rootfs")); err != nil {
		return nil, nil, err
	}
	cfg := map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"args": []string{"/bin/true"}, "cwd": "/", "user": map[string]int{"uid": 0, "gid": 0},
			"env": []string{"PATH=/usr/bin:/bin"}, "noNewPrivileges": true,
		},
		"root": map[string]any{"path": "rootfs", "readonly": true},
		"mounts": []map[string]any{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "mode=755"}},
			{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "nodev"}},
			{"destination": "/usr", "type": "bind", "source": "/usr", "options": []string{"rbind", "ro"}},
		},
		"linux": map[string]any{"namespaces": []map[string]string{
			{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "cgroup"},
		}},
	}
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o644); err != nil { //nolint:gosec // 0644: an OCI bundle's config.json, read by the baseline runtime; it holds nothing secret
		return nil, nil, err
	}
	reqs := make(chan chan error)
	go func() {
		// Never unlocked: the thread's mount namespace differs from the
		// process's, so it must die with this goroutine. crun starts with
		// the host's usual timer slack, as any baseline.
		runtime.LockOSThread()
		timerslack.UseOriginal()
		var setupErr error
		if hybridCgroups() {
			setupErr = privateWithoutUnified()
		}
		var n int
		for reply := range reqs {
			if setupErr != nil {
				reply <- setupErr
				continue
			}
			n++
			args := append(slices.Clone(global), "run", "--bundle", bundle, fmt.Sprintf("warren-bench-%d-%d", os.Getpid(), n))
			out, err := exec.Command(path, args...).CombinedOutput() //nolint:gosec // path is the baseline runtime found by LookPath; the arguments are fixed here
			if err != nil {
				err = fmt.Errorf("%s: %w: %s", name, err, out)
			}
			reply <- err
		}
	}()
	run = func() error {
		reply := make(chan error)
		reqs <- reply
		return <-reply
	}
	return run, func() { close(reqs) }, nil
}

// Rootfs makes at rootfs the root the baselines run in: empty /usr (the
// host's is bound there read-only), /proc, /dev and /tmp, and the host's
// /bin, /sbin and /lib links into /usr.
func Rootfs(rootfs string) error {
	for _, d := range []string{"usr", "proc", "dev", "tmp"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil { //nolint:gosec // 0755: a minimal container rootfs for the baseline runtime, which needs the usual modes
			return err
		}
	}
	for _, d := range []string{"bin", "sbin", "lib", "lib64"} {
		if t, err := os.Readlink("/" + d); err == nil {
			_ = os.Symlink(t, filepath.Join(rootfs, d))
		}
	}
	return nil
}

// hybridCgroups reports a cgroup2 mount beside v1 controller hierarchies.
// installed returns the path of an executable in PATH, or "".
func installed(name string) string {
	p, _ := exec.LookPath(name)
	return p
}

func hybridCgroups() bool {
	_, v2 := os.Stat("/sys/fs/cgroup/unified/cgroup.controllers")
	_, v1 := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes")
	return v2 == nil && v1 == nil
}

func privateWithoutUnified() error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	return unix.Unmount("/sys/fs/cgroup/unified", unix.MNT_DETACH)
}

// Sample times f n times (after one warm-up call) and returns the durations.
func Sample(n int, f func() error) ([]time.Duration, error) {
	if err := f(); err != nil {
		return nil, err
	}
	out := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if err := f(); err != nil {
			return nil, err
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}

// Paired times a and b alternately, n times each (after a warm-up call of
// each), so drift on a noisy machine lands on both sides alike.
func Paired(n int, a, b func() error) (da, db []time.Duration, err error) {
	timed := func(f func() error) func() (time.Duration, error) {
		return func() (time.Duration, error) {
			start := time.Now()
			err := f()
			return time.Since(start), err
		}
	}
	return PairedTimed(n, timed(a), timed(b))
}

// PairedTimed is Paired for functions that time themselves (to leave
// their setup and cleanup out).
func PairedTimed(n int, a, b func() (time.Duration, error)) (da, db []time.Duration, err error) {
	for _, f := range []func() (time.Duration, error){a, b} {
		if _, err := f(); err != nil {
			return nil, nil, err
		}
	}
	da, db = make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	for range n {
		for _, side := range []struct {
			f   func() (time.Duration, error)
			out *[]time.Duration
		}{{a, &da}, {b, &db}} {
			d, err := side.f()
			if err != nil {
				return nil, nil, err
			}
			*side.out = append(*side.out, d)
		}
	}
	return da, db, nil
}

// Median of ds (ds is sorted in place).
func Median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2]
}
