package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/warren-sandbox/warren/internal/testenv"
)

var (
	buildOnce sync.Once
	warrenBin string
	buildErr  error
)

// TestMain removes the binaries the tests built, so that a run leaves
// nothing in the temporary directory.
func TestMain(m *testing.M) {
	code := m.Run()
	if warrenBin != "" {
		_ = os.RemoveAll(filepath.Dir(warrenBin))
	}
	testenv.RemoveBuilt()
	os.Exit(code)
}

// warren builds the CLI once and returns a command running it with a
// private data and run directory (dir) and the test's agent binary.
func warren(t *testing.T, dir string, args ...string) *exec.Cmd {
	t.Helper()
	agentPath := testenv.AgentBinary(t)
	buildOnce.Do(func() {
		out, err := os.MkdirTemp("", "warren-cli-")
		if err != nil {
			buildErr = err
			return
		}
		warrenBin = filepath.Join(out, "warren")
		b, err := exec.Command("go", "build", "-o", warrenBin, ".").CombinedOutput()
		if err != nil {
			buildErr = errors.New(string(b))
		}
	})
	if buildErr != nil {
		t.Fatalf("build warren: %v", buildErr)
	}
	cmd := exec.Command(warrenBin, args...)
	// WARREN_DISK_POOL=off: a server's (and doctor's) default disk pool,
	// a loop-mounted image kept mounted after the server stops, is left to
	// the tests of disks, which pass --disk-pool and unmount it.
	// WARREN_RUNSC=off: the gvisor tier is left to the tests of tiers,
	// which name their runsc.
	cmd.Env = append(os.Environ(), "WARREN_AGENT="+agentPath, "WARREN_SPAWNER="+testenv.SpawnerBinary(t),
		"WARREN_DATA_DIR="+filepath.Join(dir, "data"), "WARREN_RUN_DIR="+filepath.Join(dir, "run"), "WARREN_DISK_POOL=off", "WARREN_RUNSC=off")
	return cmd
}

// stateDir returns a directory the sandbox's unprivileged root can reach.
func stateDir(t *testing.T) string { return testenv.SearchableDir(t, "warren-cli-state-") }

type result struct {
	code           int
	stdout, stderr string
}

func run(t *testing.T, cmd *exec.Cmd, stdin string) result {
	t.Helper()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		// Error, not Fatal: run is called from goroutines too.
		t.Error(err)
		code = -1
	}
	return result{code, out.String(), errb.String()}
}

func TestRunPassesOutputAndExitCodes(t *testing.T) {
	testenv.RequireRoot(t)
	dir := stateDir(t)
	vol := filepath.Join(dir, "vol")
	if err := os.Mkdir(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{"f": "from the host\n", "junk": "no program\n", "script": "#!/no/such/interpreter\n"} {
		if err := os.WriteFile(filepath.Join(vol, name), []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name       string
		args       []string
		stdin      string
		code       int
		stdout     string
		stderrHas  string
		stdoutHas  string
		stderrNone bool
		stdoutLen  int           // when set, stdout's exact length
		within     time.Duration // when set, warren must exit within this
	}{
		{name: "output and success", args: []string{"run", "--", "/bin/sh", "-c", "echo out; echo err >&2"}, stdout: "out\n", stderrHas: "err"},
		{name: "exit code", args: []string{"run", "--", "/bin/sh", "-c", "exit 7"}, code: 7},
		{name: "signal", args: []string{"run", "--", "/bin/sh", "-c", "kill -TERM $$"}, code: 143},
		{name: "not found", args: []string{"run", "--", "no-such-command"}, code: 127, stderrHas: "not found"},
		// The shell's codes from execve's errno: ENOEXEC (no program) is
		// not executable, ENOENT (its interpreter missing) not found.
		{name: "not executable", args: []string{"run", "--", "/etc/passwd"}, code: 126, stderrHas: "not an executable"},
		{name: "exec format", args: []string{"run", "--volume", vol + ":/v:ro", "--", "/v/junk"}, code: 126, stderrHas: "exec format error"},
		{name: "interpreter missing", args: []string{"run", "--volume", vol + ":/v:ro", "--", "/v/script"}, code: 127, stderrHas: "no such file"},
		{name: "timeout", args: []string{"run", "--timeout", "300ms", "--", "/bin/sleep", "30"}, code: 124, stderrHas: "timeout"},
		{name: "out of memory", args: []string{"run", "--memory", "48M", "--", "/usr/bin/python3", "-c", "b = bytearray(400 << 20)"}, code: 137, stderrHas: "out of memory"},
		{name: "stdin", args: []string{"run", "-i", "--", "/usr/bin/wc", "-c"}, stdin: "12345", stdout: "5\n"},
		{name: "env and workdir", args: []string{"run", "--env", "A=b c", "--workdir", "/tmp", "--", "/bin/sh", "-c", `echo "$A"; pwd`}, stdout: "b c\n/tmp\n"},
		{name: "docker short flags", args: []string{"run", "-ie", "A=b c", "-w", "/tmp", "-m", "64M", "--", "/bin/sh", "-c", `echo "$A"; pwd; cat`}, stdin: "in\n", stdout: "b c\n/tmp\nin\n"},
		{name: "python", args: []string{"run", "--", "/usr/bin/python3", "-c", "print(6*7)"}, stdout: "42\n"},
		{name: "volume", args: []string{"run", "--volume", vol + ":/v:ro", "--", "/bin/sh", "-c", "cat /v/f; touch /v/g || echo refused"}, stdout: "from the host\nrefused\n"},
		{name: "bad volume", args: []string{"run", "--volume", vol + "-missing:/v", "--", "true"}, code: 1, stderrHas: "no such file"},
		{name: "volume over /proc", args: []string{"run", "--volume", vol + ":/proc", "--", "true"}, code: 1, stderrHas: "/proc is the sandbox's own"},
		{name: "node", args: []string{"run", "--", "/usr/bin/node", "-e", "console.log(6*7)"}, stdout: "42\n"},
		{name: "no command", args: []string{"run"}, code: 2, stderrHas: "warren run: missing CMD"},
		{name: "bad memory", args: []string{"run", "--memory", "lots", "--", "true"}, code: 1, stderrHas: "size \"lots\""},
		{name: "bad env", args: []string{"run", "--env", "NOEQUALS", "--", "true"}, code: 1, stderrHas: "want K=V"},
		{name: "bad network", args: []string{"run", "--net", "host", "--", "true"}, code: 1, stderrHas: `--net "host": want none (loopback only) or egress`},
		{name: "unknown image", args: []string{"run", "--image", "alpine", "--", "true"}, code: 1, stderrHas: "image not found: alpine"},
		{name: "help", args: []string{"run", "--help"}, code: 0, stdoutHas: "-memory"},
		// Output is passed through whole, beyond the agent's 64 MiB cap for
		// kept output.
		{name: "output beyond 64 MiB", args: []string{"run", "--", "head", "-c", "70000000", "/dev/zero"}, stdoutLen: 70000000},
		{name: "negative timeout", args: []string{"run", "--timeout", "-5s", "--", "sleep", "1"}, code: 1, stderrHas: "--timeout -5s: negative"},
		{name: "sub-millisecond timeout", args: []string{"run", "--timeout", "500us", "--", "sleep", "5"}, code: 124, stderrHas: "timeout", within: 3 * time.Second},
		{name: "cpus NaN", args: []string{"run", "--cpus", "NaN", "--", "true"}, code: 1, stderrHas: "cpus: NaN out of range: want 0 (unlimited) or 0.01 (a 1 ms quota per 100 ms period) up to 1024"},
		{name: "cpus below the kernel's minimum", args: []string{"run", "--cpus", "0.001", "--", "true"}, code: 1, stderrHas: "cpus: 0.001 out of range: want 0 (unlimited) or 0.01"},
		{name: "cpus minimum", args: []string{"run", "--cpus", "0.01", "--", "/bin/echo", "slow"}, stdout: "slow\n"},
		{name: "pids 1", args: []string{"run", "--pids", "1", "--", "true"}, code: 1, stderrHas: "pids: 1 is below the minimum of 16"},
		{name: "pids minimum", args: []string{"run", "--pids", "16", "--", "/bin/sh", "-c", "/bin/echo a | /bin/cat; echo b"}, stdout: "a\nb\n"},
		{name: "flag value missing", args: []string{"run", "--net", "--", "true"}, code: 1, stderrHas: `flag --net needs a value, but is followed by "--"`},
		{name: "flag value is a flag", args: []string{"run", "--workdir", "--net", "none", "--", "true"}, code: 1, stderrHas: `flag --workdir needs a value, but is followed by "--net"`},
		{name: "flag value at the end", args: []string{"run", "--image"}, code: 2, stderrHas: "flag needs an argument"},
		{name: "relative workdir", args: []string{"run", "--workdir", "relative", "--", "true"}, code: 1, stderrHas: `workdir "relative": want an absolute path`},
		{name: "ports without a name", args: []string{"ports"}, code: 2, stderrHas: "warren ports: missing NAME"},
		{name: "ports expose without a port", args: []string{"ports", "expose", "web"}, code: 2, stderrHas: "warren ports expose: missing [HOST:]GUEST"},
		{name: "ports expose port 0", args: []string{"ports", "expose", "web", "0:80"}, code: 1, stderrHas: `port "0:80": want [HOST:]GUEST`},
		{name: "ports expose beyond 65535", args: []string{"ports", "expose", "web", "8080:65536"}, code: 1, stderrHas: `port "8080:65536": want [HOST:]GUEST`},
		{name: "ports unexpose bad port", args: []string{"ports", "unexpose", "web", "http"}, code: 1, stderrHas: `host port "http": want 1-65535`},
		{name: "ports help", args: []string{"ports", "--help"}, code: 0, stdoutHas: "warren ports expose NAME [HOST:]GUEST"},
		{name: "unknown command", args: []string{"frobnicate"}, code: 2, stderrHas: "unknown command"},
		{name: "top help", args: []string{"help"}, code: 0, stdoutHas: "doctor"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			r := run(t, warren(t, dir, tc.args...), tc.stdin)
			if took := time.Since(start); tc.within > 0 && took > tc.within {
				t.Errorf("took %v, want at most %v", took, tc.within)
			}
			if tc.stdoutLen > 0 && (len(r.stdout) != tc.stdoutLen || strings.Trim(r.stdout, "\x00") != "") {
				t.Errorf("stdout: %d bytes, want %d zeros", len(r.stdout), tc.stdoutLen)
				r.stdout = r.stdout[:min(len(r.stdout), 100)]
			}
			if r.code != tc.code {
				t.Errorf("exit %d, want %d (stdout %q, stderr %q)", r.code, tc.code, r.stdout, r.stderr)
			}
			if tc.stdout != "" && r.stdout != tc.stdout {
				t.Errorf("stdout %q, want %q", r.stdout, tc.stdout)
			}
			if !strings.Contains(r.stderr, tc.stderrHas) {
				t.Errorf("stderr %q lacks %q", r.stderr, tc.stderrHas)
			}
			if !strings.Contains(r.stdout, tc.stdoutHas) {
				t.Errorf("stdout %.200q lacks %q", r.stdout, tc.stdoutHas)
			}
		})
	}
	assertNoSandboxState(t, dir)
}

// TestRunCPUs: --cpus 0.5 holds a busy loop to about half a CPU, judged
// against an unlimited loop run at the same time. The loops are bounded in
// wall time and report their own CPU time.
func TestRunCPUs(t *testing.T) {
	testenv.RequireRoot(t)
	// A busy loop under --cpus 0.5 and, at the same time, one under no
	// limit (--cpus 0): the free loop says what a loop could get at this
	// moment's load, so the test judges the limit, not the load. Each
	// prints the share of a CPU it got over 3 s.
	loop := func(cpus string) func() (float64, error) {
		cmd := warren(t, stateDir(t), "run", "--cpus", cpus, "--", "/usr/bin/python3", "-c", `
import time
w0, c0 = time.monotonic(), time.process_time()
while time.monotonic() - w0 < 3: pass
print(round((time.process_time() - c0) / (time.monotonic() - w0), 3))
`)
		return func() (float64, error) {
			r := run(t, cmd, "")
			if r.code != 0 {
				return 0, fmt.Errorf("--cpus %s: exit %d: %s", cpus, r.code, r.stderr)
			}
			return strconv.ParseFloat(strings.TrimSpace(r.stdout), 64)
		}
	}
	limited, unlimited := loop("0.5"), loop("0")
	var half, free float64
	var errHalf, errFree error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); half, errHalf = limited() }()
	go func() { defer wg.Done(); free, errFree = unlimited() }()
	wg.Wait()
	if err := errors.Join(errHalf, errFree); err != nil {
		t.Fatal(err)
	}
	t.Logf("busy loops' share of a CPU: %.2f under --cpus 0.5, %.2f unlimited", half, free)
	// Quota periods are 100 ms, so 3 s hold 30 of them: loose bounds.
	// Above its quota the limit failed, whatever the load (load only
	// lowers a share). Below it, the limited loop must still get what a
	// free one got, up to its quota: a loaded host gives both less, a
	// quota applied wrong gives the limited one less than its due.
	if half > 0.65 {
		t.Errorf("busy loop used %.2f of a CPU under --cpus 0.5, want at most about 0.5", half)
	}
	if want := 0.6 * min(free, 0.5); half < want {
		t.Errorf("busy loop used %.2f of a CPU under --cpus 0.5 while an unlimited one got %.2f, want at least %.2f", half, free, want)
	}
	if free < 0.65 {
		// The host left a loop no more than the quota: the limit could
		// not show. Said, so that a run on a busy host is not read as
		// having checked it.
		t.Logf("the host's load left an unlimited loop %.2f of a CPU: --cpus 0.5 was not binding in this run", free)
	}
}

// TestRunTimeoutAgentStopped: the host enforces --timeout even when the
// sandbox's agent does not answer (SIGSTOPped here): warren ends soon after
// the timeout and says it was the timeout (124), and nothing is left.
func TestRunTimeoutAgentStopped(t *testing.T) {
	testenv.RequireRoot(t)
	dir := stateDir(t)
	marker := "sleep-stopped-agent"
	cmd := warren(t, dir, "run", "--timeout", "1s", "--", "/bin/sh", "-c", "cp /bin/sleep /tmp/"+marker+"; /tmp/"+marker+" 600")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool { return countProcs(marker) == 1 })
	pidFiles, _ := filepath.Glob(filepath.Join(dir, "run", "run-*", "agent.pid"))
	if len(pidFiles) != 1 {
		t.Fatalf("want one agent.pid, found %v", pidFiles)
	}
	b, err := os.ReadFile(pidFiles[0])
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.Fields(string(b))[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	took := time.Since(start)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 124 {
		t.Errorf("exit: %v, want 124 (stderr %q)", err, errb.String())
	}
	if !strings.Contains(errb.String(), "killed after the 1s timeout") {
		t.Errorf("stderr %q does not say the timeout killed it", errb.String())
	}
	// The timeout, the host's 2 s grace, and the stop.
	if took > 8*time.Second {
		t.Errorf("took %v after a 1s timeout", took)
	}
	if n := countProcs(marker); n != 0 {
		t.Errorf("%d sandbox processes survived", n)
	}
	assertNoSandboxState(t, dir)
}

func TestDoctor(t *testing.T) {
	testenv.RequireRoot(t)
	r := run(t, warren(t, stateDir(t), "doctor"), "")
	if r.code != 0 {
		t.Fatalf("doctor failed (%d):\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"ok    pid namespace", "ok    overlayfs", "ok    seccomp", "ok    sandbox start + exec true",
		"ok    network: netns + veth", "ok    network: nftables REDIRECT", "ok    network: nftables reject"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, r.stdout)
		}
	}
	// On cgroup v1 the freezer is listed (it pauses sandboxes where it is
	// mounted), and a cgroup2 mount beside the v1 hierarchies (hybrid) is
	// named.
	if !strings.Contains(r.stdout, "cgroups: mode v1") {
		return
	}
	freezer, unified := "not mounted", ""
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(mi), "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 {
			continue
		}
		switch {
		case g[0] == "cgroup" && slices.Contains(strings.Split(g[2], ","), "freezer"):
			freezer = "mounted"
		case g[0] == "cgroup2" && unified == "":
			unified = f[4]
		}
	}
	want := []string{"warn    cgroup freezer: "}
	if freezer == "mounted" {
		want = []string{"ok      cgroup freezer: pauses sandboxes"}
	}
	if unified != "" {
		want = append(want, "ok      cgroup v2 (hybrid): "+unified+" is mounted beside the v1 hierarchies")
	}
	for _, w := range want {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("doctor output lacks %q:\n%s", w, r.stdout)
		}
	}
}

// TestCrashRecovery kills `warren run` with SIGKILL while its sandbox runs:
// the sandbox must end on its own (nothing of it keeps running) and the next
// `warren run` must remove what the first one left.
func TestCrashRecovery(t *testing.T) {
	testenv.RequireRoot(t)
	dir := stateDir(t)
	marker := "sleep-crash-" + strings.ReplaceAll(t.Name(), "/", "-")
	cmd := warren(t, dir, "run", "--", "/bin/sh", "-c", "cp /bin/sleep /tmp/"+marker+"; /tmp/"+marker+" 600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool { return countProcs(marker) == 1 })
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	waitUntil(t, func() bool { return countProcs(marker) == 0 })
	// Leftovers exist until the next start clears them.
	if ents, _ := os.ReadDir(filepath.Join(dir, "data", "sandboxes")); len(ents) == 0 {
		t.Fatal("expected the killed run's state to be left behind")
	}
	if r := run(t, warren(t, dir, "run", "--", "/bin/true"), ""); r.code != 0 {
		t.Fatalf("next run failed: %+v", r)
	}
	assertNoSandboxState(t, dir)
}

// gvisorRunLeft lists what is in the gvisor tier's run directory dir
// besides empty directories and runsc's null-netns file.
func gvisorRunLeft(dir string) []string {
	var left []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			left = append(left, p+": "+err.Error())
		case d.IsDir() || p == filepath.Join(dir, ".runsc", "null-netns"):
		default:
			left = append(left, p)
		}
		return nil
	})
	return left
}

func assertNoSandboxState(t *testing.T, dir string) {
	t.Helper()
	for _, d := range []string{filepath.Join(dir, "data", "sandboxes"), filepath.Join(dir, "run")} {
		ents, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			// .agent holds the backend's copy of the agent binary,
			// .spawner.log the spawner's log and .root is the empty
			// directory agents mount their root on, shared by every
			// sandbox and every run: not a sandbox's state; .removed is
			// where removed sandboxes' files are deleted.
			switch e.Name() {
			case ".agent", ".spawner.log":
			case ".root":
				if left, _ := os.ReadDir(filepath.Join(d, e.Name())); len(left) > 0 {
					t.Errorf("something left on the host in .root: %v", left)
				}
			case ".removed":
				if left, _ := os.ReadDir(filepath.Join(d, e.Name())); len(left) > 0 {
					t.Errorf("removed sandboxes' files left: %v", left)
				}
			case ".gvisor":
				// The gvisor tier's run directory: its own empty
				// directories and runsc's null-netns file, nothing of
				// a sandbox.
				if left := gvisorRunLeft(filepath.Join(d, e.Name())); len(left) > 0 {
					t.Errorf("left in the gvisor tier's run directory: %v", left)
				}
			default:
				names = append(names, e.Name())
			}
		}
		if len(names) > 0 {
			t.Errorf("left in %s: %v", d, names)
		}
	}
	// No sandbox cgroup under any controller's warren prefix.
	matches, _ := filepath.Glob("/sys/fs/cgroup/pids/warren*/run-*")
	m2, _ := filepath.Glob("/sys/fs/cgroup/memory/*/*/warren*/run-*")
	if len(matches)+len(m2) > 0 {
		t.Errorf("cgroups left: %v %v", matches, m2)
	}
}

func countProcs(name string) int {
	n := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/comm")
		if err == nil && strings.TrimSpace(string(b)) == name[:min(len(name), 15)] {
			n++
		}
	}
	return n
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 15s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestInterruptCleansUp sends SIGINT to `warren run` mid-command: it exits
// 130 and leaves nothing behind.
func TestInterruptCleansUp(t *testing.T) {
	testenv.RequireRoot(t)
	dir := stateDir(t)
	cmd := warren(t, dir, "run", "--", "/bin/sh", "-c", "cp /bin/sleep /tmp/sleep-interrupt; /tmp/sleep-interrupt 600")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool { return countProcs("sleep-interrupt") == 1 })
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Errorf("exit after SIGINT: %v (stderr %q), want 130", err, errb.String())
	}
	if n := countProcs("sleep-interrupt"); n != 0 {
		t.Errorf("%d sandbox processes survived the interrupt", n)
	}
	assertNoSandboxState(t, dir)
}

// TestConcurrentRuns runs several `warren run`s at once on one data
// directory: each reaps orphans at start, and none may take another's
// sandbox for an orphan.
func TestConcurrentRuns(t *testing.T) {
	testenv.RequireRoot(t)
	dir := stateDir(t)
	const n = 6
	errs := make(chan string, n)
	for i := range n {
		// Built here: a Fatal in a goroutine would leave errs unsent.
		cmd := warren(t, dir, "run", "--", "/bin/sh", "-c", fmt.Sprintf("sleep 0.3; echo %d", i))
		go func() {
			r := run(t, cmd, "")
			if r.code != 0 || r.stdout != fmt.Sprintf("%d\n", i) {
				errs <- fmt.Sprintf("run %d: %+v", i, r)
				return
			}
			errs <- ""
		}()
	}
	for range n {
		if e := <-errs; e != "" {
			t.Error(e)
		}
	}
	assertNoSandboxState(t, dir)
}

// TestImageImportAndRun imports a plain rootfs holding one static binary and
// runs it as a sandbox image: the image's own files, not the host's.
func TestImageImportAndRun(t *testing.T) {
	testenv.RequireRoot(t)
	dir := stateDir(t)
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module hello\n\ngo 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	prog := `package main

import (
	"fmt"
	"os"
)

func main() {
	b, err := os.ReadFile("/etc/message")
	_, usr := os.Stat("/usr/bin/python3")
	fmt.Printf("%s %v %v %v\n", b, err, os.IsNotExist(usr), os.Args[1:])
}
`
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	build := exec.Command("go", "build", "-o", filepath.Join(rootfs, "hello"), ".")
	build.Dir, build.Env = src, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	if err := os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "etc", "message"), []byte("from-the-image"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := run(t, warren(t, dir, "image", "import", rootfs, "test/hello"), ""); r.code != 0 {
		t.Fatalf("import: %+v", r)
	}
	r := run(t, warren(t, dir, "image", "ls"), "")
	if r.code != 0 || !strings.Contains(r.stdout, "test/hello") {
		t.Fatalf("ls: %+v", r)
	}
	// The image's files, and none of the host's /usr.
	r = run(t, warren(t, dir, "run", "--image", "test/hello", "--", "/hello", "x"), "")
	if r.code != 0 || r.stdout != "from-the-image <nil> true [x]\n" {
		t.Errorf("run --image: %+v", r)
	}
	if r := run(t, warren(t, dir, "run", "--image", "test/hello"), ""); r.code != 1 || !strings.Contains(r.stderr, "no entrypoint") {
		t.Errorf("run without a command on an image without one: %+v", r)
	}
	if r := run(t, warren(t, dir, "run", "--image", "no/such", "--", "/hello"), ""); r.code != 1 || !strings.Contains(r.stderr, "no/such") {
		t.Errorf("run with an unknown image: %+v", r)
	}
	r = run(t, warren(t, dir, "image", "inspect", "test/hello"), "")
	var insp struct {
		ID     string   `json:"id"`
		Names  []string `json:"names"`
		Layers []struct {
			DiffID string `json:"diff_id"`
			Size   int64  `json:"size"`
		} `json:"layers"`
		UsedBy []string `json:"used_by"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &insp); r.code != 0 || err != nil || len(insp.Names) != 1 || insp.Names[0] != "test/hello" ||
		len(insp.Layers) != 1 || insp.Layers[0].Size <= 0 || !strings.HasPrefix(insp.ID, "sha256:") || len(insp.UsedBy) != 0 {
		t.Errorf("inspect: %+v %v: %+v", r, err, insp)
	}
	if r := run(t, warren(t, dir, "image", "inspect", "no/such"), ""); r.code != 1 || !strings.Contains(r.stderr, "no/such") {
		t.Errorf("inspect of an unknown image: %+v", r)
	}
	// A second name; the short id 'image ls' prints works where a name does.
	if r := run(t, warren(t, dir, "image", "import", rootfs, "test/again"), ""); r.code != 0 || !strings.HasPrefix(r.stdout, "imported test/again (sha256:") {
		t.Fatalf("import again: %+v", r)
	}
	if r := run(t, warren(t, dir, "image", "ls", "-q"), ""); r.code != 0 || r.stdout != "test/again\ntest/hello\n" {
		t.Errorf("ls -q: %+v", r)
	}
	shortID := insp.ID[:19]
	if r := run(t, warren(t, dir, "image", "ls", "--format", "{{.Name}} {{.Layers}} {{.ID}}"), ""); r.code != 0 || r.stdout != "test/again 1 "+insp.ID+"\ntest/hello 1 "+insp.ID+"\n" {
		t.Errorf("ls --format: %+v", r)
	}
	for _, ref := range []string{shortID, strings.TrimPrefix(shortID, "sha256:"), insp.ID} {
		if r := run(t, warren(t, dir, "image", "inspect", ref), ""); r.code != 0 || !strings.Contains(r.stdout, `"test/again"`) {
			t.Errorf("inspect %s: %+v", ref, r)
		}
	}
	if r := run(t, warren(t, dir, "image", "rm", shortID), ""); r.code != 1 || !strings.Contains(r.stderr, "has 2 names (test/again, test/hello): remove them by name") {
		t.Errorf("rm by id of an image with two names: %+v", r)
	}
	if r := run(t, warren(t, dir, "image", "rm", "test/again"), ""); r.code != 0 || r.stdout != "removed test/again\n" {
		t.Fatalf("rm: %+v", r)
	}
	if r := run(t, warren(t, dir, "image", "rm", shortID), ""); r.code != 0 || !strings.HasPrefix(r.stdout, "removed test/hello\nimage "+shortID+" has no name left") {
		t.Fatalf("rm by short id: %+v", r)
	}
	if r := run(t, warren(t, dir, "image", "inspect", "sha256:00000000"), ""); r.code != 1 || !strings.Contains(r.stderr, "image not found") {
		t.Errorf("inspect of a short id no image has: %+v", r)
	}
	// A docker-save tarball names its image (RepoTags).
	img, err := random.Image(1024, 1)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag("test/tagged:v2")
	if err != nil {
		t.Fatal(err)
	}
	tarPath := filepath.Join(t.TempDir(), "saved.tar")
	if err := tarball.WriteToFile(tarPath, tag, img); err != nil {
		t.Fatal(err)
	}
	if r := run(t, warren(t, dir, "image", "import", tarPath), ""); r.code != 0 || !strings.HasPrefix(r.stdout, "imported test/tagged:v2 (") {
		t.Errorf("import without a name: %+v", r)
	}
	if r := run(t, warren(t, dir, "image", "import", rootfs), ""); r.code != 1 || !strings.Contains(r.stderr, "no RepoTags") {
		t.Errorf("import of a root file system without a name: %+v", r)
	}
	if r := run(t, warren(t, dir, "image", "rm", "test/tagged:v2"), ""); r.code != 0 {
		t.Fatalf("rm: %+v", r)
	}
	r = run(t, warren(t, dir, "image", "prune"), "")
	if r.code != 0 || !strings.Contains(r.stdout, "freed") {
		t.Errorf("prune: %+v", r)
	}
	assertNoSandboxState(t, dir)
}

func TestImagePullFromRegistry(t *testing.T) {
	testenv.RequireRoot(t)
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	img, err := random.Image(4096, 2)
	if err != nil {
		t.Fatal(err)
	}
	ref := strings.TrimPrefix(srv.URL, "http://") + "/test/random:v1"
	parsed, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(parsed, img); err != nil {
		t.Fatal(err)
	}
	dir := stateDir(t)
	r := run(t, warren(t, dir, "image", "pull", ref, "test/pulled"), "")
	if r.code != 0 || !strings.Contains(r.stdout, "pulled test/pulled") ||
		strings.Count(r.stderr, " done (") != 2 || !strings.Contains(r.stderr, "fetched 2/2 layers") {
		t.Fatalf("pull: %+v", r)
	}
	r = run(t, warren(t, dir, "image", "ls"), "")
	if r.code != 0 || !strings.Contains(r.stdout, "test/pulled") {
		t.Fatalf("ls: %+v", r)
	}
	// Again: nothing to fetch.
	r = run(t, warren(t, dir, "image", "pull", ref, "test/pulled"), "")
	if r.code != 0 || r.stderr != "every layer already in the store\n" {
		t.Errorf("second pull: %+v", r)
	}
	r = run(t, warren(t, dir, "image", "pull", "--insecure", "--platform", "linux/"+runtime.GOARCH, ref), "")
	if r.code != 0 || !strings.Contains(r.stdout, "pulled "+ref) {
		t.Errorf("pull with flags, default name: %+v", r)
	}
	r = run(t, warren(t, dir, "image", "ls"), "")
	if r.code != 0 || !strings.Contains(r.stdout, ref) {
		t.Fatalf("ls: %+v", r)
	}
	if r := run(t, warren(t, dir, "image", "pull", strings.TrimSuffix(ref, "v1")+"nope"), ""); r.code == 0 || !strings.Contains(r.stderr, "not found") || strings.Contains(r.stderr, "fetched") {
		t.Errorf("pull of a missing tag: %+v", r)
	}
}
