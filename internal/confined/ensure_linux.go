package confined

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// EnsureInRoot opens (creating when missing) the directory or file at p
// inside the root, never leaving it, and returns an O_PATH fd. With
// noSymlinks a symlink anywhere on the way is an error rather than
// followed (within the root). The gvisor backend uses it on the host, for
// the writable paths of a read-only root it binds before runsc starts;
// the agent, for its mount points while it sets up the root.
func EnsureInRoot(rootFD int, p string, file, noSymlinks bool) (int, error) {
	p = strings.TrimPrefix(path.Clean("/"+p), "/")
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS}
	if noSymlinks {
		how.Resolve |= unix.RESOLVE_NO_SYMLINKS
	}
	if p == "" {
		return unix.Openat2(rootFD, ".", how)
	}
	fd, err := unix.Openat2(rootFD, p, how)
	switch {
	case err == nil:
		return fd, nil
	case noSymlinks && errors.Is(err, unix.ELOOP):
		return -1, fmt.Errorf("/%s passes through a symlink in the sandbox", p)
	}
	dir, base := path.Split(p)
	parent := rootFD
	if dir != "" {
		fd, err := EnsureInRoot(rootFD, dir, false, noSymlinks)
		if err != nil {
			return -1, err
		}
		defer unix.Close(fd)
		parent = fd
	}
	// mkdirat/openat need a real directory fd, not O_PATH, for creation.
	pfd, err := unix.Openat(parent, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	if file {
		fd, err := unix.Openat(pfd, base, unix.O_CREAT|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, err
		}
		if err == nil {
			unix.Close(fd)
		}
	} else if err := unix.Mkdirat(pfd, base, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, err
	}
	return unix.Openat2(pfd, base, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC | unix.O_NOFOLLOW})
}
