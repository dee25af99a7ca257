package native_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/conformance"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// detachedMounts counts this process's descriptors of mounts in no mount
// namespace: the sandbox roots the backend holds (rootmount_linux.go).
func detachedMounts() int {
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	attached := map[string]bool{}
	for _, l := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			attached[f[0]] = true
		}
	}
	fds, _ := os.ReadDir("/proc/self/fd")
	n := 0
	for _, fd := range fds {
		// A detached mount's descriptor is of its root: "/" from here.
		if link, err := os.Readlink("/proc/self/fd/" + fd.Name()); err != nil || link != "/" {
			continue
		}
		info, err := os.ReadFile("/proc/self/fdinfo/" + fd.Name())
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(info), "\n") {
			if id, ok := strings.CutPrefix(l, "mnt_id:"); ok && !attached[strings.TrimSpace(id)] {
				n++
			}
		}
	}
	return n
}

// TestRootHeldAcrossStop: the host mounts a sandbox's root and keeps it
// while the sandbox is stopped (so a stop does not wait for the overlay's
// sync and a restart attaches it again); the files survive the restart and
// Remove lets the mount go. On a kernel that cannot clone a detached mount
// the agents mount their roots and the host holds none, files surviving
// all the same.
func TestRootHeldAcrossStop(t *testing.T) {
	h := harness(t)
	ctx := context.Background()
	settle(sharedDirs.data)
	held := 1
	if !native.HostHoldsRoots() {
		t.Log("this kernel cannot clone a detached mount: the agents mount their roots")
		held = 0
	}
	before := detachedMounts()
	sb, err := h.Backend.Create(ctx, backend.Config{ID: "held-root", Image: h.Image})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sb.Remove(ctx) }()
	for i := 0; i < 3; i++ {
		if err := sb.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if got := detachedMounts(); got != before+held {
			t.Errorf("start %d: %d detached mounts held, want %d", i, got, before+held)
		}
		if r := conformance.Exec(t, sb, 0, "/bin/sh", "-c", "echo $(( $(cat /root/n 2>/dev/null || echo 0) + 1 )) > /root/n; cat /root/n"); r.Stdout != strconv.Itoa(i+1)+"\n" {
			t.Errorf("start %d: counter %q %+v %s", i, r.Stdout, r.ExitStatus, r.Stderr)
		}
		if err := sb.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if got := detachedMounts(); got != before+held {
			t.Errorf("stopped %d: %d detached mounts held, want %d (the root kept)", i, got, before+held)
		}
	}
	if err := sb.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	settle(sharedDirs.data) // unmounted in the background, with the files
	if got := detachedMounts(); got != before {
		t.Errorf("after remove: %d detached mounts held, want %d", got, before)
	}
}

// testImage is a one-layer image whose /marker says name.
func testImage(t *testing.T, b *native.Backend, dir, name string) *image.Image {
	t.Helper()
	uid, gid := b.RootIDs()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	host, err := b.HostImage()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "marker"), []byte(name), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	img := *host
	img.Name = name
	img.Layers = append([]string{dir}, host.Layers...)
	return &img
}

// TestRootRemountedForNewImage: a sandbox restarted on another image (the
// server's SetConfig while stopped) gets a root of the new layers, not the
// one held from its last run.
func TestRootRemountedForNewImage(t *testing.T) {
	h := harness(t)
	b := h.Backend.(*native.Backend)
	base := filepath.Join(sharedDirs.data, "images", "remount-test")
	one, two := testImage(t, b, filepath.Join(base, "one"), "one"), testImage(t, b, filepath.Join(base, "two"), "two")
	ctx := context.Background()
	sb, err := b.Create(ctx, backend.Config{ID: "remount", Image: one})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sb.Remove(ctx) }()
	for _, img := range []*image.Image{one, two, one} {
		sb.(*native.Sandbox).SetConfig(backend.Config{Image: img})
		if err := sb.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if r := conformance.Exec(t, sb, 0, "/bin/cat", "/marker"); r.Stdout != img.Name {
			t.Errorf("on image %s: /marker is %q %s", img.Name, r.Stdout, r.Stderr)
		}
		if err := sb.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRootMountedByAgent: where the host does not hold roots (kernels that
// cannot clone a detached mount; forced here), the agent mounts its root
// itself and the host holds nothing. A layer path longer than the mount
// API's 256-byte parameters works either way: the host names layers by
// descriptor.
func TestRootMountedByAgent(t *testing.T) {
	h := harness(t)
	b := h.Backend.(*native.Backend)
	dir := filepath.Join(sharedDirs.data, "images", "long-"+strings.Repeat("x", 120), strings.Repeat("y", 120), "layer")
	img := testImage(t, b, dir, "long")
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Join(sharedDirs.data, "images", "long-"+strings.Repeat("x", 120))) })
	if len(dir) <= 256 {
		t.Fatalf("layer path is %d bytes; the test needs more than 256", len(dir))
	}
	for _, byAgent := range []bool{false, true} {
		settle(sharedDirs.data)
		if byAgent && b.UIDRanges() {
			// Agents in ranges of their own cannot mount the root:
			// a backend without them, on a data directory of its own.
			var data, run string
			b, data, run = legacyBackend(t)
			h = harnessFor(t, b, data, run)
			dir = filepath.Join(data, "images", "long-"+strings.Repeat("x", 120), strings.Repeat("y", 120), "layer")
			img = testImage(t, b, dir, "long")
		}
		if byAgent {
			defer native.AgentMountsRoots(b)()
		}
		before := detachedMounts()
		sb := h.Sandbox(t, backend.Config{Image: img})
		if r := conformance.Exec(t, sb, 0, "/bin/cat", "/marker"); r.Stdout != "long" {
			t.Errorf("agent mounts: %v: /marker is %q %s", byAgent, r.Stdout, r.Stderr)
		}
		want := before
		if !byAgent && native.HostHoldsRoots() {
			want++
		}
		if got := detachedMounts(); got != want {
			t.Errorf("agent mounts: %v: %d detached mounts held, want %d", byAgent, got, want)
		}
		if err := sb.Remove(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRemovedInBackground: Remove frees the sandbox's name at once (its
// files are deleted in the background), and what a crash left mid-deletion
// is deleted by ReapOrphans.
func TestRemovedInBackground(t *testing.T) {
	h := harness(t)
	b := h.Backend.(*native.Backend)
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		sb, err := b.Create(ctx, backend.Config{ID: "same-name", Image: h.Image})
		if err != nil {
			t.Fatalf("create %d right after remove: %v", i, err)
		}
		if err := sb.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if r := conformance.Exec(t, sb, 0, "/bin/sh", "-c", "test ! -e /root/mine && touch /root/mine"); r.Code != 0 {
			t.Errorf("create %d sees an earlier sandbox's files: %+v %s", i, r.ExitStatus, r.Stderr)
		}
		if err := sb.Remove(ctx); err != nil {
			t.Fatal(err)
		}
	}
	left := filepath.Join(sharedDirs.data, "sandboxes", ".removed", "crashed.1.1", "upper")
	if err := os.MkdirAll(left, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(left, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ReapOrphans(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(left)); !os.IsNotExist(err) {
		t.Errorf("a crashed removal's files are still there: %v", err)
	}
}

// TestEphemeralNotListed: an ephemeral sandbox (warren run's) belongs to
// its process, so IDs, which a daemon compares with its database to find
// orphans, leaves it out; one whose creator died while assembling it (a
// ".new-" directory whose marker nobody holds) is deleted by ReapOrphans,
// one being assembled is not.
func TestEphemeralNotListed(t *testing.T) {
	testenv.RequireRoot(t)
	base := testenv.SearchableDir(t, "warren-ephemeral-test-")
	data, run := filepath.Join(base, "data"), filepath.Join(base, "run")
	b, err := native.New(native.Options{
		DataDir: data, RunDir: run, AgentPath: testenv.AgentBinary(t), SpawnerPath: testenv.SpawnerBinary(t),
		CgroupPrefix: fmt.Sprintf("warren-test-ephemeral-%d", os.Getpid()), ExitWithHost: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Close() }()
	img, err := b.HostImage()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sb, err := b.Create(ctx, backend.Config{ID: "run-eph", Image: img})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sb.Remove(ctx) }()
	if _, err := os.Stat(filepath.Join(data, "sandboxes", "run-eph", "upper")); err != nil {
		t.Fatalf("the sandbox's state is not in place: %v", err)
	}
	if ids, err := b.IDs(); err != nil || len(ids) != 0 {
		t.Errorf("IDs lists %v (%v), want no ephemeral sandbox", ids, err)
	}
	if _, err := b.Create(ctx, backend.Config{ID: "run-eph", Image: img}); !errors.Is(err, fs.ErrExist) {
		t.Errorf("a second create of the same id: %v, want ErrExist", err)
	}
	sandboxes := filepath.Join(data, "sandboxes")
	for _, d := range []string{".new-crashed", ".new-assembling"} {
		if err := os.MkdirAll(filepath.Join(sandboxes, d, "upper"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sandboxes, d, "ephemeral"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	held, err := os.Open(filepath.Join(sandboxes, ".new-assembling", "ephemeral"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = held.Close() }()
	if err := syscall.Flock(int(held.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ReapOrphans(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(sandboxes, ".new-crashed")); !os.IsNotExist(err) {
		t.Errorf("a crashed assembly is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(sandboxes, ".new-assembling")); err != nil {
		t.Errorf("ReapOrphans deleted a sandbox being assembled: %v", err)
	}
	if _, err := os.Stat(filepath.Join(sandboxes, "run-eph")); err != nil {
		t.Errorf("ReapOrphans deleted a live ephemeral sandbox: %v", err)
	}
}

// volatileOverlay reports whether an overlay's super options say it is
// volatile: "volatile", shown as "fsync=volatile" by newer kernels, as a
// whole option (a path in another may contain the word).
func volatileOverlay(opts string) bool {
	o := strings.Split(strings.TrimSpace(opts), ",")
	return slices.Contains(o, "volatile") || slices.Contains(o, "fsync=volatile")
}

// rootOverlayOptions is the super options of the overlay mounted on / in
// sb, from its mountinfo.
func rootOverlayOptions(t *testing.T, sb backend.Sandbox) string {
	t.Helper()
	r := conformance.Exec(t, sb, 0, "/bin/cat", "/proc/self/mountinfo")
	for _, l := range strings.Split(r.Stdout, "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && f[4] == "/" {
			if _, after, ok := strings.Cut(l, " - overlay "); ok {
				return after
			}
		}
	}
	t.Fatalf("no overlay on / in the sandbox's mountinfo:\n%s", r.Stdout)
	return ""
}

// TestEphemeralRootVolatile: an ephemeral sandbox's overlay (a `warren
// run`'s, whose files go with it) is volatile, so its removal does not
// sync the host's file system; it can be mounted again in the same process
// (a restart on another image remounts the same upper layer, which
// overlayfs refuses while its volatile mark is there); its files survive
// that. A sandbox that outlives its process keeps a synced overlay.
func TestEphemeralRootVolatile(t *testing.T) {
	testenv.RequireRoot(t)
	// Elsewhere (6.1, 6.12) the agents mount their roots, never volatile:
	// there the same restarts must work on a synced root.
	volatile := native.HostHoldsRoots()
	if !volatile {
		t.Log("this kernel cannot clone a detached mount: the agents mount their roots, never volatile")
	}
	base := testenv.SearchableDir(t, "warren-volatile-test-")
	data, run := filepath.Join(base, "data"), filepath.Join(base, "run")
	b, err := native.New(native.Options{
		DataDir: data, RunDir: run, AgentPath: testenv.AgentBinary(t), SpawnerPath: testenv.SpawnerBinary(t),
		CgroupPrefix: fmt.Sprintf("warren-test-volatile-%d", os.Getpid()), ExitWithHost: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Close() }()
	one := testImage(t, b, filepath.Join(data, "images", "volatile-test", "one"), "one")
	two := testImage(t, b, filepath.Join(data, "images", "volatile-test", "two"), "two")
	ctx := context.Background()
	sb, err := b.Create(ctx, backend.Config{ID: "run-volatile", Image: one})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sb.Remove(ctx) }()
	for i, img := range []*image.Image{one, two} {
		sb.(*native.Sandbox).SetConfig(backend.Config{Image: img})
		if err := sb.Start(ctx); err != nil {
			t.Fatalf("start %d (on image %s): %v", i, img.Name, err)
		}
		if opts := rootOverlayOptions(t, sb); volatileOverlay(opts) != volatile {
			t.Errorf("start %d: the ephemeral sandbox's root volatile: %v, want %v: %s", i, !volatile, volatile, opts)
		}
		if r := conformance.Exec(t, sb, 0, "/bin/sh", "-c", "echo $(( $(cat /root/n 2>/dev/null || echo 0) + 1 )) > /root/n; cat /root/n /marker"); r.Stdout != strconv.Itoa(i+1)+"\n"+img.Name {
			t.Errorf("start %d: counter and marker %q %+v %s", i, r.Stdout, r.ExitStatus, r.Stderr)
		}
		if err := sb.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := sb.Remove(ctx); err != nil {
		t.Fatal(err)
	}

	h := harness(t)
	kept, err := h.Backend.Create(ctx, backend.Config{ID: "kept-synced", Image: h.Image})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = kept.Remove(ctx) }()
	if err := kept.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if opts := rootOverlayOptions(t, kept); volatileOverlay(opts) {
		t.Errorf("a sandbox that outlives its process has a volatile root: %s", opts)
	}
}
