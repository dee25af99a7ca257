package boot

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/fdpass"
)

// The config travels on a unix stream socket: one header byte, which
// carries the root's detached mount (SCM_RIGHTS) when the host made one,
// then the Config in its binary form (codec.go), then EOF. A socket rather than a pipe because a
// pooled agent is spawned long before the sandbox it will run, so the mount
// cannot be one of the descriptors it inherits.
const configHeader = 'C'

// maxConfig bounds what the agent reads.
const maxConfig = 4 << 20

// SendConfig writes cfg to an agent's config socket with rootMount (a
// detached mount of cfg.Rootfs) attached, or none when rootMount is nil.
func SendConfig(sock *os.File, cfg *Config, rootMount *os.File) error {
	data := encodeConfig(cfg)
	if len(data) > maxConfig {
		return fmt.Errorf("config of %d bytes, limit %d", len(data), maxConfig)
	}
	var rights []byte
	if rootMount != nil {
		rights = unix.UnixRights(int(rootMount.Fd()))
	}
	rc, err := sock.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), []byte{configHeader}, rights, nil, 0)
		return !errors.Is(serr, unix.EAGAIN)
	}); err != nil {
		return err
	}
	if serr != nil {
		return serr
	}
	_, err = sock.Write(data)
	return err
}

// workloadHeader precedes the config when the host passes the sandbox's
// workload cgroup (SendWorkload): one byte carrying one descriptor.
const workloadHeader = 'W'

// SendWorkload passes work, the file through which the agent's launcher
// thread joins the workload's cgroup (cgroup.Cgroup.OpenWorkload), ahead
// of the config (SendConfig).
func SendWorkload(sock, work *os.File) error {
	rc, err := sock.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), []byte{workloadHeader}, unix.UnixRights(int(work.Fd())), nil, 0)
		return !errors.Is(serr, unix.EAGAIN)
	}); err != nil {
		return err
	}
	return serr
}

// readHeader reads one header byte from sock and the descriptors (at most
// one) that came with it.
func readHeader(rc syscall.RawConn) (byte, []int, error) {
	p := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4*4)) // room to see a few too many
	var n, oobn, flags int
	var rerr error
	if err := rc.Read(func(fd uintptr) bool {
		n, oobn, flags, _, rerr = unix.Recvmsg(int(fd), p, oob, unix.MSG_CMSG_CLOEXEC)
		return !errors.Is(rerr, unix.EAGAIN)
	}); err != nil {
		return 0, nil, err
	}
	if rerr != nil {
		return 0, nil, fmt.Errorf("read config header: %w", rerr)
	}
	fds, err := fdpass.Received(oob[:oobn])
	if err == nil && flags&unix.MSG_CTRUNC != 0 {
		err = errors.New("config: descriptors truncated")
	}
	if err == nil && len(fds) > 1 {
		err = fmt.Errorf("config: %d descriptors passed, want at most one", len(fds))
	}
	if err == nil && n != 1 {
		err = errors.New("config: no header (is the host a matching warren?)")
	}
	if err != nil {
		fdpass.Close(fds)
		return 0, nil, err
	}
	return p[0], fds, nil
}

// ReadConfig reads the config the host sent on sock (SendConfig). A root
// mount that came with it is cfg.Rootfs.Mount, and a workload cgroup sent
// before it (SendWorkload) cfg.Workload; the caller owns both.
func ReadConfig(sock *os.File) (*Config, error) {
	rc, err := sock.SyscallConn()
	if err != nil {
		return nil, err
	}
	h, fds, err := readHeader(rc)
	if err != nil {
		return nil, err
	}
	work := -1
	if h == workloadHeader {
		if len(fds) != 1 {
			return nil, fmt.Errorf("config: workload header with %d descriptors, want one", len(fds))
		}
		work = fds[0]
		if h, fds, err = readHeader(rc); err != nil {
			unix.Close(work)
			return nil, err
		}
	}
	if h != configHeader {
		err = errors.New("config: no header (is the host a matching warren?)")
	}
	var cfg *Config
	if err == nil {
		var data []byte
		data, err = io.ReadAll(io.LimitReader(sock, maxConfig+1))
		if err == nil && len(data) > maxConfig {
			err = fmt.Errorf("config: more than %d bytes", maxConfig)
		}
		if err == nil {
			cfg, err = decodeConfig(data)
		}
	}
	if err != nil {
		fdpass.Close(fds)
		if work >= 0 {
			unix.Close(work)
		}
		return nil, err
	}
	if len(fds) == 1 {
		cfg.Rootfs.Mount = fds[0]
	}
	cfg.Workload = max(work, 0)
	return cfg, nil
}
