package image

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// maxIndexDepth bounds nested image indexes.
const maxIndexDepth = 4

// maxScanEntries bounds the entries whose sizes a tarball scan remembers.
const maxScanEntries = 100_000

// open detects the format of src and returns what to import. scratch is an
// empty directory for the import's temporary files.
func (s *Store) open(ctx context.Context, src, scratch string) (*source, error) {
	fi, err := os.Stat(src)
	if err != nil {
		return nil, err
	}
	if fi.IsDir() {
		if _, err := os.Stat(filepath.Join(src, "oci-layout")); err == nil {
			return s.openLayout(src)
		}
		if _, err := os.Stat(filepath.Join(src, "manifest.json")); err == nil {
			return nil, fmt.Errorf("%w: %s looks like an extracted docker save; import the tarball", ErrFormat, src)
		}
		return s.openRootfsDir(ctx, src)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is neither a directory nor a regular file", ErrFormat, src)
	}
	scan, err := scanTar(ctx, src)
	if err != nil {
		return nil, err
	}
	switch {
	case scan.entries == 0:
		return nil, fmt.Errorf("%w: %s is an empty archive", ErrFormat, src)
	case scan.gzip && (scan.dockerManifest || scan.ociLayout):
		return nil, fmt.Errorf("%w: %s is a compressed image archive; decompress it first", ErrFormat, src)
	case scan.dockerManifest:
		return s.openDockerTar(src, scan)
	case scan.ociLayout:
		if err := s.extractLayout(ctx, src, scratch); err != nil {
			return nil, err
		}
		return s.openLayout(scratch)
	default:
		return s.openRootfsTar(ctx, src, scan.gzip)
	}
}

// tarScan is what a pass over a tarball's headers found.
type tarScan struct {
	gzip           bool
	dockerManifest bool // top-level manifest.json
	ociLayout      bool // top-level oci-layout
	entries        int
	sizes          map[string]int64
}

// openMaybeGzip opens a file, decompressing it when it starts with the gzip
// magic.
func openMaybeGzip(p string) (io.ReadCloser, bool, error) {
	f, err := os.Open(p) //nolint:gosec // p is the image file the operator asked to import
	if err != nil {
		return nil, false, err
	}
	br := bufio.NewReader(f)
	magic, _ := br.Peek(2)
	if len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			_ = f.Close()
			return nil, false, err
		}
		return struct {
			io.Reader
			io.Closer
		}{zr, f}, true, nil
	}
	return struct {
		io.Reader
		io.Closer
	}{br, f}, false, nil
}

func scanTar(ctx context.Context, p string) (*tarScan, error) {
	rc, gz, err := openMaybeGzip(p)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rc.Close() }()
	sc := &tarScan{gzip: gz, sizes: map[string]int64{}}
	tr := tar.NewReader(rc)
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil && !errors.Is(err, tar.ErrInsecurePath) {
			return nil, fmt.Errorf("%w: %s is not a tar archive: %w", ErrFormat, p, err)
		}
		name := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
		sc.entries++
		if hdr.Typeflag == tar.TypeReg {
			switch name {
			case "manifest.json":
				sc.dockerManifest = true
			case "oci-layout":
				sc.ociLayout = true
			}
		}
		if len(sc.sizes) < maxScanEntries {
			sc.sizes[name] = hdr.Size
		}
	}
	return sc, nil
}

// openDockerTar reads a docker-save tarball, after checking the sizes of
// its manifest and config (go-containerregistry reads them whole).
func (s *Store) openDockerTar(src string, scan *tarScan) (*source, error) {
	if n := scan.sizes["manifest.json"]; n > s.maxConfigBytes {
		return nil, fmt.Errorf("%w: manifest.json is %d bytes", ErrLimit, n)
	}
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(src) }) //nolint:gosec // src is the image tarball the operator asked to import
	if err != nil {
		return nil, fmt.Errorf("%w: docker tarball manifest: %w", ErrFormat, err)
	}
	if len(m) != 1 {
		return nil, fmt.Errorf("%w: docker tarball holds %d images, want 1", ErrFormat, len(m))
	}
	if n := len(m[0].Layers); n > s.maxLayers {
		return nil, fmt.Errorf("%w: %d layers", ErrLimit, n)
	}
	cfgSize, ok := scan.sizes[path.Clean(m[0].Config)]
	if !ok {
		return nil, fmt.Errorf("%w: docker tarball config %q missing", ErrFormat, m[0].Config)
	}
	if cfgSize > s.maxConfigBytes {
		return nil, fmt.Errorf("%w: config is %d bytes", ErrLimit, cfgSize)
	}
	img, err := tarball.ImageFromPath(src, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: docker tarball: %w", ErrFormat, err)
	}
	sc, err := s.fromImage(img)
	if err != nil {
		return nil, err
	}
	sc.names = m[0].RepoTags
	return sc, nil
}

// fromImage turns a go-containerregistry image into a source. Sizes were
// checked by the caller.
func (s *Store) fromImage(img v1.Image) (*source, error) {
	id, err := img.ConfigName()
	if err != nil {
		return nil, fmt.Errorf("%w: config: %w", ErrFormat, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("%w: config: %w", ErrFormat, err)
	}
	if cf.OS != "" && cf.OS != "linux" {
		return nil, fmt.Errorf("%w: image is for %s, not linux", ErrFormat, cf.OS)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("%w: layers: %w", ErrFormat, err)
	}
	if n := len(layers); n > s.maxLayers {
		return nil, fmt.Errorf("%w: %d layers", ErrLimit, n)
	}
	if len(layers) != len(cf.RootFS.DiffIDs) {
		return nil, fmt.Errorf("%w: %d layers but %d diff ids in the config", ErrFormat, len(layers), len(cf.RootFS.DiffIDs))
	}
	src := &source{
		id: id.String(),
		config: runtimeConfig{
			Env: cf.Config.Env, WorkingDir: cf.Config.WorkingDir, User: cf.Config.User,
			Entrypoint: cf.Config.Entrypoint, Cmd: cf.Config.Cmd,
		},
	}
	for i, l := range layers {
		// The config's diff ids are the ones verified: they are what
		// the image id (the config digest) commits to.
		src.layers = append(src.layers, layerSource{diffID: cf.RootFS.DiffIDs[i].String(), open: l.Uncompressed})
	}
	return src, nil
}

// openLayout reads an OCI image layout directory, picking the image for
// this platform from its index.
func (s *Store) openLayout(dir string) (*source, error) {
	if fi, err := os.Stat(filepath.Join(dir, "index.json")); err != nil {
		return nil, fmt.Errorf("%w: OCI layout: %w", ErrFormat, err)
	} else if fi.Size() > s.maxConfigBytes {
		return nil, fmt.Errorf("%w: index.json is %d bytes", ErrLimit, fi.Size())
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: OCI layout: %w", ErrFormat, err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("%w: OCI layout: %w", ErrFormat, err)
	}
	img, err := s.selectImage(idx, hostPlatform)
	if err != nil {
		return nil, err
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("%w: manifest: %w", ErrFormat, err)
	}
	if m.Config.Size > s.maxConfigBytes {
		return nil, fmt.Errorf("%w: config is %d bytes", ErrLimit, m.Config.Size)
	}
	if n := len(m.Layers); n > s.maxLayers {
		return nil, fmt.Errorf("%w: %d layers", ErrLimit, n)
	}
	return s.fromImage(img)
}

var hostPlatform = v1.Platform{OS: "linux", Architecture: runtime.GOARCH}

// extractLayout unpacks an OCI layout tarball into dir: regular files and
// directories only, names confined to dir, bytes bounded.
func (s *Store) extractLayout(ctx context.Context, src, dir string) error {
	f, err := os.Open(src) //nolint:gosec // src is the image tarball the operator asked to import
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	tr := tar.NewReader(f)
	left := s.maxTotalBytes
	for n := 0; ; n++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if n > 4*s.maxLayers+1000 {
			return fmt.Errorf("%w: OCI layout tarball has too many entries", ErrLimit)
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil && !errors.Is(err, tar.ErrInsecurePath) {
			return fmt.Errorf("%w: OCI layout tarball: %w", ErrFormat, err)
		}
		name := path.Clean(strings.TrimPrefix(hdr.Name, "/"))
		if name == "." {
			continue
		}
		if !filepath.IsLocal(name) {
			return fmt.Errorf("%w: OCI layout tarball entry %q escapes", ErrFormat, hdr.Name)
		}
		dst := filepath.Join(dir, filepath.FromSlash(name))
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			if hdr.Size > left {
				return fmt.Errorf("%w: OCI layout tarball larger than %d bytes", ErrLimit, s.maxTotalBytes)
			}
			left -= hdr.Size
			if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
				return err
			}
			// O_EXCL|O_NOFOLLOW: only regular files and directories are
			// created here, so no link can redirect a write.
			out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600) //nolint:gosec // dst is checked local to dir above (filepath.IsLocal); O_EXCL|O_NOFOLLOW refuse links
			if err != nil {
				return fmt.Errorf("%w: OCI layout tarball entry %q: %w", ErrFormat, hdr.Name, err)
			}
			_, err = io.Copy(out, &countingReader{ctx: ctx, r: tr, b: &budget{left: hdr.Size}})
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("%w: OCI layout tarball entry %q has type %q", ErrFormat, hdr.Name, hdr.Typeflag)
		}
	}
}

// openRootfsTar treats a tarball as a root filesystem: one layer. The
// digest is computed in a first pass, so a layer already stored is not
// unpacked again; the unpack verifies it.
func (s *Store) openRootfsTar(ctx context.Context, src string, gz bool) (*source, error) {
	open := func() (io.ReadCloser, error) {
		rc, isGz, err := openMaybeGzip(src)
		if err == nil && isGz != gz {
			_ = rc.Close()
			return nil, fmt.Errorf("%s changed during import", src)
		}
		return rc, err
	}
	rc, err := open()
	if err != nil {
		return nil, err
	}
	defer func() { _ = rc.Close() }()
	h := newHashWriter()
	if _, err := io.Copy(h, &countingReader{ctx: ctx, r: rc, b: &budget{left: s.maxTotalBytes}}); err != nil {
		return nil, err
	}
	return rootfsSource(h.digest(), open, runtimeConfig{})
}

// openRootfsDir treats a directory as a root filesystem: one layer, made
// by writing the tree as a tar stream (twice: once to hash, once to
// unpack).
func (s *Store) openRootfsDir(ctx context.Context, dir string) (*source, error) {
	h := newHashWriter()
	if err := writeTree(ctx, h, dir); err != nil {
		return nil, err
	}
	open := func() (io.ReadCloser, error) {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(writeTree(ctx, pw, dir)) }()
		return pr, nil
	}
	return rootfsSource(h.digest(), open, runtimeConfig{})
}

// rootfsSource is a one-layer image with runtime config rc (empty for an
// imported rootfs, which says nothing about how to run it; set for a
// built base image). Its id is the digest of a minimal OCI config naming
// the layer and rc, as a registry would compute for the same image, so
// the same layer with another config is another image. An empty rc adds
// nothing to the config (every field is omitempty): ids of plain rootfs
// imports are unchanged.
func rootfsSource(diffID string, open func() (io.ReadCloser, error), rc runtimeConfig) (*source, error) {
	h, err := v1.NewHash(diffID)
	if err != nil {
		return nil, err
	}
	cfg := v1.ConfigFile{
		Architecture: runtime.GOARCH, OS: "linux",
		RootFS: v1.RootFS{Type: "layers", DiffIDs: []v1.Hash{h}},
		Config: v1.Config{Env: rc.Env, WorkingDir: rc.WorkingDir, User: rc.User, Entrypoint: rc.Entrypoint, Cmd: rc.Cmd},
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	id := newHashWriter()
	_, _ = id.Write(raw) // a hash never fails to write
	return &source{id: id.digest(), config: rc, layers: []layerSource{{diffID: diffID, open: open}}}, nil
}

// writeTree writes the tree at root as a tar stream: directories, regular
// files (hard links kept), symlinks and devices; sockets are left out.
// Access and change times are dropped so two passes give the same bytes.
func writeTree(ctx context.Context, w io.Writer, root string) error {
	tw := tar.NewWriter(w)
	type inode struct{ dev, ino uint64 }
	links := map[inode]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSocket != 0 {
			return nil
		}
		var target string
		if fi.Mode()&fs.ModeSymlink != 0 {
			if target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, target)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if rel == "." {
			hdr.Name = "./"
		} else if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
		hdr.Format = tar.FormatPAX
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode().IsRegular() && st.Nlink > 1 {
			key := inode{uint64(st.Dev), st.Ino}
			if first, ok := links[key]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			} else {
				links[key] = hdr.Name
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.Open(p) //nolint:gosec // p comes from walking the directory the operator asked to import
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		n, err := io.Copy(tw, f)
		if err == nil && n != hdr.Size {
			err = fmt.Errorf("%s changed size during import", p)
		}
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}
