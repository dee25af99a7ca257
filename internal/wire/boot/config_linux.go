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
// carries the host's detached mounts (SCM_RIGHTS), then the Config in its
// binary form (codec.go), then EOF. The header is configHeaderRoot when the
// first descriptor is the root's mount, configHeader when there is none;
// the other descriptors are Config.BindMounts. A socket rather than a pipe
// because a pooled agent is spawned long before the sandbox it will run,
// so the mounts cannot be among the descriptors it inherits.
const (
	configHeader     = 'C'
	configHeaderRoot = 'R'
)

// maxMounts bounds the descriptors a config carries: the root and a bind
// per volume.
const maxMounts = 1 + 16

// maxConfig bounds what the agent reads.
const maxConfig = 4 << 20

// SendConfig writes cfg to an agent's config socket with rootMount (a
// detached mount of cfg.Rootfs) attached, or none when rootMount is nil,
// and binds (Config.BindMounts' mounts, one per bind of the spec without a
// source) after it.
func SendConfig(sock *os.File, cfg *Config, rootMount *os.File, binds []*os.File) error {
	data := encodeConfig(cfg)
	if len(data) > maxConfig {
		return fmt.Errorf("config of %d bytes, limit %d", len(data), maxConfig)
	}
	if len(binds) > maxMounts-1 {
		return fmt.Errorf("config with %d bind mounts, limit %d", len(binds), maxMounts-1)
	}
	header := byte(configHeader)
	var fds []int
	if rootMount != nil {
		header = configHeaderRoot
		fds = append(fds, int(rootMount.Fd()))
	}
	for _, b := range binds {
		fds = append(fds, int(b.Fd()))
	}
	var rights []byte
	if len(fds) > 0 {
		rights = unix.UnixRights(fds...)
	}
	rc, err := sock.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), []byte{header}, rights, nil, 0)
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
// maxMounts) that came with it.
func readHeader(rc syscall.RawConn) (byte, []int, error) {
	p := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4*(maxMounts+4))) // room to see a few too many
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
	if err == nil && len(fds) > maxMounts {
		err = fmt.Errorf("config: %d descriptors passed, want at most %d", len(fds), maxMounts)
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
// mount that came with it is cfg.Rootfs.Mount, bind mounts are
// cfg.BindMounts, and a workload cgroup sent before it (SendWorkload)
// cfg.Workload; the caller owns them.
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
			fdpass.Close(fds)
			return nil, fmt.Errorf("config: workload header with %d descriptors, want one", len(fds))
		}
		work = fds[0]
		if h, fds, err = readHeader(rc); err != nil {
			unix.Close(work)
			return nil, err
		}
	}
	if h != configHeader && h != configHeaderRoot {
		err = errors.New("config: no header (is the host a matching warren?)")
	}
	if err == nil && h == configHeaderRoot && len(fds) == 0 {
		err = errors.New("config: a root mount announced but not passed")
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
	if err == nil && h == configHeaderRoot {
		cfg.Rootfs.Mount, fds = fds[0], fds[1:]
	}
	if err == nil {
		binds := 0
		if cfg.Spec != nil {
			for _, m := range cfg.Spec.Mounts {
				if m.Type == "bind" && m.Source == "" {
					binds++
				}
			}
		}
		if len(fds) > 0 && len(fds) != binds {
			if cfg.Rootfs.Mount != 0 {
				unix.Close(cfg.Rootfs.Mount)
			}
			err = fmt.Errorf("config: %d bind mounts passed for %d binds", len(fds), binds)
		}
	}
	if err != nil {
		fdpass.Close(fds)
		if work >= 0 {
			unix.Close(work)
		}
		return nil, err
	}
	if len(fds) > 0 {
		cfg.BindMounts = fds
	}
	cfg.Workload = max(work, 0)
	return cfg, nil
}
