package hostile

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

// An attempt is one attack. run reports whether it was contained and why
// (or what got through). finding is the issue #18 finding it replays ("" for
// the classes the review found contained).
type attempt struct {
	class, name, finding string
	run                  func(a *arena) (contained bool, why string)
}

func (at attempt) id() string { return at.class + "/" + at.name }

// ciAttempts is what a plain `go test` (so `make test`) runs: every attempt
// CONTAINED on main, cheap enough for CI. `make test-hostile` runs
// every attempt. Add an attempt's id here once its finding is fixed.
var ciAttempts = []string{
	"socket/vsock",
	"pty/exhaust",
	"tar/upload-cut-by-stop",
	"ns/unshare-mount-setns-clone",
	"socket/raw-packet",
	"ptrace/agent",
	"exe/proc-self-exe-overwrite",
	"exe/proc-root-escape",
	"loopback/host-services",
	"image/abs-and-dotdot-paths",
	"image/symlink-then-file",
	"image/hardlink-outside",
	"image/device-node",
	"image/huge-header",
	"fileapi/path-traversal",
	"fileapi/tar-traversal",
	"keys/namespace-confusion",
	"keys/forged-tokens",
	"slow/slowloris-headers",
	"slow/slow-body",
	"slow/websocket-never-reads",
	"huge/long-path",
	// Within the victims' bound since bulk requests take turns (rpc's
	// fair.go); huge/param-strings and output/control-bytes-x4 since the
	// agent client's decoding and the escaping take less CPU: the victims'
	// p99 while they run is no higher than other attempts' (docs/security.md).
	"huge/body-over-limit",
	"huge/deep-json",
	"huge/param-strings",
	"limits/fork-bomb",
	// Contained since the fixes of findings 2, 5, 7, 8, 10, 11 and 12 merged.
	"leak/inherited-fds",
	"leak/kernel-info",
	"leak/data-dir-path",
	"image/setuid-layer",
	"setuid/upper-layer",
	"limits/memory-cpus-asked",
	"limits/inotify-vs-host-root",
	"ids/uid-shared-with-another-sandbox",
	"limits/signals-to-pid1",
	"limits/pids-admission",
	"limits/file-table",
	// Back since the agent's threads have a pids budget of their own: its
	// probe, which forks until the sandbox's pids run out, could end the
	// probing sandbox's agent before.
	"limits/open-files-admission",
	// Contained since namespace quotas and disk limits (issue 20).
	"limits/fairness",
	"limits/disk-fill",
	"output/control-bytes-x4",
}

// arena is what attempts share: the server, the attacker's standing
// sandbox, a host canary file no sandbox may read or create.
type arena struct {
	t       *testing.T
	s       *server
	v       *victims // the victims, for attempts that report their latency by step
	box     string   // the attacker's sandbox in nsAttacker
	canary  string   // a host file outside every sandbox
	secret  string   // its content
	probeMu sync.Mutex
	probe   *grants

	floodOnce sync.Once
	floodRes  *floodResult
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// hostPath is a fresh name in the host's /tmp (outside every sandbox) for a
// file an attack tries to create; it is removed at the end either way.
func (a *arena) hostPath(tag string) string {
	p := filepath.Join(os.TempDir(), "warren-hostile-"+tag+"-"+randHex(6))
	a.t.Cleanup(func() { _ = os.Remove(p) })
	return p
}

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

// attempts is every attempt, in the order they run.
func attempts() []attempt {
	return []attempt{
		{"socket", "vsock", "3", vsock},
		{"pty", "exhaust", "9", ptyExhaust},
		{"leak", "inherited-fds", "12", inheritedFDs},
		{"leak", "kernel-info", "12", kernelInfo},
		{"leak", "data-dir-path", "12", dataDirPath},
		{"tar", "upload-cut-by-stop", "13", tarCutByStop},
		{"ns", "unshare-mount-setns-clone", "", nsSyscalls},
		{"socket", "raw-packet", "", rawSockets},
		{"ptrace", "agent", "", ptraceAgent},
		{"exe", "proc-self-exe-overwrite", "", procSelfExe},
		{"exe", "proc-root-escape", "", procRootEscape},
		{"loopback", "host-services", "", hostLoopback},
		{"image", "abs-and-dotdot-paths", "", imageAbsDotdot},
		{"image", "symlink-then-file", "", imageSymlink},
		{"image", "hardlink-outside", "", imageHardlink},
		{"image", "device-node", "", imageDevice},
		{"image", "huge-header", "", imageHugeHeader},
		{"image", "setuid-layer", "2", imageSetuid},
		{"setuid", "upper-layer", "2", setuidUpper},
		{"fileapi", "path-traversal", "", fileAPITraversal},
		{"fileapi", "tar-traversal", "", tarTraversal},
		{"keys", "namespace-confusion", "", namespaceConfusion},
		{"keys", "forged-tokens", "", forgedTokens},
		{"slow", "slowloris-headers", "", slowlorisHeaders},
		{"slow", "slow-body", "", slowBody},
		{"slow", "websocket-never-reads", "", wsNeverReads},
		{"huge", "body-over-limit", "", bodyOverLimit},
		{"huge", "deep-json", "", deepJSON},
		{"huge", "param-strings", "", hugeParams},
		{"huge", "long-path", "", longPath},
		{"limits", "fork-bomb", "7", forkBomb},
		{"limits", "memory-cpus-asked", "5", askForEverything},
		{"limits", "inotify-vs-host-root", "8", inotifyHostRoot},
		{"ids", "uid-shared-with-another-sandbox", "2", sharedUID},
		{"limits", "signals-to-pid1", "11", signalsPID1},
		{"limits", "pids-admission", "7", pidsAdmission},
		{"limits", "open-files-admission", "10", filesAdmission},
		{"limits", "file-table", "10", fileTable},
		{"limits", "fairness", "6", fairness},
		{"limits", "disk-fill", "4", diskFill},
		// Last: it leaves the server's heap large, which would hide
		// the growth the other attempts measure.
		{"output", "control-bytes-x4", "1", outputControlBytes},
	}
}

// --- helpers --------------------------------------------------------------

// py runs prog in the attacker's standing sandbox; an API error is a
// broken harness, not an answer.
func (a *arena) py(prog string) string {
	a.t.Helper()
	r, err := a.s.python(a.s.attacker, nsAttacker, a.box, prog, 120)
	if err != nil || r.ExitCode != 0 {
		a.t.Fatalf("the attack program failed (a harness error, neither verdict): %v exit %d: %s %s", err, r.ExitCode, r.Stdout, r.Stderr)
	}
	return strings.TrimSpace(r.Stdout)
}

// fresh starts a sandbox for one attempt and removes it when it ends.
func (a *arena) fresh(name string, extra map[string]any) {
	a.t.Helper()
	if err := a.s.create(a.s.attacker, nsAttacker, name, extra); err != nil {
		a.t.Fatalf("create %s: %v", name, err)
	}
	a.t.Cleanup(func() {
		if err := a.s.remove(a.s.attacker, nsAttacker, name); err != nil {
			a.t.Errorf("remove %s: %v", name, err)
		}
	})
}

// growth runs f and returns how far the server's RSS rose above where it
// was before, at its peak during f.
func (a *arena) growth(f func()) int64 {
	before := a.s.rss.now()
	a.s.rss.window()
	f()
	return a.s.rss.windowPeak() - before
}

const mib = 1 << 20

// ptyHold is a background process that opens ptys, fds or inotify
// instances until the kernel says no, prints how many, and holds them.
func (a *arena) hold(box, prog string) (id, first string) {
	a.t.Helper()
	var p struct {
		ID string `json:"id"`
	}
	if err := a.s.call(a.s.attacker, "sandbox.process.start", map[string]any{"sandbox": box, "namespace": nsAttacker,
		"argv": []string{"python3", "-c", prog}}, &p); err != nil {
		a.t.Fatalf("process.start: %v", err)
	}
	var out struct {
		Data string `json:"data"`
	}
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(out.Data, "\n") && time.Now().Before(deadline) {
		if err := a.s.call(a.s.attacker, "sandbox.process.output", map[string]any{"sandbox": box, "namespace": nsAttacker,
			"id": p.ID, "wait": 10}, &out); err != nil {
			a.t.Fatalf("process.output: %v", err)
		}
	}
	return p.ID, strings.TrimSpace(out.Data)
}

func (a *arena) release(box, id string) {
	if err := a.s.call(a.s.attacker, "sandbox.process.remove", map[string]any{"sandbox": box, "namespace": nsAttacker, "id": id}, nil); err != nil {
		a.t.Errorf("process.remove: %v", err)
	}
}

// --- finding 1: output ------------------------------------------------------

// outputLimit is the output_limit of the output attempt: the largest
// sandbox.exec takes, 64 MiB; 16 MiB in the CI subset, whose victims'
// latency would otherwise ride on 1.5 GB of JSON escaping on two cores.
func outputLimit() int {
	if *all {
		return 64 * mib
	}
	return 16 * mib
}

// outputBound is what four concurrent answers of control bytes may add to
// the server's RSS: 4 × 6 × output_limit, the per-call bound the rpc tests
// hold the heap to (the review's build held 7.4 GB for 4 × 64 MiB).
func outputBound() int64 { return int64(4 * 6 * outputLimit()) }

func outputControlBytes(a *arena) (bool, string) {
	var failed atomic.Value
	limit := outputLimit()
	grew := a.growth(func() {
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "sandbox.exec", "params": map[string]any{
					"sandbox": a.box, "namespace": nsAttacker, "output_limit": limit,
					"argv": []string{"sh", "-c", "head -c " + strconv.Itoa(limit) + " /dev/zero | tr '\\0' '\\1'"}}})
				req, _ := http.NewRequest("POST", a.s.url+"/api/v1/rpc", bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+a.s.attacker)
				resp, err := a.s.client.Do(req)
				if err != nil {
					failed.Store(err.Error())
					return
				}
				n, err := io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if err != nil || resp.StatusCode != 200 || n < int64(6*limit) {
					failed.Store(fmt.Sprintf("answer %d, %d bytes, %v", resp.StatusCode, n, err))
				}
			}()
		}
		wg.Wait()
	})
	if f := failed.Load(); f != nil {
		return false, "an answer failed: " + f.(string)
	}
	why := fmt.Sprintf("4 concurrent answers of %d MiB of control bytes (%d MB each in JSON) grew the server by %d MiB (bound %d MiB)", limit/mib, 6*limit/1e6, grew/mib, outputBound()/mib)
	return grew <= outputBound(), why
}

// --- finding 3, 9, 12: the kernel's shared spaces and leaks ----------------

func vsock(a *arena) (bool, string) {
	out := a.py(`
import socket, errno
try:
    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
except OSError as e:
    print("refused", errno.errorcode.get(e.errno, e.errno)); raise SystemExit
try:
    s.bind((socket.VMADDR_CID_ANY, 47123)); print("created and bound port 47123")
except OSError as e:
    print("created (bind:", e, ")")
`)
	return strings.HasPrefix(out, "refused"), "socket(AF_VSOCK): " + out
}

func ptyExhaust(a *arena) (bool, string) {
	id, held := a.hold(a.box, `
import os, time
fds = []
try:
    while len(fds) < 100000:
        fds.append(os.openpty())
except OSError as e:
    print("held", len(fds), "ptys:", e.strerror, flush=True)
time.sleep(120)
`)
	defer a.release(a.box, id)
	r, err := a.s.python(a.s.victim, nsVictim, victimNames[0], "import os; os.openpty(); print('ok')", 30)
	if err != nil || strings.TrimSpace(r.Stdout) != "ok" {
		return false, fmt.Sprintf("attacker %s; then a victim's openpty failed: %v %s", held, err, r.Stderr)
	}
	return true, "attacker " + held + "; a victim's openpty still works"
}

func inheritedFDs(a *arena) (bool, string) {
	out := a.py(`
import os
d = os.listdir('/proc/self/fd')
extra = []
for f in d:
    if int(f) < 3: continue
    try: extra.append(f + "->" + os.readlink('/proc/self/fd/' + f))
    except OSError: pass
print(" ".join(extra))
`)
	if out != "" {
		return false, "a sandbox process holds descriptors beyond 0-2: " + out
	}
	return true, "a sandbox process holds only descriptors 0-2"
}

func kernelInfo(a *arena) (bool, string) {
	out := a.py(`
for p in ["/proc/cmdline", "/proc/config.gz", "/sys/kernel/vmcoreinfo"]:
    try:
        with open(p, "rb") as f: b = f.read(4096)
        if b: print(p, "readable:", len(b), "bytes")
    except OSError as e:
        pass
`)
	if out != "" {
		return false, strings.ReplaceAll(out, "\n", "; ")
	}
	return true, "/proc/cmdline, /proc/config.gz, /sys/kernel/vmcoreinfo unreadable"
}

func dataDirPath(a *arena) (bool, string) {
	out := a.py(`print(open("/proc/self/mountinfo").read())`)
	if strings.Contains(out, a.s.data) {
		return false, "the host's data directory path is in the sandbox's mountinfo"
	}
	return true, "mountinfo does not name the host's data directory"
}

// --- finding 13 -------------------------------------------------------------

func tarCutByStop(a *arena) (bool, string) {
	a.fresh("tarcut", nil)
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("PUT", a.s.url+"/api/v1/sandboxes/"+nsAttacker+"/tarcut/tar?path=/tmp", pr)
	req.Header.Set("Authorization", "Bearer "+a.s.attacker)
	type answer struct {
		status int
		body   string
		err    error
	}
	ans := make(chan answer, 1)
	go func() {
		resp, err := a.s.client.Do(req)
		if err != nil {
			ans <- answer{err: err}
			return
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		_ = resp.Body.Close()
		ans <- answer{status: resp.StatusCode, body: string(b)}
	}()
	tw := tar.NewWriter(pw)
	_ = tw.WriteHeader(&tar.Header{Name: "big", Mode: 0o644, Size: 512 * mib, Typeflag: tar.TypeReg})
	chunk := make([]byte, mib)
	for range 8 {
		_, _ = tw.Write(chunk)
	}
	stopped := make(chan error, 1)
	go func() {
		stopped <- a.s.call(a.s.attacker, "sandbox.stop", map[string]any{"sandbox": "tarcut", "namespace": nsAttacker}, nil)
	}()
	// Keep the body coming until the answer arrives or the stop is done.
	var got answer
	feeding := true
	for feeding {
		select {
		case got = <-ans:
			feeding = false
		default:
			if _, err := tw.Write(chunk); err != nil {
				got = <-ans
				feeding = false
			}
		}
	}
	_ = pw.CloseWithError(errors.New("cut"))
	if err := <-stopped; err != nil {
		return false, "stop: " + err.Error()
	}
	if got.err != nil {
		return false, "upload: " + got.err.Error()
	}
	if got.status == http.StatusConflict && strings.Contains(got.body, `"conflict"`) {
		return true, "the upload cut by a stop answered 409 conflict"
	}
	return false, fmt.Sprintf("the upload cut by a stop answered %d %.200s", got.status, got.body)
}

// --- namespace, mount, socket, ptrace, exe: from inside ---------------------

func nsSyscalls(a *arena) (bool, string) {
	out := a.py(`
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
res = {}
def t(name, r):
    e = ctypes.get_errno()
    res[name] = "ALLOWED" if r >= 0 else errno.errorcode.get(e, str(e))
for name, flag in [("user", 0x10000000), ("mnt", 0x20000), ("net", 0x40000000), ("pid", 0x20000000), ("uts", 0x4000000), ("ipc", 0x8000000), ("cgroup", 0x2000000)]:
    t("unshare-" + name, libc.unshare(flag))
t("mount-tmpfs", libc.mount(b"none", b"/mnt", b"tmpfs", 0, None))
t("mount-bind-proc", libc.mount(b"/proc", b"/mnt", None, 0x1000, None))
t("remount-root-rw", libc.mount(None, b"/", None, 0x20 | 0x1000, None))
t("umount-proc-sys", libc.umount2(b"/proc/sys", 2))
for p in ["/proc/1/ns/mnt", "/proc/self/ns/mnt", "/proc/self/ns/net"]:
    try:
        fd = os.open(p, os.O_RDONLY)
    except OSError as e:
        res["open-" + p] = errno.errorcode.get(e.errno, str(e.errno)); continue
    t("setns-" + p, libc.setns(fd, 0))
t("fsopen", libc.syscall(430, b"tmpfs", 0))
t("open_tree", libc.syscall(428, -100, b"/", 1))
t("pivot_root", libc.syscall(155, b"/", b"/"))
for name, flag in [("user", 0x10000000), ("mnt", 0x20000), ("net", 0x40000000)]:
    r = libc.syscall(56, flag | 17, 0, 0, 0, 0)
    if r == 0: os._exit(0)
    if r > 0: os.waitpid(r, 0)
    t("clone-new" + name, r)
print(" ".join(k + "=" + v for k, v in res.items()))
`)
	return !strings.Contains(out, "ALLOWED"), out
}

func rawSockets(a *arena) (bool, string) {
	out := a.py(`
import socket, errno, os
res = []
for name, args in [("packet", (socket.AF_PACKET, socket.SOCK_RAW, 0x0300)), ("inet-raw", (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)), ("inet6-raw", (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6))]:
    try:
        socket.socket(*args); res.append(name + "=ALLOWED")
    except OSError as e:
        res.append(name + "=" + errno.errorcode.get(e.errno, str(e.errno)))
print(" ".join(res), "interfaces:", ",".join(sorted(os.listdir("/sys/class/net"))))
`)
	return !strings.Contains(out, "ALLOWED"), out
}

func ptraceAgent(a *arena) (bool, string) {
	out := a.py(`
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
res = []
def t(name, r):
    e = ctypes.get_errno()
    res.append(name + "=" + ("ALLOWED" if r >= 0 else errno.errorcode.get(e, str(e))))
t("ptrace-attach-1", libc.ptrace(16, 1, 0, 0))
t("ptrace-seize-1", libc.ptrace(0x4206, 1, 0, 0))
for p in ["/proc/1/mem", "/proc/1/environ"]:
    try:
        with open(p, "rb") as f: f.read(1); res.append(p + "=ALLOWED")
    except OSError as e: res.append(p + "=" + errno.errorcode.get(e.errno, ""))
buf = ctypes.create_string_buffer(8)
class iov(ctypes.Structure): _fields_ = [("b", ctypes.c_void_p), ("l", ctypes.c_size_t)]
l = iov(ctypes.addressof(buf), 8); r = iov(0x400000, 8)
t("process_vm_readv-1", libc.process_vm_readv(1, ctypes.byref(l), 1, ctypes.byref(r), 1, 0))
print(" ".join(res))
`)
	return !strings.Contains(out, "ALLOWED"), out
}

func procSelfExe(a *arena) (bool, string) {
	agents, _ := filepath.Glob(filepath.Join(a.s.run, ".agent", "*"))
	sums := map[string][]byte{}
	for _, p := range agents {
		b, _ := os.ReadFile(p)
		sums[p] = b
	}
	out := a.py(`
import os, errno
res = []
for p in ["/proc/1/exe", "/proc/self/exe"]:
    try:
        fd = os.open(p, os.O_WRONLY | os.O_APPEND); os.write(fd, b"#"); res.append(p + "=WRITTEN")
    except OSError as e: res.append(p + "=" + errno.errorcode.get(e.errno, ""))
for p in ["/proc/1/exe", "/proc/self/exe"]:
    try:
        fd = os.open(p, os.O_PATH)
        w = os.open("/proc/self/fd/%d" % fd, os.O_WRONLY | os.O_APPEND); os.write(w, b"#"); res.append("reopen-O_PATH-" + p + "=WRITTEN")
    except OSError as e: res.append("reopen-O_PATH-" + p + "=" + errno.errorcode.get(e.errno, ""))
print(" ".join(res))
`)
	for p, b := range sums {
		if now, _ := os.ReadFile(p); !bytes.Equal(now, b) {
			return false, "the host's agent binary changed: " + out
		}
	}
	return !strings.Contains(out, "WRITTEN"), out + "; the host's agent binary is unchanged"
}

func procRootEscape(a *arena) (bool, string) {
	base := filepath.Base(a.canary)
	out := a.py(fmt.Sprintf(`
import glob
found = []
for p in ["/proc/1/root/../../../../tmp/%[1]s", "/proc/self/root/../../tmp/%[1]s", "/proc/1/cwd/../../../tmp/%[1]s", "/../../../tmp/%[1]s"] + [g + "/../../../tmp/%[1]s" for g in glob.glob("/proc/*/root")]:
    try:
        found.append(p + ": " + open(p).read())
    except OSError: pass
print(" ".join(found))
`, base))
	if strings.Contains(out, a.secret) {
		return false, "read the host canary: " + out
	}
	return true, "the host canary is unreachable through /proc/*/root, /proc/1/cwd and .."
}

// --- host loopback ------------------------------------------------------------

func hostLoopback(a *arena) (bool, string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		a.t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			_ = c.Close()
		}
	}()
	targets := []string{ln.Addr().String(), strings.TrimPrefix(a.s.url, "http://")}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, ad := range addrs {
			if ip, ok := ad.(*net.IPNet); ok && ip.IP.To4() != nil && !ip.IP.IsLoopback() {
				_, port, _ := net.SplitHostPort(ln.Addr().String())
				targets = append(targets, net.JoinHostPort(ip.IP.String(), port))
				break
			}
		}
	}
	js, _ := json.Marshal(targets)
	out := a.py(fmt.Sprintf(`
import socket, json
res = []
for t in json.loads(%q):
    h, p = t.rsplit(":", 1)
    try:
        s = socket.create_connection((h, int(p)), timeout=3)
    except OSError as e:
        res.append(t + "=" + type(e).__name__); continue
    # Connected: to the service, or to Warren's egress proxy, which takes
    # every TCP connection of a sandbox with a network and resets one it
    # refuses. What matters is whether anything answers.
    try:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n"); d = s.recv(64)
        res.append(t + ("=ANSWERED:" + repr(d) if d else "=CLOSED"))
    except OSError as e: res.append(t + "=connected-then-" + type(e).__name__)
print(" ".join(res))
`, js))
	if accepted.Load() > 0 || strings.Contains(out, "ANSWERED") {
		return false, out
	}
	return true, out + " (the host listener accepted nothing)"
}

// --- crafted image layers, through image.pull ---------------------------------

type entry struct {
	hdr  tar.Header
	data []byte
}

// pull serves an image of one crafted layer from a loopback registry and
// pulls it through the API with the admin key.
func (a *arena) pull(name string, entries []entry) error {
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	for _, e := range entries {
		h := e.hdr
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(&h); err != nil {
			a.t.Fatalf("write crafted header %q: %v", h.Name, err)
		}
		_, _ = tw.Write(e.data)
	}
	_ = tw.Close()
	return a.pullRaw(name, tb.Bytes())
}

// pullRaw is pull with the layer's bytes as given.
func (a *arena) pullRaw(name string, layer []byte) error {
	ref := pushLayer(a.t, name, layer)
	return a.s.call(a.s.admin, "image.pull", map[string]any{"ref": ref, "name": "hostile-" + name}, nil)
}

// storeFiles walks the image store for files named base.
func (a *arena) storeFiles(base string) []string {
	var found []string
	_ = filepath.WalkDir(filepath.Join(a.s.data, "images"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == base {
			found = append(found, p)
		}
		return nil
	})
	return found
}

func pullVerdict(err error) string {
	if err != nil {
		return "pull refused (" + kindOf(err) + ": " + err.Error() + ")"
	}
	return "pull accepted"
}

func imageAbsDotdot(a *arena) (bool, string) {
	abs, dot := a.hostPath("abs"), a.hostPath("dotdot")
	err := a.pull("absdotdot", []entry{
		{tar.Header{Name: abs, Mode: 0o644, Typeflag: tar.TypeReg}, []byte("abs")},
		{tar.Header{Name: "../../../../../../../../.." + dot, Mode: 0o644, Typeflag: tar.TypeReg}, []byte("dot")},
	})
	if exists(abs) || exists(dot) {
		return false, "a layer wrote into the host's /tmp; " + pullVerdict(err)
	}
	return true, pullVerdict(err) + "; nothing written outside the layer"
}

func imageSymlink(a *arena) (bool, string) {
	p1, p2 := a.hostPath("sym"), a.hostPath("sym")
	err := a.pull("symlink", []entry{
		{tar.Header{Name: "esc", Linkname: os.TempDir(), Typeflag: tar.TypeSymlink}, nil},
		{tar.Header{Name: "esc/" + filepath.Base(p1), Mode: 0o644, Typeflag: tar.TypeReg}, []byte("x")},
		{tar.Header{Name: "up", Linkname: "../../../../../../../../.." + os.TempDir(), Typeflag: tar.TypeSymlink}, nil},
		{tar.Header{Name: "up/" + filepath.Base(p2), Mode: 0o644, Typeflag: tar.TypeReg}, []byte("x")},
	})
	if exists(p1) || exists(p2) {
		return false, "a file through a layer's symlink landed in the host's /tmp; " + pullVerdict(err)
	}
	return true, pullVerdict(err) + "; nothing written through the symlinks"
}

func imageHardlink(a *arena) (bool, string) {
	err := a.pull("hardlink", []entry{
		{tar.Header{Name: "hl-shadow", Linkname: "/etc/shadow", Typeflag: tar.TypeLink}, nil},
		{tar.Header{Name: "hl-passwd", Linkname: "../../../../../../../../../etc/passwd", Typeflag: tar.TypeLink}, nil},
	})
	for _, f := range []string{"hl-shadow", "hl-passwd"} {
		for _, p := range a.storeFiles(f) {
			for _, host := range []string{"/etc/shadow", "/etc/passwd"} {
				fi1, e1 := os.Stat(p)
				fi2, e2 := os.Stat(host)
				if e1 == nil && e2 == nil && os.SameFile(fi1, fi2) {
					return false, p + " is a hard link to the host's " + host
				}
			}
		}
	}
	return true, pullVerdict(err) + "; no store file links to the host's /etc"
}

func imageDevice(a *arena) (bool, string) {
	err := a.pull("device", []entry{
		{tar.Header{Name: "dev-mem", Mode: 0o666, Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 1}, nil},
		{tar.Header{Name: "dev-sda", Mode: 0o666, Typeflag: tar.TypeBlock, Devmajor: 8, Devminor: 0}, nil},
	})
	for _, f := range []string{"dev-mem", "dev-sda"} {
		for _, p := range a.storeFiles(f) {
			if fi, err := os.Lstat(p); err == nil && fi.Mode()&fs.ModeDevice != 0 {
				return false, "a device node from a layer is in the store: " + p
			}
		}
	}
	return true, pullVerdict(err) + "; no device node in the store"
}

func imageHugeHeader(a *arena) (bool, string) {
	var err error
	grew := a.growth(func() {
		var l []byte
		// An 8 MiB PAX record, then a 4 MiB GNU long name.
		rec := paxRecord("comment", strings.Repeat("x", 8*mib))
		l = append(l, rawHeader("PaxHeaders/f", 'x', len(rec))...)
		l = append(l, padded([]byte(rec))...)
		l = append(l, rawHeader("f", '0', 1)...)
		l = append(l, padded([]byte("x"))...)
		long := strings.Repeat("n/", 2*mib) + "g"
		l = append(l, rawHeader("././@LongLink", 'L', len(long)+1)...)
		l = append(l, padded([]byte(long+"\x00"))...)
		l = append(l, rawHeader("g", '0', 1)...)
		l = append(l, padded([]byte("x"))...)
		l = append(l, make([]byte, 1024)...)
		err = a.pullRaw("hugeheader", l)
	})
	if !a.s.healthy() {
		return false, "the server is unhealthy after the pull"
	}
	return grew < 256*mib, fmt.Sprintf("%s; the server grew by %d MiB", pullVerdict(err), grew/mib)
}

// suidShell is a host shell copied where an attack wants a setuid binary
// (dash keeps its privileges with -p).
const suidShell = "/usr/bin/dash"

// runAsNobody runs a setuid shell as host user nobody and returns the uid
// it ends up with.
func runAsNobody(path string) (string, error) {
	cmd := exec.Command(path, "-p", "-c", "id -u")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func imageSetuid(a *arena) (bool, string) {
	sh, err := os.ReadFile(suidShell)
	if err != nil {
		a.t.Fatal(err)
	}
	perr := a.pull("setuid", []entry{{tar.Header{Name: "hostile-suid", Mode: 0o4755, Typeflag: tar.TypeReg}, sh}})
	for _, p := range a.storeFiles("hostile-suid") {
		uid, err := runAsNobody(p)
		if err == nil && uid != "65534" {
			return false, fmt.Sprintf("host user nobody ran the layer's setuid shell %s as uid %s", p, uid)
		}
	}
	return true, pullVerdict(perr) + "; no setuid file of a layer runs with privilege from the host"
}

func setuidUpper(a *arena) (bool, string) {
	name := "suid-" + randHex(4)
	if r, err := a.s.shell(a.s.attacker, nsAttacker, a.box, "cp "+suidShell+" /tmp/"+name+" && chmod 4755 /tmp/"+name, 30); err != nil || r.ExitCode != 0 {
		return false, fmt.Sprintf("setup: %v %s", err, r.Stderr)
	}
	found, _ := filepath.Glob(filepath.Join(a.s.data, "sandboxes", "*", "upper", "tmp", name))
	for _, p := range found {
		uid, err := runAsNobody(p)
		if err == nil && uid != "65534" {
			return false, fmt.Sprintf("host user nobody ran the sandbox's setuid shell (upper layer %s) as host uid %s", p, uid)
		}
	}
	return true, fmt.Sprintf("host user nobody cannot run the sandbox's setuid shell with privilege (%d copies found)", len(found))
}

// --- file API and tar traversal -------------------------------------------------

func fileAPITraversal(a *arena) (bool, string) {
	base := filepath.Base(a.canary)
	if r, err := a.s.shell(a.s.attacker, nsAttacker, a.box, "ln -sfn / /tmp/r && ln -sfn /proc/1/root/../../.. /tmp/r2", 30); err != nil || r.ExitCode != 0 {
		return false, fmt.Sprintf("setup: %v %s", err, r.Stderr)
	}
	var leaks []string
	for _, p := range []string{"/../../../../tmp/" + base, "/proc/1/root/../../../tmp/" + base, "/tmp/r/../../tmp/" + base, "/tmp/r2/tmp/" + base} {
		var out struct {
			Data string `json:"data"`
		}
		if err := a.s.call(a.s.attacker, "sandbox.file.read", map[string]any{"sandbox": a.box, "namespace": nsAttacker, "path": p}, &out); err == nil {
			if b, _ := base64.StdEncoding.DecodeString(out.Data); strings.Contains(string(b), a.secret) {
				leaks = append(leaks, "read the host canary through "+p)
			}
		}
	}
	for _, dir := range []string{"/../../../..", "/tmp/r2", "/proc/1/root/../.."} {
		target := a.hostPath("fapi")
		_ = a.s.call(a.s.attacker, "sandbox.file.write", map[string]any{"sandbox": a.box, "namespace": nsAttacker,
			"path": dir + target, "data": base64.StdEncoding.EncodeToString([]byte("pwn"))}, nil)
		if exists(target) {
			leaks = append(leaks, "wrote the host's "+target+" through "+dir)
		}
	}
	if len(leaks) > 0 {
		return false, strings.Join(leaks, "; ")
	}
	return true, "sandbox.file.read/write through .., symlinks and /proc/1/root stay in the sandbox"
}

func tarTraversal(a *arena) (bool, string) {
	base := filepath.Base(a.canary)
	var leaks []string
	// Download: the canary through .. in the path.
	for _, p := range []string{"/../../../../tmp/" + base, "/proc/1/root/../../../tmp/" + base} {
		req, _ := http.NewRequest("GET", a.s.url+"/api/v1/sandboxes/"+nsAttacker+"/"+a.box+"/tar?path="+p, nil)
		req.Header.Set("Authorization", "Bearer "+a.s.attacker)
		if resp, err := a.s.client.Do(req); err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			_ = resp.Body.Close()
			if bytes.Contains(b, []byte(a.secret)) {
				leaks = append(leaks, "downloaded the host canary through "+p)
			}
		}
	}
	// Upload: entries with .., absolute names and a symlink then a file through it.
	dot, sym := a.hostPath("tardot"), a.hostPath("tarsym")
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	for _, h := range []tar.Header{
		{Name: "../../../../../../../.." + dot, Mode: 0o644, Typeflag: tar.TypeReg, Size: 3},
		{Name: "esc", Linkname: "/proc/1/root/../../../../" + os.TempDir(), Typeflag: tar.TypeSymlink},
		{Name: "esc/" + filepath.Base(sym), Mode: 0o644, Typeflag: tar.TypeReg, Size: 3},
		{Name: "hl", Linkname: "/proc/1/root/etc/hostname", Typeflag: tar.TypeLink},
	} {
		_ = tw.WriteHeader(&h)
		if h.Size > 0 {
			_, _ = tw.Write([]byte("pwn"))
		}
	}
	_ = tw.Close()
	for _, dir := range []string{"/tmp", "/../../../tmp"} {
		req, _ := http.NewRequest("PUT", a.s.url+"/api/v1/sandboxes/"+nsAttacker+"/"+a.box+"/tar?path="+dir, bytes.NewReader(tb.Bytes()))
		req.Header.Set("Authorization", "Bearer "+a.s.attacker)
		if resp, err := a.s.client.Do(req); err == nil {
			_ = resp.Body.Close()
		}
	}
	if exists(dot) || exists(sym) {
		leaks = append(leaks, "a tar upload wrote into the host's /tmp")
	}
	if len(leaks) > 0 {
		return false, strings.Join(leaks, "; ")
	}
	return true, "tar download and upload through .., absolute names, symlinks and /proc/1/root stay in the sandbox"
}

// --- keys ------------------------------------------------------------------

func namespaceConfusion(a *arena) (bool, string) {
	s := a.s
	v := victimNames[0]
	other := map[string]any{"sandbox": v, "namespace": nsVictim}
	type try struct {
		what   string
		method string
		params map[string]any
	}
	tries := []try{
		{"exec in the victim's namespace", "sandbox.exec", map[string]any{"sandbox": v, "namespace": nsVictim, "argv": []string{"true"}}},
		{"exec by name in its own namespace", "sandbox.exec", map[string]any{"sandbox": v, "argv": []string{"true"}}},
		{"namespace with ..", "sandbox.exec", map[string]any{"sandbox": v, "namespace": nsAttacker + "/../" + nsVictim, "argv": []string{"true"}}},
		{"command.run", "sandbox.command.run", map[string]any{"sandbox": v, "namespace": nsVictim, "command": "true"}},
		{"get", "sandbox.get", other},
		{"stop", "sandbox.stop", other},
		{"remove", "sandbox.remove", other},
		{"logs", "sandbox.logs", other},
		{"file.read", "sandbox.file.read", map[string]any{"sandbox": v, "namespace": nsVictim, "path": "/etc/hostname"}},
		{"process.list", "sandbox.process.list", other},
		{"list every namespace", "sandbox.list", map[string]any{"namespace": "*"}},
		{"metrics of every namespace", "sandbox.metrics.get", map[string]any{"namespace": "*"}},
		{"key.create", "key.create", map[string]any{"namespace": "*"}},
		{"image.pull", "image.pull", map[string]any{"ref": "127.0.0.1:1/x:y"}},
	}
	// The server's internal ids (its sandbox directories' names), as
	// names, in either namespace.
	ids := s.sandboxIDs()
	for _, id := range ids {
		tries = append(tries,
			try{"exec by id " + id, "sandbox.exec", map[string]any{"sandbox": id, "argv": []string{"true"}}},
			try{"exec by id " + id + " in the victim's namespace", "sandbox.exec", map[string]any{"sandbox": id, "namespace": nsVictim, "argv": []string{"true"}}})
	}
	var through []string
	for _, tr := range tries {
		var out json.RawMessage
		err := s.call(s.attacker, tr.method, tr.params, &out)
		switch k := kindOf(err); k {
		case "forbidden", "not_found", "invalid_params":
		default:
			through = append(through, fmt.Sprintf("%s: %s %v %.100s", tr.what, k, err, out))
		}
	}
	var own struct {
		Sandboxes []struct{ Namespace string } `json:"sandboxes"`
	}
	if err := s.call(s.attacker, "sandbox.list", map[string]any{}, &own); err != nil {
		through = append(through, "own list: "+err.Error())
	}
	for _, b := range own.Sandboxes {
		if b.Namespace != nsAttacker {
			through = append(through, "sandbox.list shows namespace "+b.Namespace)
		}
	}
	get := func(path string) (int, string) {
		req, _ := http.NewRequest("GET", s.url+path, nil)
		req.Header.Set("Authorization", "Bearer "+s.attacker)
		resp, err := s.client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
		_ = resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/api/v1/sandboxes/" + nsVictim + "/" + v + "/tar?path=/etc/hostname"); code != http.StatusForbidden {
		through = append(through, fmt.Sprintf("tar download from the victim: %d", code))
	}
	if _, body := get("/metrics"); strings.Contains(body, `namespace="`+nsVictim+`"`) {
		through = append(through, "/metrics shows the victim's series")
	}
	// The WebSocket, into the victim's sandbox.
	cfg, _ := websocket.NewConfig("ws"+strings.TrimPrefix(s.url, "http")+"/api/v1/ws?namespace="+nsVictim+"&sandbox="+v, s.url)
	cfg.Header.Set("Authorization", "Bearer "+s.attacker)
	if ws, err := websocket.DialConfig(cfg); err == nil {
		_ = websocket.JSON.Send(ws, map[string]any{"argv": []string{"echo", "in"}})
		var m map[string]any
		_ = ws.SetDeadline(time.Now().Add(10 * time.Second))
		if websocket.JSON.Receive(ws, &m) == nil && m["type"] != "error" {
			through = append(through, fmt.Sprintf("WebSocket into the victim: %v", m))
		}
		_ = ws.Close()
	}
	if len(through) > 0 {
		return false, strings.Join(through, "; ")
	}
	return true, fmt.Sprintf("%d calls (by name, by the %d internal ids), the tar route, /metrics and the WebSocket refused a key of namespace %s on %s's sandbox", len(tries), len(ids), nsAttacker, nsVictim)
}

func forgedTokens(a *arena) (bool, string) {
	s := a.s
	tok := strings.TrimPrefix(s.attacker, "msb_")
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		a.t.Fatalf("unexpected key shape")
	}
	b64 := base64.RawURLEncoding
	payload, _ := b64.DecodeString(parts[1])
	var claims map[string]any
	_ = json.Unmarshal(payload, &claims)
	for k, v := range claims {
		if v == nsAttacker {
			claims[k] = "*"
		}
	}
	widened, _ := json.Marshal(claims)
	secret, err := os.ReadFile(filepath.Join(s.data, "secret.key"))
	if err != nil {
		a.t.Fatal(err)
	}
	signer, err := auth.NewSigner(bytes.TrimSpace(secret))
	if err != nil {
		a.t.Fatal(err)
	}
	expired, _, err := signer.Issue("*", time.Hour, time.Now().Add(-48*time.Hour))
	if err != nil {
		a.t.Fatal(err)
	}
	otherSecret := make([]byte, 32)
	_, _ = rand.Read(otherSecret)
	stranger, _ := auth.NewSigner(otherSecret)
	strange, _, _ := stranger.Issue("*", time.Hour, time.Now())
	var made struct {
		Key string `json:"key"`
		ID  string `json:"id"`
	}
	if err := s.call(s.admin, "key.create", map[string]any{"namespace": nsAttacker}, &made); err != nil {
		a.t.Fatalf("key.create: %v", err)
	}
	if err := s.call(s.admin, "key.revoke", map[string]any{"id": made.ID}, nil); err != nil {
		a.t.Fatalf("key.revoke: %v", err)
	}
	forged := map[string]string{
		"payload widened to *":        "msb_" + parts[0] + "." + b64.EncodeToString(widened) + "." + parts[2],
		"alg none":                    "msb_" + b64.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + b64.EncodeToString(widened) + ".",
		"alg none, no prefix":         b64.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + b64.EncodeToString(widened) + ".",
		"expired (the server secret)": expired,
		"signed with another secret":  strange,
		"revoked":                     made.Key,
		"truncated signature":         s.admin[:len(s.admin)-4],
	}
	var through []string
	for what, key := range forged {
		err := s.call(key, "sandbox.list", map[string]any{"namespace": "*"}, nil)
		if kindOf(err) != "unauthorized" {
			through = append(through, fmt.Sprintf("%s: %v", what, err))
		}
	}
	if len(through) > 0 {
		return false, strings.Join(through, "; ")
	}
	return true, fmt.Sprintf("%d forged, expired, alg-none and revoked keys were unauthorized", len(forged))
}

// --- slow clients and huge bodies -------------------------------------------

func slowlorisHeaders(a *arena) (bool, string) {
	const n = 64
	addr := strings.TrimPrefix(a.s.url, "http://")
	var conns []net.Conn
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return false, "dial: " + err.Error()
		}
		_, _ = io.WriteString(c, "POST /api/v1/rpc HTTP/1.1\r\nHost: x\r\n")
		conns = append(conns, c)
	}
	start := time.Now()
	var closed atomic.Int32
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { _ = c.Close() }()
			buf := make([]byte, 1)
			for time.Since(start) < 30*time.Second {
				_ = c.SetDeadline(time.Now().Add(time.Second))
				if _, err := c.Write([]byte("X")); err != nil {
					closed.Add(1)
					return
				}
				if _, err := c.Read(buf); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
					closed.Add(1)
					return
				}
			}
		}()
	}
	healthy := a.s.healthy()
	wg.Wait()
	took := time.Since(start)
	why := fmt.Sprintf("%d of %d connections trickling header bytes were closed by the server within %.0f s; health answered meanwhile: %v", closed.Load(), n, took.Seconds(), healthy)
	return closed.Load() == n && healthy, why
}

func slowBody(a *arena) (bool, string) {
	const n = 64
	addr := strings.TrimPrefix(a.s.url, "http://")
	var healthy bool
	grew := a.growth(func() {
		var conns []net.Conn
		for range n {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, "POST /api/v1/rpc HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+a.s.attacker+
				"\r\nContent-Type: application/json\r\nContent-Length: 10000000\r\n\r\n{")
			conns = append(conns, c)
		}
		for range 8 {
			for _, c := range conns {
				_, _ = c.Write([]byte(" "))
			}
			time.Sleep(time.Second)
		}
		healthy = a.s.healthy()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return healthy && grew < 64*mib, fmt.Sprintf("%d bodies trickled for 8 s: health answered: %v, the server grew by %d MiB", n, healthy, grew/mib)
}

func wsNeverReads(a *arena) (bool, string) {
	cfg, _ := websocket.NewConfig("ws"+strings.TrimPrefix(a.s.url, "http")+"/api/v1/ws?namespace="+nsAttacker+"&sandbox="+a.box, a.s.url)
	cfg.Header.Set("Authorization", "Bearer "+a.s.attacker)
	var healthy bool
	var derr error
	grew := a.growth(func() {
		ws, err := websocket.DialConfig(cfg)
		if err != nil {
			derr = err
			return
		}
		_ = websocket.JSON.Send(ws, map[string]any{"argv": []string{"sh", "-c", "yes hostile-output-that-nobody-reads"}})
		time.Sleep(8 * time.Second)
		healthy = a.s.healthy()
		_ = ws.Close()
	})
	if derr != nil {
		return false, "dial: " + derr.Error()
	}
	// The abandoned process must go with its connection.
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, err := a.s.shell(a.s.attacker, nsAttacker, a.box, "pgrep -x yes || true", 30)
		if err == nil && strings.TrimSpace(r.Stdout) == "" {
			break
		}
		if time.Now().After(deadline) {
			return false, "the process of the abandoned WebSocket still runs 20 s after it closed"
		}
		time.Sleep(time.Second)
	}
	return healthy && grew < 64*mib, fmt.Sprintf("a WebSocket exec of endless output never read for 8 s: health answered: %v, the server grew by %d MiB, the process ended with the connection", healthy, grew/mib)
}

// bodyLimit is the JSON-RPC route's body limit.
const bodyLimit = 64 * mib

func bodyOverLimit(a *arena) (bool, string) {
	var err error
	grew := a.growth(func() {
		head := `{"jsonrpc":"2.0","id":1,"method":"sandbox.exec","params":{"sandbox":"` + a.box + `","argv":["echo","`
		body := io.MultiReader(strings.NewReader(head), io.LimitReader(repeatReader('a'), bodyLimit+16*mib), strings.NewReader(`"]}}`))
		req, _ := http.NewRequest("POST", a.s.url+"/api/v1/rpc", body)
		req.Header.Set("Authorization", "Bearer "+a.s.attacker)
		var resp *http.Response
		resp, err = a.s.client.Do(req)
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusRequestEntityTooLarge {
				err = fmt.Errorf("answered %d: %.200s", resp.StatusCode, b)
			}
		} else if strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "broken pipe") {
			err = nil // the server closed on us past the limit: refused
		}
	})
	if err != nil {
		return false, "an 80 MiB body: " + err.Error()
	}
	return grew < 4*bodyLimit, fmt.Sprintf("an 80 MiB body was refused (413); the server grew by %d MiB (bound %d MiB)", grew/mib, 4*bodyLimit/mib)
}

type repeatReader byte

func (r repeatReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r)
	}
	return len(p), nil
}

func deepJSON(a *arena) (bool, string) {
	var through []string
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"sandbox.list","params":` + strings.Repeat("[", 5_000_000) + `}`,
		`{"jsonrpc":"2.0","id":1,"method":"sandbox.list","params":{"labels":` + strings.Repeat(`{"a":`, 1_000_000) + `}}`,
	} {
		start := time.Now()
		err := a.s.post(a.s.attacker, []byte(body), nil)
		if k := kindOf(err); k != "parse_error" && k != "invalid_params" && k != "invalid_request" {
			through = append(through, fmt.Sprintf("%d bytes nested: %v", len(body), err))
		}
		if d := time.Since(start); d > 10*time.Second {
			through = append(through, fmt.Sprintf("a nested body took %v", d))
		}
	}
	if !a.s.healthy() {
		through = append(through, "unhealthy after nested bodies")
	}
	if len(through) > 0 {
		return false, strings.Join(through, "; ")
	}
	return true, "5 MB of nested arrays and 5 MB of nested objects were refused quickly"
}

func hugeParams(a *arena) (bool, string) {
	var through []string
	manyArgs := make([]string, scale(200_000, 40_000))
	for i := range manyArgs {
		manyArgs[i] = strings.Repeat("a", 100)
	}
	manyEnv := make([]string, scale(100_000, 20_000))
	for i := range manyEnv {
		manyEnv[i] = "K" + strconv.Itoa(i) + "=" + strings.Repeat("v", 100)
	}
	cases := []struct {
		what   string
		method string
		params map[string]any
		ok     []string
	}{
		{"a 1 MiB sandbox name", "sandbox.create", map[string]any{"name": strings.Repeat("n", mib)}, []string{"invalid_params"}},
		{"a 1 MiB namespace", "sandbox.list", map[string]any{"namespace": strings.Repeat("n", mib)}, []string{"invalid_params", "forbidden"}},
		{fmt.Sprintf("%d MB of argv", len(manyArgs)*100/1e6), "sandbox.exec", map[string]any{"sandbox": a.box, "argv": manyArgs}, []string{"invalid_params", "too_large", "exec_failed"}},
		{fmt.Sprintf("%d env entries", len(manyEnv)), "sandbox.exec", map[string]any{"sandbox": a.box, "argv": []string{"true"}, "env": manyEnv}, []string{"invalid_params", "too_large", "exec_failed"}},
		{"17 MiB of stdin", "sandbox.exec", map[string]any{"sandbox": a.box, "argv": []string{"true"}, "stdin": strings.Repeat("s", 17*mib)}, []string{"too_large"}},
	}
	if *all {
		cases = append(cases, struct {
			what   string
			method string
			params map[string]any
			ok     []string
		}{"60 MiB of file data", "sandbox.file.write", map[string]any{"sandbox": a.box, "path": "/tmp/x", "data": base64.StdEncoding.EncodeToString(make([]byte, 45*mib))}, []string{"too_large", ""}})
	}
	var most int64
	var each []string // how long each case took, the victims' p99 meanwhile
	for _, c := range cases {
		var err error
		began := time.Now()
		most = max(most, a.growth(func() { err = a.s.call(a.s.attacker, c.method, c.params, nil) }))
		p99, _ := a.v.p99Since(began)
		each = append(each, fmt.Sprintf("%s %.1f s %v", c.what, time.Since(began).Seconds(), p99.Round(time.Millisecond)))
		k := kindOf(err)
		if err != nil && k == "" {
			through = append(through, c.what+": "+err.Error())
			continue
		}
		if !slices.Contains(c.ok, k) {
			through = append(through, fmt.Sprintf("%s: %q %v", c.what, k, err))
		}
	}
	if !a.s.healthy() {
		through = append(through, "unhealthy after huge params")
	}
	if most > 4*bodyLimit {
		through = append(through, fmt.Sprintf("one request grew the server by %d MiB (bound %d MiB)", most/mib, 4*bodyLimit/mib))
	}
	if len(through) > 0 {
		return false, strings.Join(through, "; ")
	}
	return true, fmt.Sprintf("%d huge parameters were refused or handled; one request grew the server by at most %d MiB (bound %d MiB); each (time, victims' p99): %s",
		len(cases), most/mib, 4*bodyLimit/mib, strings.Join(each, ", "))
}

// --- limits (findings 4-8, 10, 11) ---------------------------------------------

// grants is what one default sandbox of the attacker could take: pids (its
// cgroup's pids.max) and open files, measured by opening them up to a cap.
type grants struct {
	pids, files int
	filesCapped bool
}

// filesCap bounds the open-file probe so the suite never exhausts the
// host's file table itself: an eighth of file-max.
func filesCap() int {
	b, _ := os.ReadFile("/proc/sys/fs/file-max")
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n / 8
}

// forkBombProg fills the sandbox's task limit: threads first (cheap to
// make on a slow machine), then forks until the kernel refuses; it holds
// them 3 s and lets go.
const forkBombProg = `
import os, threading, time, signal
ev, t0 = threading.Event(), time.time()
n, kids, terr, ferr = 0, [], "", ""
try:
    while n < 100000:
        threading.Thread(target=ev.wait, daemon=True).start(); n += 1
except RuntimeError as e:
    terr = str(e)
try:
    while len(kids) < 100000:
        p = os.fork()
        if p == 0:
            time.sleep(30); os._exit(0)
        kids.append(p)
except OSError as e:
    ferr = e.strerror
print(n + len(kids), "tasks:", n, "threads (" + terr + "),", len(kids), "forks, then fork:", ferr, "(%.1f s)" % (time.time() - t0), flush=True)
time.sleep(3)
ev.set()
for k in kids: os.kill(k, signal.SIGKILL)
for k in kids: os.waitpid(k, 0)
`

func (a *arena) measure() *grants {
	a.probeMu.Lock()
	defer a.probeMu.Unlock()
	if a.probe != nil {
		return a.probe
	}
	box := "probe"
	before := a.s.sandboxIDs()
	a.fresh(box, nil)
	var id string
	for _, d := range a.s.sandboxIDs() {
		if !slices.Contains(before, d) {
			id = d
		}
	}
	g := &grants{pids: a.s.pidsMax(a.t, id)}
	limit := filesCap()
	r, err := a.s.python(a.s.attacker, nsAttacker, box, fmt.Sprintf(`
import os, resource, time
cap = %d
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
total, kids = 0, []
deadline = time.time() + 30
while total < cap and time.time() < deadline:
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        n, fds = 0, []
        try:
            while total + n < cap - 8:
                fds.append(os.open("/dev/null", os.O_RDONLY)); n += 1
        except OSError:
            pass
        os.write(w, str(n).encode()); time.sleep(60); os._exit(0)
    os.close(w)
    n = int(os.read(r, 64) or b"0"); os.close(r)
    kids.append(pid); total += n + 2
    if n == 0: break
print(total)
for k in kids: os.kill(k, 9)
for k in kids: os.waitpid(k, 0)
`, limit), 120)
	if err != nil {
		a.t.Fatalf("open-file probe: %v", err)
	}
	g.files, _ = strconv.Atoi(strings.TrimSpace(r.Stdout))
	g.filesCapped = g.files >= limit-16
	a.probe = g
	return g
}

func forkBomb(a *arena) (bool, string) {
	box := "bomb"
	a.fresh(box, nil)
	// The host forks all along the bomb.
	stop, done := make(chan struct{}), make(chan struct{})
	var hostForkErr error
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if err := exec.Command("true").Run(); err != nil {
				hostForkErr = err
			}
		}
	}()
	r, err := a.s.python(a.s.attacker, nsAttacker, box, forkBombProg, 120)
	close(stop)
	<-done
	if hostForkErr != nil {
		return false, "the host could not fork during the bomb: " + hostForkErr.Error()
	}
	if err != nil {
		// The agent's threads have a pids budget the bomb cannot take
		// (package cgroup, split_linux.go): a bomb that ends its own
		// sandbox, as it could before, is a breach now.
		return false, "the bomb's exec failed (" + kindOf(err) + "): " + err.Error()
	}
	n, _ := strconv.Atoi(strings.Fields(r.Stdout + " 0")[0])
	if n >= 100000 || n == 0 || !strings.Contains(r.Stdout, "then fork: Resource temporarily unavailable") {
		return false, "the bomb was not stopped: " + r.Stdout + r.Stderr
	}
	var after execResult
	if err := a.s.call(a.s.attacker, "sandbox.exec", map[string]any{"sandbox": box, "namespace": nsAttacker, "argv": []string{"true"}, "timeout": 10}, &after); err != nil || after.ExitCode != 0 {
		return false, fmt.Sprintf("after the bomb the sandbox's agent no longer runs execs: %+v, %v", after, err)
	}
	return true, fmt.Sprintf("a task bomb stopped at the sandbox's pid limit, %s; the host forked meanwhile, and the sandbox's agent runs execs after it", strings.TrimSpace(r.Stdout))
}

func askForEverything(a *arena) (bool, string) {
	var through []string
	for _, c := range []struct {
		what  string
		extra map[string]any
	}{
		{"1 TiB of memory", map[string]any{"memory_mib": 1 << 20}},
		{"256 CPUs", map[string]any{"cpus": 256}},
	} {
		name := "ask-" + randHex(3)
		err := a.s.create(a.s.attacker, nsAttacker, name, c.extra)
		if err == nil {
			through = append(through, c.what+" was granted")
			_ = a.s.remove(a.s.attacker, nsAttacker, name)
		}
	}
	if len(through) > 0 {
		return false, strings.Join(through, "; ")
	}
	return true, "1 TiB of memory and 256 CPUs were refused"
}

func inotifyHostRoot(a *arena) (bool, string) {
	id, held := a.hold(a.box, `
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
n = 0
while n < 100000 and libc.inotify_init1(0) >= 0:
    n += 1
print("held", n, "inotify instances:", os.strerror(ctypes.get_errno()), flush=True)
time.sleep(120)
`)
	fd, err := syscall.InotifyInit1(0)
	if err == nil {
		_ = syscall.Close(fd)
	}
	// Another tenant's sandbox is another host user (its own uid range).
	r, verr := a.s.python(a.s.victim, nsVictim, victimNames[0], "import ctypes; print(ctypes.CDLL(None).inotify_init1(0) >= 0)", 30)
	a.release(a.box, id)
	if err != nil {
		return false, fmt.Sprintf("sandbox %s; host root's inotify_init then failed: %v", held, err)
	}
	if verr != nil || strings.TrimSpace(r.Stdout) != "True" {
		return false, fmt.Sprintf("sandbox %s; another tenant's sandbox then got none: %v %q %q", held, verr, r.Stdout, r.Stderr)
	}
	return true, "sandbox " + held + "; host root and another tenant's sandbox still get inotify instances"
}

// sharedUID compares the host uid ranges the attacker's sandbox and a
// victim's run as: one uid held by both would let code that escaped one
// sandbox read, plant and signal the other's files and processes.
func sharedUID(a *arena) (bool, string) {
	const prog = "print(open('/proc/self/uid_map').read().split()[1])"
	mine := a.py(prog)
	r, err := a.s.python(a.s.victim, nsVictim, victimNames[0], prog, 30)
	if err != nil || r.ExitCode != 0 {
		a.t.Fatalf("read a victim's uid_map (a harness error): %v %s", err, r.Stderr)
	}
	theirs := strings.TrimSpace(r.Stdout)
	if mine == theirs {
		return false, "the attacker's and a victim's sandbox root are the same host uid " + mine
	}
	return true, fmt.Sprintf("sandbox root is host uid %s here, %s in a victim's sandbox", mine, theirs)
}

func signalsPID1(a *arena) (bool, string) {
	box := "sig"
	a.fresh(box, nil)
	for _, sig := range []string{"TERM", "INT", "HUP", "QUIT", "USR1", "USR2", "PIPE", "ALRM", "SEGV", "ABRT", "BUS", "KILL", "STOP"} {
		_, _ = a.s.shell(a.s.attacker, nsAttacker, box, "kill -"+sig+" 1; sleep 0.3", 30)
		time.Sleep(300 * time.Millisecond)
		var r execResult
		if err := a.s.call(a.s.attacker, "sandbox.exec", map[string]any{"sandbox": box, "namespace": nsAttacker, "argv": []string{"true"}, "timeout": 10}, &r); err != nil {
			return false, "SIG" + sig + " from sandbox code to PID 1 ended the sandbox: " + err.Error()
		}
	}
	return true, "PID 1 survived 13 signals from sandbox code"
}

// flood starts default sandboxes in the attacker's namespace until the
// server refuses one (at most maxRunning), then asks for one in the
// victims' namespace, and removes them all. It runs once; pids, files and
// fairness read its answer.
type floodResult struct {
	admitted, running int
	refusal           error
	victimErr         error
}

func (a *arena) flood() *floodResult {
	a.floodOnce.Do(func() {
		r := &floodResult{}
		var names []string
		for i := range maxRunning {
			name := "flood-" + strconv.Itoa(i)
			if err := a.s.create(a.s.attacker, nsAttacker, name, nil); err != nil {
				r.refusal = err
				break
			}
			names = append(names, name)
		}
		r.admitted = len(names)
		var all struct {
			Sandboxes []struct{ State string } `json:"sandboxes"`
		}
		_ = a.s.call(a.s.admin, "sandbox.list", map[string]any{"namespace": "*"}, &all)
		for _, b := range all.Sandboxes {
			if b.State == "running" {
				r.running++
			}
		}
		r.victimErr = a.s.create(a.s.victim, nsVictim, "after-flood", nil)
		if r.victimErr == nil {
			_ = a.s.remove(a.s.victim, nsVictim, "after-flood")
		}
		for _, n := range names {
			if err := a.s.remove(a.s.attacker, nsAttacker, n); err != nil {
				a.t.Errorf("remove %s: %v", n, err)
			}
		}
		a.floodRes = r
	})
	return a.floodRes
}

func pidMax() int {
	b, _ := os.ReadFile("/proc/sys/kernel/pid_max")
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

func pidsAdmission(a *arena) (bool, string) {
	g := a.measure()
	f := a.flood()
	held := f.running * g.pids
	why := fmt.Sprintf("one sandbox may hold %d processes (its pids.max); the server let %d run at once (the attacker's refused after %d: %v): %d pids against pid_max %d",
		g.pids, f.running, f.admitted, f.refusal, held, pidMax())
	return held < pidMax(), why
}

func filesAdmission(a *arena) (bool, string) {
	g := a.measure()
	f := a.flood()
	b, _ := os.ReadFile("/proc/sys/fs/file-max")
	fileMax, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	capped := ""
	if g.filesCapped {
		capped = " (the probe's cap: at least)"
	}
	held := f.running * g.files
	why := fmt.Sprintf("one sandbox opens %d files%s; the server let %d run at once: %d open files against file-max %d",
		g.files, capped, f.running, held, fileMax)
	return held < fileMax, why
}

// pinFiles is how many files the file-table attempt pins: a few MiB of
// its sandbox's memory, far below the host's file table (it stays under
// vm.max_map_count, one process).
const pinFiles = 20000

// pinProg maps a file of the sandbox's tmpfs pinFiles times, closing each
// descriptor (so RLIMIT_NOFILE counts none), prints how many it holds and
// holds them. It calls mmap itself: Python's mmap keeps a descriptor.
const pinProg = `
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
path = "/dev/shm/pin"
with open(path, "wb") as f:
    f.write(b"x" * 4096)
n, err = 0, 0
while n < %d:
    fd = os.open(path, os.O_RDONLY)
    p = libc.mmap(None, 4096, 1, 1, fd, 0)
    e = ctypes.get_errno()
    os.close(fd)
    if p is None or p == ctypes.c_void_p(-1).value:
        err = e
        break
    n += 1
print(n, err, flush=True)
time.sleep(600)
`

// fileTable is finding 10: files a sandbox maps and closes stay open
// without a descriptor, bounded only by its memory limit (each is charged
// to its cgroup), and the kernel refuses a file to every process without
// CAP_SYS_ADMIN once fs.file-max are open. A sandbox of 64 MiB pins
// pinFiles files; from the memory that cost it, the attempt works out how
// many files all the memory the server may grant could pin, and holds the
// host's file-max to that. Meanwhile an unprivileged host process must
// still open a file. (The sandbox pins a part of its limit, not all of it:
// at the limit the kernel's OOM killer picks among its processes.)
func fileTable(a *arena) (bool, string) {
	box := "files"
	before := a.s.sandboxIDs()
	a.fresh(box, map[string]any{"memory_mib": 64})
	var id string
	for _, d := range a.s.sandboxIDs() {
		if !slices.Contains(before, d) {
			id = d
		}
	}
	readNr := func() int64 {
		b, _ := os.ReadFile("/proc/sys/fs/file-nr")
		n, _ := strconv.ParseInt(strings.Fields(string(b) + " 0")[0], 10, 64)
		return n
	}
	used0, nr0 := a.s.memoryUsage(id), readNr()
	pid, first := a.hold(box, fmt.Sprintf(pinProg, pinFiles))
	defer a.release(box, pid)
	used1, nr1 := a.s.memoryUsage(id), readNr()
	var pinned, errno int
	if _, err := fmt.Sscan(first, &pinned, &errno); err != nil || pinned == 0 {
		return false, fmt.Sprintf("the probe did not pin files: %q", first)
	}
	// An unprivileged host user opens a file (and the binary it runs).
	open := exec.Command("/bin/cat", "/proc/self/stat")
	open.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, openErr := open.CombinedOutput()
	if used0 == 0 || used1 <= used0 {
		return false, fmt.Sprintf("no memory charged to the sandbox's cgroup for %d files (%d -> %d bytes)", pinned, used0, used1)
	}
	perFile := float64(used1-used0) / float64(pinned)
	host, err := sandbox.ReadHost()
	if err != nil {
		return false, err.Error()
	}
	granted := host.Capacity(1).MemoryBytes
	could := int64(float64(granted) / perFile)
	b, _ := os.ReadFile("/proc/sys/fs/file-max")
	fileMax, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	why := fmt.Sprintf("a 64 MiB sandbox pinned %d mapped files (errno %d; the host's file-nr rose by %d), %.0f bytes of its memory each (%.0f files per MiB): "+
		"the %d MiB the server may grant could pin %d, with %d open now, against file-max %d; an unprivileged host open(): %v",
		pinned, errno, nr1-nr0, perFile, float64(mib)/perFile, granted/mib, could, nr0, fileMax, openErr)
	if openErr != nil {
		return false, why + " " + strings.TrimSpace(string(out))
	}
	return nr0+could <= fileMax, why
}

func fairness(a *arena) (bool, string) {
	f := a.flood()
	if f.victimErr != nil {
		return false, fmt.Sprintf("after the attacker's namespace started %d sandboxes, another namespace's start was refused: %v", f.admitted, f.victimErr)
	}
	return true, fmt.Sprintf("the attacker started %d sandboxes (refused: %v); another namespace could still start one", f.admitted, f.refusal)
}

// diskBound is how much one attempt writes at most: past it with no limit
// hit, the sandbox has no disk limit (the suite stops there).
const diskBound = 1 << 30

func diskFill(a *arena) (bool, string) {
	box := "disk"
	a.fresh(box, nil)
	r, err := a.s.shell(a.s.attacker, nsAttacker, box, fmt.Sprintf(
		"head -c %d /dev/zero > /tmp/fill; echo bytes=$(stat -c %%s /tmp/fill); i=0; mkdir /tmp/many; while [ $i -lt 20000 ]; do : > /tmp/many/$i || break; i=$((i+1)); done; echo inodes=$i", diskBound), 300)
	if err != nil {
		return false, "exec: " + err.Error()
	}
	out := strings.Join(strings.Fields(r.Stdout), " ")
	if strings.Contains(out, "bytes="+strconv.Itoa(diskBound)) || strings.Contains(out, "inodes=20000") {
		return false, "no disk or inode limit stopped the sandbox: " + out
	}
	return true, "a disk limit stopped the sandbox: " + out
}

// rawHeader is a ustar header block written by hand: archive/tar's writer
// refuses the oversized headers an attacker crafts.
func rawHeader(name string, typ byte, size int) []byte {
	h := make([]byte, 512)
	copy(h[0:100], name)
	copy(h[100:], "0000644\x00")
	copy(h[108:], "0000000\x00")
	copy(h[116:], "0000000\x00")
	copy(h[124:], fmt.Sprintf("%011o\x00", size))
	copy(h[136:], "00000000000\x00")
	h[156] = typ
	copy(h[257:], "ustar\x0000")
	copy(h[148:156], "        ")
	sum := 0
	for _, b := range h {
		sum += int(b)
	}
	copy(h[148:], fmt.Sprintf("%06o\x00 ", sum))
	return h
}

// padded pads b to whole 512-byte blocks.
func padded(b []byte) []byte {
	return append(b, make([]byte, (512-len(b)%512)%512)...)
}

// paxRecord is one PAX record "LEN key=value\n", LEN counting itself.
func paxRecord(k, v string) string {
	body := " " + k + "=" + v + "\n"
	n := len(body) + 1
	for len(strconv.Itoa(n))+len(body) != n {
		n = len(strconv.Itoa(n)) + len(body)
	}
	return strconv.Itoa(n) + body
}

// longPath: a file path far past PATH_MAX must be refused as the caller's
// mistake, without echoing it whole.
func longPath(a *arena) (bool, string) {
	size := scale(40*mib, mib)
	start := time.Now()
	err := a.s.call(a.s.attacker, "sandbox.file.stat", map[string]any{"sandbox": a.box, "namespace": nsAttacker, "path": "/" + strings.Repeat("p", size)}, nil)
	took := time.Since(start)
	var re *rpcError
	if !errors.As(err, &re) {
		return false, fmt.Sprintf("a 40 MiB path: %v", err)
	}
	why := fmt.Sprintf("a %d MiB path answered %s in %.1f s with a %d-byte message: %s", size/mib, re.Kind, took.Seconds(), len(re.Message), clip(re.Message, 120))
	// 30 s: reading and decoding a 40 MiB body takes seconds on a loaded
	// 2-core machine; the point is a refusal, not an agent round trip.
	return re.Kind == "invalid_params" && took < 30*time.Second && len(re.Message) < 64<<10, why
}

// scale picks an attack's size: full with -hostile.all, ci in the CI
// subset (still past every limit it tests, cheaper for the victims'
// latency on two cores).
func scale(full, ci int) int {
	if *all {
		return full
	}
	return ci
}
