package seccomp

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// envInstall makes this test binary, started by BenchmarkInstall, install
// the default profile's filter once and print how long that took.
const envInstall = "WARREN_TEST_SECCOMP_INSTALL"

// TestInstallHelper is the child side of BenchmarkInstall; it does nothing
// in a normal run.
func TestInstallHelper(t *testing.T) {
	if os.Getenv(envInstall) == "" {
		return
	}
	prog, err := Compile(DefaultProfile())
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := Install(prog); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("install_ns %d\n", time.Since(t0).Nanoseconds())
}

// BenchmarkInstall measures what installing the default filter costs a
// fresh process, as every agent pays it at start: the kernel runs the
// program for every syscall number to build its action cache. Each
// iteration starts this test binary once; the metric is the median.
func BenchmarkInstall(b *testing.B) {
	var ns []float64
	for b.Loop() {
		cmd := exec.Command(os.Args[0], "-test.run=^TestInstallHelper$", "-test.count=1")
		cmd.Env = append(os.Environ(), envInstall+"=1")
		out, err := cmd.Output()
		if err != nil {
			b.Fatalf("install helper: %v\n%s", err, out)
		}
		found := false
		for _, line := range strings.Split(string(out), "\n") {
			if v, ok := strings.CutPrefix(line, "install_ns "); ok {
				n, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatal(err)
				}
				ns, found = append(ns, n), true
			}
		}
		if !found {
			b.Fatalf("install helper printed no time:\n%s", out)
		}
	}
	slices.Sort(ns)
	b.ReportMetric(ns[len(ns)/2]/1e6, "install-ms")
}
