package network

import (
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/netplumb"
	"github.com/warren-sandbox/warren/internal/testenv"
)

func TestOwnedPrefix(t *testing.T) {
	p, err := OwnedPrefix("warren-1a2b3c4d")
	if err != nil {
		t.Fatal(err)
	}
	pid, start, ok := parseOwned(strings.TrimPrefix(p, "warren-1a2b3c4d"+ownedInfix))
	if !ok || pid != os.Getpid() {
		t.Fatalf("OwnedPrefix %q: parsed %d %d %v, want this pid %d", p, pid, start, ok, os.Getpid())
	}
	if !ownerAlive(pid, start) {
		t.Error("this process is not alive by its own prefix")
	}
	if ownerAlive(pid, start+1) {
		t.Error("another start time (a reused pid) counts as alive")
	}
	// A process that was collected is gone.
	cmd := exec.Command("/bin/true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cpid := cmd.Process.Pid
	cstart, err := startTime(cpid)
	if err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if ownerAlive(cpid, cstart) {
		t.Errorf("exited pid %d counts as alive", cpid)
	}
	// The prefix fits netplumb's bound with the longest pid and start time.
	long := "warren-1a2b3c4d" + ownedInfix + "4194304-" + strconv.FormatUint(1<<63, 10)
	cfg := netplumb.Config{Prefix: long, Pool: netplumb.DefaultPool, MaxConns: 1, ResolverPort: 1, ProxyPort: 2}
	if err := cfg.Validate(); err != nil {
		t.Errorf("the longest owned prefix is refused: %v", err)
	}
}

func TestParseOwned(t *testing.T) {
	for _, tc := range []struct {
		in  string
		ok  bool
		pid int
	}{
		{"12-345", true, 12},
		{"12-345-6", false, 0},
		{"012-345", false, 0},
		{"12-0345", false, 0},
		{"-5", false, 0},
		{"0-5", false, 0},
		{"12", false, 0},
		{"x-5", false, 0},
		{"12-", false, 0},
		{"", false, 0},
	} {
		pid, _, ok := parseOwned(tc.in)
		if ok != tc.ok || pid != tc.pid {
			t.Errorf("parseOwned(%q) = %d, %v; want %d, %v", tc.in, pid, ok, tc.pid, tc.ok)
		}
	}
}

// TestAutoPoolExhausted: with every slot held by another instance, Start
// fails at once, saying so. A range of one slot outside AutoRange's, so
// no real instance is disturbed.
func TestAutoPoolExhausted(t *testing.T) {
	testenv.RequireRoot(t)
	saved := AutoRange
	AutoRange = netip.MustParsePrefix("10.250.240.0/20")
	t.Cleanup(func() { AutoRange = saved })
	if err := os.MkdirAll(PoolLockDir, 0o700); err != nil {
		t.Fatal(err)
	}
	lockFile := filepath.Join(PoolLockDir, "10.250.240.0_20")
	_, statErr := os.Stat(lockFile)
	held, err := lockSlot(slot(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = held.Close()
		if errors.Is(statErr, os.ErrNotExist) {
			_ = os.Remove(lockFile)
		}
	})
	_, err = Start(Options{Prefix: "warren-test-exhausted"})
	want := "no free pool in 10.250.240.0/20: 10.250.240.0/20 (another instance's)"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Start with every slot taken: %v, want %q", err, want)
	}
	// Nothing was made for the instance.
	if ts, err := netplumb.Tables("warren-test-exhausted"); err != nil || len(ts) > 0 {
		t.Errorf("tables %v (%v) after a failed start", ts, err)
	}
	// The slot stays the holder's.
	if f, err := lockSlot(slot(0)); !errors.Is(err, unix.EWOULDBLOCK) {
		t.Errorf("the held slot could be taken: %v", err)
		if f != nil {
			_ = f.Close()
		}
	}
}

// BenchmarkSweepOwned is what every warren run pays for the sweep when
// nothing is left to sweep: one listing of the host's tables.
func BenchmarkSweepOwned(b *testing.B) {
	testenv.RequireRoot(b)
	for b.Loop() {
		if _, err := SweepOwned("warren-bench-nothing"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStartRemove is what a warren run with a network pays for the
// network itself, besides its sandbox's link: Start (listeners, the pool
// slot, the table) and CloseAndRemove.
func BenchmarkStartRemove(b *testing.B) {
	testenv.RequireRoot(b)
	prefix, err := OwnedPrefix("warren-bench")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		n, err := Start(Options{Prefix: prefix})
		if err != nil {
			b.Fatal(err)
		}
		if err := n.CloseAndRemove(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSweepOwned: of two owned instances, the one whose process is gone
// is removed, table and links; the live one stays.
func TestSweepOwned(t *testing.T) {
	testenv.RequireRoot(t)
	base := "warren-test-sweep-" + strconv.Itoa(os.Getpid())
	cmd := exec.Command("/bin/true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadPid := cmd.Process.Pid
	deadStart, err := startTime(deadPid)
	if err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	dead := base + ownedInfix + strconv.Itoa(deadPid) + "-" + strconv.FormatUint(deadStart, 10)
	live, err := OwnedPrefix(base)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range []string{dead, live} {
		// Pools of no slot of AutoRange's, so no real instance is disturbed.
		pool := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 251, byte(16*i + os.Getpid()%8*32), 0}), 20).Masked()
		h, err := netplumb.Open(netplumb.Config{Prefix: p, Pool: pool, ResolverPort: 1, ProxyPort: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = netplumb.RemoveInstance(p) })
		if err := h.Close(); err != nil { // as a killed process would leave it
			t.Fatal(err)
		}
	}
	removed, err := SweepOwned(base)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != dead {
		t.Errorf("swept %v, want only %s", removed, dead)
	}
	if ts, err := netplumb.Tables(base); err != nil || len(ts) != 1 || ts[0] != live {
		t.Errorf("tables after the sweep: %v (%v), want only the live %s", ts, err, live)
	}
}
