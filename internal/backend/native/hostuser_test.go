package native_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/conformance"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// asNobody runs argv as an unprivileged host user (uid and gid 65534, no
// supplementary groups) and returns its combined output and error. argv is
// exec'd by a shell already running as that user: setpriv itself execs
// while it still holds root's capabilities, which reach any path.
func asNobody(t *testing.T, argv ...string) (string, error) {
	t.Helper()
	return asUID(t, 65534, argv...)
}

// asUID is asNobody as uid (and gid) uid.
func asUID(t *testing.T, uid int, argv ...string) (string, error) {
	t.Helper()
	testenv.RequireFile(t, "/usr/bin/setpriv")
	ids := []string{fmt.Sprintf("--reuid=%d", uid), fmt.Sprintf("--regid=%d", uid), "--clear-groups"}
	cmd := exec.Command("/usr/bin/setpriv", append(append(ids, "--", "/bin/sh", "-c", `exec "$@"`, "sh"), argv...)...) //nolint:gosec // the test's own commands
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestHostUserReachesNothing is issue #18's finding 2: a sandbox makes a
// setuid copy of a shell in its upper layer; a host user who knows the
// path (mountinfo showed it) must not be able to reach it, let alone run it
// with the sandbox's uid, nor anything else under the data and run
// directories.
func TestHostUserReachesNothing(t *testing.T) {
	h := harness(t)
	sb := h.Sandbox(t, backend.Config{})
	if r := conformance.Exec(t, sb, 0, "/bin/sh", "-c", "cp /bin/sh /sush && chmod 4755 /sush && ls -ln /sush"); r.Code != 0 {
		t.Fatalf("make a setuid shell: %+v %s", r.ExitStatus, r.Stderr)
	}
	upper := filepath.Join(sharedDirs.data, "sandboxes", sb.ID(), "upper")
	st, err := os.Stat(filepath.Join(upper, "sush"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode()&os.ModeSetuid == 0 {
		t.Fatalf("the sandbox's shell is not setuid (%v): the test proves nothing", st.Mode())
	}
	if out, err := asNobody(t, filepath.Join(upper, "sush"), "-p", "-c", "id -u"); err == nil {
		t.Errorf("a host user ran the sandbox's setuid shell: %s", out)
	}
	closed := []string{
		sharedDirs.data, filepath.Join(sharedDirs.data, "sandboxes"), filepath.Join(sharedDirs.data, "images"),
		filepath.Join(sharedDirs.data, "sandboxes", sb.ID()), upper, sharedDirs.run, filepath.Join(sharedDirs.run, sb.ID()),
	}
	if h.Backend.(*native.Backend).UIDRanges() {
		// The run directory is searchable (not listable) with per-sandbox
		// uid ranges: agents reach their binary and the empty directories
		// they mount on through it. Nothing else is.
		closed = slices.DeleteFunc(closed, func(p string) bool { return p == sharedDirs.run })
		if out, err := asNobody(t, "/bin/ls", sharedDirs.run); err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("a host user lists %s: %q %v", sharedDirs.run, out, err)
		}
		for _, name := range []string{".root", ".agent"} {
			if out, err := asNobody(t, "/bin/ls", filepath.Join(sharedDirs.run, name)); err == nil || !strings.Contains(out, "Permission denied") {
				t.Errorf("a host user lists %s: %q %v", name, out, err)
			}
		}
	}
	for _, p := range closed {
		if out, err := asNobody(t, "/usr/bin/stat", "-c", "%A", p+"/."); err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("a host user reaches %s: %q %v", p, out, err)
		}
	}
}

// TestUserNSOwnedBySandbox is issue #18's finding 8: the kernel charges a
// user namespace's inotify instances (and message queues, queued signals,
// ...) to its owner at the host's level. A sandbox's namespace is owned by
// its own host uid, so a sandbox holding every inotify instance it may
// leaves host root able to make more.
func TestUserNSOwnedBySandbox(t *testing.T) {
	h := harness(t)
	if !h.UserNS {
		t.Fatal("no user namespace: nothing to test")
	}
	b := h.Backend.(*native.Backend)
	sb := h.Sandbox(t, backend.Config{})
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", sb.(*native.Sandbox).Pid()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ns.Close() }()
	owner, err := unix.IoctlGetInt(int(ns.Fd()), unix.NS_GET_OWNER_UID)
	if uid := sandboxRootUID(t, sb); err != nil || owner != uid {
		t.Errorf("the sandbox's user namespace is owned by uid %d (%v), want its root's host uid %d", owner, err, uid)
	}
	// The sandbox takes every inotify instance it can and holds them.
	hold := `import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
n = 0
while libc.inotify_init1(0) >= 0:
    n += 1
open("/tmp/held", "w").write("%d %d" % (n, ctypes.get_errno()))
time.sleep(60)
`
	if r := conformance.Exec(t, sb, 0, "/bin/sh", "-c", "ulimit -n 4096; setsid python3 -c '"+hold+"' </dev/null >/dev/null 2>&1 &"); r.Code != 0 {
		t.Fatalf("start the holder: %+v %s", r.ExitStatus, r.Stderr)
	}
	var held string
	for i := 0; i < 100 && held == ""; i++ {
		time.Sleep(50 * time.Millisecond)
		held = conformance.Exec(t, sb, 0, "/bin/cat", "/tmp/held").Stdout
	}
	var n, errno int
	if _, err := fmt.Sscanf(held, "%d %d", &n, &errno); err != nil || syscall.Errno(errno) != syscall.EMFILE {
		t.Fatalf("the sandbox's holder reports %q, want a count and EMFILE", held)
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Fatalf("host root cannot make an inotify instance while a sandbox holds %d: %v", n, err)
	}
	_ = unix.Close(fd)
	if !b.UIDRanges() {
		return // every sandbox is the same host user: they share the limit
	}
	// With a uid range of its own, another sandbox is another user.
	other := h.Sandbox(t, backend.Config{})
	if r := conformance.Exec(t, other, 0, "/usr/bin/python3", "-c", "import ctypes; print(ctypes.CDLL(None).inotify_init1(0) >= 0)"); r.Stdout != "True\n" {
		t.Errorf("another sandbox cannot make an inotify instance while one holds %d: %+v %q %s", n, r.ExitStatus, r.Stdout, r.Stderr)
	}
}

// TestMountinfoHidesDataDir is the last leak of issue #18's finding 12: a
// sandbox's mountinfo named its layers and upper directory by their host
// paths, the data directory's among them. Where the host mounts the root
// (native.HostHoldsRoots), it names the layers by descriptors of detached
// mounts, whose paths start at their own root.
func TestMountinfoHidesDataDir(t *testing.T) {
	h := harness(t)
	sb := h.Sandbox(t, backend.Config{})
	r := conformance.Exec(t, sb, 0, "/bin/cat", "/proc/self/mountinfo")
	if r.Code != 0 || !strings.Contains(r.Stdout, " / / ") {
		t.Fatalf("mountinfo: %+v %q %s", r.ExitStatus, r.Stdout, r.Stderr)
	}
	leaked := strings.Contains(r.Stdout, filepath.Base(filepath.Dir(sharedDirs.data)))
	if !native.HostHoldsRoots() {
		// The agent mounts the layers itself, by path (Linux 6.1, 6.12).
		if !leaked {
			t.Errorf("the agent mounted the root by path, yet mountinfo does not show it: %s", r.Stdout)
		}
		return
	}
	if leaked {
		t.Errorf("the sandbox's mountinfo shows the data directory %s:\n%s", sharedDirs.data, r.Stdout)
	}
}

// TestVolumeBehindGroupDir: a volume may sit in a directory only root and
// the sandboxes' root group can pass (0710, as docs/isolation.md advises,
// so host users cannot reach what a sandbox writes there); sandbox root
// writes to it.
func TestVolumeBehindGroupDir(t *testing.T) {
	h := harness(t)
	uid, gid := h.Backend.(*native.Backend).RootIDs()
	if uid == 0 {
		t.Fatal("no user namespace: nothing to test")
	}
	host := testenv.SearchableDir(t, "warren-volume-test-")
	closed := filepath.Join(host, "closed")
	vol := filepath.Join(closed, "vol")
	if err := os.MkdirAll(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(vol, uid, gid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(closed, 0, gid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(closed, 0o710); err != nil {
		t.Fatal(err)
	}
	sb := h.Sandbox(t, backend.Config{Volumes: []backend.Volume{{Source: vol, Target: "/data"}}})
	if r := conformance.Exec(t, sb, 0, "/bin/sh", "-c", "echo out > /data/out"); r.Code != 0 {
		t.Fatalf("write to the volume: %+v %s", r.ExitStatus, r.Stderr)
	}
	if out, err := asNobody(t, "/bin/cat", filepath.Join(vol, "out")); err == nil {
		t.Errorf("a host user read the volume: %q", out)
	}
}

// sandboxRootUID is the host uid sb's root maps to, from its uid_map.
func sandboxRootUID(t *testing.T, sb backend.Sandbox) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", sb.(*native.Sandbox).Pid()))
	if err != nil {
		t.Fatal(err)
	}
	var inside, outside, n int
	if _, err := fmt.Sscan(string(b), &inside, &outside, &n); err != nil || inside != 0 {
		t.Fatalf("uid_map %q: %v", b, err)
	}
	return outside
}
