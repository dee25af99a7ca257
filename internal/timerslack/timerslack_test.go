package timerslack

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/testenv"
)

func threadSlack(t *testing.T, tid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/timerslack_ns", tid))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestCoarsen: every thread, the ones that existed and the ones started
// after, gets the slack; Original keeps what the process had.
func TestCoarsen(t *testing.T) {
	testenv.RequireRoot(t) // other threads' slack needs CAP_SYS_NICE
	before, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A thread that exists before the change, parked until the end.
	tids := make(chan int)
	release := make(chan struct{})
	defer close(release)
	go func() {
		runtime.LockOSThread()
		tids <- unix.Gettid()
		<-release
	}()
	old := <-tids
	if err := Coarsen(1500 * time.Microsecond); err != nil {
		t.Fatal(err)
	}
	if got := threadSlack(t, old); got != "1500000" {
		t.Errorf("a thread that existed: slack %s ns, want 1500000", got)
	}
	go func() {
		runtime.LockOSThread() // a new thread: this one never goes back
		tids <- unix.Gettid()
		<-release
	}()
	if got := threadSlack(t, <-tids); got != "1500000" {
		t.Errorf("a thread started after: slack %s ns, want 1500000", got)
	}
	if got := Original(); got != uint64(before) {
		t.Errorf("Original %d, want the slack before, %d", got, before)
	}
	// What a thread that uses the original starts has it; the thread
	// gets the coarse one back after.
	restore := UseOriginal()
	out, err := exec.Command("/bin/cat", "/proc/self/timerslack_ns").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != fmt.Sprint(before) {
		t.Errorf("a child of a thread that uses the original: slack %s ns, want %d", got, before)
	}
	tid := unix.Gettid()
	restore()
	if got := threadSlack(t, tid); got != "1500000" {
		t.Errorf("after restore the thread's slack is %s ns, want 1500000", got)
	}
	for _, d := range []time.Duration{0, -1, 2 * time.Second} {
		if err := Coarsen(d); err == nil {
			t.Errorf("Coarsen(%v) accepted", d)
		}
	}
}
