// Package image provides the root filesystems sandboxes start from. An Image
// is a stack of read-only directories (overlay lower layers, top first), the
// mounts the image needs, and its runtime defaults.
//
// The "host" image needs no download: the host's /usr (and /bin, /lib* where
// they are real directories) bound read-only, over a small skeleton with a
// sanitized copy of /etc. Its language views (Language) are what the
// language names get by default.
package image

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Image is what a sandbox's root filesystem is assembled from.
type Image struct {
	Name       string
	ID         string        // "sha256:<hex>" of the image config; "" for the host image
	Layers     []string      // overlay lower directories, top-most first
	Mounts     []specs.Mount // made inside the root before the standard mounts
	Env        []string
	WorkingDir string
	User       string
	Entrypoint []string
	Cmd        []string
}

// HostName is the name of the host image.
const HostName = "host"

// Pin is what a sandbox records to start from img again on every later
// start, whatever the name it was first started by points to by then (a
// language name an operator remapped, a tag re-pulled): a stored image's
// id, or the host image's (or its language view's) own name, which
// Resolver.Resolve takes back.
func (img *Image) Pin() string {
	if img.ID != "" {
		return img.ID
	}
	return img.Name
}

// hostVersion changes whenever the skeleton's layout changes, so an old
// skeleton on disk is never reused with a new binary.
const hostVersion = "2"

// etcAllow lists what of the host's /etc a sandbox gets. Everything else
// (shadow, gshadow, ssh host keys, machine-id, sudoers, credentials of
// installed services, ssl/private) stays out: an allowlist cannot leak a
// secret file someone adds to /etc later.
var etcAllow = []string{
	"passwd", "group", "nsswitch.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
	"localtime", "timezone", "os-release", "debian_version", "lsb-release", "alternatives",
	"ssl", "ca-certificates", "ca-certificates.conf", "mime.types", "protocols", "services",
	"profile", "profile.d", "bash.bashrc", "inputrc", "shells", "login.defs",
	"python3", "python3.11", "python3.12", "python3.13", "locale.alias", "gai.conf", "host.conf",
	"networks", "magic", "magic.mime", "mailcap", "terminfo", "xattr.conf",
}

// etcDeny is removed from allowed directories (a private-key directory
// inside ssl, for instance).
var etcDeny = map[string]bool{"ssl/private": true}

// hostDirs are the top-level host directories the host image exposes
// read-only: bound when a real directory, recreated as the same symlink when
// a link (merged /usr).
var hostDirs = []string{"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// skeletonDirs are created empty in the skeleton, with their modes.
var skeletonDirs = []struct {
	path string
	mode fs.FileMode
}{
	{"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755}, {"tmp", 0o1777}, {"root", 0o700},
	{"home", 0o755}, {"run", 0o755}, {"mnt", 0o755}, {"opt", 0o755}, {"srv", 0o755},
	{"media", 0o755}, {"var", 0o755}, {"var/tmp", 0o1777}, {"var/lib", 0o755},
	{"var/cache", 0o755}, {"var/log", 0o755}, {"etc", 0o755},
}

// Host returns the host image, building its skeleton under dir on first use.
// uid and gid are the host ids that own the skeleton: the ids sandbox root
// maps to, so the sandbox sees its own /etc as root's.
func Host(dir string, uid, gid int) (*Image, error) {
	key, err := hostKey(uid, gid)
	if err != nil {
		return nil, err
	}
	skel := filepath.Join(dir, "host-"+key)
	if _, err := os.Stat(skel); errors.Is(err, fs.ErrNotExist) {
		if err := buildSkeleton(dir, skel, uid, gid); err != nil {
			return nil, fmt.Errorf("build host image: %w", err)
		}
	} else if err != nil {
		return nil, err
	}
	img := &Image{Name: HostName, Layers: []string{skel}}
	for _, d := range hostDirs {
		fi, err := os.Lstat("/" + d)
		if err != nil || !fi.IsDir() {
			continue
		}
		img.Mounts = append(img.Mounts, specs.Mount{
			Destination: "/" + d, Type: "bind", Source: "/" + d,
			Options: []string{"rbind", "ro", "nosuid", "nodev"},
		})
	}
	return img, nil
}

// hostKey fingerprints what the skeleton is made of, so a changed /etc or a
// different owner gets a fresh skeleton.
func hostKey(uid, gid int) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "v%s uid=%d gid=%d\n", hostVersion, uid, gid)
	for _, d := range hostDirs {
		if t, err := os.Readlink("/" + d); err == nil {
			fmt.Fprintf(h, "link %s %s\n", d, t)
		}
	}
	for _, name := range etcAllow {
		fi, err := os.Lstat(filepath.Join("/etc", name))
		if err != nil {
			continue
		}
		fmt.Fprintf(h, "%s %d %d %v\n", name, fi.Size(), fi.ModTime().UnixNano(), fi.Mode())
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

func buildSkeleton(dir, skel string, uid, gid int) error {
	if err := os.MkdirAll(dir, 0o711); err != nil { //nolint:gosec // 0711: the host image's skeleton lies below it and the sandboxes' uid range must traverse it
		return err
	}
	tmp, err := os.MkdirTemp(dir, ".host-build-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	if err := os.Chmod(tmp, 0o755); err != nil { //nolint:gosec // 0755: tmp becomes the skeleton's /, which the sandbox's processes must read
		return err
	}
	for _, d := range skeletonDirs {
		p := filepath.Join(tmp, d.path)
		if err := os.MkdirAll(p, 0o755); err != nil { //nolint:gosec // 0755 then set to the entry's own mode just below
			return err
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return err
		}
	}
	for _, d := range hostDirs {
		fi, err := os.Lstat("/" + d)
		switch {
		case err != nil:
			continue
		case fi.Mode()&fs.ModeSymlink != 0:
			t, err := os.Readlink("/" + d)
			if err != nil {
				return err
			}
			if err := os.Symlink(t, filepath.Join(tmp, d)); err != nil {
				return err
			}
		case fi.IsDir():
			if err := os.Mkdir(filepath.Join(tmp, d), 0o755); err != nil { //nolint:gosec // 0755: a directory of the skeleton, readable by the sandbox's processes like the host's
				return err
			}
		}
	}
	for _, name := range etcAllow {
		if err := copyTree(filepath.Join("/etc", name), filepath.Join(tmp, "etc", name), name); err != nil {
			return fmt.Errorf("copy /etc/%s: %w", name, err)
		}
	}
	files := map[string]string{
		"etc/hostname": "sandbox\n",
		"etc/hosts":    "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
		// No network by default: an empty resolver config fails fast
		// instead of waiting on the host's resolver.
		"etc/resolv.conf": "",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(tmp, name), []byte(content), 0o644); err != nil { //nolint:gosec // 0644: the skeleton's /etc files (hosts, resolv.conf, ...) are world-readable by convention
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(tmp, LangBin), 0o755); err != nil { //nolint:gosec // 0755: on the sandbox's PATH, read by its processes
		return err
	}
	for name, target := range langLinks {
		if err := os.Symlink(target, filepath.Join(tmp, LangBin, name)); err != nil {
			return err
		}
	}
	if err := chownTree(tmp, uid, gid); err != nil {
		return err
	}
	// Another process may have built the same skeleton meanwhile; its
	// copy is as good as ours.
	if err := os.Rename(tmp, skel); err != nil && !errors.Is(err, fs.ErrExist) && !errors.Is(err, syscall.ENOTEMPTY) {
		return err
	}
	return nil
}

// copyTree copies src to dst: regular files, directories and symlinks (as
// links, never followed). rel is src relative to /etc, for etcDeny.
func copyTree(src, dst, rel string) error {
	if etcDeny[rel] {
		return nil
	}
	fi, err := os.Lstat(src)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		t, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(t, dst)
	case fi.IsDir():
		if err := os.Mkdir(dst, fi.Mode().Perm()); err != nil {
			return err
		}
		ents, err := os.ReadDir(src)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if err := copyTree(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name()), rel+"/"+e.Name()); err != nil {
				return err
			}
		}
		return nil
	case fi.Mode().IsRegular():
		if fi.Size() > 64<<20 {
			return nil // nothing in /etc a sandbox needs is this large
		}
		in, err := os.Open(src) //nolint:gosec // src is below the host's /etc, copied into the host image's skeleton
		if err != nil {
			return err
		}
		defer func() { _ = in.Close() }()
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm()) //nolint:gosec // dst is below the skeleton's tmp dir; O_EXCL refuses anything already there
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			_ = out.Close()
			return err
		}
		return out.Close()
	}
	return nil // sockets, fifos, devices: not copied
}

func chownTree(root string, uid, gid int) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}
