package spawner

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/cgroup"
	"github.com/warren-sandbox/warren/internal/oci"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// setup starts a spawner from the real binary and makes a cgroup to spawn
// into. Privileged.
func setup(t *testing.T) (*Client, *cgroup.Cgroup) {
	t.Helper()
	testenv.RequireRoot(t)
	cg := testCgroup(t, "c")
	c, err := Start(testenv.SpawnerBinary(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, cg
}

// testCgroup makes a cgroup (named kind and a timestamp) under this test
// process's own prefix; both go at the end of the test.
func testCgroup(t *testing.T, kind string) *cgroup.Cgroup {
	t.Helper()
	m, err := cgroup.New(fmt.Sprintf("warren-spawnertest-%d", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	cg, err := m.Create(fmt.Sprintf("%s%d", kind, time.Now().UnixNano()), cgroup.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cg.Destroy() })
	return cg
}

// setupWithGroup is setup with a spawner that has a supplementary group
// (4242), which its children must not get.
func setupWithGroup(t *testing.T) (*Client, *cgroup.Cgroup) {
	t.Helper()
	testenv.RequireRoot(t)
	groups, err := syscall.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Setgroups([]int{4242}); err != nil {
		t.Fatal(err)
	}
	c, cg := setup(t)
	if err := syscall.Setgroups(groups); err != nil {
		t.Fatal(err)
	}
	return c, cg
}

// spawn starts req with its stdout and stderr on a pipe.
func spawn(t *testing.T, c *Client, target cgroup.SpawnTarget, req Request) (pid, pidfd int, out *bufio.Reader) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	pid, pidfd, err = c.Spawn(req, target, []*os.File{w, w})
	_ = w.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.PidfdSendSignal(pidfd, syscall.SIGKILL, nil, 0)
		unix.Close(pidfd)
	})
	return pid, pidfd, bufio.NewReader(r)
}

// spawnShell spawns sh -c script in cg.
func spawnShell(t *testing.T, c *Client, cg *cgroup.Cgroup, script string) (pid, pidfd int, out *bufio.Reader) {
	t.Helper()
	target, err := cg.OpenSpawnTarget()
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	return spawn(t, c, target, Request{Path: "/bin/sh", Args: []string{"sh", "-c", script}, KeepCaps: ^uint64(0)})
}

func waitExited(t *testing.T, pidfd int) {
	t.Helper()
	var n int
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		n, err = unix.Poll([]unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}, int(time.Until(deadline).Milliseconds()))
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if n != 1 || err != nil {
		t.Fatalf("pidfd did not report the exit within 10s: %d %v", n, err)
	}
}

func readyLine(t *testing.T, out *bufio.Reader, want string) {
	t.Helper()
	if line, err := out.ReadString('\n'); line != want+"\n" {
		t.Fatalf("child said %q (%v), want %q", line, err, want)
	}
}

func TestSpawn(t *testing.T) {
	c, cg := setupWithGroup(t)
	pid, pidfd, out := spawnShell(t, c, cg, "echo ready; exec sleep 60")
	readyLine(t, out, "ready")
	if g := procStatus(t, pid)["Groups"]; g != "" {
		t.Errorf("supplementary groups %q leaked from the spawner", g)
	}
	if got := testenv.ParentPID(pid); got != c.Pid() {
		t.Errorf("child's parent is %d, want the spawner %d", got, c.Pid())
	}
	// The child joined the cgroup before it ran: it is the only member.
	if procs, err := cg.Procs(); err != nil || !slices.Equal(procs, []int{pid}) {
		t.Errorf("cgroup holds %v (%v), want the child %d", procs, err, pid)
	}
	if err := unix.PidfdSendSignal(pidfd, syscall.SIGKILL, nil, 0); err != nil {
		t.Fatal(err)
	}
	waitExited(t, pidfd)
	// The spawner reaps it: no zombie stays.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("child %d was not reaped", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSpawnNamespaces checks, from the host's view of the child, everything
// a request asks for: new namespaces with the child as PID 1, root of a
// user namespace mapped to the unprivileged range, the narrowed bounding
// set, its own session, exactly descriptors 0..n, and no blocked or ignored
// signal inherited from the spawner.
func TestSpawnNamespaces(t *testing.T) {
	testenv.Require(t, unix.Access("/proc/self/ns/user", unix.F_OK) == nil, "user namespaces")
	c, cg := setupWithGroup(t)
	target, err := cg.OpenSpawnTarget()
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	keep, err := oci.CapMask([]string{"CAP_CHOWN", "CAP_KILL", "CAP_SYS_ADMIN"})
	if err != nil {
		t.Fatal(err)
	}
	const host = 0x60000000
	// The spawner answers once the child has exec'd: what is looked at
	// below is sleep as the spawner left it.
	pid, _, _ := spawn(t, c, target, Request{
		Path: "/bin/sleep", Args: []string{"sleep", "60"}, Env: []string{"A=b"},
		Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS,
		UserNS:     &IDMap{Host: host, Size: 65536}, KeepCaps: keep,
	})
	status := procStatus(t, pid)
	if got := strings.Fields(status["NSpid"]); len(got) != 2 || got[1] != "1" {
		t.Errorf("NSpid %q: want the child to be PID 1 of a new pid namespace", status["NSpid"])
	}
	if got := strings.Fields(status["Uid"]); len(got) != 4 || got[0] != strconv.Itoa(host) || got[1] != strconv.Itoa(host) {
		t.Errorf("Uid %q: want %d (root of its user namespace)", status["Uid"], host)
	}
	if status["Groups"] != "" {
		t.Errorf("supplementary groups %q leaked from the spawner", status["Groups"])
	}
	if m, _ := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", pid)); strings.Join(strings.Fields(string(m)), " ") != fmt.Sprintf("0 %d 65536", host) {
		t.Errorf("uid_map %q", m)
	}
	if m, _ := os.ReadFile(fmt.Sprintf("/proc/%d/gid_map", pid)); strings.Join(strings.Fields(string(m)), " ") != fmt.Sprintf("0 %d 65536", host) {
		t.Errorf("gid_map %q", m)
	}
	if bnd, _ := strconv.ParseUint(status["CapBnd"], 16, 64); bnd != keep {
		t.Errorf("bounding set %#x, want %#x", bnd, keep)
	}
	for _, k := range []string{"SigBlk", "SigIgn"} {
		if v, _ := strconv.ParseUint(status[k], 16, 64); v != 0 {
			t.Errorf("%s %s: the spawner's signal state leaked into the child", k, status[k])
		}
	}
	for _, ns := range []string{"mnt", "pid", "net", "ipc", "uts", "user"} {
		mine, _ := os.Readlink("/proc/self/ns/" + ns)
		theirs, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		if err != nil || theirs == mine {
			t.Errorf("%s namespace %q (%v), same as the host's %q", ns, theirs, err, mine)
		}
	}
	if sid, err := unix.Getsid(pid); err != nil || sid != pid {
		t.Errorf("session %d (%v), want its own (%d)", sid, err, pid)
	}
	// The dynamic loader of sleep may still hold a library open for a
	// moment after the exec; a descriptor leaked by the spawner stays.
	var fds []string
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			t.Fatal(err)
		}
		fds = fds[:0]
		for _, e := range ents {
			fds = append(fds, e.Name())
		}
		if slices.Equal(fds, []string{"0", "1", "2"}) || time.Now().After(deadline) {
			break
		}
	}
	if !slices.Equal(fds, []string{"0", "1", "2"}) {
		t.Errorf("child holds descriptors %v, want exactly 0 1 2", fds)
	}
	if p, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/0", pid)); p != "/dev/null" {
		t.Errorf("stdin is %q, want /dev/null", p)
	}
	environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if string(environ) != "A=b\x00" {
		t.Errorf("environment %q, want exactly A=b", environ)
	}
}

func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// TestSpawnV2 spawns through CLONE_INTO_CGROUP, into a cgroup made on this
// host's cgroup2 mount (which needs no controller for that).
func TestSpawnV2(t *testing.T) {
	c, _ := setup(t)
	spawnIntoV2(t, c, "v2")
}

// spawnIntoV2 spawns a child into a new cgroup (named after name) below
// this process's on the cgroup2 mount, checks that the child is its only
// member, and kills it.
func spawnIntoV2(t *testing.T, c *Client, name string) {
	t.Helper()
	dir := filepath.Join(ownV2Cgroup(t), fmt.Sprintf("warren-spawnertest-%s-%d", name, os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for deadline := time.Now().Add(5 * time.Second); os.Remove(dir) != nil && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
	})
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	target := cgroup.SpawnTarget{V2: true, Files: []*os.File{f}}
	pid, pidfd, out := spawn(t, c, target, Request{Path: "/bin/sh", Args: []string{"sh", "-c", "echo ready; exec sleep 60"}, KeepCaps: ^uint64(0)})
	readyLine(t, out, "ready")
	if procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs")); strings.TrimSpace(string(procs)) != strconv.Itoa(pid) {
		t.Errorf("v2 cgroup holds %q, want the child %d", procs, pid)
	}
	_ = unix.PidfdSendSignal(pidfd, syscall.SIGKILL, nil, 0)
	waitExited(t, pidfd)
}

// ownV2Cgroup is this process's cgroup directory on the cgroup2 mount.
func ownV2Cgroup(t *testing.T) string {
	t.Helper()
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var mnt string
	for _, l := range strings.Split(string(mounts), "\n") {
		if pre, post, ok := strings.Cut(l, " - "); ok && strings.HasPrefix(post, "cgroup2 ") {
			mnt = strings.Fields(pre)[4]
			break
		}
	}
	testenv.Require(t, mnt != "", "a cgroup2 mount")
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(self), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return filepath.Join(mnt, p)
		}
	}
	t.Fatal("no cgroup2 entry in /proc/self/cgroup")
	return ""
}

func TestSpawnErrors(t *testing.T) {
	c, cg := setup(t)
	target, err := cg.OpenSpawnTarget()
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	_, _, err = c.Spawn(Request{Path: "/nonexistent/agent", Args: []string{"x"}}, target, nil)
	if err == nil || !strings.Contains(err.Error(), "exec /nonexistent/agent") || !errorsIsNotExist(err) {
		t.Errorf("missing binary: got %v", err)
	}
	for _, tc := range []struct {
		name   string
		req    Request
		target cgroup.SpawnTarget
		want   string
	}{
		{"no path", Request{Args: []string{"x"}}, target, "no path"},
		{"no args", Request{Path: "/bin/true"}, target, "no args"},
		{"no cgroup", Request{Path: "/bin/true", Args: []string{"x"}}, cgroup.SpawnTarget{}, "cgroup spawn target"},
		{"NUL in env", Request{Path: "/bin/true", Args: []string{"x"}, Env: []string{"A=\x00"}}, target, "NUL"},
		{"too large", Request{Path: "/bin/true", Args: []string{"x", strings.Repeat("a", maxRequest)}}, target, "limit"},
	} {
		if _, _, err := c.Spawn(tc.req, tc.target, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error with %q", tc.name, err, tc.want)
		}
	}
	// Broken messages straight to the spawner: each is refused and it goes
	// on serving.
	one := cgroup.SpawnTarget{Files: target.Files[:1]}
	valid, err := encode(Request{Path: "/nonexistent", Args: []string{"x"}}, one, 0)
	if err != nil {
		t.Fatal(err)
	}
	badMagic := slices.Clone(valid)
	badMagic[0] ^= 0xff
	badCount := slices.Clone(valid)
	binary.NativeEndian.PutUint32(badCount[36:], 9) // nfiles
	fewer := slices.Clone(valid)
	binary.NativeEndian.PutUint32(fewer[44:], 3) // nenv, with no env strings
	more := append(slices.Clone(valid), "extra\x00"...)
	binary.NativeEndian.PutUint32(more[48:], binary.NativeEndian.Uint32(more[48:])+6)
	vm := slices.Clone(valid)
	binary.NativeEndian.PutUint64(vm[8:], unix.CLONE_VM|unix.CLONE_NEWNS) // cloneflags
	unterminated := slices.Clone(valid[:len(valid)-1])
	binary.NativeEndian.PutUint32(unterminated[48:], binary.NativeEndian.Uint32(unterminated[48:])-1)
	for _, tc := range []struct {
		name string
		msg  []byte
		want string
	}{
		{"short", valid[:10], "shorter than its header"},
		{"bad magic", badMagic, "not a warren spawner request"},
		{"descriptor count", badCount, "carries 1"},
		{"fewer strings", fewer, "fewer strings"},
		{"more strings", more, "more strings"},
		{"unterminated", unterminated, "strings do not match"},
		{"clone flags", vm, "clone flags other than new namespaces"},
	} {
		if got := rawRequest(t, c, tc.msg, target.Files[:1]); !strings.Contains(got, tc.want) {
			t.Errorf("%s: reply %q, want %q", tc.name, got, tc.want)
		}
	}
	rawNoReply(t, c, []byte("garbage"))
	rawNoReply(t, c, nil)
	if !c.Alive() {
		t.Fatal("the spawner died of a malformed request")
	}
	_, pidfd, out := spawnShell(t, c, cg, "echo still serving")
	readyLine(t, out, "still serving")
	waitExited(t, pidfd)
}

func errorsIsNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }

// rawRequest sends msg with a reply socket and extra descriptors, and
// returns the spawner's error text ("" for a child, which it kills).
func rawRequest(t *testing.T, c *Client, msg []byte, extra []*os.File) string {
	t.Helper()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pair[0])
	fds := append([]int{pair[1]}, fileFDs(extra)...)
	if err := unix.Sendmsg(int(c.ctl.Fd()), msg, unix.UnixRights(fds...), nil, 0); err != nil {
		t.Fatal(err)
	}
	unix.Close(pair[1])
	pid, pidfd, err := recvReply(pair[0])
	if err == nil {
		_ = unix.PidfdSendSignal(pidfd, syscall.SIGKILL, nil, 0)
		unix.Close(pidfd)
		t.Errorf("a raw request started child %d", pid)
		return ""
	}
	return err.Error()
}

// rawNoReply sends msg without any descriptor: there is nobody to answer.
func rawNoReply(t *testing.T, c *Client, msg []byte) {
	t.Helper()
	if err := unix.Sendmsg(int(c.ctl.Fd()), msg, nil, nil, 0); err != nil {
		t.Fatal(err)
	}
}

// TestSpawnerSurvivesGarbage sends random and randomly corrupted requests
// (their path never names a real file, so nothing can start); every one
// with a reply socket gets an error, and the spawner keeps serving.
func TestSpawnerSurvivesGarbage(t *testing.T) {
	c, cg := setup(t)
	target, err := cg.OpenSpawnTarget()
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	valid, err := encode(Request{Path: "/nonexistent/x", Args: []string{"a", "b"}, Env: []string{"K=V"}}, cgroup.SpawnTarget{Files: target.Files[:1]}, 0)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 500; i++ {
		var msg []byte
		if i%2 == 0 {
			msg = make([]byte, rng.IntN(2*len(valid)))
			for j := range msg {
				msg[j] = byte(rng.Uint32())
			}
		} else {
			msg = slices.Clone(valid)
			for k := rng.IntN(4) + 1; k > 0; k-- {
				msg[rng.IntN(len(msg))] = byte(rng.Uint32())
			}
			// Keep the path unrunnable: no byte of "/nonexistent/x" may
			// turn it into another file that exists.
			copy(msg[headerSize:], "/nonexistent/x")
		}
		extra := target.Files[:rng.IntN(2)]
		if got := rawRequest(t, c, msg, extra); got == "" {
			t.Fatalf("request %d (%x) was not refused", i, msg)
		}
	}
	if !c.Alive() {
		t.Fatal("the spawner died")
	}
	_, pidfd, out := spawnShell(t, c, cg, "echo still serving")
	readyLine(t, out, "still serving")
	waitExited(t, pidfd)
}

// Closing the host's end ends the spawner but not its children: a
// daemon's sandboxes outlive it.
func TestCloseLeavesChildren(t *testing.T) {
	c, cg := setup(t)
	pid, pidfd, out := spawnShell(t, c, cg, "echo up; exec sleep 60")
	readyLine(t, out, "up")
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if c.Alive() {
		t.Fatal("spawner still alive after Close")
	}
	if err := unix.Kill(pid, 0); err != nil {
		t.Errorf("child %d did not survive the spawner: %v", pid, err)
	}
	target, err := cg.OpenSpawnTarget()
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	if _, _, err := c.Spawn(Request{Path: "/bin/true", Args: []string{"true"}}, target, nil); err == nil {
		t.Error("Spawn after Close succeeded")
	}
	if err := unix.PidfdSendSignal(pidfd, syscall.SIGKILL, nil, 0); err != nil {
		t.Fatal(err)
	}
	waitExited(t, pidfd)
}

// BenchmarkSpawn measures one spawn of an agent-shaped child (all the
// namespaces a sandbox gets, a user namespace, a narrowed bounding set)
// that exits at once, and reports the spawner's own CPU time per spawn:
// what a sandbox start costs the host before the agent runs.
func BenchmarkSpawn(b *testing.B) {
	testenv.RequireRoot(b)
	m, err := cgroup.New(fmt.Sprintf("warren-spawnerbench-%d", os.Getpid()))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = m.Close() }()
	cg, err := m.Create("b", cgroup.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cg.Destroy() }()
	c, err := Start(testenv.SpawnerBinary(b), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	keep, _ := oci.CapMask(oci.DefaultCapabilities)
	req := Request{
		Path: "/bin/true", Args: []string{"true"}, KeepCaps: keep,
		Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS,
		UserNS:     &IDMap{Host: 0x60000000, Size: 65536},
	}
	cpu0 := cpuTime(b, c.Pid())
	for b.Loop() {
		target, err := cg.OpenSpawnTarget()
		if err != nil {
			b.Fatal(err)
		}
		_, pidfd, err := c.Spawn(req, target, nil)
		target.Close()
		if err != nil {
			b.Fatal(err)
		}
		// The runtime's preemption signal may interrupt the wait.
		for {
			_, err := unix.Poll([]unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}, 10000)
			if err == nil {
				break
			}
			if err != unix.EINTR {
				b.Fatal(err)
			}
		}
		unix.Close(pidfd)
	}
	b.ReportMetric(float64((cpuTime(b, c.Pid())-cpu0).Microseconds())/1000/float64(b.N), "spawner-cpu-ms/op")
}

// cpuTime is a process's user+system CPU time so far.
func cpuTime(b *testing.B, pid int) time.Duration {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+stime) * time.Second / 100 // USER_HZ
}

// TestChildInheritsNothingOfWarren: whatever warren was started with (a
// umask, a working directory, inheritable and ambient capabilities, nice,
// a scheduling class, an oom_score_adj), the child starts clean: umask
// 022, cwd /, no inheritable or ambient capability, nice 0, SCHED_OTHER,
// oom_score_adj 0.
func TestChildInheritsNothingOfWarren(t *testing.T) {
	testenv.RequireRoot(t)
	cg := testCgroup(t, "i")
	// The spawner is started from a thread whose state it inherits; the
	// thread is never given back (it ends with its goroutine).
	started := make(chan *Client)
	go func() {
		runtime.LockOSThread()
		old := syscall.Umask(0o077)
		defer syscall.Umask(old)
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			t.Error(err)
		}
		data[0].Inheritable |= 1 << unix.CAP_SYS_MODULE
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			t.Error(err)
		}
		if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, unix.CAP_SYS_MODULE, 0, 0); err != nil {
			t.Error(err)
		}
		c, err := start(testenv.SpawnerBinary(t), nil, nil)
		if err != nil {
			t.Error(err)
		}
		started <- c
	}()
	c := <-started
	if c == nil {
		t.FailNow()
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := unix.SchedSetAttr(c.Pid(), &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_BATCH, Nice: 10}, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", c.Pid()), []byte("500"), 0); err != nil {
		t.Fatal(err)
	}
	target, err := cg.OpenSpawnTarget()
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	pid, _, _ := spawn(t, c, target, Request{Path: "/bin/sleep", Args: []string{"sleep", "60"}, KeepCaps: ^uint64(0),
		Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS})
	status := procStatus(t, pid)
	for k, want := range map[string]string{"Umask": "0022", "CapInh": "0000000000000000", "CapAmb": "0000000000000000"} {
		if status[k] != want {
			t.Errorf("%s %s, want %s", k, status[k], want)
		}
	}
	if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err != nil || cwd != "/" {
		t.Errorf("cwd %q (%v), want /", cwd, err)
	}
	if nice, err := unix.Getpriority(unix.PRIO_PROCESS, pid); err != nil || nice != 20 { // 20 - nice
		t.Errorf("getpriority %d (%v), want 20 (nice 0)", nice, err)
	}
	if attr, err := unix.SchedGetAttr(pid, 0); err != nil || attr.Policy != unix.SCHED_NORMAL {
		t.Errorf("scheduling policy %+v (%v), want SCHED_NORMAL", attr, err)
	}
	if adj, _ := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid)); strings.TrimSpace(string(adj)) != "0" {
		t.Errorf("oom_score_adj %q, want 0", adj)
	}
}

// TestTimerSlack: a request's timer slack is the child's after its exec;
// without one the child keeps the spawner's.
func TestTimerSlack(t *testing.T) {
	c, cg := setup(t)
	target, err := cg.OpenSpawnTarget()
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	slack := func(pid int) string {
		t.Helper()
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/timerslack_ns", pid))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	sleep := Request{Path: "/bin/sleep", Args: []string{"sleep", "60"}, KeepCaps: ^uint64(0)}
	pid, _, _ := spawn(t, c, target, sleep)
	if got, want := slack(pid), slack(c.Pid()); got != want {
		t.Errorf("without a timer slack the child has %s ns, want the spawner's %s", got, want)
	}
	sleep.TimerSlack = 1500 * time.Microsecond
	pid, _, _ = spawn(t, c, target, sleep)
	if got := slack(pid); got != "1500000" {
		t.Errorf("child's timer slack %s ns, want 1500000", got)
	}
	sleep.TimerSlack = 2 * time.Second
	if _, _, err := c.Spawn(sleep, target, nil); err == nil || !strings.Contains(err.Error(), "timer slack") {
		t.Errorf("a 2s timer slack: %v, want refused", err)
	}
}

// TestSpawnWithoutClone3: where clone3 is missing (before Linux 5.3, or
// hidden by a seccomp profile), the spawner uses clone and joins a v2
// cgroup through cgroup.procs; the child is as it would be otherwise.
func TestSpawnWithoutClone3(t *testing.T) {
	testenv.RequireRoot(t)
	logf, err := os.CreateTemp(t.TempDir(), "spawner-log-")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = logf.Close() }()
	c, err := start(testenv.SpawnerBinary(t), logf, []string{"WARREN_SPAWNER_NO_CLONE3=1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	t.Cleanup(func() {
		if b, _ := os.ReadFile(logf.Name()); !strings.Contains(string(b), "using clone") {
			t.Errorf("the spawner did not take the clone path; its log: %q", b)
		}
	})
	cg := testCgroup(t, "n")
	pid, pidfd, out := spawnShell(t, c, cg, "echo ready; exec sleep 60")
	readyLine(t, out, "ready")
	if procs, err := cg.Procs(); err != nil || !slices.Equal(procs, []int{pid}) {
		t.Errorf("cgroup holds %v (%v), want the child %d", procs, err, pid)
	}
	if err := unix.PidfdSendSignal(pidfd, syscall.SIGKILL, nil, 0); err != nil {
		t.Errorf("pidfd from clone: %v", err)
	}
	waitExited(t, pidfd)
	// A v2 cgroup, joined through cgroup.procs.
	spawnIntoV2(t, c, "n3")
}

// TestSpawnUnderSignals: signals to this process while it waits for the
// spawner's reply (which has a receive timeout, so the kernel does not
// restart the wait) must not fail a spawn with EINTR.
func TestSpawnUnderSignals(t *testing.T) {
	c, cg := setup(t)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
				_ = unix.Kill(os.Getpid(), unix.SIGURG) // the runtime's preemption signal: harmless
				time.Sleep(20 * time.Microsecond)
			}
		}
	}()
	target, err := cg.OpenSpawnTarget()
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	for i := 0; i < 300; i++ {
		_, pidfd, err := c.Spawn(Request{Path: "/bin/true", Args: []string{"true"}, KeepCaps: ^uint64(0)}, target, nil)
		if err != nil {
			t.Fatalf("spawn %d: %v", i, err)
		}
		waitExited(t, pidfd)
		unix.Close(pidfd)
	}
}

// TestIDMapNS asks for a user namespace to idmap a mount with: a file
// owned by host uid base+7 reads through the idmapped mount as range+7,
// and bad maps, or descriptors sent along, are refused without a child.
func TestIDMapNS(t *testing.T) {
	c, _ := setup(t)
	const base, rng = 0x60000000, 0x60000000 + 3*65536
	dir := t.TempDir()
	f := filepath.Join(dir, "f")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(f, base+7, base+7); err != nil {
		t.Fatal(err)
	}
	ns, err := c.IDMapNS(fmt.Sprintf("0 0 1\n%d %d 65536\n", base, rng))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ns.Close() }()
	if typ, err := unix.IoctlRetInt(int(ns.Fd()), unix.NS_GET_NSTYPE); err != nil || typ != unix.CLONE_NEWUSER {
		t.Fatalf("the namespace's type: %#x %v, want a user namespace", typ, err)
	}
	mnt, err := idmappedClone(t, dir, ns)
	if err != nil {
		if errors.Is(err, unix.EINVAL) && !canIdmap(t, dir) {
			// The file system (tmpfs before Linux 6.3, say) takes no
			// idmapped mount from any namespace: the type above is
			// what this machine can check.
			return
		}
		t.Fatalf("idmap a mount with the namespace: %v", err)
	}
	defer unix.Close(mnt)
	var st unix.Stat_t
	if err := unix.Fstatat(mnt, "f", &st, 0); err != nil {
		t.Fatal(err)
	}
	if st.Uid != rng+7 || st.Gid != rng+7 {
		t.Errorf("through the idmapped mount: owner %d:%d, want %d", st.Uid, st.Gid, rng+7)
	}
	for _, bad := range []string{"0 0 1; rm -rf /", strings.Repeat("1 ", 200), "", "0 0 0\n"} {
		if ns, err := c.IDMapNS(bad); err == nil {
			_ = ns.Close()
			t.Errorf("map %q: no error", bad)
		}
	}
	// The request with a descriptor it must not carry.
	b := make([]byte, headerSize, headerSize+8)
	binary.NativeEndian.PutUint32(b[0:], requestMagic)
	binary.NativeEndian.PutUint32(b[4:], flagIDMapNS)
	binary.NativeEndian.PutUint32(b[48:], 6)
	b = append(b, "0 0 1\x00"...)
	if msg := rawRequest(t, c, b, []*os.File{ns}); !strings.Contains(msg, "no descriptors") {
		t.Errorf("an id map request with a descriptor: %q", msg)
	}
	ns2, err := c.IDMapNS("0 0 1")
	if err != nil {
		t.Fatalf("the spawner serves after bad requests: %v", err)
	}
	_ = ns2.Close()
}

// canIdmap reports whether dir's file system takes an idmapped mount, with
// a user namespace made the usual way (a child with CLONE_NEWUSER).
func canIdmap(t *testing.T, dir string) bool {
	t.Helper()
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0x60000000, Size: 65536}}
	cmd := exec.Command("/bin/sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, UidMappings: m, GidMappings: m}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ns.Close() }()
	mnt, err := idmappedClone(t, dir, ns)
	if err == nil {
		unix.Close(mnt)
	}
	return err == nil
}

// idmappedClone is a detached mount of dir idmapped through ns.
func idmappedClone(t *testing.T, dir string, ns *os.File) (int, error) {
	t.Helper()
	mnt, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(ns.Fd())}
	if err := unix.MountSetattr(mnt, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(mnt)
		return -1, err
	}
	return mnt, nil
}
