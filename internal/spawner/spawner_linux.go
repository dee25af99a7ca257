// Package spawner starts sandbox agents through warren-spawner
// (cmd/warren-spawner), a small single-threaded C process that the host
// starts once and that forks every agent: into new namespaces, into its
// cgroup, with a narrowed capability bounding set. This package is its
// client.
//
// Why a separate process, and why C: Go cannot vfork a child that enters a
// new user namespace (the parent must write the child's id maps while the
// child waits, so package syscall drops CLONE_VFORK|CLONE_VM). A spawn from
// a Go process therefore copies the page tables of a multi-threaded
// runtime, and every page the runtime writes until the child execs takes a
// copy-on-write fault and a TLB shootdown across CPUs. The bounding set and
// a v1 cgroup's membership are per thread, so each spawn also needed a
// fresh OS thread that was discarded after it. From the server that cost
// 12% of all CPU under load; from a Go spawner process 1.3 ms of CPU per
// spawn on the project's machine; from warren-spawner 0.5 ms, about half of
// it the kernel creating the namespaces.
//
// Protocol (cmd/warren-spawner/spawner.c has the C side): the host holds
// one end of a SOCK_SEQPACKET socket pair and the spawner the other, as
// descriptor 3. A request is one message: a fixed header and the strings
// it counts (encode), with a reply socket, the cgroup's spawn target
// (cgroup.SpawnTarget) and the child's descriptors 1..n as SCM_RIGHTS. The
// spawner answers on the reply socket with one fixed-size reply and, on
// success, a pidfd of the child. It serves requests in order, reaps its
// children, and exits when the host's end closes; the children keep running
// (a daemon's sandboxes outlive the daemon).
package spawner

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/cgroup"
	"github.com/warren-sandbox/warren/internal/fdpass"
)

// Limits of the protocol; the spawner enforces the same.
const (
	maxRequest   = 64 << 10
	maxFiles     = 64
	maxCgroupFDs = 16
	maxStrings   = 8192
)

// The wire format, in the host's byte order (both ends run on it).
const (
	requestMagic  = 0x31505357 // "WSP1"
	headerSize    = 56
	replySize     = 208
	flagUserNS    = 2 // (1 meant setsid; every child now gets its own session)
	flagCgroupV2  = 4
	flagIDMapNS   = 8
	maxIDMap      = 256
	replyWhatSize = replySize - 8
)

// Request describes one child.
type Request struct {
	Path string
	Args []string
	Env  []string
	// Cloneflags are the namespaces to create (CLONE_NEW*, nothing else);
	// CLONE_NEWUSER is added when UserNS is set. The child always gets a
	// session of its own.
	Cloneflags uintptr
	// UserNS maps the child's uids and gids 0..Size-1 to Host..; the child
	// becomes root of its new user namespace before exec.
	UserNS *IDMap
	// KeepCaps is the capability bounding set the child keeps, as a bit
	// mask; every other capability leaves it before the exec.
	KeepCaps uint64
	// TimerSlack, when not 0, is the child's timer slack (prctl
	// PR_SET_TIMERSLACK): how late the kernel may wake its timed sleeps so
	// as to batch wakeups. It is kept across the exec and inherited by the
	// child's threads and children. At most a second.
	TimerSlack time.Duration
}

// IDMap is a user namespace's id mapping.
type IDMap struct {
	Host uint32
	Size uint32
}

// encode lays out req as the spawner reads it (struct request in
// spawner.c, then the NUL-terminated strings: path, args, env).
func encode(req Request, target cgroup.SpawnTarget, nfiles int) ([]byte, error) {
	switch {
	case req.Path == "":
		return nil, errors.New("spawner: no path")
	case len(req.Args) == 0:
		return nil, errors.New("spawner: no args (argv[0] at least)")
	case len(target.Files) == 0 || len(target.Files) > maxCgroupFDs:
		return nil, fmt.Errorf("spawner: a cgroup spawn target needs 1 to %d descriptors, has %d", maxCgroupFDs, len(target.Files))
	case nfiles > maxFiles:
		return nil, fmt.Errorf("spawner: %d descriptors for the child, limit %d", nfiles, maxFiles)
	case 1+len(req.Args)+len(req.Env) > maxStrings:
		return nil, fmt.Errorf("spawner: %d strings, limit %d", 1+len(req.Args)+len(req.Env), maxStrings)
	case req.TimerSlack < 0 || req.TimerSlack > time.Second:
		return nil, fmt.Errorf("spawner: timer slack %v, want 0 to 1s", req.TimerSlack)
	}
	var flags uint32
	var uidHost, uidSize uint32
	if req.UserNS != nil {
		flags |= flagUserNS
		uidHost, uidSize = req.UserNS.Host, req.UserNS.Size
	}
	if target.V2 {
		flags |= flagCgroupV2
	}
	all := append(append([]string{req.Path}, req.Args...), req.Env...)
	strs := 0
	for _, s := range all {
		if strings.IndexByte(s, 0) >= 0 {
			return nil, fmt.Errorf("spawner: %q contains a NUL byte", s)
		}
		strs += len(s) + 1
	}
	if headerSize+strs > maxRequest {
		return nil, fmt.Errorf("spawner: request of %d bytes, limit %d", headerSize+strs, maxRequest)
	}
	b := make([]byte, headerSize, headerSize+strs)
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], requestMagic)
	ne.PutUint32(b[4:], flags)
	ne.PutUint64(b[8:], uint64(req.Cloneflags))
	ne.PutUint64(b[16:], req.KeepCaps)
	ne.PutUint32(b[24:], uidHost)
	ne.PutUint32(b[28:], uidSize)
	ne.PutUint32(b[32:], uint32(len(target.Files)))            //nolint:gosec // 1 to maxCgroupFDs, checked above
	ne.PutUint32(b[36:], uint32(nfiles))                       //nolint:gosec // at most maxFiles, checked above
	ne.PutUint32(b[40:], uint32(len(req.Args)))                //nolint:gosec // fewer than maxStrings, checked above
	ne.PutUint32(b[44:], uint32(len(req.Env)))                 //nolint:gosec // fewer than maxStrings, checked above
	ne.PutUint32(b[48:], uint32(strs))                         //nolint:gosec // less than maxRequest, checked above
	ne.PutUint32(b[52:], uint32(req.TimerSlack.Nanoseconds())) //nolint:gosec // 0 to 1s (1e9 ns), checked above
	for _, s := range all {
		b = append(append(b, s...), 0)
	}
	return b, nil
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

// Start starts the spawner binary at path. Its output goes to log (nil:
// discarded).
func Start(path string, log *os.File) (*Client, error) { return start(path, log, nil) }

// start is Start with the spawner's environment (tests use it).
func start(path string, log *os.File, env []string) (*Client, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("spawner: socketpair: %w", err)
	}
	host, child := os.NewFile(uintptr(fds[0]), "spawner"), os.NewFile(uintptr(fds[1]), "spawner-child")
	defer func() { _ = child.Close() }()
	cmd := &exec.Cmd{Path: path, Args: []string{"warren-spawner"}, Env: append([]string{}, env...), ExtraFiles: []*os.File{child}}
	if log != nil {
		cmd.Stdout, cmd.Stderr = log, log
	}
	if err := cmd.Start(); err != nil {
		_ = host.Close()
		return nil, fmt.Errorf("spawner: %w", err)
	}
	c := &Client{ctl: host, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(c.done) }()
	return c, nil
}

// Pid is the spawner's process id.
func (c *Client) Pid() int { return c.cmd.Process.Pid }

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
// pidfd polls readable once it has exited. Concurrent calls are safe.
func (c *Client) Spawn(req Request, target cgroup.SpawnTarget, files []*os.File) (pid, pidfd int, err error) {
	msg, err := encode(req, target, len(files))
	if err != nil {
		return 0, -1, err
	}
	return c.request(msg, append(fileFDs(target.Files), fileFDs(files)...))
}

// IDMapNS returns a user namespace with no process in it whose uid and gid
// maps are both idmap (uid_map's format: "inside outside count" lines), to
// idmap mounts with (mount_setattr MOUNT_ATTR_IDMAP). A Go process cannot
// create one itself: unshare(CLONE_NEWUSER) needs a single-threaded caller.
func (c *Client) IDMapNS(idmap string) (*os.File, error) {
	if len(idmap)+1 > maxIDMap || strings.IndexByte(idmap, 0) >= 0 || idmap == "" {
		return nil, fmt.Errorf("spawner: id map of %d bytes, want 1 to %d", len(idmap), maxIDMap-1)
	}
	b := make([]byte, headerSize, headerSize+len(idmap)+1)
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], requestMagic)
	ne.PutUint32(b[4:], flagIDMapNS)
	ne.PutUint32(b[48:], uint32(len(idmap)+1)) //nolint:gosec // at most maxIDMap, checked above
	b = append(append(b, idmap...), 0)
	_, fd, err := c.request(b, nil)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), "userns"), nil
}

// request sends one request with its descriptors (after the reply socket
// it makes) and reads the answer: a pid and a descriptor.
func (c *Client) request(msg []byte, fds []int) (pid, fd int, err error) {
	if !c.Alive() {
		return 0, -1, ErrGone
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, -1, fmt.Errorf("spawner: socketpair: %w", err)
	}
	defer unix.Close(pair[0])
	// The spawner gives a child 10 s to exec; a reply that takes far
	// longer means a wedged spawner, not a slow spawn.
	if err := unix.SetsockoptTimeval(pair[0], unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: replyTimeout}); err != nil {
		unix.Close(pair[1])
		return 0, -1, fmt.Errorf("spawner: %w", err)
	}
	// One message per request: concurrent sends never interleave.
	err = unix.Sendmsg(int(c.ctl.Fd()), msg, unix.UnixRights(append([]int{pair[1]}, fds...)...), nil, 0)
	unix.Close(pair[1])
	if err != nil {
		if !c.Alive() || errors.Is(err, unix.EPIPE) {
			return 0, -1, fmt.Errorf("%w: %w", ErrGone, err)
		}
		return 0, -1, fmt.Errorf("spawner: send request: %w", err)
	}
	return recvReply(pair[0])
}

// replyTimeout bounds the wait for a reply, in seconds.
const replyTimeout = 60

// recvReply reads the spawner's answer: a child's pid and pidfd, or the
// step that failed and its errno.
func recvReply(fd int) (pid, pidfd int, err error) {
	buf := make([]byte, replySize+1)
	oob := make([]byte, unix.CmsgSpace(4*4)) // room to see a few too many
	var n, oobn, flags int
	for {
		n, oobn, flags, _, err = unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		// A socket with a receive timeout is not restarted after a
		// signal (the Go runtime's, say): EINTR, to be retried.
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return 0, -1, fmt.Errorf("spawner: read reply: %w", err)
	}
	fds, err := fdpass.Received(oob[:oobn])
	if err != nil {
		return 0, -1, fmt.Errorf("spawner: read reply: %w", err)
	}
	if n == 0 {
		fdpass.Close(fds)
		return 0, -1, errors.New("spawner: closed without a reply (did it crash? see its log)")
	}
	if n != replySize || flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		fdpass.Close(fds)
		return 0, -1, fmt.Errorf("spawner: malformed reply of %d bytes", n)
	}
	ne := binary.NativeEndian
	pid, errno := int(int32(ne.Uint32(buf[0:]))), syscall.Errno(ne.Uint32(buf[4:])) //nolint:gosec // the C side writes a pid_t, a signed 32-bit value, in this word
	if errno != 0 {
		fdpass.Close(fds)
		what := buf[8:replySize]
		for i, c := range what {
			if c == 0 {
				what = what[:i]
				break
			}
		}
		return 0, -1, fmt.Errorf("spawner: %s: %w", what, errno)
	}
	if len(fds) != 1 || pid <= 0 {
		fdpass.Close(fds)
		return 0, -1, errors.New("spawner: reply without a child")
	}
	return pid, fds[0], nil
}

func fileFDs(fs []*os.File) []int {
	fds := make([]int, len(fs))
	for i, f := range fs {
		fds[i] = int(f.Fd())
	}
	return fds
}
