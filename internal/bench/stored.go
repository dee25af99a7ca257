package bench

import (
	"context"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/image/layer"
	"github.com/warren-sandbox/warren/internal/store"
)

// StoredImage imports a minimal root filesystem (/bin/true with its
// dynamic linker and libraries, and the usual top-level directories) into
// a throwaway image store under dir and returns it as a backend image: the
// "sandbox from a stored image" side of the stored-vs-host start
// comparison. Nothing touches a registry. shift is the ownership the
// backend's sandboxes need (their root's host ids).
func StoredImage(ctx context.Context, dir string, shift layer.IDMap) (*image.Image, error) {
	root := filepath.Join(dir, "rootfs")
	for _, d := range []string{"bin", "etc", "proc", "sys", "dev", "tmp", "root", "run", "var/tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil { //nolint:gosec // 0755: directories of an image's rootfs, which a sandbox's processes must read
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/true\n"), 0o644); err != nil { //nolint:gosec // 0644: /etc/passwd of an image's rootfs is world-readable by convention
		return nil, err
	}
	files, err := withLibraries("/bin/true")
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		if err := copyFile(f, filepath.Join(root, f)); err != nil {
			return nil, err
		}
	}
	db, err := store.Open(filepath.Join(dir, "warren.db"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = db.Close() }()
	st, err := image.OpenStore(filepath.Join(dir, "images"), db, shift)
	if err != nil {
		return nil, err
	}
	if _, err := st.Import(ctx, root, "bench/minimal"); err != nil {
		return nil, err
	}
	return st.Get("bench/minimal")
}

// withLibraries returns path, its ELF interpreter and the shared libraries
// it needs, found where the dynamic linker looks on Debian and Ubuntu.
func withLibraries(path string) ([]string, error) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, err
	}
	f, err := elf.Open(real)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	out := []string{path}
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(p.Open())
		if err != nil {
			return nil, err
		}
		if len(b) > 0 && b[len(b)-1] == 0 {
			b = b[:len(b)-1]
		}
		out = append(out, string(b))
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return nil, err
	}
	dirs, _ := filepath.Glob("/lib/*-linux-gnu*")
	more, _ := filepath.Glob("/usr/lib/*-linux-gnu*")
	dirs = append(append(dirs, more...), "/lib64", "/lib", "/usr/lib")
	for _, l := range libs {
		found := ""
		for _, d := range dirs {
			if _, err := os.Stat(filepath.Join(d, l)); err == nil {
				found = filepath.Join(d, l)
				break
			}
		}
		if found == "" {
			return nil, fmt.Errorf("%s needs %s, not found in %v", path, l, dirs)
		}
		out = append(out, found)
	}
	return out, nil
}

// copyFile copies the file src resolves to into dst, executable.
func copyFile(src, dst string) error {
	in, err := os.Open(src) //nolint:gosec // src is a host binary (e.g. /bin/true) the benchmark copies into its image
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil { //nolint:gosec // 0755: directories of an image's rootfs, which a sandbox's processes must read
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755) //nolint:gosec // 0755: an executable in an image's rootfs, run by the sandbox's uid
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}
