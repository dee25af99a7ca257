package native_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/conformance"
	"github.com/warren-sandbox/warren/internal/uidrange"
)

// TestSandboxesHaveOwnUIDRanges is issue #18's finding 2 between sandboxes:
// no host uid is shared by two running sandboxes, while what each keeps on
// disk stays owned by the storage range and survives a restart in another
// range. Where the kernel cannot (the host does not hold roots: Linux 6.1,
// 6.12), sandboxes run as the storage range, as before.
func TestSandboxesHaveOwnUIDRanges(t *testing.T) {
	h := harness(t)
	b := h.Backend.(*native.Backend)
	if !h.UserNS {
		t.Fatal("no user namespace: nothing to test")
	}
	base := int(b.UserNS().Host)
	if !native.HostHoldsRoots() {
		if b.UIDRanges() {
			t.Fatal("per-sandbox uid ranges on a kernel where the host cannot hold roots")
		}
		if uid := sandboxRootUID(t, h.Sandbox(t, backend.Config{})); uid != base {
			t.Errorf("sandbox root is host uid %d, want the storage range's %d", uid, base)
		}
		return
	}
	if !b.UIDRanges() {
		t.Fatal("no per-sandbox uid ranges where the host holds roots")
	}
	a, other := h.Sandbox(t, backend.Config{}), h.Sandbox(t, backend.Config{})
	ua, uo := sandboxRootUID(t, a), sandboxRootUID(t, other)
	if ua == uo || ua == base || uo == base || (ua-base)%uidrange.Size != 0 || (uo-base)%uidrange.Size != 0 {
		t.Fatalf("sandbox roots are host uids %d and %d; want two ranges above the storage range %d", ua, uo, base)
	}
	ranges, err := uidrange.New(uidrange.DefaultDir(uint32(base)), uint32(base), 0) //nolint:gosec // the storage range's base
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []int{ua, uo} {
		if inUse, err := ranges.InUse((u - base) / uidrange.Size); !inUse || err != nil {
			t.Errorf("range of host uid %d not locked while its sandbox runs: %v", u, err)
		}
	}
	// Files are written to the upper directory as the storage range.
	if r := conformance.Exec(t, a, 0, "/bin/sh", "-c", "echo one > /f && echo x > /g && chown 1000:1000 /g"); r.Code != 0 {
		t.Fatalf("write: %+v %s", r.ExitStatus, r.Stderr)
	}
	upper := filepath.Join(sharedDirs.data, "sandboxes", a.ID(), "upper")
	for name, want := range map[string]int{"f": base, "g": base + 1000} {
		st, err := os.Stat(filepath.Join(upper, name))
		if err != nil {
			t.Fatal(err)
		}
		if uid := int(st.Sys().(*syscall.Stat_t).Uid); uid != want {
			t.Errorf("/%s on disk is owned by host uid %d, want %d", name, uid, want)
		}
	}
	// Holding one sandbox's uid (as code that escaped it would) gives no
	// power over another's processes: signalling its own works, the
	// other's is refused. With one shared range it was allowed.
	pa, po := a.(*native.Sandbox).Pid(), other.(*native.Sandbox).Pid()
	signal := func(pid int) (string, error) {
		return asUID(t, ua, "/bin/kill", "-0", fmt.Sprint(pid))
	}
	if out, err := signal(pa); err != nil {
		t.Fatalf("as sandbox a's root, signal a's agent: %s %v", out, err)
	}
	if out, err := signal(po); err == nil || !strings.Contains(out, "not permitted") {
		t.Errorf("as sandbox a's root, signal the other sandbox's agent: %q %v", out, err)
	}
	if err := a.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := a.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	r := conformance.Exec(t, a, 0, "/bin/sh", "-c", "echo two >> /f && cat /f && stat -c '%u %g' /f /g")
	if r.Code != 0 || r.Stdout != "one\ntwo\n0 0\n1000 1000\n" {
		t.Errorf("after a restart in range %d: %+v %q %s", (sandboxRootUID(t, a)-base)/uidrange.Size, r.ExitStatus, r.Stdout, r.Stderr)
	}
}

// TestVolumeWrittenAsStorageRoot: with per-sandbox uid ranges, what sandbox
// root writes to a volume is owned on the host by the storage range's root
// (the uid the README names), whatever range the sandbox runs in, and a
// file the host made there for that uid is the sandbox root's.
func TestVolumeWrittenAsStorageRoot(t *testing.T) {
	h := harness(t)
	b := h.Backend.(*native.Backend)
	if !b.UIDRanges() {
		if native.HostHoldsRoots() && h.UserNS {
			t.Fatal("no per-sandbox uid ranges where the host holds roots")
		}
		return // TestVolumes covers volumes without ranges
	}
	base := b.UserNS().Host
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "mine"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(dir, "mine"), int(base), int(base)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, int(base), int(base)); err != nil {
		t.Fatal(err)
	}
	sb := h.Sandbox(t, backend.Config{Volumes: []backend.Volume{{Source: dir, Target: "/v"}}})
	r := conformance.Exec(t, sb, 0, "/bin/sh", "-c", "echo y >> /v/mine && echo new > /v/new && stat -c '%u' /v/mine && grep -c ' /v ' /proc/self/mountinfo")
	if r.Code != 0 || !strings.HasPrefix(r.Stdout, "0\n") {
		t.Fatalf("use the volume: %+v %q %s", r.ExitStatus, r.Stdout, r.Stderr)
	}
	st, err := os.Stat(filepath.Join(dir, "new"))
	if err != nil {
		t.Fatal(err)
	}
	if uid := st.Sys().(*syscall.Stat_t).Uid; uid != base {
		t.Errorf("a file sandbox root made in a volume is owned by host uid %d, want %d", uid, base)
	}
	if uid := sandboxRootUID(t, sb); uid == int(base) {
		t.Errorf("the sandbox runs as the storage range (%d)", uid)
	}
}

// TestStartAfterCreateCutShort: a crash in Create can leave a sandbox's
// upper directory without its work directory; the next start makes it
// again (the crash-recovery suite found a sandbox that could never start).
func TestStartAfterCreateCutShort(t *testing.T) {
	h := harness(t)
	sb, err := h.Backend.Create(t.Context(), backend.Config{ID: "cut-short", Image: h.Image})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sb.Remove(context.Background()) }()
	for _, d := range []string{"work", "rootfs"} {
		if err := os.Remove(filepath.Join(sharedDirs.data, "sandboxes", sb.ID(), d)); err != nil {
			t.Fatal(err)
		}
	}
	if err := sb.Start(t.Context()); err != nil {
		t.Fatalf("start without a work directory: %v", err)
	}
	if r := conformance.Exec(t, sb, 0, "/bin/sh", "-c", "echo ok > /f && cat /f"); r.Stdout != "ok\n" {
		t.Errorf("write after the start: %+v %q %s", r.ExitStatus, r.Stdout, r.Stderr)
	}
}
