package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/image/layer"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/testenv"
)

const shiftBase = 200000

// newStore opens an image store in a fresh directory with a fresh database.
// As root, ownership is shifted by shiftBase.
func newStore(t testing.TB) *Store {
	t.Helper()
	dir := t.TempDir()
	db, err := store.Open(filepath.Join(dir, "warren.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	var shift layer.IDMap
	if os.Geteuid() == 0 {
		shift = layer.IDMap{HostBase: shiftBase, Size: 65536}
	}
	s, err := OpenStore(filepath.Join(dir, "images"), db, shift)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// entry is one tar entry of a test layer.
type entry struct {
	name, body string
	dir        bool
}

func tarBytes(t *testing.T, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.body)), Typeflag: tar.TypeReg, ModTime: time.Unix(1700000000, 0)}
		if e.dir {
			hdr.Mode, hdr.Size, hdr.Typeflag = 0o755, 0, tar.TypeDir
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func tarLayer(t *testing.T, entries []entry) v1.Layer {
	t.Helper()
	b := tarBytes(t, entries)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

var testConfig = v1.Config{
	Env:        []string{"PATH=/usr/bin:/bin", "GREETING=hello"},
	WorkingDir: "/work",
	User:       "1000:1000",
	Entrypoint: []string{"/usr/bin/tool"},
	Cmd:        []string{"--serve"},
}

// twoLayerImage: the top layer replaces a file, whites one out and makes a
// directory opaque.
func twoLayerImage(t *testing.T) v1.Image {
	t.Helper()
	base := tarLayer(t, []entry{
		{name: "etc/", dir: true},
		{name: "etc/a.txt", body: "base"},
		{name: "etc/gone.txt", body: "gone"},
		{name: "opq/", dir: true},
		{name: "opq/old.txt", body: "old"},
		{name: "usr/bin/tool", body: "#!/bin/sh\n"},
	})
	top := tarLayer(t, []entry{
		{name: "etc/", dir: true},
		{name: "etc/a.txt", body: "top"},
		{name: "etc/.wh.gone.txt"},
		{name: "opq/", dir: true},
		{name: "opq/.wh..wh..opq"},
		{name: "opq/new.txt", body: "new"},
	})
	img, err := mutate.AppendLayers(empty.Image, base, top)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", runtime.GOARCH, testConfig
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func dockerTar(t *testing.T, img v1.Image) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "image.tar")
	if err := tarball.WriteToFile(p, name.MustParseReference("test/image:latest"), img); err != nil {
		t.Fatal(err)
	}
	return p
}

// ociLayout writes img for this platform plus a random image for another
// architecture, so the platform has to be picked.
func ociLayout(t *testing.T, img v1.Image) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	other, err := random.Image(512, 2)
	if err != nil {
		t.Fatal(err)
	}
	arch := "s390x"
	if runtime.GOARCH == arch {
		arch = "riscv64"
	}
	if err := p.AppendImage(other, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: arch})); err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH})); err != nil {
		t.Fatal(err)
	}
	return dir
}

// tarDir archives a directory (regular files and directories).
func tarDir(t *testing.T, dir string, gz bool) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "archive.tar")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var w io.Writer = f
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(f)
		w = zw
	}
	tw := tar.NewWriter(w)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func assertTmpEmpty(t *testing.T, s *Store) {
	t.Helper()
	ents, err := os.ReadDir(s.tmpDir())
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("temporary directories left: %v", names)
	}
}

func layerDirs(t *testing.T, s *Store) []string {
	t.Helper()
	ents, err := os.ReadDir(s.layersDir())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func assertNoRecords(t *testing.T, s *Store) {
	t.Helper()
	recs, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 0 {
		t.Errorf("records left: %+v", recs)
	}
	for _, table := range []string{"images", "image_layers", "image_names"} {
		var n int
		if err := s.db.QueryRow(`SELECT COUNT(*) FROM ` + table).Scan(&n); err != nil || n != 0 {
			t.Errorf("%s: %d rows, %v", table, n, err)
		}
	}
}

// checkTwoLayer verifies a Get of the two-layer image: layers top first,
// the top layer holding the whiteout and opaque marker, config honoured.
func checkTwoLayer(t *testing.T, s *Store, nm string, want v1.Image) {
	t.Helper()
	img, err := s.Get(nm)
	if err != nil {
		t.Fatal(err)
	}
	if len(img.Layers) != 2 {
		t.Fatalf("layers = %v", img.Layers)
	}
	top, base := img.Layers[0], img.Layers[1]
	diffIDs := func() []string {
		cf, err := want.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		var ds []string
		for _, d := range cf.RootFS.DiffIDs {
			ds = append(ds, d.String())
		}
		return ds
	}()
	if filepath.Base(base) != strings.TrimPrefix(diffIDs[0], "sha256:") || filepath.Base(top) != strings.TrimPrefix(diffIDs[1], "sha256:") {
		t.Errorf("layer dirs %v are not keyed by diff ids %v (top first)", img.Layers, diffIDs)
	}
	if got := readFile(t, filepath.Join(base, "etc/a.txt")); got != "base" {
		t.Errorf("base etc/a.txt = %q", got)
	}
	if got := readFile(t, filepath.Join(base, "opq/old.txt")); got != "old" {
		t.Errorf("base opq/old.txt = %q", got)
	}
	if got := readFile(t, filepath.Join(top, "etc/a.txt")); got != "top" {
		t.Errorf("top etc/a.txt = %q", got)
	}
	if got := readFile(t, filepath.Join(top, "opq/new.txt")); got != "new" {
		t.Errorf("top opq/new.txt = %q", got)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(top, "etc/gone.txt"), &st); err != nil {
		t.Errorf("whiteout missing: %v", err)
	} else if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("whiteout is mode %o rdev %d, want a 0/0 character device", st.Mode, st.Rdev)
	}
	buf := make([]byte, 8)
	if n, err := unix.Lgetxattr(filepath.Join(top, "opq"), "user.overlay.opaque", buf); err != nil || string(buf[:n]) != "y" {
		t.Errorf("opq not opaque: %q, %v", buf[:max(n, 0)], err)
	}
	if err := unix.Lstat(filepath.Join(top, "etc/a.txt"), &st); err != nil || st.Uid != shiftBase {
		t.Errorf("owner of top etc/a.txt = %d, %v; want shifted %d", st.Uid, err, shiftBase)
	}
	if err := unix.Lstat(top, &st); err != nil || st.Uid != shiftBase || st.Mode&0o777 != 0o755 {
		t.Errorf("layer root uid %d mode %o, %v", st.Uid, st.Mode&0o777, err)
	}
	if !slices.Equal(img.Env, testConfig.Env) || img.WorkingDir != testConfig.WorkingDir || img.User != testConfig.User ||
		!slices.Equal(img.Entrypoint, testConfig.Entrypoint) || !slices.Equal(img.Cmd, testConfig.Cmd) {
		t.Errorf("config not honoured: %+v", img)
	}
	rec := mustRecord(t, s, nm)
	id, _ := want.ConfigName()
	if rec.ID != id.String() || !slices.Equal(rec.Layers, diffIDs) || rec.Size <= 0 || time.Since(rec.Created) > time.Hour {
		t.Errorf("record %+v, want id %s layers %v", rec, id, diffIDs)
	}
}

func mustRecord(t *testing.T, s *Store, nm string) Record {
	t.Helper()
	recs, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Name == nm {
			return r
		}
	}
	t.Fatalf("no record %q in %+v", nm, recs)
	return Record{}
}

func TestImportDockerTar(t *testing.T) {
	testenv.RequireRoot(t)
	s := newStore(t)
	img := twoLayerImage(t)
	if _, err := s.Import(context.Background(), dockerTar(t, img), "test/image:latest"); err != nil {
		t.Fatal(err)
	}
	checkTwoLayer(t, s, "test/image:latest", img)
	assertTmpEmpty(t, s)
	overlayCheck(t, s, "test/image:latest")
}

func TestImportOCILayoutDir(t *testing.T) {
	testenv.RequireRoot(t)
	s := newStore(t)
	img := twoLayerImage(t)
	if _, err := s.Import(context.Background(), ociLayout(t, img), "oci"); err != nil {
		t.Fatal(err)
	}
	checkTwoLayer(t, s, "oci", img)
	assertTmpEmpty(t, s)
}

func TestImportOCILayoutTar(t *testing.T) {
	testenv.RequireRoot(t)
	s := newStore(t)
	img := twoLayerImage(t)
	if _, err := s.Import(context.Background(), tarDir(t, ociLayout(t, img), false), "oci-tar"); err != nil {
		t.Fatal(err)
	}
	checkTwoLayer(t, s, "oci-tar", img)
	assertTmpEmpty(t, s)
}

// overlayCheck mounts the image's layers as a read-only overlay and reads
// the merged view.
func overlayCheck(t *testing.T, s *Store, nm string) {
	t.Helper()
	img, err := s.Get(nm)
	if err != nil {
		t.Fatal(err)
	}
	testenv.RequireRoot(t)
	mnt := t.TempDir()
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "userxattr,lowerdir="+strings.Join(img.Layers, ":")); err != nil {
		// Root can always mount overlayfs on this project's machines;
		// a failure is the layers' fault, not a missing capability.
		t.Fatalf("mount the imported layers as an overlay: %v", err)
	}
	defer func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount: %v", err)
		}
	}()
	if got := readFile(t, filepath.Join(mnt, "etc/a.txt")); got != "top" {
		t.Errorf("merged etc/a.txt = %q", got)
	}
	if got := readFile(t, filepath.Join(mnt, "usr/bin/tool")); got != "#!/bin/sh\n" {
		t.Errorf("merged usr/bin/tool = %q", got)
	}
	for _, gone := range []string{"etc/gone.txt", "opq/old.txt"} {
		if _, err := os.Lstat(filepath.Join(mnt, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("merged %s should be hidden: %v", gone, err)
		}
	}
	if got := readFile(t, filepath.Join(mnt, "opq/new.txt")); got != "new" {
		t.Errorf("merged opq/new.txt = %q", got)
	}
}

func TestImportRootfsDirAndTar(t *testing.T) {
	s := newStore(t)
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin/hello"), []byte("hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(root, "bin/hello"), filepath.Join(root, "bin/hello2")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("hello", filepath.Join(root, "bin/link")); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Import(context.Background(), root, "rootfs")
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Layers) != 1 || rec.Size <= 0 {
		t.Fatalf("record %+v", rec)
	}
	img, err := s.Get("rootfs")
	if err != nil {
		t.Fatal(err)
	}
	if len(img.Layers) != 1 {
		t.Fatalf("layers %v", img.Layers)
	}
	l := img.Layers[0]
	if got := readFile(t, filepath.Join(l, "bin/hello2")); got != "hi\n" {
		t.Errorf("bin/hello2 = %q", got)
	}
	var a, b unix.Stat_t
	if err := unix.Lstat(filepath.Join(l, "bin/hello"), &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lstat(filepath.Join(l, "bin/hello2"), &b); err != nil {
		t.Fatal(err)
	}
	if a.Ino != b.Ino || a.Mode&0o777 != 0o755 {
		t.Errorf("hard link lost (ino %d vs %d) or mode %o", a.Ino, b.Ino, a.Mode&0o777)
	}
	if tgt, err := os.Readlink(filepath.Join(l, "bin/link")); err != nil || tgt != "hello" {
		t.Errorf("symlink = %q, %v", tgt, err)
	}
	// Importing the same directory again unpacks nothing.
	n := s.unpacked.Load()
	if _, err := s.Import(context.Background(), root, "rootfs-again"); err != nil {
		t.Fatal(err)
	}
	if s.unpacked.Load() != n {
		t.Errorf("re-import of the same rootfs unpacked again")
	}

	// A gzip rootfs tarball.
	if _, err := s.Import(context.Background(), tarDir(t, root, true), "rootfs-tgz"); err != nil {
		t.Fatal(err)
	}
	img, err = s.Get("rootfs-tgz")
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(img.Layers[0], "bin/hello")); got != "hi\n" {
		t.Errorf("tgz bin/hello = %q", got)
	}
	assertTmpEmpty(t, s)
}

func TestSameImageTwiceUnpacksOnce(t *testing.T) {
	testenv.RequireRoot(t)
	s := newStore(t)
	img := twoLayerImage(t)
	src := dockerTar(t, img)
	if _, err := s.Import(context.Background(), src, "a"); err != nil {
		t.Fatal(err)
	}
	if got := s.unpacked.Load(); got != 2 {
		t.Fatalf("first import unpacked %d layers, want 2", got)
	}
	// Same layers through another format and another name.
	if _, err := s.Import(context.Background(), ociLayout(t, img), "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(context.Background(), src, "a"); err != nil {
		t.Fatal(err)
	}
	if got := s.unpacked.Load(); got != 2 {
		t.Errorf("re-imports unpacked %d layers in total, want still 2", got)
	}
	ra, rb := mustRecord(t, s, "a"), mustRecord(t, s, "b")
	if ra.ID != rb.ID {
		t.Errorf("same image, different ids: %s %s", ra.ID, rb.ID)
	}
	if len(layerDirs(t, s)) != 2 {
		t.Errorf("layer dirs %v", layerDirs(t, s))
	}
}

func TestRemoveThenPrune(t *testing.T) {
	testenv.RequireRoot(t)
	s := newStore(t)
	img := twoLayerImage(t)
	src := dockerTar(t, img)
	for _, n := range []string{"a", "b"} {
		if _, err := s.Import(context.Background(), src, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Remove("a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Remove: %v, want ErrNotFound", err)
	}
	if _, err := s.Get("a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get removed name: %v", err)
	}
	// "b" still names the image: nothing to prune.
	if freed, err := s.Prune(); err != nil || freed != 0 {
		t.Fatalf("Prune with the image still named: %d, %v", freed, err)
	}
	checkTwoLayer(t, s, "b", img)
	if err := s.Remove("b"); err != nil {
		t.Fatal(err)
	}
	assertNoRecords(t, s)
	if len(layerDirs(t, s)) != 2 {
		t.Fatalf("Remove deleted layer dirs before Prune: %v", layerDirs(t, s))
	}
	freed, err := s.Prune()
	if err != nil {
		t.Fatal(err)
	}
	if freed <= 0 {
		t.Errorf("Prune freed %d bytes", freed)
	}
	if d := layerDirs(t, s); len(d) != 0 {
		t.Errorf("layer dirs left after Prune: %v", d)
	}
	var n int
	if err := s.db.QueryRow(`SELECT COUNT(*) FROM layers`).Scan(&n); err != nil || n != 0 {
		t.Errorf("layer rows left: %d, %v", n, err)
	}
	if freed, err := s.Prune(); err != nil || freed != 0 {
		t.Errorf("second Prune: %d, %v", freed, err)
	}
	assertTmpEmpty(t, s)
}

func TestRenameReplacesImage(t *testing.T) {
	testenv.RequireRoot(t)
	s := newStore(t)
	if _, err := s.Import(context.Background(), dockerTar(t, twoLayerImage(t)), "x"); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "f"), []byte("f"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(context.Background(), root, "x"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := s.db.QueryRow(`SELECT COUNT(*) FROM images`).Scan(&n); err != nil || n != 1 {
		t.Errorf("images = %d, %v: the unnamed old image should be gone", n, err)
	}
	if freed, err := s.Prune(); err != nil || freed <= 0 || len(layerDirs(t, s)) != 1 {
		t.Errorf("Prune: %d, %v, dirs %v", freed, err, layerDirs(t, s))
	}
	if img, err := s.Get("x"); err != nil || readFile(t, filepath.Join(img.Layers[0], "f")) != "f" {
		t.Errorf("Get after replace: %v", err)
	}
}

// corruptDockerTar writes a docker-save tarball by hand whose second
// layer's content does not match its diff id.
func corruptDockerTar(t *testing.T) string {
	t.Helper()
	good := tarBytes(t, []entry{{name: "ok.txt", body: "ok"}})
	bad := tarBytes(t, []entry{{name: "bad.txt", body: "tampered"}})
	sum := sha256.Sum256(good)
	goodID := "sha256:" + hex.EncodeToString(sum[:])
	wrong := sha256.Sum256([]byte("something else"))
	cfg, _ := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH, "os": "linux",
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{goodID, "sha256:" + hex.EncodeToString(wrong[:])}},
		"config": map[string]any{},
	})
	manifest, _ := json.Marshal([]map[string]any{{"Config": "config.json", "RepoTags": []string{"bad:latest"}, "Layers": []string{"l1.tar", "l2.tar"}}})
	p := filepath.Join(t.TempDir(), "corrupt.tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	tw := tar.NewWriter(f)
	for _, e := range []struct {
		name string
		body []byte
	}{{"config.json", cfg}, {"l1.tar", good}, {"l2.tar", bad}, {"manifest.json", manifest}} {
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.body))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCorruptLayerRecordsNothing(t *testing.T) {
	s := newStore(t)
	_, err := s.Import(context.Background(), corruptDockerTar(t), "bad")
	if !errors.Is(err, ErrDigest) {
		t.Fatalf("import of a corrupt layer: %v, want ErrDigest", err)
	}
	assertNoRecords(t, s)
	assertTmpEmpty(t, s)
	// The good first layer is complete but unreferenced: Prune's job.
	if d := layerDirs(t, s); len(d) != 1 {
		t.Fatalf("layer dirs %v, want the one verified layer", d)
	}
	if freed, err := s.Prune(); err != nil || freed <= 0 || len(layerDirs(t, s)) != 0 {
		t.Errorf("Prune: %d, %v, left %v", freed, err, layerDirs(t, s))
	}
}

func TestCancelMidImport(t *testing.T) {
	testenv.RequireRoot(t)
	s := newStore(t)
	img := twoLayerImage(t)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Cancel as the second layer starts unpacking: its temporary
	// directory exists and the unpack's first read fails.
	s.beforeUnpack = func(d string) {
		if d == cf.RootFS.DiffIDs[1].String() {
			cancel()
		}
	}
	_, err = s.Import(ctx, dockerTar(t, img), "cancelled")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled import: %v", err)
	}
	assertNoRecords(t, s)
	assertTmpEmpty(t, s)
	if d := layerDirs(t, s); len(d) != 1 || d[0] != cf.RootFS.DiffIDs[0].Hex {
		t.Errorf("layer dirs %v, want only the complete first layer", d)
	}
	// A later import reuses the complete layer and unpacks only the other.
	s.beforeUnpack = nil
	n := s.unpacked.Load()
	if _, err := s.Import(context.Background(), dockerTar(t, img), "again"); err != nil {
		t.Fatal(err)
	}
	if got := s.unpacked.Load() - n; got != 1 {
		t.Errorf("retry unpacked %d layers, want 1", got)
	}
}

func TestCancelBeforeAnyLayer(t *testing.T) {
	s := newStore(t)
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "f"), []byte("f"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Import(ctx, root, "x"); !errors.Is(err, context.Canceled) {
		t.Fatalf("import with a cancelled context: %v", err)
	}
	assertNoRecords(t, s)
	assertTmpEmpty(t, s)
	if d := layerDirs(t, s); len(d) != 0 {
		t.Errorf("layer dirs %v", d)
	}
}

func TestLimits(t *testing.T) {
	testenv.RequireRoot(t)
	img := twoLayerImage(t)
	src := dockerTar(t, img)

	s := newStore(t)
	s.maxLayers = 1
	if _, err := s.Import(context.Background(), src, "x"); !errors.Is(err, ErrLimit) {
		t.Errorf("2 layers with maxLayers 1: %v", err)
	}
	s = newStore(t)
	s.maxTotalBytes = 3000 // the first layer's tar fits, not both
	if _, err := s.Import(context.Background(), src, "x"); !errors.Is(err, ErrLimit) && !errors.Is(err, layer.ErrLimit) {
		t.Errorf("over the byte budget: %v", err)
	}
	assertNoRecords(t, s)
	assertTmpEmpty(t, s)
	s = newStore(t)
	s.maxConfigBytes = 10
	if _, err := s.Import(context.Background(), src, "x"); !errors.Is(err, ErrLimit) {
		t.Errorf("config over the limit: %v", err)
	}
	if _, err := s.Import(context.Background(), ociLayout(t, img), "x"); !errors.Is(err, ErrLimit) {
		t.Errorf("layout config over the limit: %v", err)
	}
}

func TestNames(t *testing.T) {
	for _, n := range []string{"python", "ghcr.io/org/img:1.2", "a_b-c.d"} {
		if err := ValidateName(n); err != nil {
			t.Errorf("%q: %v", n, err)
		}
	}
	for _, n := range []string{"", "Upper", "-x", "/abs", "a b", "host", "a/../b", strings.Repeat("a", 256), "x\x00"} {
		if err := ValidateName(n); !errors.Is(err, ErrInvalidName) {
			t.Errorf("%q accepted: %v", n, err)
		}
	}
	s := newStore(t)
	if _, err := s.Import(context.Background(), t.TempDir(), "Bad Name"); !errors.Is(err, ErrInvalidName) {
		t.Errorf("Import with a bad name: %v", err)
	}
	if _, err := s.Get("nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get unknown: %v", err)
	}
}

func TestOpenStoreCleansTmp(t *testing.T) {
	dir := t.TempDir()
	db, err := store.Open(filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	s, err := OpenStore(filepath.Join(dir, "images"), db, layer.IDMap{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(s.tmpDir(), "layer-123", "half"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Another live process's scratch directory (a `warren image import`
	// beside the server) is its own; a dead one's is left over.
	tmp := filepath.Dir(s.tmpDir())
	live := filepath.Join(tmp, strconv.Itoa(os.Getppid()), "layer-1")
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	dead := filepath.Join(tmp, strconv.Itoa(cmd.Process.Pid), "layer-2")
	for _, d := range []string{live, dead} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s, err = OpenStore(filepath.Join(dir, "images"), db, layer.IDMap{})
	if err != nil {
		t.Fatal(err)
	}
	assertTmpEmpty(t, s)
	if _, err := os.Stat(live); err != nil {
		t.Errorf("opening the store deleted a live process's unpacking: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(dead)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a dead process's unpacking was kept: %v", err)
	}
}

// TestConcurrentImportsAndPrune: imports of the same image race each other
// (same layers renamed into place) and a Prune loop; every committed image
// keeps its layers.
func TestConcurrentImportsAndPrune(t *testing.T) {
	testenv.RequireRoot(t)
	s := newStore(t)
	src := dockerTar(t, twoLayerImage(t))
	const n = 4
	errs := make(chan error, n)
	done := make(chan struct{})
	pruned := make(chan error, 1)
	go func() {
		for {
			select {
			case <-done:
				pruned <- nil
				return
			default:
			}
			if _, err := s.Prune(); err != nil {
				pruned <- err
				return
			}
		}
	}()
	for i := range n {
		go func() {
			_, err := s.Import(context.Background(), src, "img-"+string(rune('a'+i)))
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	close(done)
	if err := <-pruned; err != nil {
		t.Fatal(err)
	}
	for i := range n {
		img, err := s.Get("img-" + string(rune('a'+i)))
		if err != nil {
			t.Fatal(err)
		}
		if got := readFile(t, filepath.Join(img.Layers[0], "etc/a.txt")); got != "top" {
			t.Errorf("etc/a.txt = %q", got)
		}
	}
	assertTmpEmpty(t, s)
}

func TestCompressedImageArchiveRefused(t *testing.T) {
	testenv.RequireRoot(t)
	s := newStore(t)
	dir := t.TempDir()
	raw, err := os.ReadFile(dockerTar(t, twoLayerImage(t)))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(raw); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "image.tar.gz")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(context.Background(), p, "x"); !errors.Is(err, ErrFormat) {
		t.Errorf("gzip docker archive: %v, want ErrFormat", err)
	}
	empty := filepath.Join(dir, "empty.tar")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(context.Background(), empty, "x"); !errors.Is(err, ErrFormat) {
		t.Errorf("empty archive: %v, want ErrFormat", err)
	}
	assertNoRecords(t, s)
}

// useImage records a sandbox started from image id, as the server's
// sandbox manager does, and returns a function that removes it.
func useImage(t *testing.T, s *Store, ns, name, id string) func() {
	t.Helper()
	sbID := "sb-" + ns + "-" + name
	if _, err := s.db.Exec(`INSERT INTO sandboxes (id, namespace, name, state, spec, image_id, created) VALUES (?, ?, ?, 'running', X'7B7D', ?, 0)`,
		sbID, ns, name, id); err != nil {
		t.Fatal(err)
	}
	return func() {
		if _, err := s.db.Exec(`DELETE FROM sandboxes WHERE id = ?`, sbID); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSandboxPinsImage(t *testing.T) {
	testenv.RequireRoot(t)
	s := newStore(t)
	ctx := context.Background()
	img := twoLayerImage(t)
	rec, err := s.Import(ctx, dockerTar(t, img), "x")
	if err != nil {
		t.Fatal(err)
	}
	release := useImage(t, s, "team", "box", rec.ID)

	err = s.Remove("x")
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "team/box") {
		t.Fatalf("Remove of an image a sandbox uses: %v, want ErrInUse naming team/box", err)
	}
	checkTwoLayer(t, s, "x", img)

	// With a second name, removing one name is fine; the last is refused.
	if _, err := s.Import(ctx, dockerTar(t, img), "y"); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("x"); err != nil {
		t.Fatalf("Remove of one of two names: %v", err)
	}
	d, err := s.Inspect("y")
	if err != nil {
		t.Fatal(err)
	}
	if d.ID != rec.ID || !slices.Equal(d.Names, []string{"y"}) || !slices.Equal(d.UsedBy, []string{"team/box"}) ||
		len(d.LayerSizes) != 2 || d.LayerSizes[0]+d.LayerSizes[1] != d.Size || d.Size <= 0 {
		t.Errorf("Inspect = %+v", d)
	}

	// Re-pointing the name leaves the sandbox's image, by id, and its layers.
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "new"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(ctx, root, "y"); err != nil {
		t.Fatal(err)
	}
	if freed, err := s.Prune(); err != nil || freed != 0 {
		t.Fatalf("Prune with the old image in use: freed %d, %v", freed, err)
	}
	byID, err := s.Get(rec.ID)
	if err != nil {
		t.Fatalf("Get by id of an unnamed image a sandbox uses: %v", err)
	}
	if byID.ID != rec.ID || len(byID.Layers) != 2 || readFile(t, filepath.Join(byID.Layers[1], "etc", "a.txt")) != "base" {
		t.Errorf("Get by id = %+v", byID)
	}
	if d, err := s.Inspect(rec.ID); err != nil || len(d.Names) != 0 || len(d.UsedBy) != 1 {
		t.Errorf("Inspect by id: %+v, %v", d, err)
	}

	// Once the sandbox is gone, Prune collects the image and its layers.
	release()
	freed, err := s.Prune()
	if err != nil || freed <= 0 {
		t.Fatalf("Prune after the sandbox went: freed %d, %v", freed, err)
	}
	if _, err := s.Get(rec.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get by id after prune: %v, want ErrNotFound", err)
	}
	if n := len(layerDirs(t, s)); n != 1 {
		t.Errorf("layer dirs after prune: %d, want the new image's 1", n)
	}
	if err := ValidateName(rec.ID); !errors.Is(err, ErrInvalidName) {
		t.Errorf("an image id as a name: %v", err)
	}
}

// TestHoldPinsImage: a warren run's hold keeps an image from rm and its
// layers from prune, also after a re-import moved its name; a dead
// holder's file pins nothing.
func TestHoldPinsImage(t *testing.T) {
	testenv.RequireRoot(t)
	s := newStore(t)
	ctx := context.Background()
	rec, err := s.Import(ctx, dockerTar(t, twoLayerImage(t)), "x")
	if err != nil {
		t.Fatal(err)
	}
	img, err := s.Get("x")
	if err != nil {
		t.Fatal(err)
	}
	release, err := s.Hold(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("x"); !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "warren run") {
		t.Fatalf("Remove of a held image: %v", err)
	}
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "f"), []byte("f"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(ctx, root, "x"); err != nil {
		t.Fatal(err)
	}
	if freed, err := s.Prune(); err != nil || freed != 0 {
		t.Fatalf("Prune with the old image held: freed %d, %v", freed, err)
	}
	for _, l := range img.Layers {
		if _, err := os.Stat(l); err != nil {
			t.Errorf("held layer pruned: %v", err)
		}
	}
	// A hold whose holder is gone: its file is not locked.
	dead := filepath.Join(s.holdsDir(), strings.TrimPrefix(rec.ID, "sha256:")+"-dead")
	if err := os.WriteFile(dead, []byte(strings.Join(rec.Layers, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	release()
	freed, err := s.Prune()
	if err != nil || freed <= 0 {
		t.Fatalf("Prune after release: freed %d, %v", freed, err)
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("dead holder's file left: %v", err)
	}
	if n := len(layerDirs(t, s)); n != 1 {
		t.Errorf("layer dirs after prune: %d, want the new image's 1", n)
	}
}

// TestImportNameAndShortID: an import without a name takes a docker-save
// tarball's first RepoTag, and is refused for a source that gives none;
// ResolveID finds an image by the short id 'warren image ls' prints, with
// or without "sha256:", and refuses what is not a hex prefix.
func TestImportNameAndShortID(t *testing.T) {
	s := newStore(t)
	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := s.Import(context.Background(), dockerTar(t, img), "")
	if err != nil || rec.Name != "test/image:latest" {
		t.Fatalf("import without a name: %+v %v", rec, err)
	}
	if _, err := s.Import(context.Background(), t.TempDir(), ""); !errors.Is(err, ErrInvalidName) || !strings.Contains(err.Error(), "no RepoTags") {
		t.Errorf("import of a root file system without a name: %v", err)
	}
	for _, p := range []string{rec.ID[:19], rec.ID[7:19], rec.ID, rec.ID[:11]} {
		if id, err := s.ResolveID(p); err != nil || id != rec.ID {
			t.Errorf("ResolveID(%q) = %q, %v; want %q", p, id, err, rec.ID)
		}
	}
	for _, p := range []string{"sha256:", "abc", "sha256:xyz123", "test/image:latest", rec.ID + "0"} {
		if _, err := s.ResolveID(p); !errors.Is(err, ErrInvalidName) {
			t.Errorf("ResolveID(%q): %v, want ErrInvalidName", p, err)
		}
	}
	other := "0000"
	if strings.HasPrefix(rec.ID[7:], other) {
		other = "1111"
	}
	if _, err := s.ResolveID(other); !errors.Is(err, ErrNotFound) {
		t.Errorf("ResolveID(%q) of no image: %v, want ErrNotFound", other, err)
	}
}
