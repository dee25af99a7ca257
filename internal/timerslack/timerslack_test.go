package timerslack

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
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
	threads, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	existed := map[int]bool{}
	for _, e := range threads {
		tid, _ := strconv.Atoi(e.Name())
		existed[tid] = true
	}
	if err := Coarsen(1500 * time.Microsecond); err != nil {
		t.Fatal(err)
	}
	if got := threadSlack(t, old); got != "1500000" {
		t.Errorf("a thread that existed: slack %s ns, want 1500000", got)
	}
	// Threads locked one after another until the runtime has to start a
	// new one: it inherits the slack from the thread that started it.
	fresh := 0
	for i := 0; i < 64 && fresh == 0; i++ {
		go func() {
			runtime.LockOSThread() // never goes back: each holds a thread
			tids <- unix.Gettid()
			<-release
		}()
		if tid := <-tids; !existed[tid] {
			fresh = tid
		}
	}
	if fresh == 0 {
		t.Fatal("no new thread after 64 locked goroutines")
	}
	if got := threadSlack(t, fresh); got != "1500000" {
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
