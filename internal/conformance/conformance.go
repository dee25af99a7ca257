// Package conformance is the isolation test suite every backend must pass.
// It drives sandboxes only through the backend interface and the agent, so a
// new backend runs it unchanged: write a Harness and call Run from a test.
//
// The checks run real workloads on the real kernel: they need root and the
// host's /usr/bin/python3 in the image.
package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/oci"
	"github.com/warren-sandbox/warren/internal/seccomp"
	"github.com/warren-sandbox/warren/internal/wire"
)

// Harness is what a backend provides to the suite.
type Harness struct {
	Backend backend.Backend
	Image   *image.Image
	// UserNS says sandbox root must not be host root.
	UserNS bool
	// HostPid returns the host pid of a sandbox's init (for host-side checks).
	HostPid func(backend.Sandbox) int
	// Snapshot describes every host resource sandboxes can leave behind
	// (mounts, cgroups, runtime and state directories, processes); two
	// snapshots with no sandbox alive must be equal.
	Snapshot func() (string, error)
	// Cycles is the number of create/destroy cycles of the leak test (default 200).
	Cycles int
}

var seq atomic.Int64

// Sandbox creates and starts a sandbox with cfg (ID and Image filled in when
// empty) and removes it when the test ends.
func (h *Harness) Sandbox(t testing.TB, cfg backend.Config) backend.Sandbox {
	t.Helper()
	if cfg.ID == "" {
		cfg.ID = fmt.Sprintf("conf-%d-%d", os.Getpid(), seq.Add(1))
	}
	if cfg.Image == nil {
		cfg.Image = h.Image
	}
	ctx := context.Background()
	sb, err := h.Backend.Create(ctx, cfg)
	if err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	t.Cleanup(func() {
		if err := sb.Remove(context.Background()); err != nil {
			t.Errorf("remove sandbox: %v", err)
		}
	})
	if err := sb.Start(ctx); err != nil {
		t.Fatalf("start sandbox: %v", err)
	}
	return sb
}

// Result is a finished command's output.
type Result struct {
	backend.ExecResult
	Stdout, Stderr string
}

// Exec runs argv in sb and collects its output.
func Exec(t testing.TB, sb backend.Sandbox, timeout time.Duration, argv ...string) Result {
	t.Helper()
	var out, errb bytes.Buffer
	var mu sync.Mutex
	res, err := backend.Exec(context.Background(), sb, &wire.ExecRequest{Argv: argv, TimeoutMs: timeout.Milliseconds()},
		func(stream string, data []byte) {
			mu.Lock()
			defer mu.Unlock()
			if stream == wire.Stderr {
				errb.Write(data)
			} else {
				out.Write(data)
			}
		})
	if err != nil {
		t.Fatalf("exec %q: %v", argv, err)
	}
	return Result{ExecResult: res, Stdout: out.String(), Stderr: errb.String()}
}

// Python runs a Python program in sb.
func Python(t testing.TB, sb backend.Sandbox, timeout time.Duration, code string) Result {
	t.Helper()
	return Exec(t, sb, timeout, "/usr/bin/python3", "-c", code)
}

// Run runs every isolation check against h.
func Run(t *testing.T, h *Harness) {
	t.Run("HostProcessesInvisible", h.hostProcessesInvisible)
	t.Run("HostFilesystemNotWritable", h.hostFilesystemNotWritable)
	t.Run("LoopbackOnlyNetwork", h.loopbackOnly)
	t.Run("MemoryLimitOOMKills", h.memoryOOM)
	t.Run("PidsLimitHoldsForkBomb", h.pidsLimit)
	t.Run("CPUQuotaThrottles", h.cpuQuota)
	t.Run("DroppedCapabilitiesFail", h.capabilities)
	t.Run("SeccompDenies", h.seccomp)
	t.Run("MaskedPaths", h.maskedPaths)
	t.Run("DevContents", h.devContents)
	t.Run("Rlimits", h.rlimits)
	t.Run("PtysCapped", h.ptysCapped)
	t.Run("HostImageEtcSanitized", h.etcSanitized)
	t.Run("HostEnforcesTimeoutOnStoppedAgent", h.stoppedAgentTimeout)
	t.Run("RootIsNotHostRoot", h.rootIsNotHostRoot)
	t.Run("AgentUnreachable", h.agentUnreachable)
	t.Run("StopKillsWholeTree", h.stopKillsTree)
	t.Run("AgentIgnoresSignalsFromSandbox", h.agentIgnoresSignals)
	t.Run("PauseKeepsMemoryUsesNoCPU", h.pause)
	t.Run("ReadOnlyRoot", h.readOnlyRoot)
	t.Run("Volumes", h.volumes)
	t.Run("TmpKeptAcrossRestart", h.tmpKept)
	t.Run("NoInheritedDescriptors", h.noInheritedDescriptors)
	t.Run("NoLeftoversAfterCycles", h.noLeftovers)
	t.Run("KernelAsDeclared", h.kernelAsDeclared)
}

// kernelAsDeclared checks the backend's SecondKernel: the kernel sandbox
// code talks to is the host's (its /proc/version and uname are the
// host's), or, declared, one of the backend's own, which the sandbox
// sees in place of the host's.
func (h *Harness) kernelAsDeclared(t *testing.T) {
	host, err := os.ReadFile("/proc/version")
	if err != nil {
		t.Fatal(err)
	}
	var uts syscall.Utsname
	if err := syscall.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	var rel strings.Builder
	for _, c := range uts.Release {
		if c == 0 {
			break
		}
		rel.WriteByte(byte(c))
	}
	sb := h.Sandbox(t, backend.Config{})
	r := Exec(t, sb, 10*time.Second, "/bin/sh", "-c", "cat /proc/version; uname -r")
	if r.Code != 0 {
		t.Fatalf("cat /proc/version: %+v %s", r.ExitStatus, r.Stderr)
	}
	same := r.Stdout == string(host)+rel.String()+"\n"
	if second := h.Backend.Capabilities().SecondKernel; second == same {
		t.Errorf("declared SecondKernel=%v, but the sandbox sees %q (the host: %q, release %q)", second, r.Stdout, host, rel.String())
	}
}

func (h *Harness) hostProcessesInvisible(t *testing.T) {
	sb := h.Sandbox(t, backend.Config{})
	r := Python(t, sb, 30*time.Second, `
import os
pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
print(' '.join(map(str, pids)))
print(open('/proc/1/cmdline','rb').read().split(b'\0')[0].decode())
`)
	if r.Code != 0 {
		t.Fatalf("python failed: %+v %s", r.ExitStatus, r.Stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	pids := strings.Fields(lines[0])
	// The agent, python itself, perhaps a REPL: never the host's hundreds.
	if len(pids) > 5 {
		t.Errorf("sandbox sees %d processes: %v", len(pids), pids)
	}
	if pids[0] != "1" {
		t.Errorf("lowest pid in sandbox is %s, want 1 (own pid namespace)", pids[0])
	}
	if !strings.Contains(lines[1], "warren-agent") {
		t.Errorf("pid 1 is %q, want the agent", lines[1])
	}
	if self := strconv.Itoa(os.Getpid()); len(pids) > 0 && os.Getpid() > 100 {
		for _, p := range pids {
			if p == self {
				t.Errorf("the test process's host pid %s is visible", self)
			}
		}
	}
}

func (h *Harness) hostFilesystemNotWritable(t *testing.T) {
	sb := h.Sandbox(t, backend.Config{})
	marker := fmt.Sprintf("warren-conformance-%d", time.Now().UnixNano())
	r := Python(t, sb, 30*time.Second, fmt.Sprintf(`
import errno
for p in ['/usr/%[1]s', '/usr/bin/%[1]s', '/lib/%[1]s']:
    try:
        open(p, 'w').write('x')
        print('WROTE', p)
    except OSError as e:
        print('denied', p, errno.errorcode[e.errno])
open('/%[1]s', 'w').write('sandbox-only')
open('/etc/passwd', 'a').write('intruder:x:0:0::/:/bin/sh\n')
open('/tmp/%[1]s', 'w').write('x')
print('ok')
`, marker))
	if r.Code != 0 {
		t.Fatalf("python failed: %+v %s", r.ExitStatus, r.Stderr)
	}
	if strings.Contains(r.Stdout, "WROTE") {
		t.Errorf("sandbox wrote into a host directory:\n%s", r.Stdout)
	}
	for _, p := range []string{"/" + marker, "/usr/" + marker, "/usr/bin/" + marker, "/tmp/" + marker} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s appeared on the host", p)
		}
	}
	b, _ := os.ReadFile("/etc/passwd")
	if strings.Contains(string(b), "intruder") {
		t.Fatal("host /etc/passwd was modified")
	}
	// The sandbox itself sees its own writes (its private writable layer).
	r = Exec(t, sb, 10*time.Second, "/bin/cat", "/"+marker)
	if r.Stdout != "sandbox-only" {
		t.Errorf("sandbox lost its own write: %q", r.Stdout)
	}
}

func (h *Harness) loopbackOnly(t *testing.T) {
	// A service on the host's loopback must be unreachable: the sandbox's
	// 127.0.0.1 is its own.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("host"))
			_ = c.Close()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	sb := h.Sandbox(t, backend.Config{})
	r := Python(t, sb, 30*time.Second, fmt.Sprintf(`
import socket, os
print('ifaces', sorted(n for _, n in socket.if_nameindex()))
routes = [l for l in open('/proc/net/route').read().splitlines()[1:] if l.strip()]
print('routes', len(routes))
s = socket.socket(); s.settimeout(2)
try:
    s.connect(('127.0.0.1', %d)); print('host-loopback REACHED')
except OSError as e:
    print('host-loopback refused', type(e).__name__)
srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen()
c = socket.create_connection(srv.getsockname(), timeout=2); a, _ = srv.accept()
c.sendall(b'ping'); print('own-loopback', a.recv(4).decode())
`, port))
	if r.Code != 0 {
		t.Fatalf("python failed: %+v %s", r.ExitStatus, r.Stderr)
	}
	for _, want := range []string{"ifaces ['lo']", "routes 0", "host-loopback refused", "own-loopback ping"} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("want %q in:\n%s", want, r.Stdout)
		}
	}
}

func (h *Harness) memoryOOM(t *testing.T) {
	sb := h.Sandbox(t, backend.Config{MemoryBytes: 64 << 20})
	if !h.Backend.Capabilities().OOMKillsProcess {
		endsSandbox(t, sb, "going over a 64 MiB memory limit", `
chunks = []
for i in range(64):
    chunks.append(bytearray(16 << 20))
print('survived 1 GiB')
`)
		return
	}
	r := Python(t, sb, 60*time.Second, `
chunks = []
for i in range(64):
    chunks.append(bytearray(16 << 20))
print('survived 1 GiB')
`)
	if r.Code == 0 || strings.Contains(r.Stdout, "survived") {
		t.Fatalf("allocating 1 GiB under a 64 MiB limit succeeded: %+v", r.ExitStatus)
	}
	if !r.OOMKilled || r.Signal != "SIGKILL" {
		t.Errorf("want OOM kill reported with SIGKILL, got oom=%v %+v", r.OOMKilled, r.ExitStatus)
	}
	// The sandbox survives its workload's OOM.
	if r := Exec(t, sb, 10*time.Second, "/bin/true"); r.Code != 0 {
		t.Errorf("sandbox unusable after OOM: %+v", r.ExitStatus)
	}
}

// endsSandbox checks the declared alternative to a limit that fails one
// process (OOMKillsProcess, PidsLimitFailsFork): the Python program code,
// which goes over the limit and prints "survived" if it gets past it,
// ends the whole sandbox (the exec fails, Done closes), which then stops
// cleanly and starts again.
func endsSandbox(t *testing.T, sb backend.Sandbox, what, code string) {
	t.Helper()
	var out bytes.Buffer
	var mu sync.Mutex
	res, err := backend.Exec(context.Background(), sb, &wire.ExecRequest{Argv: []string{"/usr/bin/python3", "-c", code}, TimeoutMs: 60000},
		func(_ string, b []byte) { mu.Lock(); out.Write(b); mu.Unlock() })
	mu.Lock()
	survived := strings.Contains(out.String(), "survived")
	mu.Unlock()
	if err == nil && res.Code == 0 || survived {
		t.Fatalf("%s: the program got past the limit: %+v %v", what, res, err)
	}
	select {
	case <-sb.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the sandbox still runs (declared: it ends): %+v %v", what, res, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sb.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if err := sb.Start(ctx); err != nil {
		t.Fatalf("start again: %v", err)
	}
	if r := Exec(t, sb, 10*time.Second, "/bin/true"); r.Code != 0 {
		t.Errorf("sandbox unusable after its restart: %+v", r.ExitStatus)
	}
}

func (h *Harness) pidsLimit(t *testing.T) {
	sb := h.Sandbox(t, backend.Config{PidsMax: 32})
	if !h.Backend.Capabilities().PidsLimitFailsFork {
		endsSandbox(t, sb, "a fork bomb past 32 pids", `
import os, time
for i in range(2000):
    if os.fork() == 0:
        time.sleep(60); os._exit(0)
print('survived 2000 forks')
`)
		return
	}
	r := Python(t, sb, 60*time.Second, `
import os, time, errno
kids, err = 0, None
for i in range(500):
    try:
        pid = os.fork()
    except OSError as e:
        err = errno.errorcode[e.errno]; break
    if pid == 0:
        time.sleep(30); os._exit(0)
    kids += 1
print(kids, err)
`)
	f := strings.Fields(r.Stdout)
	if len(f) != 2 {
		t.Fatalf("unexpected output %q (stderr %q)", r.Stdout, r.Stderr)
	}
	kids, _ := strconv.Atoi(f[0])
	if kids >= 32 || f[1] != "EAGAIN" {
		t.Errorf("forked %d children before %s; want < 32 and EAGAIN", kids, f[1])
	}
	st, err := sb.Stats()
	if err != nil {
		t.Fatal(err)
	}
	// The stats count the agent's threads too, which have a budget of
	// their own (backend.AgentPids) beside the sandbox's 32.
	if st.Pids < int64(kids) || st.Pids > 32+backend.AgentPids {
		t.Errorf("cgroup holds %d pids; want the %d children, at most 32 + the agent's %d", st.Pids, kids, backend.AgentPids)
	}
	// A shell fork bomb is contained, and the sandbox can still be stopped.
	r = Exec(t, sb, 3*time.Second, "/bin/sh", "-c", "f() { f | f & }; f")
	_ = r
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sb.Stop(ctx); err != nil {
		t.Errorf("stop after fork bomb: %v", err)
	}
}

func (h *Harness) cpuQuota(t *testing.T) {
	sb := h.Sandbox(t, backend.Config{CPUs: 0.2})
	before, err := sb.Stats()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r := Python(t, sb, 30*time.Second, `
import time
end = time.time() + 1.5
while time.time() < end: pass
`)
	wall := time.Since(start)
	if r.Code != 0 {
		t.Fatalf("busy loop failed: %+v %s", r.ExitStatus, r.Stderr)
	}
	after, err := sb.Stats()
	if err != nil {
		t.Fatal(err)
	}
	used := after.CPUUsage - before.CPUUsage
	if frac := used.Seconds() / wall.Seconds(); frac > 0.35 {
		t.Errorf("used %.2f CPUs over %v with a 0.2 quota", frac, wall)
	}
	if after.Throttled <= before.Throttled {
		t.Errorf("no throttled periods recorded (%d -> %d)", before.Throttled, after.Throttled)
	}
}

func (h *Harness) capabilities(t *testing.T) {
	sb := h.Sandbox(t, backend.Config{})
	hostTime := time.Now()
	r := Python(t, sb, 30*time.Second, `
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def res(rc):
    return 'ok' if rc == 0 else errno.errorcode[ctypes.get_errno()]
os.makedirs('/mnt/x', exist_ok=True)
print('mount', res(libc.mount(b'none', b'/mnt/x', b'tmpfs', 0, None)))
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); print('raw ok')
except OSError as e:
    print('raw', errno.errorcode[e.errno])
class timeval(ctypes.Structure):
    _fields_ = [('s', ctypes.c_long), ('us', ctypes.c_long)]
print('settimeofday', res(libc.settimeofday(ctypes.byref(timeval(1, 0)), None)))
print('mknod', res(libc.mknod(b'/tmp/dev', 0o20666, os.makedev(1, 3))))
# Calls the seccomp filter lets through (checked below), so only the missing
# capability can stop them.
print('sethostname', res(libc.sethostname(b'intruder', 8)), socket.gethostname())
import fcntl, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
def lo_flags():
    return struct.unpack('16sh', fcntl.ioctl(s, 0x8913, struct.pack('16sh', b'lo', 0)))[1]  # SIOCGIFFLAGS
try:
    fcntl.ioctl(s, 0x8914, struct.pack('16sh', b'lo', lo_flags() & ~1)); print('lo-down ok')  # SIOCSIFFLAGS
except OSError as e:
    print('lo-down', errno.errorcode[e.errno])
print('lo-up', lo_flags() & 1)
for l in open('/proc/self/status'):
    if l.startswith(('CapBnd', 'CapEff', 'NoNewPrivs')): print(l.strip().replace('\t', ' '))
`)
	if r.Code != 0 {
		t.Fatalf("python failed: %+v %s", r.ExitStatus, r.Stderr)
	}
	loDown := "lo-down EPERM"
	if h.Backend.Capabilities().SecondKernel {
		// gVisor's kernel has no SIOCSIFFLAGS at all: the call fails
		// whatever the capabilities (and lo stays up, checked below).
		loDown = "lo-down ENOTTY"
	}
	for _, want := range []string{"mount EPERM", "raw EPERM", "settimeofday EPERM", "mknod EPERM", "NoNewPrivs: 1",
		"sethostname EPERM sandbox", loDown, "lo-up 1"} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("want %q in:\n%s", want, r.Stdout)
		}
	}
	if d := time.Since(hostTime); d < 0 || d > time.Minute {
		t.Errorf("host clock moved: %v", d)
	}
	// Those probes prove a capability is missing only if the filter lets
	// their calls through: CAP_SYS_ADMIN (sethostname), CAP_NET_ADMIN
	// (SIOCSIFFLAGS), CAP_MKNOD (mknod), CAP_NET_RAW (socket). The filter
	// may refuse socket families, as long as the raw probe's AF_INET is
	// allowed before that refusal.
	inetAllowed := false
	for _, sc := range seccomp.DefaultProfile().Syscalls {
		if sc.Action == specs.ActAllow {
			if slices.Contains(sc.Names, "socket") && len(sc.Args) == 1 && sc.Args[0].Index == 0 &&
				sc.Args[0].Op == specs.OpMaskedEqual && sc.Args[0].ValueTwo == syscall.AF_INET {
				inetAllowed = true
			}
			continue
		}
		if inetAllowed && slices.Contains(sc.Names, "socket") && len(sc.Args) == 0 {
			continue
		}
		for _, name := range []string{"sethostname", "ioctl", "mknod", "mknodat", "socket"} {
			if slices.Contains(sc.Names, name) {
				t.Errorf("the seccomp profile acts on %s (%s), so its probe says nothing about capabilities", name, sc.Action)
			}
		}
	}
	// CAP_SYS_ADMIN (21), CAP_NET_RAW (13), CAP_SYS_TIME (25), CAP_MKNOD (27) absent.
	for _, line := range strings.Split(r.Stdout, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "CapBnd:" {
			m, err := strconv.ParseUint(f[1], 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []uint{13, 21, 25, 27} {
				if m&(1<<c) != 0 {
					t.Errorf("capability %d in bounding set %s", c, f[1])
				}
			}
		}
	}
}

func (h *Harness) seccomp(t *testing.T) {
	sb := h.Sandbox(t, backend.Config{})
	r := Python(t, sb, 30*time.Second, `
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
calls = {'keyctl': 250, 'bpf': 321, 'userfaultfd': 323, 'perf_event_open': 298,
         'unshare': 272, 'kexec_load': 246, 'init_module': 175, 'open_by_handle_at': 304,
         'io_uring_setup': 425}
for name, nr in sorted(calls.items()):
    rc = libc.syscall(nr, 0, 0, 0, 0, 0)
    print(name, 'ok' if rc >= 0 else errno.errorcode[ctypes.get_errno()])
print('clone3', errno.errorcode.get(ctypes.get_errno()) if libc.syscall(435, 0, 0) < 0 else 'ok')
import socket
for fam, name in ((socket.AF_VSOCK, 'vsock'), (socket.AF_UNIX, 'unix'), (socket.AF_INET, 'inet'), (socket.AF_NETLINK, 'netlink')):
    try:
        socket.socket(fam, socket.SOCK_DGRAM if fam == socket.AF_NETLINK else socket.SOCK_STREAM).close()
        print('socket', name, 'ok')
    except OSError as e:
        print('socket', name, errno.errorcode[e.errno])
for l in open('/proc/self/status'):
    if l.startswith('Seccomp:'): print(l.strip().replace('\t', ' '))
`)
	if r.Code != 0 {
		t.Fatalf("python failed: %+v %s", r.ExitStatus, r.Stderr)
	}
	for _, name := range []string{"keyctl", "bpf", "userfaultfd", "perf_event_open", "unshare", "kexec_load", "init_module", "open_by_handle_at", "io_uring_setup"} {
		if !strings.Contains(r.Stdout, name+" EPERM") {
			t.Errorf("%s not denied with EPERM:\n%s", name, r.Stdout)
		}
	}
	if !strings.Contains(r.Stdout, "clone3 ENOSYS") {
		t.Errorf("clone3 should fail with ENOSYS:\n%s", r.Stdout)
	}
	// vsock's ports are the host's: the family is refused, the sandbox's
	// own (per network namespace) families are not.
	for _, want := range []string{"socket vsock EAFNOSUPPORT", "socket unix ok", "socket inet ok", "socket netlink ok"} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("want %q:\n%s", want, r.Stdout)
		}
	}
	if !strings.Contains(r.Stdout, "Seccomp: 2") {
		t.Errorf("no seccomp filter in force:\n%s", r.Stdout)
	}
}

// ptysCapped: a sandbox's devpts holds at most oci.MaxPtys terminals, so
// one sandbox cannot take the host's whole pool (kernel.pty.max).
func (h *Harness) ptysCapped(t *testing.T) {
	sb := h.Sandbox(t, backend.Config{})
	r := Python(t, sb, 30*time.Second, `
import os, errno
held = []
try:
    for _ in range(1000):
        held.append(os.openpty())
    print('opened', len(held))
except OSError as e:
    print('opened', len(held), errno.errorcode[e.errno])
`)
	if r.Code != 0 {
		t.Fatalf("python failed: %+v %s", r.ExitStatus, r.Stderr)
	}
	want := fmt.Sprintf("opened %d ENOSPC", oci.MaxPtys)
	if h.Backend.Capabilities().SecondKernel {
		// The cap protects the host's pool, which the second kernel's
		// terminals do not take (they are its own): no cap applies.
		want = "opened 1000"
	}
	if strings.TrimSpace(r.Stdout) != want {
		t.Errorf("got %q, want %q", strings.TrimSpace(r.Stdout), want)
	}
	// The cap is the sandbox's own: another sandbox still opens one.
	if r := Python(t, h.Sandbox(t, backend.Config{}), 30*time.Second, "import os; os.openpty(); print('ok')"); strings.TrimSpace(r.Stdout) != "ok" {
		t.Errorf("a second sandbox cannot open a terminal: %+v %q %s", r.ExitStatus, r.Stdout, r.Stderr)
	}
}

// agentIgnoresSignals: sandbox code may signal its PID 1 (same uid), and the
// kernel delivers to a namespace's init every signal it has a handler for.
// The Go runtime has one for nearly all, and exits on most of them; the
// agent must discard them (the host stops it with SIGKILL, from outside).
func (h *Harness) agentIgnoresSignals(t *testing.T) {
	sb := h.Sandbox(t, backend.Config{})
	// Every signal but SIGKILL and SIGSTOP (which never reach init from
	// inside), real-time ones and the C libraries' own (32-34) included:
	// eight to an exec, one at a time, so a failure names a few.
	for first := 1; first <= 64; first += 8 {
		var sh strings.Builder
		for n := first; n < first+8; n++ {
			if n != int(syscall.SIGKILL) && n != int(syscall.SIGSTOP) {
				fmt.Fprintf(&sh, "kill -%d 1 && sleep 0.02 && ", n)
			}
		}
		sh.WriteString("echo alive")
		r := Exec(t, sb, 20*time.Second, "/bin/sh", "-c", sh.String())
		if r.Code != 0 || r.Stdout != "alive\n" {
			t.Fatalf("signals %d-%d to PID 1: %+v %q %q", first, first+7, r.ExitStatus, r.Stdout, r.Stderr)
		}
	}
	// Then all of them at once, several times over, pending together: on
	// Linux 6.1 a signal left at its default action ended the agent when it
	// arrived while the runtime had it blocked.
	r := Exec(t, sb, 60*time.Second, "/bin/sh", "-c",
		"for i in 1 2 3 4 5; do n=1; while [ $n -le 64 ]; do case $n in 9|19) ;; *) kill -$n 1;; esac; n=$((n+1)); done; done; sleep 0.2; echo alive")
	if r.Code != 0 || r.Stdout != "alive\n" {
		t.Fatalf("every signal to PID 1 at once: %+v %q %q", r.ExitStatus, r.Stdout, r.Stderr)
	}
	select {
	case <-sb.Done():
		t.Fatal("the sandbox ended after its code signalled PID 1")
	default:
	}
	// The commands it starts keep every signal at its default but 32 and 34
	// (ignored, as documented): SIGTERM still ends one.
	r = Exec(t, sb, 20*time.Second, "/bin/sh", "-c", "grep SigIgn /proc/self/status; sleep 30 & kill -TERM $!; wait $!; echo $?")
	want := "SigIgn:\t0000000280000000\n143\n"
	if h.Backend.Capabilities().SecondKernel {
		// The Linux 6.1 hazard those two guard against is the host
		// kernel's, and gVisor's /proc/<pid>/status has no SigIgn line:
		// what is left to check is that SIGTERM ends a command.
		want = "143\n"
	}
	if r.Code != 0 || r.Stdout != want {
		t.Fatalf("a command's signals: %+v %q, want %q", r.ExitStatus, r.Stdout, want)
	}
}

// noInheritedDescriptors: a command in the sandbox holds stdin, stdout and
// stderr and nothing of the agent's (its listener, connections, the
// host's lifeline, files it opened).
func (h *Harness) noInheritedDescriptors(t *testing.T) {
	sb := h.Sandbox(t, backend.Config{})
	r := Exec(t, sb, 10*time.Second, "/bin/ls", "/proc/self/fd")
	if r.Code != 0 {
		t.Fatalf("ls: %+v %s", r.ExitStatus, r.Stderr)
	}
	// 3 is ls's own handle on /proc/self/fd.
	if got := strings.Fields(r.Stdout); !slices.Equal(got, []string{"0", "1", "2", "3"}) {
		t.Errorf("a sandbox command holds descriptors %v, want 0 1 2 (and ls's 3)", got)
	}
}

func (h *Harness) maskedPaths(t *testing.T) {
	sb := h.Sandbox(t, backend.Config{})
	if h.Backend.Capabilities().SecondKernel {
		h.kernelFilesOwn(t, sb)
		return
	}
	r := Python(t, sb, 30*time.Second, `
import os, errno
for p in ['/proc/kcore', '/proc/keys', '/proc/timer_list', '/proc/sched_debug', '/proc/cmdline', '/proc/config.gz', '/sys/kernel/vmcoreinfo']:
    try:
        print(p, len(open(p, 'rb').read(4096)))
    except OSError as e:
        print(p, errno.errorcode[e.errno])
print('/sys/firmware', os.listdir('/sys/firmware') if os.path.isdir('/sys/firmware') else 'absent')
for p in ['/proc/sys/kernel/hostname', '/proc/sysrq-trigger']:
    try:
        open(p, 'w').write('x'); print(p, 'WRITTEN')
    except OSError as e:
        print(p, errno.errorcode[e.errno])
try:
    open('/sys/kernel/mm/transparent_hugepage/enabled', 'w').write('never'); print('sys WRITTEN')
except OSError as e:
    print('sys', errno.errorcode[e.errno])
`)
	if r.Code != 0 {
		t.Fatalf("python failed: %+v %s", r.ExitStatus, r.Stderr)
	}
	// A masked file reads empty; one this kernel lacks is absent in the
	// sandbox too. Either way nothing of the host's leaks.
	masked := 0
	for _, p := range []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/cmdline", "/proc/config.gz", "/sys/kernel/vmcoreinfo"} {
		want := p + " ENOENT"
		if _, err := os.Stat(p); err == nil {
			want = p + " 0"
			masked++
		}
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("want %q in:\n%s", want, r.Stdout)
		}
	}
	if masked == 0 {
		t.Error("none of the masked /proc files exists on this host; the check proved nothing")
	}
	for _, want := range []string{"/sys/firmware []", "/proc/sys/kernel/hostname EROFS", "sys EROFS"} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("want %q in:\n%s", want, r.Stdout)
		}
	}
	if strings.Contains(r.Stdout, "WRITTEN") {
		t.Errorf("a read-only path was written:\n%s", r.Stdout)
	}
}

// kernelFilesOwn is maskedPaths for a backend with a second kernel,
// whose /proc and /sys are its own: there is nothing of the host's to
// mask, so it checks that the host's shows nowhere (its boot line, kernel
// addresses and configuration) and that what the sandbox writes there
// reaches its own kernel only.
func (h *Harness) kernelFilesOwn(t *testing.T, sb backend.Sandbox) {
	hostName, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	hostCmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil || len(hostCmdline) == 0 {
		t.Fatalf("the host's /proc/cmdline: %q %v: the check would prove nothing", hostCmdline, err)
	}
	r := Python(t, sb, 30*time.Second, `
import errno, socket
for p in ['/proc/cmdline', '/proc/kcore', '/proc/kallsyms', '/proc/config.gz', '/sys/kernel/vmcoreinfo', '/proc/keys', '/proc/timer_list']:
    try:
        print(p, open(p, 'rb').read(4096).hex())
    except OSError as e:
        print(p, errno.errorcode[e.errno])
try:
    open('/proc/sys/kernel/hostname', 'w').write('intruder'); print('hostname written', socket.gethostname())
except OSError as e:
    print('hostname', errno.errorcode[e.errno])
`)
	if r.Code != 0 {
		t.Fatalf("python failed: %+v %s", r.ExitStatus, r.Stderr)
	}
	for _, l := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		p, v, _ := strings.Cut(l, " ")
		if !strings.HasPrefix(p, "/") || len(v) < 8 {
			continue // absent, or too short to hold anything
		}
		host, err := os.ReadFile(p) //nolint:gosec // one of the kernel files listed above
		if err == nil && len(host) > 0 && strings.Contains(v, fmt.Sprintf("%x", host[:min(len(host), 64)])) {
			t.Errorf("%s shows the host's: %s", p, v)
		}
	}
	if now, _ := os.Hostname(); now != hostName {
		t.Errorf("the host's hostname changed to %q", now)
	}
}

func (h *Harness) rootIsNotHostRoot(t *testing.T) {
	if !h.UserNS && h.Backend.Capabilities().SecondKernel {
		h.secondKernelNotHostRoot(t)
		return
	}
	if !h.UserNS {
		t.Skip("backend runs without a user namespace here (documented fallback)")
	}
	sb := h.Sandbox(t, backend.Config{})
	r := Exec(t, sb, 10*time.Second, "/bin/cat", "/proc/self/uid_map")
	f := strings.Fields(r.Stdout)
	if len(f) != 3 || f[0] != "0" || f[1] == "0" {
		t.Errorf("uid_map %q: sandbox root must map to a non-root host uid", r.Stdout)
	}
	if h.HostPid != nil {
		pid := h.HostPid(sb)
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "Uid:") && strings.Fields(l)[1] == "0" {
				t.Errorf("sandbox init runs as host uid 0: %s", l)
			}
		}
	}
	// Files sandbox root creates are not owned by host root.
	r = Exec(t, sb, 10*time.Second, "/bin/sh", "-c", "id -u; touch /owned && stat -c %u /owned")
	if f := strings.Fields(r.Stdout); len(f) != 2 || f[0] != "0" || f[1] != "0" {
		t.Errorf("inside, root should be uid 0 and own its files: %q", r.Stdout)
	}
}

// secondKernelNotHostRoot is rootIsNotHostRoot for a second kernel
// without a user namespace of the backend's: sandbox root is the second
// kernel's root, and the host process that runs all of the sandbox's code
// is not host root.
func (h *Harness) secondKernelNotHostRoot(t *testing.T) {
	if h.HostPid == nil {
		t.Fatal("harness has no HostPid")
	}
	sb := h.Sandbox(t, backend.Config{})
	if r := Exec(t, sb, 10*time.Second, "/usr/bin/id", "-u"); strings.TrimSpace(r.Stdout) != "0" {
		t.Fatalf("inside, the agent's commands should run as root: %q %q", r.Stdout, r.Stderr)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", h.HostPid(sb)))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 1 && (f[0] == "Uid:" || f[0] == "Gid:") && slices.Contains(f[1:], "0") {
			t.Errorf("the sandbox's host process runs as root: %s", l)
		}
	}
}

// agentUnreachable checks sandbox code cannot reach into its init (the
// agent): not its descriptors (the host's socket among them), memory,
// environment, binary or root.
func (h *Harness) agentUnreachable(t *testing.T) {
	sb := h.Sandbox(t, backend.Config{})
	r := Python(t, sb, 30*time.Second, `
import os
paths = ['/proc/1/' + p for p in ('exe', 'mem', 'environ', 'root/etc/hostname', 'cwd/.')]
paths += ['/proc/1/fd/' + n for n in os.listdir('/proc/1/fd')]
for p in paths:
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
        print('OPENED', p)
        os.close(fd)
    except OSError as e:
        print('denied', p, e.errno)
`)
	if r.Code != 0 {
		t.Fatalf("python failed: %+v %s", r.ExitStatus, r.Stderr)
	}
	if strings.Contains(r.Stdout, "OPENED") || !strings.Contains(r.Stdout, "denied /proc/1/fd/") {
		t.Errorf("sandbox code reached its init:\n%s", r.Stdout)
	}
}

func (h *Harness) stopKillsTree(t *testing.T) {
	sb := h.Sandbox(t, backend.Config{})
	marker := fmt.Sprintf("%d.%d", 1000+os.Getpid()%1000, time.Now().UnixNano()%100000)
	// Double fork and setsid: the escapee is reparented and in a new session.
	r := Exec(t, sb, 10*time.Second, "/bin/sh", "-c", "(setsid /bin/sleep "+marker+" >/dev/null 2>&1 &) ; sleep 0.2; echo started")
	if !strings.Contains(r.Stdout, "started") {
		t.Fatalf("setup failed: %+v %q %q", r.ExitStatus, r.Stdout, r.Stderr)
	}
	second := h.Backend.Capabilities().SecondKernel
	if second {
		// The escapee is a process of the backend's kernel, not the
		// host's: the host sees none, and stop must end the one host
		// process that runs them all.
		if n := hostProcessesWith(marker); n != 0 {
			t.Fatalf("a process of the second kernel is a host process (%d)", n)
		}
		if r := Exec(t, sb, 10*time.Second, "/bin/sh", "-c", "ps -eo args 2>/dev/null || cat /proc/[0-9]*/cmdline"); !strings.Contains(r.Stdout, marker) {
			t.Fatalf("the escapee is not running inside: %q", r.Stdout)
		}
	} else if n := hostProcessesWith(marker); n != 1 {
		t.Fatalf("want the escapee running once on the host, found %d", n)
	}
	pid := 0
	if h.HostPid != nil {
		pid = h.HostPid(sb)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if n := hostProcessesWith(marker); n != 0 {
		t.Errorf("%d processes survived stop", n)
	}
	if pid > 0 && alive(pid) {
		t.Errorf("the sandbox's host process %d survived stop", pid)
	}
}

// alive reports whether pid is a process that has not exited (a zombie
// has).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && i+2 < len(b) && b[i+2] != 'Z'
}

// hostProcessesWith counts host processes whose command line contains s.
func hostProcessesWith(s string) int {
	ents, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(b, []byte(s)) && !bytes.Contains(b, []byte("-c")) {
			n++
		}
	}
	return n
}

func (h *Harness) noLeftovers(t *testing.T) {
	if h.Snapshot == nil {
		t.Fatal("harness has no Snapshot")
	}
	before, err := h.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	cycles := h.Cycles
	if cycles == 0 {
		cycles = 200
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	var failed atomic.Int64
	work := make(chan int)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := h.cycle(ctx, i); err != nil {
					if failed.Add(1) <= 3 {
						t.Errorf("cycle %d: %v", i, err)
					}
				}
			}
		}()
	}
	for i := range cycles {
		work <- i
	}
	close(work)
	wg.Wait()
	after, err := h.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if before != after {
		t.Errorf("leftovers after %d cycles:\nbefore:\n%s\nafter:\n%s", cycles, before, after)
	}
}

// cycle creates, uses and removes one sandbox. Every third cycle leaves a
// busy workload running when the sandbox is removed (half of them paused,
// where the backend can pause); every third stops it mid-command from
// another goroutine.
func (h *Harness) cycle(ctx context.Context, i int) error {
	sb, err := h.Backend.Create(ctx, backend.Config{ID: fmt.Sprintf("cycle-%d-%d", os.Getpid(), i), Image: h.Image, MemoryBytes: 128 << 20, PidsMax: 64})
	if err != nil {
		return err
	}
	if err := sb.Start(ctx); err != nil {
		_ = sb.Remove(ctx)
		return err
	}
	switch i % 3 {
	case 0:
		if st, err := sb.Agent().Exec(ctx, &wire.ExecRequest{Argv: []string{"/bin/true"}}, nil); err != nil || st.Code != 0 {
			_ = sb.Remove(ctx)
			return fmt.Errorf("exec true: %w %+v", err, st)
		}
	case 1:
		if _, err := sb.Agent().StartProcess(ctx, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "sleep 1000 & while :; do :; done"}}); err != nil {
			_ = sb.Remove(ctx)
			return err
		}
		// Every other such sandbox is removed paused.
		if p, ok := sb.(backend.Pauser); ok && i%2 == 0 {
			if err := p.Pause(ctx); err != nil {
				_ = sb.Remove(ctx)
				return err
			}
		}
	case 2:
		c := sb.Agent()
		go func() { time.Sleep(5 * time.Millisecond); _ = sb.Stop(ctx) }()
		_, _ = c.Exec(ctx, &wire.ExecRequest{Argv: []string{"/bin/sleep", "1000"}}, nil)
	}
	return sb.Remove(ctx)
}

// devContents checks /dev holds exactly what the spec gives a sandbox
// (oci.Devices bound from the host, the devpts, shm and mqueue mounts, and
// the standard links) and that the device nodes work.
func (h *Harness) devContents(t *testing.T) {
	sb := h.Sandbox(t, backend.Config{})
	r := Python(t, sb, 30*time.Second, `
import errno, os, stat
def describe(p):
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode): return 'link ' + os.readlink(p)
    if stat.S_ISCHR(st.st_mode): return 'chr %d:%d' % (os.major(st.st_rdev), os.minor(st.st_rdev))
    if stat.S_ISDIR(st.st_mode): return 'dir'
    return 'other %o' % st.st_mode
for n in sorted(os.listdir('/dev')):
    print('/dev/' + n, describe('/dev/' + n))
for n in sorted(os.listdir('/dev/pts')):
    print('/dev/pts/' + n, describe('/dev/pts/' + n))
with open('/dev/null', 'wb') as f: f.write(b'x' * 65536)
print('null-read', len(open('/dev/null', 'rb').read()))
z = open('/dev/zero', 'rb').read(1 << 20)
print('zero', len(z), z.count(0))
try:
    with open('/dev/full', 'wb', buffering=0) as f: f.write(b'x'); print('full WRITTEN')
except OSError as e:
    print('full', errno.errorcode[e.errno])
print('full-read', open('/dev/full', 'rb').read(8).count(0))
for d in ('random', 'urandom'):
    b = open('/dev/' + d, 'rb').read(64)
    print(d, len(b), len(set(b)) > 8)
m, s = os.openpty()
os.write(s, b'ping\n'); print('pty', os.read(m, 64).strip().decode(), os.ttyname(s))
open('/dev/shm/x', 'w').write('x'); print('shm ok')
with open('/dev/stderr', 'w') as f: f.write('through /dev/stderr')
`)
	if r.Code != 0 {
		t.Fatalf("python failed: %+v %s", r.ExitStatus, r.Stderr)
	}
	var entries []string
	checks := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		if strings.HasPrefix(l, "/dev/") {
			entries = append(entries, l)
		} else if k, v, ok := strings.Cut(l, " "); ok {
			checks[k] = v
		}
	}
	want := []string{
		"/dev/core link /proc/kcore",
		"/dev/fd link /proc/self/fd",
		"/dev/full chr 1:7",
		"/dev/mqueue dir",
		"/dev/null chr 1:3",
		"/dev/ptmx link pts/ptmx",
		"/dev/pts dir",
		"/dev/random chr 1:8",
		"/dev/shm dir",
		"/dev/stderr link /proc/self/fd/2",
		"/dev/stdin link /proc/self/fd/0",
		"/dev/stdout link /proc/self/fd/1",
		"/dev/tty chr 5:0",
		"/dev/urandom chr 1:9",
		"/dev/zero chr 1:5",
		"/dev/pts/ptmx chr 5:2",
	}
	if h.Backend.Capabilities().SecondKernel {
		// The second kernel's /dev is its own set of emulated devices
		// (none a host device): the nodes checked below must work.
		want = entries
	}
	if !slices.Equal(entries, want) {
		t.Errorf("/dev holds:\n  %s\nwant exactly:\n  %s", strings.Join(entries, "\n  "), strings.Join(want, "\n  "))
	}
	for k, v := range map[string]string{
		"null-read": "0", "zero": "1048576 1048576", "full": "ENOSPC", "full-read": "8",
		"random": "64 True", "urandom": "64 True", "pty": "ping /dev/pts/0", "shm": "ok",
	} {
		if checks[k] != v {
			t.Errorf("%s: got %q, want %q (output:\n%s)", k, checks[k], v, r.Stdout)
		}
	}
	if r.Stderr != "through /dev/stderr" {
		t.Errorf("stderr %q: /dev/stderr does not lead to the command's stderr", r.Stderr)
	}
}

// rlimits checks a sandbox's processes run with the rlimits of the spec.
// A sandbox cannot raise a hard limit it inherits from the host, so where
// this process's hard limit is lower, that is what the sandbox gets.
func (h *Harness) rlimits(t *testing.T) {
	sp, err := oci.Build(oci.Params{RootPath: "/"})
	if err != nil {
		t.Fatal(err)
	}
	label := map[string]string{"RLIMIT_NOFILE": "Max open files", "RLIMIT_CORE": "Max core file size"}
	resource := map[string]int{"RLIMIT_NOFILE": syscall.RLIMIT_NOFILE, "RLIMIT_CORE": syscall.RLIMIT_CORE}
	if len(sp.Process.Rlimits) != len(label) {
		t.Fatalf("the spec sets %d rlimits, the check knows %d: %+v", len(sp.Process.Rlimits), len(label), sp.Process.Rlimits)
	}
	sb := h.Sandbox(t, backend.Config{})
	// The command itself, and a process it forks.
	r := Exec(t, sb, 10*time.Second, "/bin/sh", "-c", "cat /proc/self/limits; echo; cat /proc/$$/limits")
	if r.Code != 0 {
		t.Fatalf("cat failed: %+v %s", r.ExitStatus, r.Stderr)
	}
	for _, rl := range sp.Process.Rlimits {
		var host syscall.Rlimit
		if err := syscall.Getrlimit(resource[rl.Type], &host); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("%s %d %d", label[rl.Type], min(rl.Soft, host.Max), min(rl.Hard, host.Max))
		if h.Backend.Capabilities().SecondKernel {
			// The limits are the second kernel's, which the host's
			// hard limits do not bound: the spec's own.
			want = fmt.Sprintf("%s %d %d", label[rl.Type], rl.Soft, rl.Hard)
		}
		n := 0
		for _, l := range strings.Split(r.Stdout, "\n") {
			if strings.HasPrefix(l, label[rl.Type]+" ") {
				f := strings.Fields(strings.TrimPrefix(l, label[rl.Type]))
				if got := fmt.Sprintf("%s %s %s", label[rl.Type], f[0], f[1]); got != want {
					t.Errorf("%s: %q, want %q", rl.Type, got, want)
				}
				n++
			}
		}
		if n != 2 {
			t.Errorf("%s: found %d of 2 lines in:\n%s", rl.Type, n, r.Stdout)
		}
	}
}

// etcSanitized checks what a sandbox of the host image sees of the host's
// /etc: none of its secrets, and no file or directory the host keeps from
// other users.
func (h *Harness) etcSanitized(t *testing.T) {
	if h.Image.Name != image.HostName {
		t.Skipf("the harness image is %q, not the host image", h.Image.Name)
	}
	secrets := []string{"/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/machine-id",
		"/etc/sudoers", "/etc/sudoers.d", "/etc/ssl/private", "/etc/ssh"}
	onHost := 0
	for _, p := range secrets {
		if _, err := os.Lstat(p); err == nil {
			onHost++
		}
	}
	if _, err := os.Stat("/etc/shadow"); err != nil || onHost < 2 {
		t.Fatalf("this host lacks /etc/shadow or most of %v: the check would prove little", secrets)
	}
	sb := h.Sandbox(t, backend.Config{})
	r := Python(t, sb, 30*time.Second, `
import os
for d, dirs, files in os.walk('/etc'):
    for n in dirs + files:
        p = os.path.join(d, n)
        print('l' if os.path.islink(p) else 'd' if os.path.isdir(p) else 'f', p)
`)
	if r.Code != 0 {
		t.Fatalf("python failed: %+v %s", r.ExitStatus, r.Stderr)
	}
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		kind, p, _ := strings.Cut(l, " ")
		seen[p] = true
		if strings.HasPrefix(path.Base(p), "ssh_host_") {
			t.Errorf("ssh host key %s in the sandbox", p)
		}
		fi, err := os.Lstat(p)
		if err != nil || kind == "l" {
			continue // the sandbox's own (hostname, hosts), or a link
		}
		if need := fs.FileMode(0o004) | map[bool]fs.FileMode{true: 0o001}[fi.IsDir()]; fi.Mode().Perm()&need != need {
			t.Errorf("%s is in the sandbox, but the host keeps it from other users (mode %v)", p, fi.Mode().Perm())
		}
	}
	for _, p := range secrets {
		if seen[p] {
			t.Errorf("%s is in the sandbox", p)
		}
	}
	if !seen["/etc/passwd"] {
		t.Errorf("/etc/passwd missing: the listing is wrong:\n%s", r.Stdout)
	}
}

// stoppedAgentTimeout checks the host enforces an exec's timeout when the
// agent does not answer (stopped with SIGSTOP mid-command): the call ends
// soon after the timeout, says the command timed out, and the sandbox is
// stopped and can be stopped again.
func (h *Harness) stoppedAgentTimeout(t *testing.T) {
	if h.HostPid == nil {
		t.Fatal("harness has no HostPid")
	}
	sb := h.Sandbox(t, backend.Config{})
	pid := h.HostPid(sb)
	const timeout = time.Second
	stopped := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		stopped <- syscall.Kill(pid, syscall.SIGSTOP)
	}()
	start := time.Now()
	res, err := backend.Exec(context.Background(), sb, &wire.ExecRequest{Argv: []string{"/bin/sleep", "30"}, TimeoutMs: timeout.Milliseconds()}, nil)
	took := time.Since(start)
	if serr := <-stopped; serr != nil {
		t.Fatalf("SIGSTOP the agent: %v", serr)
	}
	if !errors.Is(err, backend.ErrAgentUnresponsive) || !res.TimedOut {
		t.Errorf("got %+v, %v; want a timed-out result and ErrAgentUnresponsive", res, err)
	}
	// The timeout, the host's grace period, and the stop.
	if took < timeout || took > timeout+8*time.Second {
		t.Errorf("the call took %v with a %v timeout", took, timeout)
	}
	select {
	case <-sb.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the sandbox's init still runs")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sb.Stop(ctx); err != nil {
		t.Errorf("stop: %v", err)
	}
}
