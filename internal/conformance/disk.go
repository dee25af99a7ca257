package conformance

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/backend"
)

// RunDisk runs the disk limit checks against h, whose backend must enforce
// limits (a DiskLimits mechanism, backend.DiskLimiter sandboxes): a
// backend without them fails, since a test asking for them means them.
func RunDisk(t *testing.T, h *Harness) {
	d, ok := h.Backend.(interface{ DiskLimits() string })
	if !ok || d.DiskLimits() == "" {
		t.Fatalf("backend %s enforces no disk limits", h.Backend.Name())
	}
	t.Run("DiskLimit", h.diskLimit)
}

// WantQuotaExceeded runs sh -c script in sb and wants it to fail with
// "Disk quota exceeded" (EDQUOT, the host's, through either kernel).
func WantQuotaExceeded(t *testing.T, sb backend.Sandbox, what, script string) {
	t.Helper()
	r := Exec(t, sb, 60*time.Second, "/bin/sh", "-c", script)
	if r.Code == 0 || !strings.Contains(r.Stderr, "Disk quota exceeded") {
		t.Fatalf("%s: exit %+v, stderr %q; want EDQUOT", what, r.ExitStatus, r.Stderr)
	}
}

// diskLimit: a sandbox filling its root or its /tmp stops at its limit
// with EDQUOT in the writer, while another sandbox and the host write on;
// a full sandbox starts again writable with its cap kept; a new cap
// applies at the next start; sandbox.get's figures (DiskUsage, DiskLimit)
// say so.
func (h *Harness) diskLimit(t *testing.T) {
	const limit = 32 << 20
	sb := h.Sandbox(t, backend.Config{DiskBytes: limit})
	other := h.Sandbox(t, backend.Config{})
	lim, ok := sb.(backend.DiskLimiter)
	du, ok2 := sb.(backend.DiskUser)
	if !ok || !ok2 {
		t.Fatalf("%T is no backend.DiskLimiter and DiskUser", sb)
	}
	if got := lim.DiskLimit(); got != limit {
		t.Errorf("DiskLimit = %d, want %d", got, limit)
	}
	WantQuotaExceeded(t, sb, "fill the root", "dd if=/dev/zero of=/root/big bs=1M count=64")
	// The kernel's accounting is current to its last commit: wait for it.
	var used int64
	for deadline := time.Now().Add(40 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var err error
		if used, err = du.DiskUsage(); err != nil {
			t.Fatal(err)
		}
		if used >= limit/2 || time.Now().After(deadline) {
			break
		}
	}
	if used < limit/2 || used > limit {
		t.Errorf("DiskUsage of a full sandbox = %d; want near %d", used, limit)
	}
	if r := Exec(t, sb, 0, "/bin/sh", "-c", "rm /root/big && sync"); r.Code != 0 {
		t.Fatalf("rm: %+v %s", r.ExitStatus, r.Stderr)
	}
	WantQuotaExceeded(t, sb, "fill /tmp", "dd if=/dev/zero of=/tmp/big bs=1M count=64")
	if r := Exec(t, other, 60*time.Second, "/bin/sh", "-c", "dd if=/dev/zero of=/tmp/big bs=1M count=64 && rm /tmp/big"); r.Code != 0 {
		t.Fatalf("another sandbox beside a full one: %+v %s", r.ExitStatus, r.Stderr)
	}
	host := filepath.Join(t.TempDir(), "host")
	if err := os.WriteFile(host, make([]byte, 64<<20), 0o600); err != nil {
		t.Fatalf("the host beside a full sandbox: %v", err)
	}

	// Full, stopped and started: writable again (it can delete), and
	// the cap is kept.
	ctx := context.Background()
	if err := sb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Start(ctx); err != nil {
		t.Fatal(err)
	}
	WantQuotaExceeded(t, sb, "after a restart", "rm /tmp/big && sync && dd if=/dev/zero of=/root/big bs=1M count=64")
	if got := lim.DiskLimit(); got != limit {
		t.Errorf("DiskLimit after a restart = %d, want %d", got, limit)
	}

	// A new cap (SetConfig while stopped) applies at the next start.
	re, ok := sb.(backend.Reconfigurer)
	if !ok {
		return
	}
	if err := sb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	re.SetConfig(backend.Config{Image: h.Image, DiskBytes: 2 * limit})
	if err := sb.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := lim.DiskLimit(); got != 2*limit {
		t.Errorf("DiskLimit after a start with a new config = %d, want %d", got, 2*limit)
	}
	// rm -f: the EDQUOT above may have come at the file's creation,
	// leaving no /root/big. The cap counts what the host's file system
	// has freed: on gvisor neither the sandbox's sync commits the host's
	// file system nor does an unlink free a file the sentry still holds,
	// so the space comes back a moment later (documented); the host syncs
	// and the write is tried again for a while.
	var r Result
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		if rm := Exec(t, sb, 0, "/bin/sh", "-c", "rm -f /root/big && sync"); rm.Code != 0 {
			t.Fatalf("rm: %+v %s", rm.ExitStatus, rm.Stderr)
		}
		unix.Sync()
		r = Exec(t, sb, 60*time.Second, "/bin/sh", "-c", "dd if=/dev/zero of=/root/big bs=1M count=40 && rm /root/big")
		if r.Code == 0 || !strings.Contains(r.Stderr, "quota") || time.Now().After(deadline) {
			break
		}
	}
	if r.Code != 0 {
		t.Errorf("40 MiB under a 64 MiB cap: %+v %s", r.ExitStatus, r.Stderr)
	}
}
