package layer

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/testenv"
)

type ent struct {
	h    tar.Header
	body string
}

var t0 = time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)

func reg(name, body string, mode int64) ent {
	return ent{h: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body)), ModTime: t0}, body: body}
}

func dirE(name string, mode int64) ent {
	return ent{h: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, ModTime: t0}}
}

func sym(name, target string) ent {
	return ent{h: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: t0}}
}

func hard(name, target string) ent {
	return ent{h: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, ModTime: t0}}
}

func dev(name string, typ byte, major, minor int64) ent {
	return ent{h: tar.Header{Typeflag: typ, Name: name, Mode: 0o620, Devmajor: major, Devminor: minor, ModTime: t0}}
}

func tarOf(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range ents {
		h := e.h
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("write header %q: %v", h.Name, err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatalf("write body %q: %v", h.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// sandbox makes parent/{layer,canary/f} and returns the layer dir and a
// check that nothing outside it changed.
func sandbox(t testing.TB) (dir string, check func()) {
	t.Helper()
	parent := t.TempDir()
	dir = filepath.Join(parent, "layer")
	canary := filepath.Join(parent, "canary")
	for _, d := range []string{dir, canary} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(canary, "f"), []byte("canary"), 0o644); err != nil {
		t.Fatal(err)
	}
	var before unix.Stat_t
	if err := unix.Lstat(canary, &before); err != nil {
		t.Fatal(err)
	}
	return dir, func() {
		t.Helper()
		names := readNames(t, parent)
		if !slices.Equal(names, []string{"canary", "layer"}) {
			t.Errorf("parent holds %v, want [canary layer]", names)
		}
		if names := readNames(t, canary); !slices.Equal(names, []string{"f"}) {
			t.Errorf("canary dir holds %v", names)
		}
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(canary, "f"), &st); err != nil || st.Mode != unix.S_IFREG|0o644 || st.Uid != 0 || st.Size != 6 {
			t.Errorf("canary file changed: %+v %v", st, err)
		}
		if b, _ := os.ReadFile(filepath.Join(canary, "f")); string(b) != "canary" {
			t.Errorf("canary content %q", b)
		}
		var after unix.Stat_t
		if err := unix.Lstat(canary, &after); err != nil || after.Mtim != before.Mtim || after.Mode != before.Mode {
			t.Errorf("canary dir changed")
		}
	}
}

func readNames(t testing.TB, d string) []string {
	t.Helper()
	es, err := os.ReadDir(d)
	if err != nil {
		t.Fatal(err)
	}
	var n []string
	for _, e := range es {
		n = append(n, e.Name())
	}
	return n
}

func lstat(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatalf("lstat %s: %v", p, err)
	}
	return st
}

func getxattr(p, name string) (string, error) {
	b := make([]byte, 1024)
	n, err := unix.Lgetxattr(p, name, b)
	if err != nil {
		return "", err
	}
	return string(b[:n]), nil
}

func unpack(t *testing.T, opt Options, ents ...ent) (string, Stats) {
	t.Helper()
	dir, check := sandbox(t)
	st, err := Unpack(bytes.NewReader(tarOf(t, ents...)), dir, opt)
	if err != nil {
		t.Fatalf("Unpack: %v", err)
	}
	check()
	return dir, st
}

func capV2(effective bool) string {
	b := make([]byte, 20)
	magic := uint32(capRev2)
	if effective {
		magic |= 1
	}
	binary.LittleEndian.PutUint32(b, magic)
	binary.LittleEndian.PutUint32(b[4:], 1<<10) // CAP_NET_BIND_SERVICE permitted
	return string(b)
}

func TestUnpackTree(t *testing.T) {
	testenv.RequireRoot(t)
	shift := IDMap{HostBase: 100000, Size: 65536}
	dirMtime := time.Date(2019, 5, 6, 7, 8, 9, 123456789, time.UTC)
	su := reg("/bin/su", "su-binary", 0o4755)
	u := dirE("./home/u/", 0o700)
	u.h.Uid, u.h.Gid, u.h.ModTime = 1000, 1001, dirMtime
	u.h.Format = tar.FormatPAX // nanosecond mtime
	f := reg("home/u/f", "hello", 0o2640)
	f.h.Uid, f.h.Gid = 1000, 1001
	f.h.PAXRecords = map[string]string{
		"SCHILY.xattr.user.foo":                "bar",
		"SCHILY.xattr.trusted.overlay.opaque":  "y",
		"SCHILY.xattr.user.overlay.opaque":     "y",
		"SCHILY.xattr.security.selinux":        "system_u:object_r:shadow_t:s0",
		"SCHILY.xattr.system.posix_acl_access": "\x02\x00\x00\x00",
	}
	ping := reg("bin/ping", "ping", 0o755)
	ping.h.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": capV2(true)}
	lib := sym("lib", "usr/lib")
	lib.h.Uid, lib.h.Gid = 5, 6
	sticky := dirE("tmp", 0o1777)
	shared := dirE("shared", 0o2775) // setgid on a directory is kept
	dir, st := unpack(t, Options{IDShift: shift},
		dirE("./", 0o755), dirE("bin", 0o755), su, u, f, ping, lib, hard("bin/su2", "./bin/su"), sticky, shared,
		sym("abs", "/etc/passwd"), reg("deep/er/file", "x", 0o600))

	want := Stats{Files: 4, Dirs: 5 + 3, Symlinks: 2, Hardlinks: 1, Bytes: int64(len("su-binary") + len("hello") + len("ping") + 1)}
	if st != want {
		t.Errorf("stats %+v, want %+v", st, want)
	}
	for _, c := range []struct {
		path      string
		mode      uint32
		uid, gid  uint32
		mtime     time.Time
		nlink     uint64
		checkTime bool
	}{
		{".", unix.S_IFDIR | 0o755, 100000, 100000, t0, 0, true},
		// setuid and setgid are stripped (issue #18, finding 2).
		{"bin/su", unix.S_IFREG | 0o755, 100000, 100000, t0, 2, true},
		{"bin/su2", unix.S_IFREG | 0o755, 100000, 100000, t0, 2, true},
		{"home/u", unix.S_IFDIR | 0o700, 101000, 101001, dirMtime, 0, true},
		{"home/u/f", unix.S_IFREG | 0o640, 101000, 101001, t0, 1, true},
		{"home", unix.S_IFDIR | 0o755, 100000, 100000, time.Time{}, 0, false}, // implicit
		{"lib", unix.S_IFLNK | 0o777, 100005, 100006, t0, 0, true},
		{"tmp", unix.S_IFDIR | 0o1777, 100000, 100000, t0, 0, true},
		{"shared", unix.S_IFDIR | 0o2775, 100000, 100000, t0, 0, true},
		{"deep/er/file", unix.S_IFREG | 0o600, 100000, 100000, t0, 1, true},
	} {
		s := lstat(t, filepath.Join(dir, c.path))
		if s.Mode != c.mode || s.Uid != c.uid || s.Gid != c.gid {
			t.Errorf("%s: mode %o uid %d gid %d, want %o %d %d", c.path, s.Mode, s.Uid, s.Gid, c.mode, c.uid, c.gid)
		}
		if c.nlink != 0 && s.Nlink != c.nlink {
			t.Errorf("%s: nlink %d, want %d", c.path, s.Nlink, c.nlink)
		}
		if got := time.Unix(s.Mtim.Unix()); c.checkTime && !got.Equal(c.mtime) {
			t.Errorf("%s: mtime %v, want %v", c.path, got, c.mtime)
		}
	}
	if tgt, _ := os.Readlink(filepath.Join(dir, "abs")); tgt != "/etc/passwd" {
		t.Errorf("abs -> %q", tgt)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "home/u/f")); string(b) != "hello" {
		t.Errorf("content %q", b)
	}
	fp := filepath.Join(dir, "home/u/f")
	if v, err := getxattr(fp, "user.foo"); err != nil || v != "bar" {
		t.Errorf("user.foo = %q, %v", v, err)
	}
	for _, x := range []string{"trusted.overlay.opaque", "user.overlay.opaque", "security.selinux", "system.posix_acl_access"} {
		if v, err := getxattr(fp, x); !errors.Is(err, unix.ENODATA) {
			t.Errorf("%s should be dropped: %q, %v", x, v, err)
		}
	}
	// The v2 capability becomes v3 for the shifted root.
	v, err := getxattr(filepath.Join(dir, "bin/ping"), "security.capability")
	if err != nil || len(v) != 24 {
		t.Fatalf("security.capability %x, %v", v, err)
	}
	b := []byte(v)
	if m := binary.LittleEndian.Uint32(b); m != capRev3|1 || binary.LittleEndian.Uint32(b[4:]) != 1<<10 || binary.LittleEndian.Uint32(b[20:]) != 100000 {
		t.Errorf("security.capability %x", b)
	}
}

func TestUnpackNoShift(t *testing.T) {
	testenv.RequireRoot(t)
	f := reg("f", "x", 0o644)
	f.h.Uid, f.h.Gid = 1234, 4321
	ping := reg("ping", "p", 0o755)
	ping.h.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": capV2(false)}
	dir, _ := unpack(t, Options{}, f, ping)
	if s := lstat(t, filepath.Join(dir, "f")); s.Uid != 1234 || s.Gid != 4321 {
		t.Errorf("owner %d:%d", s.Uid, s.Gid)
	}
	if v, err := getxattr(filepath.Join(dir, "ping"), "security.capability"); err != nil || v != capV2(false) {
		t.Errorf("capability %x, %v", v, err)
	}
}

func TestWhiteouts(t *testing.T) {
	testenv.RequireRoot(t)
	for _, userx := range []bool{false, true} {
		want, other := "trusted.overlay.opaque", "user.overlay.opaque"
		if userx {
			want, other = other, want
		}
		t.Run(want, func(t *testing.T) {
			dir, st := unpack(t, Options{UserXattr: userx, IDShift: IDMap{HostBase: 1000, Size: 10}},
				reg("a/.wh.b", "", 0o644),
				reg("d/.wh..wh..opq", "", 0o644),
				reg(".wh.top", "", 0),
				// Same-layer entries are not hidden by a whiteout.
				reg("c/f", "keep", 0o644), reg("c/.wh.f", "", 0o644),
				dirE("e/g", 0o755), reg("e/.wh.g", "", 0o644),
				// A directory replacing this layer's whiteout is opaque.
				reg("h/.wh.i", "", 0o644), dirE("h/i", 0o755),
				// A file replaces a whiteout.
				reg("j/.wh.k", "", 0), reg("j/k", "k", 0o644),
			)
			if st.Whiteouts != 6 || st.Opaque != 1 {
				t.Errorf("stats %+v", st)
			}
			for _, p := range []string{"a/b", "top"} {
				s := lstat(t, filepath.Join(dir, p))
				if s.Mode&unix.S_IFMT != unix.S_IFCHR || s.Rdev != 0 {
					t.Errorf("%s: mode %o rdev %d, want char 0/0", p, s.Mode, s.Rdev)
				}
			}
			if s := lstat(t, filepath.Join(dir, "c/f")); s.Mode&unix.S_IFMT != unix.S_IFREG {
				t.Errorf("c/f was whited out by its own layer")
			}
			if s := lstat(t, filepath.Join(dir, "j/k")); s.Mode&unix.S_IFMT != unix.S_IFREG {
				t.Errorf("j/k not a file")
			}
			for _, p := range []string{"d", "e/g", "h/i"} {
				if v, err := getxattr(filepath.Join(dir, p), want); err != nil || v != "y" {
					t.Errorf("%s: %s = %q, %v", p, want, v, err)
				}
				if _, err := getxattr(filepath.Join(dir, p), other); !errors.Is(err, unix.ENODATA) {
					t.Errorf("%s: %s set: %v", p, other, err)
				}
			}
			if _, err := getxattr(filepath.Join(dir, "a"), want); !errors.Is(err, unix.ENODATA) {
				t.Errorf("a wrongly opaque: %v", err)
			}
		})
	}
}

func TestDevices(t *testing.T) {
	testenv.RequireRoot(t)
	ents := []ent{dev("null", tar.TypeChar, 1, 3), dev("loop0", tar.TypeBlock, 7, 0), dev("fifo", tar.TypeFifo, 0, 0), dev("wh", tar.TypeChar, 0, 0)}
	dir, st := unpack(t, Options{}, ents...)
	if st.Skipped != 4 || len(readNames(t, dir)) != 0 {
		t.Errorf("skip: stats %+v, dir %v", st, readNames(t, dir))
	}
	dir, st = unpack(t, Options{Devices: CreateDevices, IDShift: IDMap{HostBase: 50, Size: 1}}, ents...)
	if st.Skipped != 1 || st.Files != 3 {
		t.Errorf("create: stats %+v", st)
	}
	for _, c := range []struct {
		p    string
		mode uint32
		rdev uint64
	}{{"null", unix.S_IFCHR | 0o620, unix.Mkdev(1, 3)}, {"loop0", unix.S_IFBLK | 0o620, unix.Mkdev(7, 0)}, {"fifo", unix.S_IFIFO | 0o620, 0}} {
		s := lstat(t, filepath.Join(dir, c.p))
		if s.Mode != c.mode || s.Rdev != c.rdev || s.Uid != 50 {
			t.Errorf("%s: mode %o rdev %x uid %d", c.p, s.Mode, s.Rdev, s.Uid)
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, "wh")); !os.IsNotExist(err) {
		t.Errorf("char 0/0 entry created: %v", err)
	}
}

func TestReplace(t *testing.T) {
	testenv.RequireRoot(t)
	dir, check := sandbox(t)
	canaryFile := filepath.Join(filepath.Dir(dir), "canary", "f")
	d2 := dirE("d", 0o700)
	d2.h.Uid = 7
	_, err := Unpack(bytes.NewReader(tarOf(t,
		reg("f", "one", 0o644), reg("f", "two", 0o600),
		sym("l", canaryFile), reg("l", "replaced-link", 0o644),
		reg("s", "file", 0o644), sym("s", "target"),
		dirE("d", 0o755), reg("d/keep", "k", 0o644), d2,
		reg("x", "file", 0o644), dirE("x", 0o755),
		dirE("e", 0o755), reg("e", "now-a-file", 0o644),
		reg("h", "h", 0o644), hard("h2", "h"), reg("h2", "separate", 0o644),
	)), dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	check()
	for p, want := range map[string]string{"f": "two", "l": "replaced-link", "d/keep": "k", "e": "now-a-file", "h": "h", "h2": "separate"} {
		if b, err := os.ReadFile(filepath.Join(dir, p)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", p, b, err, want)
		}
	}
	if s := lstat(t, filepath.Join(dir, "f")); s.Mode != unix.S_IFREG|0o600 {
		t.Errorf("f mode %o", s.Mode)
	}
	if s := lstat(t, filepath.Join(dir, "d")); s.Mode != unix.S_IFDIR|0o700 || s.Uid != 7 {
		t.Errorf("d mode %o uid %d", s.Mode, s.Uid)
	}
	if s := lstat(t, filepath.Join(dir, "x")); s.Mode&unix.S_IFMT != unix.S_IFDIR {
		t.Errorf("x not a dir")
	}
	if tgt, _ := os.Readlink(filepath.Join(dir, "s")); tgt != "target" {
		t.Errorf("s -> %q", tgt)
	}
}

func TestReject(t *testing.T) {
	testenv.RequireRoot(t)
	parentOf := func(dir string) string { return filepath.Dir(dir) }
	bigOwner := reg("f", "x", 0o644)
	bigOwner.h.Uid = 65536
	negOwner := reg("f", "x", 0o644)
	negOwner.h.Uid = -1
	badCap := reg("f", "x", 0o644)
	badCap.h.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": "\x00\x00\x00\x01abcd"}
	bigXattr := reg("f", "x", 0o644)
	bigXattr.h.PAXRecords = map[string]string{"SCHILY.xattr.user.big": string(make([]byte, 65537))}
	for _, c := range []struct {
		name string
		ents func(dir string) []ent
		opt  Options
		want error
	}{
		{"dotdot", func(string) []ent { return []ent{reg("../x", "x", 0o644)} }, Options{}, ErrInvalid},
		{"dotdot-deep", func(string) []ent { return []ent{reg("a/../../x", "x", 0o644)} }, Options{}, ErrInvalid},
		{"dotdot-dir", func(string) []ent { return []ent{dirE("a/..", 0o755)} }, Options{}, ErrInvalid},
		{"symlink-etc-write", func(string) []ent { return []ent{sym("link", "/etc"), reg("link/passwd", "pwned", 0o644)} }, Options{}, ErrInvalid},
		{"symlink-dotdot-write", func(string) []ent { return []ent{sym("link", ".."), reg("link/x", "x", 0o644)} }, Options{}, ErrInvalid},
		{"symlink-inside-write", func(string) []ent { return []ent{dirE("sub", 0o755), sym("link", "sub"), reg("link/x", "x", 0o644)} }, Options{}, ErrInvalid},
		{"symlink-inside-hardlink", func(string) []ent { return []ent{reg("sub/f", "x", 0o644), sym("link", "sub"), hard("h", "link/f")} }, Options{}, ErrInvalid},
		{"symlink-canary-write", func(d string) []ent {
			return []ent{sym("link", filepath.Join(parentOf(d), "canary")), reg("link/f", "pwned", 0o644)}
		}, Options{}, ErrInvalid},
		{"symlink-canary-mkdir", func(d string) []ent {
			return []ent{sym("link", filepath.Join(parentOf(d), "canary")), dirE("link/new/", 0o755)}
		}, Options{}, ErrInvalid},
		{"symlink-parent-whiteout", func(string) []ent { return []ent{sym("link", "../canary"), reg("link/.wh.f", "", 0)} }, Options{}, ErrInvalid},
		{"symlink-opaque", func(string) []ent { return []ent{sym("link", "../canary"), reg("link/.wh..wh..opq", "", 0)} }, Options{}, ErrInvalid},
		{"symlink-hardlink-new", func(string) []ent { return []ent{reg("f", "x", 0o644), sym("link", "../canary"), hard("link/g", "f")} }, Options{}, ErrInvalid},
		{"hardlink-outside", func(string) []ent { return []ent{hard("h", "../canary/f")} }, Options{}, ErrInvalid},
		{"hardlink-abs-outside", func(d string) []ent { return []ent{hard("h", filepath.Join(parentOf(d), "canary/f"))} }, Options{}, ErrInvalid},
		{"hardlink-via-symlink", func(string) []ent { return []ent{sym("link", "../canary"), hard("h", "link/f")} }, Options{}, ErrInvalid},
		{"hardlink-to-symlink", func(string) []ent { return []ent{sym("s", "../canary/f"), hard("h", "s")} }, Options{}, ErrInvalid},
		{"hardlink-missing", func(string) []ent { return []ent{hard("h", "nope")} }, Options{}, ErrInvalid},
		{"hardlink-to-dir", func(string) []ent { return []ent{dirE("d", 0o755), hard("h", "d")} }, Options{}, ErrInvalid},
		{"hardlink-self", func(string) []ent { return []ent{reg("f", "x", 0o644), hard("f", "f")} }, Options{}, ErrInvalid},
		{"parent-is-file", func(string) []ent { return []ent{reg("f", "x", 0o644), reg("f/g", "x", 0o644)} }, Options{}, ErrInvalid},
		{"bad-wh-plnk", func(string) []ent { return []ent{reg("a/.wh..wh.plnk", "", 0)} }, Options{}, ErrInvalid},
		{"bad-wh-empty", func(string) []ent { return []ent{reg("a/.wh.", "", 0)} }, Options{}, ErrInvalid},
		{"bad-wh-dotdot", func(string) []ent { return []ent{reg(".wh..", "", 0)} }, Options{}, ErrInvalid},
		{"bad-wh-dir-component", func(string) []ent { return []ent{reg(".wh.a/b", "", 0)} }, Options{}, ErrInvalid},
		{"root-as-file", func(string) []ent { return []ent{reg(".", "x", 0o644)} }, Options{}, ErrInvalid},
		{"file-over-nonempty-dir", func(string) []ent { return []ent{reg("d/f", "x", 0o644), reg("d", "x", 0o644)} }, Options{}, ErrInvalid},
		{"owner-outside-map", func(string) []ent { return []ent{bigOwner} }, Options{IDShift: IDMap{HostBase: 100000, Size: 65536}}, ErrInvalid},
		{"owner-negative", func(string) []ent { return []ent{negOwner} }, Options{}, ErrInvalid},
		{"bad-capability", func(string) []ent { return []ent{badCap} }, Options{}, ErrInvalid},
		{"xattr-too-big", func(string) []ent { return []ent{bigXattr} }, Options{}, ErrInvalid},
		// mknod would drop the high bits and make 0/0, a whiteout.
		{"device-major-too-big", func(string) []ent { return []ent{dev("d", tar.TypeChar, 1<<12, 0)} }, Options{Devices: CreateDevices}, ErrInvalid},
		{"device-minor-too-big", func(string) []ent { return []ent{dev("d", tar.TypeChar, 0, 1<<20)} }, Options{Devices: CreateDevices}, ErrInvalid},
		{"too-many-entries", func(string) []ent {
			return []ent{reg("a", "", 0), reg("b", "", 0), reg("c", "", 0), reg("d", "", 0)}
		}, Options{MaxEntries: 3}, ErrLimit},
		{"implicit-dirs-count", func(string) []ent { return []ent{reg("a/b/c/d", "", 0)} }, Options{MaxEntries: 3}, ErrLimit},
		{"too-many-bytes", func(string) []ent {
			return []ent{reg("a", "12345", 0), reg("b", "67890", 0)}
		}, Options{MaxBytes: 8}, ErrLimit},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir, check := sandbox(t)
			_, err := Unpack(bytes.NewReader(tarOf(t, c.ents(dir)...)), dir, c.opt)
			if !errors.Is(err, c.want) {
				t.Errorf("err = %v, want %v", err, c.want)
			}
			// The API answers with the kind: the image is at fault.
			if want := map[error]error{ErrInvalid: errdefs.ErrInvalid, ErrLimit: errdefs.ErrLimit}[c.want]; want != nil && errdefs.Kind(err) != want.Error() {
				t.Errorf("kind of %v = %v, want %v", err, errdefs.Kind(err), want)
			}
			check()
		})
	}
}

func TestRejectNUL(t *testing.T) {
	testenv.RequireRoot(t)
	for _, e := range []ent{reg(strings.Repeat("a", 120)+"Q/b", "x", 0o644), sym("s", strings.Repeat("a", 120)+"Q")} {
		b := tarOf(t, e)
		if bytes.Count(b, []byte("Q")) != 1 {
			t.Fatal("marker not unique")
		}
		b = bytes.ReplaceAll(b, []byte("Q"), []byte{0})
		dir, check := sandbox(t)
		if _, err := Unpack(bytes.NewReader(b), dir, Options{}); err == nil {
			t.Errorf("NUL in %s accepted", e.h.Name)
		}
		check()
		if n := readNames(t, dir); len(n) != 0 {
			t.Errorf("created %v", n)
		}
	}
	if _, err := cleanName("a\x00b"); !errors.Is(err, ErrInvalid) {
		t.Errorf("cleanName accepted NUL: %v", err)
	}
}

// shortBody is a tar whose one header claims size bytes but whose body (and
// the archive) ends after a few.
func shortBody(t testing.TB, size int64) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "big", Size: size, Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write([]byte("only a little")); err != nil {
		t.Fatal(err)
	}
	if err := tw.Flush(); err == nil {
		t.Fatal("flush of a short entry succeeded")
	}
	return b.Bytes()
}

func TestHugeHeaderShortBody(t *testing.T) {
	testenv.RequireRoot(t)
	for _, c := range []struct {
		name string
		size int64
		opt  Options
		want error
	}{
		{"over-budget", 10 << 30, Options{}, ErrLimit},
		{"within-budget", 1 << 30, Options{}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir, check := sandbox(t)
			var before, after runtimeMem
			before.read()
			_, err := Unpack(bytes.NewReader(shortBody(t, c.size)), dir, c.opt)
			after.read()
			if err == nil {
				t.Fatal("short body accepted")
			}
			if c.want != nil && !errors.Is(err, c.want) {
				t.Errorf("err = %v, want %v", err, c.want)
			}
			if c.want == nil && !errors.Is(err, errUnexpectedEOF) {
				t.Errorf("err = %v, want unexpected EOF", err)
			}
			if d := after.total - before.total; d > 16<<20 {
				t.Errorf("allocated %d bytes", d)
			}
			if c.want != nil {
				if n := readNames(t, dir); len(n) != 0 {
					t.Errorf("over-budget entry created %v", n)
				}
			}
			check()
		})
	}
}

func TestUnpackPreconditions(t *testing.T) {
	testenv.RequireRoot(t)
	dir, _ := sandbox(t)
	if err := os.WriteFile(filepath.Join(dir, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Unpack(bytes.NewReader(tarOf(t)), dir, Options{}); err == nil {
		t.Error("non-empty dir accepted")
	}
	dir2, _ := sandbox(t)
	if _, err := Unpack(bytes.NewReader(tarOf(t)), dir2, Options{IDShift: IDMap{HostBase: 1 << 31, Size: 1 << 31}}); err == nil {
		t.Error("overflowing id map accepted")
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir2, link); err != nil {
		t.Fatal(err)
	}
	if _, err := Unpack(bytes.NewReader(tarOf(t)), link, Options{}); err == nil {
		t.Error("symlinked dir accepted")
	}
}

var errUnexpectedEOF = io.ErrUnexpectedEOF

type runtimeMem struct{ total uint64 }

func (m *runtimeMem) read() {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m.total = ms.TotalAlloc
}
