package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/bench"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// releaseBinary builds warren as `make build` does (static, the agent and
// spawner embedded with their digests) into dir, without touching the
// source tree: the embedded files come in through a build overlay.
func releaseBinary(b *testing.B, dir string) string {
	b.Helper()
	agentbinDir := filepath.Join(testenv.ModuleRoot(), "internal", "agentbin")
	replace := map[string]string{}
	for name, src := range map[string]string{"warren-agent": testenv.AgentBinary(b), "warren-spawner": testenv.SpawnerBinary(b)} {
		data, err := os.ReadFile(src) //nolint:gosec // the test's own build
		if err != nil {
			b.Fatal(err)
		}
		sum := sha256.Sum256(data)
		digest := filepath.Join(dir, name+".sha256")
		if err := os.WriteFile(digest, []byte(hex.EncodeToString(sum[:])+"\n"), 0o600); err != nil {
			b.Fatal(err)
		}
		replace[filepath.Join(agentbinDir, name)] = src
		replace[filepath.Join(agentbinDir, name+".sha256")] = digest
	}
	ov, _ := json.Marshal(map[string]any{"Replace": replace})
	overlay := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(overlay, ov, 0o600); err != nil {
		b.Fatal(err)
	}
	out := filepath.Join(dir, "warren")
	cmd := exec.Command("go", "build", "-trimpath", "-tags", "embedagent", "-overlay", overlay, "-o", out, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build warren: %v\n%s", err, msg)
	}
	return out
}

// BenchmarkWholeProcess measures warren as a user meets it, a whole
// process from exec to exit, against whole processes doing the same job in
// the same run: `warren --help` against /bin/true (a command that does no
// work), `warren run -- /bin/true` against bubblewrap running /bin/true in
// namespaces of its own. Each iteration is one round of all four,
// interleaved. Issue #23's targets: run ≤ 1.5× bubblewrap, --help ≤ 5 ms.
//
//	go test -run XXX -bench WholeProcess -benchtime 40x ./cmd/warren
func BenchmarkWholeProcess(b *testing.B) {
	testenv.RequireRoot(b)
	bw, err := exec.LookPath("bwrap")
	testenv.Require(b, err == nil, "bubblewrap (bwrap) installed: scripts/setup.sh installs it")
	dir := testenv.SearchableDir(b, "warren-bench-process-")
	warren := releaseBinary(b, b.TempDir())
	run := []string{warren, "run", "--data-dir", filepath.Join(dir, "data"), "--run-dir", filepath.Join(dir, "run"), "--", "/bin/true"}
	fs := []func() error{
		bench.Command(warren, "--help"),
		bench.Command("/bin/true"),
		bench.Command(run...),
		bench.Command(bw, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "/bin/true"),
	}
	b.ResetTimer()
	ds, err := bench.Interleaved(b.N, fs)
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	med := func(i int) time.Duration { return bench.Percentile(ds[i], 50) }
	msOf := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(msOf(med(0)), "help-ms")
	b.ReportMetric(msOf(med(1)), "true-ms")
	b.ReportMetric(msOf(med(2)), "run-ms")
	b.ReportMetric(msOf(med(3)), "bwrap-ms")
	b.ReportMetric(float64(med(2))/float64(med(3)), "run/bwrap")
	b.ReportMetric(float64(med(0))/float64(med(1)), "help/true")
	b.ReportMetric(0, "ns/op") // a round of four processes: the medians above say what each took
}
