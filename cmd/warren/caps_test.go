package main

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/oci"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// TestServeCaps: issue 18's finding 5 through the API. A namespace key's
// sandbox.start asking for 1 TiB and 256 CPUs is refused (400,
// invalid_params) by the caps warren serve derives from the host, and
// --pids and --open-files are what a real sandbox's processes get: the
// kernel refuses the fork and the open beyond them.
func TestServeCaps(t *testing.T) {
	testenv.RequireRoot(t)
	dir := stateDir(t)
	create := run(t, warren(t, dir, "key", "create", "--namespace", "team", "--expire", "1d"), "")
	if create.code != 0 {
		t.Fatalf("key create: %+v", create)
	}
	key := strings.TrimSpace(create.stdout)
	url, srv, stderr := startServe(t, dir, "--pids", "48", "--open-files", "100")
	running := true
	defer func() {
		if running {
			stopServe(t, srv)
		}
	}()
	call := rpcCaller(t, url, key)
	r := call("sandbox.start", map[string]any{"sandbox": "big", "config": map[string]any{"memory": 1 << 20, "cpus": 256}})
	if r.status != 400 || r.Error == nil || r.Error.Data.Kind != "invalid_params" ||
		!strings.Contains(r.Error.Message, "memory 1048576 MiB is above this server's cap of") ||
		!strings.Contains(r.Error.Message, "cpus 256 is above this server's cap of") {
		t.Fatalf("1 TiB and 256 cpus: %d %+v, want 400, invalid_params naming both caps", r.status, r.Error)
	}
	if r := call("sandbox.start", map[string]any{"sandbox": "box"}); r.status != 200 {
		t.Fatalf("start: %d %+v\n%s", r.status, r.Error, stderr.String())
	}
	removed := false
	defer func() {
		if !removed {
			call("sandbox.remove", map[string]any{"sandbox": "box"})
		}
	}()
	// Opens /dev/null and forks sleepers until the kernel says no; the
	// sleepers close their output so the command ends with the script.
	script := `
import os, time
fds = []
try:
    while len(fds) < 1000:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError as e:
    print(len(fds), e.errno)
for fd in fds:
    os.close(fd)
n = 0
try:
    while n < 1000:
        if os.fork() == 0:
            os.close(1); os.close(2); time.sleep(1); os._exit(0)
        n += 1
except OSError as e:
    print(n, e.errno)
`
	r = call("sandbox.command.run", map[string]any{"sandbox": "box", "command": "python3", "args": []string{"-c", script}, "timeout": 30})
	var out struct {
		Output []struct {
			Text string `json:"text"`
		} `json:"output"`
	}
	if r.status != 200 {
		t.Fatalf("command: %d %+v", r.status, r.Error)
	}
	if err := json.Unmarshal(r.Result, &out); err != nil {
		t.Fatal(err)
	}
	var text string
	for _, o := range out.Output {
		text += o.Text + "\n"
	}
	lines := strings.Fields(text)
	if len(lines) != 4 {
		t.Fatalf("output %q, want two lines of count and errno", text)
	}
	files, _ := strconv.Atoi(lines[0])
	forks, _ := strconv.Atoi(lines[2])
	// EMFILE below 100 descriptors, less those python holds; EAGAIN below
	// 48 tasks, less the agent's own and python's.
	if lines[1] != "24" || files >= 100 || files < 80 {
		t.Errorf("opened %d files, then errno %s: want EMFILE (24) a little below --open-files 100", files, lines[1])
	}
	if lines[3] != "11" || forks >= 48 || forks < 20 {
		t.Errorf("forked %d, then errno %s: want EAGAIN (11) below --pids 48", forks, lines[3])
	}
	// The Python REPL keeps its pipes high, where a limit of 100 allows
	// none at 100 or above. (After the script's sleepers have gone.)
	time.Sleep(1500 * time.Millisecond)
	r = call("sandbox.repl.run", map[string]any{"sandbox": "box", "language": "python", "code": "print(6*7)"})
	if r.status != 200 || !strings.Contains(string(r.Result), "42") {
		t.Errorf("repl under --open-files 100: %d %+v %s", r.status, r.Error, r.Result)
	}
	if r := call("sandbox.remove", map[string]any{"sandbox": "box"}); r.status != 200 {
		t.Fatalf("remove: %d %+v", r.status, r.Error)
	}
	removed = true
	stopServe(t, srv)
	running = false
	// The server said (read once it has stopped writing) whether the
	// host's fs.file-max is too low for the files its sandboxes' memory
	// can hold mapped.
	host, err := sandbox.ReadHost()
	if err != nil {
		t.Fatal(err)
	}
	if warned := strings.Contains(stderr.String(), "raise it with sysctl -w fs.file-max="); warned != (host.FileMax < host.FileMaxNeeded()) {
		t.Errorf("fs.file-max %d, %d needed: warned %v", host.FileMax, host.FileMaxNeeded(), warned)
	}
}

// TestAdmissionFlags: the caps and the capacity follow the flags, "auto"
// the host; a flag out of range is refused, naming it.
func TestAdmissionFlags(t *testing.T) {
	h := sandbox.Host{MemoryBytes: 8 << 30, CPUs: 4, Pids: 32768, Ptys: 3072, FileMax: 1 << 22, NrOpen: 1 << 20}
	c := serveConfig{maxMemory: "auto", maxCPUs: "auto", pids: "1024", openFiles: "auto", cpuOvercommit: "8"}
	l, capacity, err := c.admission(h)
	if err != nil {
		t.Fatal(err)
	}
	if l != h.Limits() || capacity != h.Capacity(8) {
		t.Errorf("auto: %+v %+v, want the host's %+v %+v", l, capacity, h.Limits(), h.Capacity(8))
	}
	c = serveConfig{maxMemory: "2G", maxCPUs: "1.5", pids: "256", openFiles: "4096", cpuOvercommit: "2"}
	l, capacity, err = c.admission(h)
	if err != nil {
		t.Fatal(err)
	}
	if want := (sandbox.Limits{MaxMemoryMiB: 2048, MaxCPUs: 1.5, Pids: 256, OpenFiles: 4096}); l != want || capacity.CPUs != 8 {
		t.Errorf("set: %+v, cpus %v; want %+v, cpus 8", l, capacity.CPUs, want)
	}
	c = serveConfig{maxMemory: "1K", maxCPUs: "0", pids: "40000", openFiles: "2000000", cpuOvercommit: "0"}
	_, _, err = c.admission(h)
	for _, flag := range []string{"--max-memory", "--max-cpus", "--pids", "--open-files", "--cpu-overcommit"} {
		if err == nil || !strings.Contains(err.Error(), flag+" ") {
			t.Errorf("error %v does not name %s", err, flag)
		}
	}
}

// TestServeRaisesFileMax: finding 10 at its cause. A server on a host
// whose fs.file-max is below what all its memory could hold open as files
// raises it at start, logging both values; with --keep-file-max it keeps
// it and warns. The test restores the host's value, and only ever sets one
// above what is open now (need-1 is far above the files of any host).
func TestServeRaisesFileMax(t *testing.T) {
	testenv.RequireRoot(t)
	orig := fileMax(t)
	t.Cleanup(func() {
		if err := sandbox.SetFileMax(orig); err != nil {
			t.Errorf("restore fs.file-max %d: %v", orig, err)
		}
	})
	host, err := sandbox.ReadHost()
	if err != nil {
		t.Fatal(err)
	}
	need := host.FileMaxNeeded()
	low := min(orig, need-1)
	for _, keep := range []bool{true, false} {
		if err := sandbox.SetFileMax(low); err != nil {
			t.Fatal(err)
		}
		dir := stateDir(t)
		_, srv, stderr := startServe(t, dir, "--keep-file-max="+strconv.FormatBool(keep))
		stopServe(t, srv)
		log := stderr.String()
		got := fileMax(t)
		raised := strings.Contains(log, `"msg":"raised fs.file-max to what sandboxes' memory can hold open","old":`+strconv.FormatInt(low, 10)+`,"new":`+strconv.FormatInt(need, 10))
		warned := strings.Contains(log, "raise it with sysctl -w fs.file-max="+strconv.FormatInt(need, 10))
		switch {
		case keep && (got != low || raised || !warned):
			t.Errorf("--keep-file-max: fs.file-max %d -> %d, raised %v, warned %v\n%s", low, got, raised, warned, log)
		case !keep && (got != need || !raised || warned):
			t.Errorf("fs.file-max %d -> %d (want %d), raised %v, warned %v\n%s", low, got, need, raised, warned, log)
		}
	}
}

func fileMax(t *testing.T) int64 { return readProcInt(t, "/proc/sys/fs/file-max") }

// TestServeRaisesKernelLimits: a server whose --max-running sandboxes'
// terminals and pids do not fit kernel.pty.max and kernel.pid_max raises
// them at start (the boot defaults hold 168 and 179 sandboxes of 32 pids,
// and admission would refuse starts on them long before --max-running);
// with --keep-kernel-limits it keeps them and warns. The test restores the
// host's values.
func TestServeRaisesKernelLimits(t *testing.T) {
	testenv.RequireRoot(t)
	for _, p := range []string{"/proc/sys/kernel/pty/max", "/proc/sys/kernel/pid_max"} {
		orig := readProcInt(t, p)
		t.Cleanup(func() {
			if err := os.WriteFile(p, []byte(strconv.FormatInt(orig, 10)), 0); err != nil {
				t.Errorf("restore %s %d: %v", p, orig, err)
			}
		})
	}
	const running, pids = 300, 64
	wantPtys := sandbox.PtysNeeded(running) + readProcInt(t, "/proc/sys/kernel/pty/reserve")
	wantPids := sandbox.PidsNeeded(running, pids)
	if tm := readProcInt(t, "/proc/sys/kernel/threads-max"); tm < wantPids {
		t.Fatalf("kernel.threads-max %d is below the %d pids this test asks for", tm, wantPids)
	}
	for _, keep := range []bool{true, false} {
		if err := os.WriteFile("/proc/sys/kernel/pty/max", []byte("4096"), 0); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile("/proc/sys/kernel/pid_max", []byte("32768"), 0); err != nil {
			t.Fatal(err)
		}
		dir := stateDir(t)
		_, srv, stderr := startServe(t, dir, "--max-running", strconv.Itoa(running), "--pids", strconv.Itoa(pids), "--keep-kernel-limits="+strconv.FormatBool(keep))
		stopServe(t, srv)
		log := stderr.String()
		gotPtys, gotPids := readProcInt(t, "/proc/sys/kernel/pty/max"), readProcInt(t, "/proc/sys/kernel/pid_max")
		raised := strings.Contains(log, `"msg":"raised kernel.pty.max to what --max-running sandboxes' terminals need","max_running":300,"new":`+strconv.FormatInt(wantPtys, 10)) &&
			strings.Contains(log, `"msg":"raised kernel.pid_max to what --max-running sandboxes' pids need","max_running":300,"pids":64,"new":`+strconv.FormatInt(wantPids, 10))
		warned := strings.Contains(log, "--keep-kernel-limits is set")
		switch {
		case keep && (gotPtys != 4096 || gotPids != 32768 || raised || !warned):
			t.Errorf("--keep-kernel-limits: kernel.pty.max 4096 -> %d, pid_max 32768 -> %d, raised %v, warned %v\n%s", gotPtys, gotPids, raised, warned, log)
		case !keep && (gotPtys != wantPtys || gotPids != wantPids || !raised || warned):
			t.Errorf("kernel.pty.max 4096 -> %d (want %d), pid_max 32768 -> %d (want %d), raised %v, warned %v\n%s", gotPtys, wantPtys, gotPids, wantPids, raised, warned, log)
		}
	}
	// What was raised holds --max-running sandboxes with the host's eighth.
	host, err := sandbox.ReadHost()
	if err != nil {
		t.Fatal(err)
	}
	c := host.Capacity(1)
	if n := int64(running * oci.MaxPtys); c.Ptys < n || c.Ptys > n+oci.MaxPtys {
		t.Errorf("pty capacity after the raise %d, want %d (one sandbox's worth of slack at most)", c.Ptys, n)
	}
	if n := int64(running * (pids + backend.AgentPids)); c.Pids < n || c.Pids > n+pids+backend.AgentPids {
		t.Errorf("pid capacity after the raise %d, want %d (one sandbox's worth of slack at most)", c.Pids, n)
	}
}

func readProcInt(t *testing.T, p string) int64 {
	t.Helper()
	b, err := os.ReadFile(p) //nolint:gosec // fixed files under /proc/sys
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
