// Package spawner starts sandbox agents on behalf of a long-lived host
// process (the server) from a small helper process, the spawner.
//
// Why a separate process: Go cannot vfork a child that enters a new user
// namespace (the parent must write the child's uid map while the child
// waits, so syscall drops CLONE_VFORK|CLONE_VM). Every such spawn therefore
// copies the parent's page tables, and afterwards every write the parent
// makes to a shared page takes a copy-on-write fault and a TLB shootdown
// across CPUs. In the server under load that was 12% of all CPU, and a
// spawn took 2.7 ms against 1.3 ms from a small process. The spawner is the
// agent binary in another mode: a few MiB, nearly no heap, so the copy is
// cheap and the server's pages are never shared with a child.
//
// Protocol: the host holds one end of a SOCK_SEQPACKET socket pair and the
// spawner the other, as descriptor 3. A request is one message: a JSON
// Request and, as SCM_RIGHTS, a reply socket, the cgroup's spawn target
// (cgroup.SpawnTarget) and the child's descriptors 1..n. The spawner answers
// on the reply socket with one message: a JSON reply and, on success, a
// pidfd of the child. Requests are served concurrently. The spawner reaps
// its children and exits when the host's end closes; the children keep
// running (a daemon's sandboxes outlive the daemon).
package spawner

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/cgroup"
	"github.com/warren-sandbox/warren/internal/fdpass"
)

// Arg is the argument that starts the agent binary as a spawner.
const Arg = "--spawner"

// Limits on a request, which only the host sends, and on a reply.
const (
	maxRequest = 64 << 10
	maxFiles   = 64
	maxReply   = 8 << 10
)

// Request describes one child.
type Request struct {
	Path       string   `json:"path"`
	Args       []string `json:"args"`
	Env        []string `json:"env"`
	Cloneflags uintptr  `json:"cloneflags"`
	Setsid     bool     `json:"setsid"`
	// UserNS maps the child's uids and gids 0..Size-1 to Host..; the child
	// becomes root of its new user namespace before exec.
	UserNS *IDMap `json:"userns,omitempty"`
	// KeepCaps is the capability bounding set the child inherits, as a
	// bit mask; the spawning thread drops every other capability first.
	KeepCaps uint64 `json:"keep_caps"`
	// CgroupV2 and NCgroup describe the spawn target's descriptors.
	CgroupV2 bool `json:"cgroup_v2"`
	NCgroup  int  `json:"ncgroup"`
	// NFiles descriptors follow, the child's 1..NFiles (0 is /dev/null).
	NFiles int `json:"nfiles"`
}

// IDMap is a user namespace's id mapping.
type IDMap struct {
	Host uint32 `json:"host"`
	Size uint32 `json:"size"`
}

type reply struct {
	Pid int    `json:"pid"`
	Err string `json:"err,omitempty"`
}

// Client is the host's end of a running spawner.
type Client struct {
	ctl  *os.File
	cmd  *exec.Cmd
	done chan struct{}
}

// ErrGone reports that the spawner process had exited before it received
// the request, so no child was started and the request may be retried
// with another spawner.
var ErrGone = errors.New("spawner exited")

// Start starts the spawner from the agent binary at path. Its output goes
// to log (nil: discarded).
func Start(path string, log *os.File) (*Client, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("spawner: socketpair: %w", err)
	}
	host, child := os.NewFile(uintptr(fds[0]), "spawner"), os.NewFile(uintptr(fds[1]), "spawner-child")
	defer child.Close()
	cmd := &exec.Cmd{Path: path, Args: []string{"warren-agent", Arg}, Env: []string{}, ExtraFiles: []*os.File{child}}
	if log != nil {
		cmd.Stdout, cmd.Stderr = log, log
	}
	if err := cmd.Start(); err != nil {
		host.Close()
		return nil, fmt.Errorf("spawner: %w", err)
	}
	c := &Client{ctl: host, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(c.done) }()
	return c, nil
}

// Alive reports whether the spawner still runs.
func (c *Client) Alive() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// Close makes the spawner exit (its children keep running) and waits.
func (c *Client) Close() error {
	err := c.ctl.Close()
	<-c.done
	return err
}

// Spawn starts a child as req describes, in the cgroup of target, with
// files as its descriptors 1..len(files). It returns the child's pid and a
// pidfd the caller owns. The child is the spawner's, which reaps it; the
// pidfd polls readable once it has exited.
func (c *Client) Spawn(req Request, target cgroup.SpawnTarget, files []*os.File) (pid, pidfd int, err error) {
	if !c.Alive() {
		return 0, -1, ErrGone
	}
	req.CgroupV2, req.NCgroup, req.NFiles = target.V2, len(target.Files), len(files)
	msg, err := json.Marshal(req)
	if err != nil {
		return 0, -1, err
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, -1, fmt.Errorf("spawner: socketpair: %w", err)
	}
	defer unix.Close(pair[0])
	fds := append(append([]int{pair[1]}, fileFDs(target.Files)...), fileFDs(files)...)
	// One message per request: concurrent sends never interleave.
	err = unix.Sendmsg(int(c.ctl.Fd()), msg, unix.UnixRights(fds...), nil, 0)
	unix.Close(pair[1])
	if err != nil {
		if !c.Alive() || errors.Is(err, unix.EPIPE) {
			return 0, -1, fmt.Errorf("%w: %w", ErrGone, err)
		}
		return 0, -1, fmt.Errorf("spawner: send request: %w", err)
	}
	var rep reply
	pidfd, err = recv(pair[0], &rep)
	if err != nil {
		return 0, -1, fmt.Errorf("spawner: %w", err)
	}
	if rep.Err != "" {
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
		return 0, -1, errors.New(rep.Err)
	}
	if pidfd < 0 || rep.Pid <= 0 {
		return 0, -1, errors.New("spawner: reply without a child")
	}
	return rep.Pid, pidfd, nil
}

// recv reads one reply into v and returns the one descriptor it may carry
// (-1 if none). Extra descriptors are closed. A reply is a pid or an
// error message: small buffers, allocated once per spawn.
func recv(fd int, v any) (int, error) {
	buf := make([]byte, maxReply)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return -1, err
	}
	fds, err := fdpass.Received(oob[:oobn])
	if err != nil {
		return -1, err
	}
	one := -1
	if len(fds) > 0 {
		one = fds[0]
		fdpass.Close(fds[1:])
	}
	if n == 0 {
		if one >= 0 {
			unix.Close(one)
		}
		return -1, errors.New("connection closed")
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		if one >= 0 {
			unix.Close(one)
		}
		return -1, errors.New("message truncated")
	}
	if err := json.Unmarshal(buf[:n], v); err != nil {
		if one >= 0 {
			unix.Close(one)
		}
		return -1, fmt.Errorf("decode: %w", err)
	}
	return one, nil
}

// Main runs the spawner on descriptor 3 until the host's end closes, and
// returns the process's exit code.
func Main() int {
	ctl := 3
	if _, err := unix.FcntlInt(uintptr(ctl), unix.F_GETFD, 0); err != nil {
		fmt.Fprintln(os.Stderr, "warren-agent --spawner: no control socket; it is started by warren, not by hand")
		return 2
	}
	unix.CloseOnExec(ctl)
	go reap()
	buf := make([]byte, maxRequest)
	oob := make([]byte, unix.CmsgSpace(4*(maxFiles+2*16)))
	for {
		n, oobn, flags, _, err := unix.Recvmsg(ctl, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "warren-agent --spawner:", err)
			return 1
		}
		fds, err := fdpass.Received(oob[:oobn])
		if n == 0 && len(fds) == 0 && hungUp(ctl) {
			return 0 // the host closed its end
		}
		if err != nil || len(fds) == 0 || flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
			fdpass.Close(fds)
			fmt.Fprintln(os.Stderr, "warren-agent --spawner: malformed request dropped")
			continue
		}
		var req Request
		err = json.Unmarshal(buf[:n], &req)
		go serve(req, err, fds)
	}
}

// hungUp tells the end of the connection from an empty message, which
// reads the same.
func hungUp(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}}
	n, err := unix.Poll(p, 0)
	return err != nil || (n == 1 && p[0].Revents&(unix.POLLHUP|unix.POLLRDHUP) != 0)
}

// serve answers one request on its reply socket, fds[0].
func serve(req Request, decodeErr error, fds []int) {
	defer fdpass.Close(fds)
	var pid, pidfd int
	err := decodeErr
	switch {
	case err != nil:
		err = fmt.Errorf("spawner: decode request: %w", err)
	case req.NCgroup < 1 || req.NFiles < 0 || req.NCgroup+req.NFiles != len(fds)-1:
		err = fmt.Errorf("spawner: request names %d+%d descriptors, carries %d", req.NCgroup, req.NFiles, len(fds)-1)
	default:
		pid, pidfd, err = spawn(req, req.CgroupV2, fds[1:1+req.NCgroup], fds[1+req.NCgroup:])
	}
	rep := reply{Pid: pid}
	var oob []byte
	if err != nil {
		rep.Err = err.Error()
		if len(rep.Err) > maxReply/8 {
			// At most 6 bytes each once escaped in JSON: it still fits.
			rep.Err = rep.Err[:maxReply/8]
		}
	} else {
		oob = unix.UnixRights(pidfd)
		defer unix.Close(pidfd)
	}
	msg, _ := json.Marshal(rep)
	_ = unix.Sendmsg(fds[0], msg, oob, nil, 0)
}

// Local does in this process what the spawner does: it starts the child
// req describes, in the cgroup of target, with files as its descriptors
// 1..n, and returns its pid and a pidfd the caller owns. The child is this
// process's, which must reap it.
func Local(req Request, target cgroup.SpawnTarget, files []*os.File) (pid, pidfd int, err error) {
	return spawn(req, target.V2, fileFDs(target.Files), fileFDs(files))
}

func fileFDs(fs []*os.File) []int {
	fds := make([]int, len(fs))
	for i, f := range fs {
		fds[i] = int(f.Fd())
	}
	return fds
}

var devNull = sync.OnceValues(func() (*os.File, error) { return os.Open(os.DevNull) })

func spawn(req Request, v2 bool, cgFDs, files []int) (pid, pidfd int, err error) {
	if req.Path == "" {
		return 0, -1, errors.New("spawner: no path")
	}
	null, err := devNull()
	if err != nil {
		return 0, -1, err
	}
	childFiles := []uintptr{null.Fd()}
	for _, fd := range files {
		childFiles = append(childFiles, uintptr(fd))
	}
	pidfd = -1
	attr := &syscall.SysProcAttr{Setsid: req.Setsid, Cloneflags: req.Cloneflags, PidFD: &pidfd}
	if m := req.UserNS; m != nil {
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(m.Host), Size: int(m.Size)}}
		attr.UidMappings, attr.GidMappings = ids, ids
		attr.GidMappingsEnableSetgroups = true
		// The clone child still has host uid 0, which is unmapped in the
		// new namespace; it becomes that namespace's root before exec, or
		// exec would drop every capability.
		attr.Credential = &syscall.Credential{Uid: 0, Gid: 0, Groups: []uint32{}}
	}
	err = cgroup.SpawnInto(v2, cgFDs, func(cgFD int) error {
		// A discarded thread: its bounding set can be narrowed for the
		// clone to inherit.
		if err := DropBounding(req.KeepCaps); err != nil {
			return err
		}
		if cgFD >= 0 {
			attr.UseCgroupFD, attr.CgroupFD = true, cgFD
		}
		var err error
		pid, err = syscall.ForkExec(req.Path, req.Args, &syscall.ProcAttr{Env: req.Env, Files: childFiles, Sys: attr})
		return err
	})
	if err != nil {
		return 0, -1, fmt.Errorf("start %s: %w", req.Path, err)
	}
	return pid, pidfd, nil
}

// DropBounding removes every capability not in keep from the calling
// thread's bounding set; the thread must not be used for anything else
// afterwards (a child it forks inherits the narrowed set).
func DropBounding(keep uint64) error {
	for c := 0; c < 64; c++ {
		if keep&(1<<c) != 0 {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			if errors.Is(err, unix.EINVAL) {
				return nil // past the kernel's last capability
			}
			return fmt.Errorf("narrow bounding set: %w", err)
		}
	}
	return nil
}

// reap collects exited children, which are the sandboxes' agents: their
// parent is this process.
func reap() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGCHLD)
	for range ch {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
