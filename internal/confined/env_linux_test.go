package confined

import (
	"archive/tar"
	"bytes"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// env is a Root inside a directory tree with things beside it that must
// never change:
//
//	base/canary              file
//	base/outside/secret      file
//	base/outside/sub/        dir
//	base/l1/l2/l3/root/      the Root (so "../../../.." from it is base)
//	base/l1/l2/l3/root/sub/  an empty directory
//
// and the hostileLinks planted in the root.
type env struct {
	t       testing.TB
	base    string
	root    string
	outside string
	canary  string
	r       *Root
	before  map[string]string
	// marker starts the name of everything written through symlinks that
	// lead to "/" if followed outside the root; an escape would leave
	// /<marker>*.
	marker string
}

// hostileLinks are planted in the root; values with %s take base.
var hostileLinks = map[string]string{
	"abs":        "/",
	"up":         "../../../..",
	"deep":       strings.Repeat("../", 40),
	"out":        "%s/outside",
	"outrel":     "../../../../outside",
	"canarylink": "%s/canary",
	"canaryrel":  "../../../../canary",
}

func newEnv(t testing.TB) *env {
	t.Helper()
	base := t.TempDir()
	e := &env{
		t:       t,
		base:    base,
		root:    filepath.Join(base, "l1", "l2", "l3", "root"),
		outside: filepath.Join(base, "outside"),
		canary:  filepath.Join(base, "canary"),
		marker:  markerName(),
	}
	must(t, os.MkdirAll(filepath.Join(e.root, "sub"), 0o755))
	must(t, os.MkdirAll(filepath.Join(e.outside, "sub"), 0o755))
	must(t, os.WriteFile(e.canary, []byte("canary\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(e.outside, "secret"), []byte("secret\n"), 0o600))
	e.plant(".")
	e.before = snapshot(t, base, e.root)
	r, err := Open(e.root)
	must(t, err)
	e.r = r
	t.Cleanup(func() {
		_ = r.Close()
		e.check()
	})
	return e
}

func markerName() string { return fmt.Sprintf("warren-fs-escape-%d", os.Getpid()) }

// plant creates the hostile symlinks in directory rel of the root.
func (e *env) plant(rel string) {
	for name, target := range hostileLinks {
		if strings.Contains(target, "%s") {
			target = fmt.Sprintf(target, e.base)
		}
		must(e.t, os.Symlink(target, e.path(filepath.Join(rel, name))))
	}
}

// path is the host path of rel in the root.
func (e *env) path(rel string) string { return filepath.Join(e.root, rel) }

// check fails the test if anything outside the root changed.
func (e *env) check() {
	e.t.Helper()
	after := snapshot(e.t, e.base, e.root)
	for p, d := range e.before {
		if after[p] != d {
			e.t.Errorf("outside the root: %s changed: %q -> %q", p, d, after[p])
		}
	}
	for p, d := range after {
		if _, ok := e.before[p]; !ok {
			e.t.Errorf("outside the root: %s appeared: %q", p, d)
		}
	}
	// Everything written through links to "/" is named after the marker,
	// so a confinement bug shows (and is cleaned up) here instead of
	// clobbering the host.
	escaped, _ := filepath.Glob("/" + e.marker + "*")
	for _, p := range escaped {
		e.t.Errorf("%s exists: a write escaped to the host's /", p)
		_ = os.RemoveAll(p)
	}
}

func (e *env) read(rel string) string {
	e.t.Helper()
	b, err := os.ReadFile(e.path(rel))
	if err != nil {
		e.t.Fatalf("read %s: %v", rel, err)
	}
	return string(b)
}

func (e *env) exists(rel string) bool {
	_, err := os.Lstat(e.path(rel))
	return err == nil
}

// snapshot describes every entry below dir except the subtree skip.
func snapshot(t testing.TB, dir, skip string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d iofs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == skip {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		m[rel] = describe(t, p, false)
		return nil
	})
	must(t, err)
	return m
}

// describe renders type, permission bits, content or target (and mtime to
// the second when withTime) of p.
func describe(t testing.TB, p string, withTime bool) string {
	t.Helper()
	fi, err := os.Lstat(p)
	must(t, err)
	d := fmt.Sprintf("%v", fi.Mode())
	switch {
	case fi.Mode().IsRegular():
		b, err := os.ReadFile(p)
		must(t, err)
		d += fmt.Sprintf(" %d %x", len(b), b[:min(len(b), 64)])
		if len(b) > 64 {
			d += fmt.Sprintf(" ...%x", b[len(b)-64:])
		}
	case fi.Mode()&os.ModeSymlink != 0:
		target, err := os.Readlink(p)
		must(t, err)
		d += " -> " + target
		withTime = false
	}
	if withTime {
		d += fmt.Sprintf(" t=%d", fi.ModTime().Unix())
	}
	return d
}

// tree describes everything below dir, with mtimes.
func tree(t testing.TB, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	must(t, filepath.WalkDir(dir, func(p string, d iofs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel != "." {
			m[rel] = describe(t, p, true)
		}
		return nil
	}))
	return m
}

// tempLeft lists leftover temporary files below dir.
func tempLeft(t testing.TB, dir string) []string {
	var left []string
	must(t, filepath.WalkDir(dir, func(p string, d iofs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), ".warren-") {
			left = append(left, p)
		}
		return nil
	}))
	return left
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// ent is one entry of a test archive.
type ent struct {
	name string
	typ  byte // default tar.TypeReg
	body string
	link string
	mode int64 // default 0644
	// size, when set, is written into the header instead of len(body)
	// and the archive ends right after that header.
	size int64
}

func file(name, body string) ent   { return ent{name: name, body: body} }
func dir(name string) ent          { return ent{name: name, typ: tar.TypeDir, mode: 0o755} }
func symlink(name, to string) ent  { return ent{name: name, typ: tar.TypeSymlink, link: to} }
func hardlink(name, to string) ent { return ent{name: name, typ: tar.TypeLink, link: to} }

func mkTar(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if e.size != 0 {
			h.Size = e.size
			must(t, tw.WriteHeader(h)) // written through at once
			return buf.Bytes()
		}
		must(t, tw.WriteHeader(h))
		if e.body != "" {
			_, err := tw.Write([]byte(e.body))
			must(t, err)
		}
	}
	must(t, tw.Close())
	return buf.Bytes()
}
