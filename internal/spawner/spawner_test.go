package spawner

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/cgroup"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// setup starts a spawner from the real agent binary and makes a cgroup to
// spawn into. Privileged.
func setup(t *testing.T) (*Client, *cgroup.Cgroup) {
	t.Helper()
	testenv.RequireRoot(t)
	m, err := cgroup.New(fmt.Sprintf("warren-spawnertest-%d", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	cg, err := m.Create(fmt.Sprintf("c%d", time.Now().UnixNano()), cgroup.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cg.Destroy() })
	c, err := Start(testenv.AgentBinary(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, cg
}

// spawnShell spawns sh -c script with its stdout on a pipe.
func spawnShell(t *testing.T, c *Client, cg *cgroup.Cgroup, script string) (pid, pidfd int, out *bufio.Reader) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	target, err := cg.OpenSpawnTarget()
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	pid, pidfd, err = c.Spawn(Request{Path: "/bin/sh", Args: []string{"sh", "-c", script}, Setsid: true, KeepCaps: ^uint64(0)}, target, []*os.File{w, w})
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.PidfdSendSignal(pidfd, syscall.SIGKILL, nil, 0)
		unix.Close(pidfd)
	})
	return pid, pidfd, bufio.NewReader(r)
}

func waitExited(t *testing.T, pidfd int) {
	t.Helper()
	n, err := unix.Poll([]unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}, 10000)
	if n != 1 || err != nil {
		t.Fatalf("pidfd did not report the exit within 10s: %d %v", n, err)
	}
}

func TestSpawn(t *testing.T) {
	c, cg := setup(t)
	pid, pidfd, out := spawnShell(t, c, cg, "echo ready; exec sleep 60")
	if line, err := out.ReadString('\n'); line != "ready\n" {
		t.Fatalf("child said %q, %v", line, err)
	}
	if got := testenv.ParentPID(pid); got != c.cmd.Process.Pid {
		t.Errorf("child's parent is %d, want the spawner %d", got, c.cmd.Process.Pid)
	}
	// On cgroup v1 the spawner forks from a thread it moved into the
	// cgroup and then discards; the thread leaves as it exits, which may
	// be just after the spawn was answered.
	var procs []int
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		procs, err = cg.Procs()
		if err != nil || (len(procs) == 1 && procs[0] == pid) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || len(procs) != 1 || procs[0] != pid {
		t.Errorf("cgroup holds %v (%v), want the child %d born in it", procs, err, pid)
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

func TestSpawnErrors(t *testing.T) {
	c, cg := setup(t)
	target, err := cg.OpenSpawnTarget()
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	if _, _, err := c.Spawn(Request{Path: "/nonexistent/agent", Args: []string{"x"}}, target, nil); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing binary: got %v", err)
	}
	if _, _, err := c.Spawn(Request{Args: []string{"x"}}, target, nil); err == nil || !strings.Contains(err.Error(), "no path") {
		t.Errorf("no path: got %v", err)
	}
	if _, _, err := c.Spawn(Request{Path: "/bin/true"}, cgroup.SpawnTarget{}, nil); err == nil || !strings.Contains(err.Error(), "descriptors") {
		t.Errorf("no cgroup: got %v", err)
	}
	// Hostile or broken messages: a request that is not JSON, one without
	// a reply socket, an empty one. Each is refused and the spawner goes
	// on serving.
	reply := func(msg []byte, withSocket bool) string {
		pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(pair[0])
		var oob []byte
		if withSocket {
			oob = unix.UnixRights(pair[1])
		}
		if err := unix.Sendmsg(int(c.ctl.Fd()), msg, oob, nil, 0); err != nil {
			t.Fatal(err)
		}
		unix.Close(pair[1])
		if !withSocket {
			return ""
		}
		var rep reply
		if _, err := recv(pair[0], &rep); err != nil {
			t.Fatal(err)
		}
		return rep.Err
	}
	if e := reply([]byte("{not json"), true); !strings.Contains(e, "decode request") {
		t.Errorf("garbage request: got %q", e)
	}
	if e := reply([]byte(`{"path":"/bin/true","ncgroup":3,"nfiles":9}`), true); !strings.Contains(e, "carries 0") {
		t.Errorf("descriptor count mismatch: got %q", e)
	}
	reply([]byte(`{"path":"/bin/true"}`), false)
	reply(nil, false)
	if !c.Alive() {
		t.Fatal("the spawner died of a malformed request")
	}
	_, pidfd, out := spawnShell(t, c, cg, "echo still serving")
	if line, _ := out.ReadString('\n'); line != "still serving\n" {
		t.Errorf("after malformed requests: %q", line)
	}
	waitExited(t, pidfd)
}

// Closing the host's end ends the spawner but not its children: a
// daemon's sandboxes outlive it.
func TestCloseLeavesChildren(t *testing.T) {
	c, cg := setup(t)
	pid, pidfd, out := spawnShell(t, c, cg, "echo up; exec sleep 60")
	if line, _ := out.ReadString('\n'); line != "up\n" {
		t.Fatalf("child said %q", line)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if c.Alive() {
		t.Fatal("spawner still alive after Close")
	}
	if err := unix.Kill(pid, 0); err != nil {
		t.Errorf("child %d did not survive the spawner: %v", pid, err)
	}
	if _, _, err := c.Spawn(Request{Path: "/bin/true"}, cgroup.SpawnTarget{}, nil); err == nil {
		t.Error("Spawn after Close succeeded")
	}
	if err := unix.PidfdSendSignal(pidfd, syscall.SIGKILL, nil, 0); err != nil {
		t.Fatal(err)
	}
	waitExited(t, pidfd)
}
