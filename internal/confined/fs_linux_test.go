package confined

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/testenv"
	"github.com/warren-sandbox/warren/internal/wire"
)

// badNames are rejected by every operation with kind invalid.
var badNames = []string{
	"../x", "a/../../x", "/../x", "..", "x/..", "x\x00y",
	strings.Repeat("a/", 2049), "d/" + strings.Repeat("n", 256),
}

func wantKind(t *testing.T, what string, err error, kind string) {
	t.Helper()
	if got := Kind(err); got != kind {
		t.Errorf("%s: error %v (kind %q), want kind %q", what, err, got, kind)
	}
}

func TestInvalidNames(t *testing.T) {
	e := newEnv(t)
	r := e.r
	for _, n := range badNames {
		_, err := r.Stat(n)
		wantKind(t, "Stat", err, wire.ErrInvalid)
		_, err = r.List(n, 0)
		wantKind(t, "List", err, wire.ErrInvalid)
		_, _, err = r.Open(n)
		wantKind(t, "Open", err, wire.ErrInvalid)
		_, err = r.WriteFile(n, strings.NewReader("x"), 0o644, 0)
		wantKind(t, "WriteFile", err, wire.ErrInvalid)
		wantKind(t, "Mkdir", r.Mkdir(n, true, 0o755), wire.ErrInvalid)
		wantKind(t, "Remove", r.Remove(n, true), wire.ErrInvalid)
		wantKind(t, "Move from", r.Move(n, "y"), wire.ErrInvalid)
		wantKind(t, "Move to", r.Move("canarylink", n), wire.ErrInvalid)
		wantKind(t, "WriteTar", r.WriteTar(io.Discard, n), wire.ErrInvalid)
		_, err = r.ExtractTar(bytes.NewReader(mkTar(t, file("f", "x"))), n, TarLimits{})
		wantKind(t, "ExtractTar", err, wire.ErrInvalid)
	}
	if !e.exists("canarylink") {
		t.Error("canarylink was moved")
	}
}

func TestStat(t *testing.T) {
	e := newEnv(t)
	must(t, os.WriteFile(e.path("f"), []byte("hello"), 0o640))
	must(t, os.Mkdir(e.path("d"), 0o750))
	must(t, unix.Mkfifo(e.path("fifo"), 0o600))
	tests := []struct {
		name   string
		kind   string // error kind, "" for success
		typ    string
		path   string
		size   int64
		mode   os.FileMode
		target string
	}{
		{name: "f", typ: "file", path: "/f", size: 5, mode: 0o640},
		{name: "/f", typ: "file", path: "/f", size: 5, mode: 0o640},
		{name: "d", typ: "dir", path: "/d", mode: os.ModeDir | 0o750},
		{name: "", typ: "dir", path: "/"},
		{name: "/", typ: "dir", path: "/"},
		{name: ".", typ: "dir", path: "/"},
		{name: "fifo", typ: "other", path: "/fifo", mode: os.ModeNamedPipe | 0o600},
		{name: "abs", typ: "symlink", path: "/abs", target: "/"},
		{name: "out", typ: "symlink", path: "/out", target: e.outside},
		{name: "canarylink", typ: "symlink", path: "/canarylink", target: e.canary},
		// Through the escape links: resolved inside the root.
		{name: "abs/f", typ: "file", path: "/abs/f", size: 5, mode: 0o640},
		{name: "up/f", typ: "file", path: "/up/f", size: 5, mode: 0o640},
		{name: "deep/d", typ: "dir", path: "/deep/d", mode: os.ModeDir | 0o750},
		{name: "out/secret", kind: wire.ErrNotFound},
		{name: "outrel/secret", kind: wire.ErrNotFound},
		{name: "up/canary", kind: wire.ErrNotFound},
		{name: "deep/etc/passwd", kind: wire.ErrNotFound},
		{name: "abs" + e.canary, kind: wire.ErrNotFound},
		{name: "missing", kind: wire.ErrNotFound},
		{name: "f/x", kind: wire.ErrInvalid},
	}
	for _, tt := range tests {
		fi, err := e.r.Stat(tt.name)
		if tt.kind != "" {
			wantKind(t, "Stat "+tt.name, err, tt.kind)
			continue
		}
		if err != nil {
			t.Errorf("Stat(%q): %v", tt.name, err)
			continue
		}
		if fi.Type != tt.typ || fi.Path != tt.path || fi.Target != tt.target {
			t.Errorf("Stat(%q) = %+v, want type %s path %s target %q", tt.name, fi, tt.typ, tt.path, tt.target)
		}
		if tt.mode != 0 && (os.FileMode(fi.Mode) != tt.mode || (tt.typ == "file" && fi.Size != tt.size)) {
			t.Errorf("Stat(%q): mode %v size %d, want %v %d", tt.name, os.FileMode(fi.Mode), fi.Size, tt.mode, tt.size)
		}
	}
	if fi, _ := e.r.Stat("/"); fi.Name != "/" {
		t.Errorf("Stat(/).Name = %q", fi.Name)
	}
	if fi, _ := e.r.Stat("d/../d"); fi.Name != "" {
		t.Errorf("Stat with .. succeeded: %+v", fi)
	}
}

func TestList(t *testing.T) {
	e := newEnv(t)
	for _, n := range []string{"c", "a", "b"} {
		must(t, os.WriteFile(e.path(filepath.Join("sub", n)), nil, 0o644))
	}
	names := func(infos []wire.FileInfo) []string {
		var s []string
		for _, fi := range infos {
			s = append(s, fi.Name)
		}
		return s
	}
	infos, err := e.r.List("sub", 0)
	must(t, err)
	if got := names(infos); !slices.Equal(got, []string{"a", "b", "c"}) || infos[0].Path != "/sub/a" {
		t.Errorf("List(sub) = %v (%+v)", got, infos[0])
	}
	_, err = e.r.List("sub", 2)
	wantKind(t, "List over limit", err, wire.ErrTooLarge)
	if infos, err := e.r.List("sub", 3); err != nil || len(infos) != 3 {
		t.Errorf("List at limit: %d entries, %v", len(infos), err)
	}
	root, err := e.r.List("/", 0)
	must(t, err)
	for _, via := range []string{"abs", "up", "deep"} {
		got, err := e.r.List(via, 0)
		must(t, err)
		if !slices.Equal(names(got), names(root)) {
			t.Errorf("List(%s) = %v, want the root's %v", via, names(got), names(root))
		}
	}
	for i, fi := range root {
		if fi.Name == "canarylink" && (fi.Type != "symlink" || fi.Target != e.canary) {
			t.Errorf("root entry %d: %+v", i, fi)
		}
	}
	_, err = e.r.List("out", 0)
	wantKind(t, "List(out)", err, wire.ErrNotFound)
	_, err = e.r.List("sub/a", 0)
	wantKind(t, "List(file)", err, wire.ErrInvalid)
	_, err = e.r.List("nope", 0)
	wantKind(t, "List(missing)", err, wire.ErrNotFound)
}

func TestOpen(t *testing.T) {
	e := newEnv(t)
	must(t, os.WriteFile(e.path("f"), []byte("content"), 0o600))
	must(t, os.Symlink("f", e.path("tof")))
	must(t, os.Symlink("/f", e.path("toabsf")))
	must(t, unix.Mkfifo(e.path("fifo"), 0o644))
	must(t, os.Symlink("fifo", e.path("tofifo")))
	tests := []struct {
		name, want, kind string
	}{
		{name: "f", want: "content"},
		{name: "/f", want: "content"},
		{name: "tof", want: "content"},
		{name: "toabsf", want: "content"},
		{name: "abs/f", want: "content"},
		{name: "deep/tof", want: "content"},
		{name: "canarylink", kind: wire.ErrNotFound},
		{name: "canaryrel", kind: wire.ErrNotFound},
		{name: "out/secret", kind: wire.ErrNotFound},
		{name: "up/outside/secret", kind: wire.ErrNotFound},
		{name: "fifo", kind: wire.ErrInvalid},
		{name: "tofifo", kind: wire.ErrInvalid},
		{name: "sub", kind: wire.ErrInvalid},
		{name: "/", kind: wire.ErrInvalid},
		{name: "missing", kind: wire.ErrNotFound},
	}
	for _, tt := range tests {
		type result struct {
			data string
			fi   wire.FileInfo
			err  error
		}
		ch := make(chan result, 1)
		go func() {
			f, fi, err := e.r.Open(tt.name)
			if err != nil {
				ch <- result{err: err}
				return
			}
			defer func() { _ = f.Close() }()
			b, err := io.ReadAll(f)
			ch <- result{string(b), fi, err}
		}()
		var res result
		select {
		case res = <-ch:
		case <-time.After(5 * time.Second):
			// Release the blocked open (a writer unblocks a FIFO
			// reader) so the test fails instead of hanging.
			t.Errorf("Open(%q) hangs", tt.name)
			if w, err := os.OpenFile(e.path("fifo"), os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
				_ = w.Close()
			}
			res = <-ch
		}
		if tt.kind != "" {
			wantKind(t, "Open "+tt.name, res.err, tt.kind)
			continue
		}
		if res.err != nil || res.data != tt.want || res.fi.Size != int64(len(tt.want)) || res.fi.Type != "file" {
			t.Errorf("Open(%q) = %q %+v %v, want %q", tt.name, res.data, res.fi, res.err, tt.want)
		}
	}
}

func TestOpenDevice(t *testing.T) {
	e := newEnv(t)
	err := unix.Mknod(e.path("null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
	testenv.Require(t, err == nil, "mknod (CAP_MKNOD)")
	_, _, err = e.r.Open("null")
	wantKind(t, "Open(device)", err, wire.ErrInvalid)
	fi, err := e.r.Stat("null")
	if err != nil || fi.Type != "other" || os.FileMode(fi.Mode)&os.ModeCharDevice == 0 {
		t.Errorf("Stat(null) = %+v, %v", fi, err)
	}
}

func TestWriteFile(t *testing.T) {
	e := newEnv(t)
	r := e.r
	must(t, os.WriteFile(e.path("target"), []byte("target"), 0o644))
	must(t, os.Symlink("target", e.path("link")))
	must(t, os.Symlink(filepath.Join(e.outside, "secret"), e.path("outlink")))
	must(t, os.Symlink("../../../../outside/secret", e.path("outrellink")))

	tests := []struct {
		name   string
		mode   os.FileMode
		kind   string
		at     string // where the data must land, relative to the root
		wantMd os.FileMode
	}{
		{name: "new", mode: 0o640, at: "new", wantMd: 0o640},
		{name: "/sub/new", mode: 0o600, at: "sub/new", wantMd: 0o600},
		{name: "suid", mode: 0o755 | os.ModeSetuid | os.ModeSetgid | os.ModeSticky, at: "suid", wantMd: 0o755},
		{name: "target", mode: 0o600, at: "target", wantMd: 0o600},
		// A final symlink is replaced, never written through.
		{name: "link", mode: 0o644, at: "link", wantMd: 0o644},
		{name: "outlink", mode: 0o644, at: "outlink", wantMd: 0o644},
		{name: "outrellink", mode: 0o644, at: "outrellink", wantMd: 0o644},
		{name: "canarylink", mode: 0o644, at: "canarylink", wantMd: 0o644},
		// Intermediate escape links resolve inside the root.
		{name: "abs/" + e.marker, mode: 0o644, at: e.marker, wantMd: 0o644},
		{name: "deep/" + e.marker + "2", mode: 0o644, at: e.marker + "2", wantMd: 0o644},
		{name: "up/" + e.marker + "3", mode: 0o644, at: e.marker + "3", wantMd: 0o644},
		{name: "out/secret", kind: wire.ErrNotFound},
		{name: "outrel/x", kind: wire.ErrNotFound},
		{name: "missing/x", kind: wire.ErrNotFound},
		{name: "/", kind: wire.ErrInvalid},
		{name: "sub", kind: wire.ErrInvalid}, // a directory
	}
	for _, tt := range tests {
		data := "data for " + tt.name
		n, err := r.WriteFile(tt.name, strings.NewReader(data), tt.mode, 0)
		if tt.kind != "" {
			wantKind(t, "WriteFile "+tt.name, err, tt.kind)
			continue
		}
		if err != nil || n != int64(len(data)) {
			t.Errorf("WriteFile(%q) = %d, %v", tt.name, n, err)
			continue
		}
		fi, err := os.Lstat(e.path(tt.at))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode() != tt.wantMd {
			t.Errorf("WriteFile(%q): %s is %v, %v; want regular %v", tt.name, tt.at, modeOf(fi), err, tt.wantMd)
			continue
		}
		if got := e.read(tt.at); got != data {
			t.Errorf("WriteFile(%q): %s holds %q", tt.name, tt.at, got)
		}
	}
	if got := e.read("target"); got != "data for target" {
		t.Errorf("target = %q: written through the link", got)
	}
	if left := tempLeft(t, e.root); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

func TestWriteFileTooLarge(t *testing.T) {
	e := newEnv(t)
	must(t, os.WriteFile(e.path("sub/keep"), []byte("old"), 0o644))
	before := tree(t, e.path("sub"))
	for _, name := range []string{"sub/keep", "sub/new"} {
		n, err := e.r.WriteFile(name, strings.NewReader(strings.Repeat("x", 101)), 0o644, 100)
		wantKind(t, "WriteFile over max", err, wire.ErrTooLarge)
		if n > 101 {
			t.Errorf("read %d bytes for max 100", n)
		}
	}
	if after := tree(t, e.path("sub")); !mapsEqual(before, after) {
		t.Errorf("too-large write left changes: %v -> %v", before, after)
	}
	if n, err := e.r.WriteFile("sub/exact", strings.NewReader(strings.Repeat("x", 100)), 0o644, 100); err != nil || n != 100 {
		t.Errorf("write of exactly max: %d, %v", n, err)
	}
	// A failing source leaves nothing either.
	_, err := e.r.WriteFile("sub/fail", io.MultiReader(strings.NewReader("part"), errReader{}), 0o644, 0)
	if !errors.Is(err, errBoom) || Kind(err) != wire.ErrInternal {
		t.Errorf("failing source: %v", err)
	}
	if e.exists("sub/fail") || len(tempLeft(t, e.root)) > 0 {
		t.Error("failing source left a file")
	}
}

var errBoom = errors.New("boom")

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errBoom }

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

func TestMkdir(t *testing.T) {
	e := newEnv(t)
	must(t, os.WriteFile(e.path("file"), nil, 0o644))
	tests := []struct {
		name    string
		parents bool
		mode    os.FileMode
		kind    string
		at      string
	}{
		{name: "d", mode: 0o700, at: "d"},
		{name: "d", kind: wire.ErrExists},
		{name: "d", parents: true, mode: 0o755},
		{name: "/", kind: wire.ErrExists},
		{name: "/", parents: true},
		{name: "a/b/c", kind: wire.ErrNotFound},
		{name: "a/b/c", parents: true, mode: 0o711, at: "a/b/c"},
		{name: "file", kind: wire.ErrExists},
		{name: "file", parents: true, kind: wire.ErrExists},
		{name: "file/x", parents: true, kind: wire.ErrInvalid},
		{name: "abs/" + e.marker, mode: 0o755, at: e.marker},
		{name: "deep/" + e.marker + "-m/n", parents: true, mode: 0o755, at: e.marker + "-m/n"},
		{name: "abs/" + e.marker + "-d/n", parents: true, mode: 0o755, at: e.marker + "-d/n"},
		{name: "up/sub/m", parents: true, mode: 0o750, at: "sub/m"},
		// Dangling escape links: their targets would be inside the root
		// but do not exist; like mkdir -p, fail rather than create them.
		{name: "out/x", kind: wire.ErrNotFound},
		{name: "out/x", parents: true, kind: wire.ErrNotFound},
		{name: "outrel/y", parents: true, kind: wire.ErrNotFound},
		{name: "canarylink/z", parents: true, kind: wire.ErrNotFound},
	}
	for _, tt := range tests {
		err := e.r.Mkdir(tt.name, tt.parents, tt.mode)
		if tt.kind != "" {
			wantKind(t, "Mkdir "+tt.name, err, tt.kind)
			continue
		}
		if err != nil {
			t.Errorf("Mkdir(%q, %v): %v", tt.name, tt.parents, err)
			continue
		}
		if tt.at == "" {
			continue
		}
		fi, err := os.Lstat(e.path(tt.at))
		if err != nil || fi.Mode() != os.ModeDir|tt.mode {
			t.Errorf("Mkdir(%q): %s is %v, %v; want %v", tt.name, tt.at, modeOf(fi), err, os.ModeDir|tt.mode)
		}
	}
}

func TestRemove(t *testing.T) {
	e := newEnv(t)
	must(t, os.WriteFile(e.path(e.marker+"-f"), nil, 0o644))
	must(t, os.MkdirAll(e.path("full/a/b"), 0o755))
	must(t, os.WriteFile(e.path("full/a/b/x"), nil, 0o644))
	e.plant("full/a") // links to outside inside the tree
	must(t, os.Mkdir(e.path("empty"), 0o755))
	must(t, os.MkdirAll(e.path("ro/inner"), 0o755))
	must(t, os.Chmod(e.path("ro"), 0o500))
	tests := []struct {
		name      string
		recursive bool
		kind      string
		gone      string // must no longer exist
	}{
		{name: "/", recursive: true, kind: wire.ErrPermission},
		{name: "", kind: wire.ErrPermission},
		{name: ".", recursive: true, kind: wire.ErrPermission},
		{name: "//./", recursive: true, kind: wire.ErrPermission},
		{name: "abs/" + e.marker + "-f", gone: e.marker + "-f"},
		{name: "missing", kind: wire.ErrNotFound},
		{name: "missing", recursive: true, kind: wire.ErrNotFound},
		{name: "full", kind: wire.ErrInvalid},
		{name: "empty", gone: "empty"},
		{name: "full", recursive: true, gone: "full"},
		{name: "ro", recursive: true, gone: "ro"},
		{name: "out/secret", kind: wire.ErrNotFound},
		{name: "outrel/secret", recursive: true, kind: wire.ErrNotFound},
		{name: "up/canary", kind: wire.ErrNotFound},
		{name: "out", recursive: true, gone: "out"},
		{name: "canarylink", gone: "canarylink"},
		{name: "deep", recursive: true, gone: "deep"},
	}
	for _, tt := range tests {
		err := e.r.Remove(tt.name, tt.recursive)
		if tt.kind != "" {
			wantKind(t, "Remove "+tt.name, err, tt.kind)
			continue
		}
		if err != nil {
			t.Errorf("Remove(%q, %v): %v", tt.name, tt.recursive, err)
		}
		if e.exists(tt.gone) {
			t.Errorf("Remove(%q): %s still exists", tt.name, tt.gone)
		}
	}
	if _, err := os.Stat(e.root); err != nil {
		t.Fatalf("root gone: %v", err)
	}
}

func TestMove(t *testing.T) {
	e := newEnv(t)
	must(t, os.WriteFile(e.path("a"), []byte("A"), 0o644))
	must(t, os.WriteFile(e.path("b"), []byte("B"), 0o644))
	must(t, os.Mkdir(e.path("d"), 0o755))
	tests := []struct {
		from, to string
		kind     string
		at, want string
	}{
		{from: "a", to: "d/a2", at: "d/a2", want: "A"},
		{from: "/d/a2", to: "b", at: "b", want: "A"}, // replaces
		{from: "b", to: "abs/" + e.marker, at: e.marker, want: "A"},
		{from: e.marker, to: "deep/" + e.marker + "-c", at: e.marker + "-c", want: "A"},
		{from: e.marker + "-c", to: "out/stolen", kind: wire.ErrNotFound},
		{from: "out/secret", to: "stolen", kind: wire.ErrNotFound},
		{from: "outrel/secret", to: "stolen", kind: wire.ErrNotFound},
		{from: "up/canary", to: "stolen", kind: wire.ErrNotFound},
		{from: "/", to: "x", kind: wire.ErrInvalid},
		{from: e.marker + "-c", to: "/", kind: wire.ErrInvalid},
		{from: "d", to: "d/inside", kind: wire.ErrInvalid},
		{from: "missing", to: "x", kind: wire.ErrNotFound},
		// The link moves, not what it points to.
		{from: "canarylink", to: "moved-link", at: "moved-link"},
	}
	for _, tt := range tests {
		err := e.r.Move(tt.from, tt.to)
		if tt.kind != "" {
			wantKind(t, "Move "+tt.from+" "+tt.to, err, tt.kind)
			continue
		}
		if err != nil {
			t.Errorf("Move(%q, %q): %v", tt.from, tt.to, err)
			continue
		}
		if tt.want != "" {
			if got := e.read(tt.at); got != tt.want {
				t.Errorf("Move(%q, %q): %s = %q", tt.from, tt.to, tt.at, got)
			}
		} else if fi, err := os.Lstat(e.path(tt.at)); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("Move(%q, %q): %s is not the link: %v", tt.from, tt.to, tt.at, err)
		}
	}
}

// TestConcurrentSwap runs every operation while another goroutine keeps
// swapping "d", "f" and "r" between real entries and symlinks pointing out
// of the root. Operations may fail; nothing outside may change.
func TestConcurrentSwap(t *testing.T) {
	e := newEnv(t)
	m := e.marker
	// "d" and "f" point at the things beside the root; "r" at the host's
	// "/", so only marker names are used below it.
	dTargets := []string{e.outside, "../../../..", e.canary, filepath.Join(e.outside, "secret"), "../../../../outside"}
	rTargets := []string{"/", strings.Repeat("../", 40)}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	//nolint:errcheck // the swaps race the operations and may fail; only the root's invariant is checked
	wg.Go(func() {
		d, f, r := e.path("d"), e.path("f"), e.path("r")
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			os.RemoveAll(d)
			os.Remove(f)
			os.RemoveAll(r)
			if i%2 == 0 {
				os.Mkdir(d, 0o755)
				os.WriteFile(f, []byte("f"), 0o644)
				os.Mkdir(r, 0o755)
			} else {
				os.Symlink(dTargets[i/2%len(dTargets)], d)
				os.Symlink(dTargets[(i/2+1)%len(dTargets)], f)
				os.Symlink(rTargets[i/2%len(rTargets)], r)
			}
			// Renames anywhere make openat2 IN_ROOT return EAGAIN.
			os.Rename(e.path("sub"), e.path("sub2"))
			os.Rename(e.path("sub2"), e.path("sub"))
		}
	})
	archive := mkTar(t, file("a/b", "x"), symlink("s", "/"), file("s/"+m+"-c", "y"), symlink("o", e.outside), file("o/secret", "pwned"), hardlink("h", "a/b"))
	rArchive := mkTar(t, dir(m+"-t/"), file(m+"-t/a", "x"), symlink(m+"-s", m+"-t"), file(m+"-s/b", "y"))
	//nolint:errcheck // each operation may fail in the race; what is checked is that none reaches outside
	for range 300 {
		e.r.WriteFile("d/x", strings.NewReader("pwned"), 0o644, 0)
		e.r.WriteFile("f", strings.NewReader("pwned"), 0o644, 0)
		e.r.WriteFile("d/secret", strings.NewReader("pwned"), 0o644, 0)
		e.r.WriteFile("r/"+m+"-x", strings.NewReader("pwned"), 0o644, 0)
		e.r.Mkdir("d/m/n", true, 0o755)
		e.r.Mkdir("r/"+m+"-m/n", true, 0o755)
		e.r.Stat("d/x")
		if f, _, err := e.r.Open("f"); err == nil {
			b, _ := io.ReadAll(f)
			f.Close()
			if string(b) == "secret\n" || string(b) == "canary\n" {
				t.Fatal("read a file outside the root")
			}
		}
		if f, _, err := e.r.Open("d/secret"); err == nil {
			b, _ := io.ReadAll(f)
			f.Close()
			if string(b) == "secret\n" {
				t.Fatal("read the secret outside the root")
			}
		}
		e.r.List("d", 0)
		e.r.Move("d/x", "d/y")
		e.r.Move("r/"+m+"-x", "r/"+m+"-y")
		e.r.Remove("d/m", true)
		e.r.Remove("r/"+m+"-m", true)
		e.r.Remove("d/secret", false)
		e.r.WriteTar(io.Discard, "d")
		e.r.WriteTar(io.Discard, "r")
		e.r.ExtractTar(bytes.NewReader(archive), "d", TarLimits{})
		e.r.ExtractTar(bytes.NewReader(rArchive), "r", TarLimits{})
		e.r.Remove("d", true)
		e.r.Remove("r", true)
	}
	close(stop)
	wg.Wait()
}

func TestClose(t *testing.T) {
	e := newEnv(t)
	must(t, e.r.Close())
	if _, err := e.r.Stat("/"); err == nil {
		t.Error("Stat after Close succeeded")
	}
	if err := e.r.Close(); err == nil {
		t.Error("second Close succeeded")
	}
	if _, err := Open(filepath.Join(e.base, "nope")); Kind(err) != wire.ErrNotFound {
		t.Errorf("Open(missing dir): %v", err)
	}
}

func modeOf(fi os.FileInfo) os.FileMode {
	if fi == nil {
		return 0
	}
	return fi.Mode()
}
