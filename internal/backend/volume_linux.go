package backend

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/errdefs"
)

// ErrVolumeNotAllowed marks a volume the server's policy refuses: invalid
// params, as the request names the volume.
var ErrVolumeNotAllowed = errdefs.Errorf(errdefs.ErrInvalid, "host path not allowed")

// CheckVolumeSource checks that v's host path lies beneath one of roots
// (absolute paths without symlinks, as returned by filepath.EvalSymlinks)
// and that it exists as a directory or regular file, reached without a
// symlink, "..", or a magic link on the way. A nil roots allows any host
// path. The check is repeated by the backend when it mounts: a path
// changed in between fails the start rather than mounting something else.
func CheckVolumeSource(roots []string, v Volume) error {
	if err := v.Validate(); err != nil {
		return err
	}
	root := "/"
	if roots != nil {
		root = ""
		for _, r := range roots {
			if v.Source == r || strings.HasPrefix(v.Source, strings.TrimSuffix(r, "/")+"/") {
				root = r
				break
			}
		}
		if root == "" {
			return fmt.Errorf("volume host path %.80q: %w (allowed: beneath %s)", v.Source, ErrVolumeNotAllowed, strings.Join(roots, ", "))
		}
	}
	rel, err := filepath.Rel(root, v.Source)
	if err != nil {
		return err
	}
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("volume root %s: %w", root, err)
	}
	defer unix.Close(rootFD)
	fd, err := unix.Openat2(rootFD, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
		return fmt.Errorf("volume host path %.80q: %w: it passes through a symlink", v.Source, ErrVolumeNotAllowed)
	}
	if err != nil {
		return fmt.Errorf("volume host path %.80q: %w", v.Source, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if m := st.Mode & unix.S_IFMT; m != unix.S_IFDIR && m != unix.S_IFREG {
		return fmt.Errorf("volume host path %.80q: %w: not a directory or regular file", v.Source, ErrVolumeNotAllowed)
	}
	return nil
}
