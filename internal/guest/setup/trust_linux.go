package setup

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/cabundle"
)

// installTrust puts caPEM (boot.Config.TrustCA) in the sandbox's system
// trust store: the image's bundle (the first of cabundle.Sources found)
// with the CA appended, a former start's block replaced, written at
// cabundle.Path and where the image keeps its bundle. Run in the new root
// before it turns read-only and before any of the sandbox's processes:
// the writes land in its writable layer, whatever its write paths.
func installTrust(caPEM []byte) error {
	var base []byte
	src := ""
	for _, p := range cabundle.Sources {
		b, err := readBundle(p)
		if err == nil {
			base, src = b, p
			break
		}
		if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("read the image's trust store %s: %w", p, err)
		}
	}
	bundle := cabundle.Append(base, caPEM)
	targets := []string{cabundle.Path}
	if src != "" && src != cabundle.Path {
		targets = append(targets, src)
	}
	for _, p := range targets {
		if err := replaceFile(p, bundle); err != nil {
			return fmt.Errorf("install the sandbox's CA in %s: %w", p, err)
		}
	}
	return nil
}

// readBundle reads the image's bundle at p, following symlinks (Fedora's
// is one) inside the sandbox's root: a regular file of at most
// cabundle.MaxBundle bytes.
func readBundle(p string) ([]byte, error) {
	f, err := os.Open(p) //nolint:gosec // a path of cabundle.Sources, in the sandbox's own root
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Size() > cabundle.MaxBundle {
		return nil, fmt.Errorf("a %v of %d bytes, want a regular file of at most %d", fi.Mode().Type(), fi.Size(), cabundle.MaxBundle)
	}
	return io.ReadAll(io.LimitReader(f, cabundle.MaxBundle))
}

// replaceFile makes p a regular file (mode 0644) holding b, by a rename:
// a symlink at p is replaced, not followed.
func replaceFile(p string, b []byte) error {
	if err := os.MkdirAll(path.Dir(p), 0o755); err != nil { //nolint:gosec // 0755: the usual mode of /etc/ssl/certs
		return err
	}
	tmp := p + ".warren-new"
	_ = os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o644) //nolint:gosec // 0644: every process reads the trust store
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		_ = os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}
