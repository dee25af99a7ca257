package confined

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/wire"
)

// buildTree fills directory rel of the root with every kind of entry.
func buildTree(t *testing.T, e *env, rel string) {
	t.Helper()
	p := func(n string) string { return e.path(filepath.Join(rel, n)) }
	binary := make([]byte, 0, 256*16+100_000)
	for range 16 {
		for b := range 256 {
			binary = append(binary, byte(b))
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100_000 {
		binary = append(binary, byte(rng.Uint32()))
	}
	longDir := strings.Repeat("d", 100) + "/" + strings.Repeat("e", 100)
	must(t, os.MkdirAll(p("sub/inner"), 0o755))
	must(t, os.MkdirAll(p(longDir), 0o755))
	must(t, os.Mkdir(p("emptydir"), 0o755))
	files := []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{"bin.dat", binary, 0o640},
		{"exec.sh", []byte("#!/bin/sh\necho hi\n"), 0o755},
		{"private", []byte("p"), 0o600},
		{"empty", nil, 0o644},
		{"bad\xff\xfe name\n", []byte("invalid utf-8 name"), 0o644},
		{strings.Repeat("L", 255), []byte("long name"), 0o644},
		{longDir + "/" + strings.Repeat("f", 200), []byte("very long path"), 0o444},
		{"sub/inner/f", []byte("inner"), 0o604},
		{"suid", []byte("suid"), 0o755},
	}
	for _, f := range files {
		must(t, os.WriteFile(p(f.name), f.data, 0o600))
		must(t, os.Chmod(p(f.name), f.mode))
	}
	must(t, unix.Chmod(p("suid"), 0o4755))
	for link, target := range map[string]string{
		"rel-link": "sub/inner/f",
		"abs-link": "/etc/passwd",
		"escape":   e.outside,
		"escrel":   "../../../../../outside/secret",
		"dangling": "nope",
		"sub/up":   "..",
	} {
		must(t, os.Symlink(target, p(link)))
	}
	must(t, os.Link(p("exec.sh"), p("hard")))
	must(t, unix.Mkfifo(p("pipe"), 0o644))
	must(t, os.Chmod(p("sub/inner"), 0o700))
	must(t, os.Chmod(p("sub"), 0o750))
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	for _, n := range []string{"private", "sub/inner", "emptydir"} {
		must(t, os.Chtimes(p(n), old, old))
	}
}

func TestTarRoundTrip(t *testing.T) {
	e := newEnv(t)
	buildTree(t, e, "src")
	var buf bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- e.r.WriteTar(&buf, "/src/") }()
	select {
	case err := <-done:
		must(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("WriteTar hangs (on the FIFO?)")
	}

	// The archive stores links as links and nothing from outside.
	tr := tar.NewReader(bytes.NewReader(buf.Bytes()))
	seen := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		must(t, err)
		body, err := io.ReadAll(tr)
		must(t, err)
		if bytes.Contains(body, []byte("secret")) || bytes.Contains(body, []byte("canary")) {
			t.Errorf("entry %q holds data from outside the root", h.Name)
		}
		if strings.HasPrefix(h.Name, "/") || strings.HasPrefix(h.Name, "src") || strings.Contains(h.Name, "..") {
			t.Errorf("entry name %q is not relative to the directory", h.Name)
		}
		seen[h.Name] = h
	}
	if h := seen["escape"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != e.outside {
		t.Errorf("escape entry: %+v", h)
	}
	if h := seen["suid"]; h == nil || h.Mode != 0o4755 {
		t.Errorf("suid entry: %+v", h)
	}
	if seen["pipe"] != nil {
		t.Error("FIFO archived")
	}
	if h := seen["sub/"]; h == nil || h.Typeflag != tar.TypeDir {
		t.Errorf("sub/ entry: %+v", h)
	}

	stats, err := e.r.ExtractTar(bytes.NewReader(buf.Bytes()), "dst/x", TarLimits{})
	must(t, err)
	if stats.Symlinks != 6 || stats.Files != 10 || stats.Skipped != 0 || stats.Dirs != 5 {
		t.Errorf("stats = %+v", stats)
	}
	want := tree(t, e.path("src"))
	delete(want, "pipe")
	want["suid"] = strings.Replace(want["suid"], "urwx", "-rwx", 1)
	got := tree(t, e.path("dst/x"))
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%q: got %q, want %q", k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%q: extra entry %q", k, got[k])
		}
	}
}

func TestWriteTarSingle(t *testing.T) {
	e := newEnv(t)
	buildTree(t, e, "src")
	tests := []struct {
		name string
		kind string
		want string // "name typeflag" of the single entry
	}{
		{name: "src/exec.sh", want: "exec.sh 0"},
		{name: "src/escape", want: "escape 2"},
		{name: "out", want: "out 2"},
		{name: "abs", want: "abs 2"},
		{name: "src/pipe", kind: wire.ErrInvalid},
		{name: "missing", kind: wire.ErrNotFound},
		{name: "out/secret", kind: wire.ErrNotFound},
		{name: "up/outside", kind: wire.ErrNotFound},
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		err := e.r.WriteTar(&buf, tt.name)
		if tt.kind != "" {
			wantKind(t, "WriteTar "+tt.name, err, tt.kind)
			continue
		}
		must(t, err)
		tr := tar.NewReader(&buf)
		var got []string
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			must(t, err)
			got = append(got, h.Name+" "+string(h.Typeflag))
		}
		if len(got) != 1 || got[0] != tt.want {
			t.Errorf("WriteTar(%q) entries %q, want [%q]", tt.name, got, tt.want)
		}
	}
	// The whole root through an escape link is just the link.
	var buf bytes.Buffer
	must(t, e.r.WriteTar(&buf, "/"))
	if bytes.Contains(buf.Bytes(), []byte("secret\n")) || bytes.Contains(buf.Bytes(), []byte("canary\n")) {
		t.Error("tar of the root holds data from outside")
	}
}

func TestExtractTarHostile(t *testing.T) {
	type check struct {
		rel  string // relative to dst
		want string // content; "" = must not exist; "<dir>", "<link:T>", "<mode:0755>" special
	}
	tests := []struct {
		name  string
		tar   func(e *env) []byte
		kind  string
		stats TarStats
		check []check
	}{{
		name: "dotdot",
		tar:  func(e *env) []byte { return mkTar(e.t, file("ok", "ok"), file("../evil", "x")) },
		kind: wire.ErrInvalid, stats: TarStats{Files: 1, Bytes: 2},
		check: []check{{"ok", "ok"}, {"../evil", ""}},
	}, {
		name: "dotdot nested",
		tar:  func(e *env) []byte { return mkTar(e.t, file("a/../../evil", "x")) },
		kind: wire.ErrInvalid,
	}, {
		name: "dotdot dir",
		tar:  func(e *env) []byte { return mkTar(e.t, dir("../../evildir/")) },
		kind: wire.ErrInvalid,
	}, {
		name:  "absolute names are relative to the destination",
		tar:   func(e *env) []byte { return mkTar(e.t, file("/abs", "a"), file("//x/./y", "b")) },
		stats: TarStats{Files: 2, Bytes: 2},
		check: []check{{"abs", "a"}, {"x/y", "b"}},
	}, {
		name: "write through archive symlinks stays inside",
		tar: func(e *env) []byte {
			return mkTar(e.t, symlink("l", "/"), file("l/"+e.marker+"-x", "1"),
				symlink("l2", strings.Repeat("../", 20)), file("l2/"+e.marker+"-y", "2"),
				symlink("lc", e.canary), file("lc", "4"))
		},
		stats: TarStats{Files: 3, Symlinks: 3, Bytes: 3},
		check: []check{{"%MARK%-x", "1"}, {"%MARK%-y", "2"}, {"l", "<link:/>"}, {"lc", "4"}},
	}, {
		name: "write through planted symlinks stays inside",
		tar: func(e *env) []byte {
			return mkTar(e.t, file("abs/"+e.marker, "1"), file("up/canary", "2"), file("canarylink", "4"), file("deep/"+e.marker+"-z", "5"))
		},
		stats: TarStats{Files: 4, Bytes: 4},
		check: []check{{"%MARK%", "1"}, {"canary", "2"}, {"canarylink", "4"}, {"%MARK%-z", "5"}},
	}, {
		name: "write through dangling archive symlink",
		tar:  func(e *env) []byte { return mkTar(e.t, symlink("lo", e.outside), file("lo/secret", "3")) },
		kind: wire.ErrNotFound, stats: TarStats{Symlinks: 1},
		check: []check{{"lo", "<link:" + "%OUT%" + ">"}},
	}, {
		name: "write through dangling planted symlink",
		tar:  func(e *env) []byte { return mkTar(e.t, file("out/secret", "3")) },
		kind: wire.ErrNotFound,
	}, {
		name: "mkdir through dangling planted symlink",
		tar:  func(e *env) []byte { return mkTar(e.t, dir("outrel/d/")) },
		kind: wire.ErrNotFound,
	}, {
		name: "hardlink to absolute path outside the destination",
		tar:  func(e *env) []byte { return mkTar(e.t, hardlink("h", "/etc/passwd")) },
		kind: wire.ErrInvalid, check: []check{{"h", ""}},
	}, {
		name: "hardlink to host path",
		tar:  func(e *env) []byte { return mkTar(e.t, hardlink("h", e.canary)) },
		kind: wire.ErrInvalid, check: []check{{"h", ""}},
	}, {
		name: "hardlink with dotdot",
		tar:  func(e *env) []byte { return mkTar(e.t, hardlink("h", "../../../../../canary")) },
		kind: wire.ErrInvalid, check: []check{{"h", ""}},
	}, {
		name: "hardlink through planted symlink",
		tar:  func(e *env) []byte { return mkTar(e.t, hardlink("h", "canarylink")) },
		kind: wire.ErrInvalid, check: []check{{"h", ""}},
	}, {
		name: "hardlink through symlink dir",
		tar:  func(e *env) []byte { return mkTar(e.t, hardlink("h", "out/secret")) },
		kind: wire.ErrInvalid, check: []check{{"h", ""}},
	}, {
		name: "hardlink to directory",
		tar:  func(e *env) []byte { return mkTar(e.t, dir("d/"), hardlink("h", "d")) },
		kind: wire.ErrInvalid, stats: TarStats{Dirs: 1}, check: []check{{"h", ""}},
	}, {
		name: "hardlink inside",
		tar: func(e *env) []byte {
			return mkTar(e.t, file("f", "data"), hardlink("g", "f"), hardlink("/g", "/f"), hardlink("sub/h", "./g"))
		},
		stats: TarStats{Files: 1, Hardlinks: 3, Bytes: 4},
		check: []check{{"g", "data"}, {"sub/h", "data"}},
	}, {
		name: "devices and fifos skipped",
		tar: func(e *env) []byte {
			return mkTar(e.t, ent{name: "null", typ: tar.TypeChar}, ent{name: "sda", typ: tar.TypeBlock}, ent{name: "fifo", typ: tar.TypeFifo}, ent{name: "cont", typ: tar.TypeCont}, file("after", "a"))
		},
		stats: TarStats{Files: 1, Skipped: 4, Bytes: 1},
		check: []check{{"null", ""}, {"sda", ""}, {"fifo", ""}, {"cont", ""}, {"after", "a"}},
	}, {
		name: "special mode bits stripped",
		tar: func(e *env) []byte {
			return mkTar(e.t, ent{name: "suid", body: "x", mode: 0o4755}, ent{name: "sgid", body: "x", mode: 0o2640},
				ent{name: "sticky/", typ: tar.TypeDir, mode: 0o1777}, ent{name: "ro/", typ: tar.TypeDir, mode: 0o555}, file("ro/f", "f"))
		},
		stats: TarStats{Files: 3, Dirs: 2, Bytes: 3},
		check: []check{{"suid", "<mode:-rwxr-xr-x>"}, {"sgid", "<mode:-rw-r----->"}, {"sticky", "<mode:drwxrwxrwx>"}, {"ro", "<mode:dr-xr-xr-x>"}, {"ro/f", "f"}},
	}, {
		name: "long and odd names",
		tar: func(e *env) []byte {
			return mkTar(e.t, file(strings.Repeat("p/", 60)+strings.Repeat("q", 255), "long"), file("bad\xff\xfe", "odd"))
		},
		stats: TarStats{Files: 2, Bytes: 7},
		check: []check{{strings.Repeat("p/", 60) + strings.Repeat("q", 255), "long"}, {"bad\xff\xfe", "odd"}},
	}, {
		name: "component too long",
		tar:  func(e *env) []byte { return mkTar(e.t, file(strings.Repeat("q", 256), "x")) },
		kind: wire.ErrInvalid,
	}, {
		name: "file named dot",
		tar:  func(e *env) []byte { return mkTar(e.t, file(".", "x")) },
		kind: wire.ErrInvalid,
	}, {
		name: "dot dir ignored",
		tar: func(e *env) []byte {
			return mkTar(e.t, ent{name: "./", typ: tar.TypeDir, mode: 0o700}, file("./a", "a"))
		},
		stats: TarStats{Files: 1, Bytes: 1},
		check: []check{{".", "<mode:drwxr-xr-x>"}, {"a", "a"}},
	}, {
		name: "replace",
		tar: func(e *env) []byte {
			return mkTar(e.t, file("x", "1"), file("x", "2"), symlink("x", "t"), dir("x/"), file("y", "1"), symlink("y", "t"))
		},
		stats: TarStats{Files: 3, Symlinks: 2, Dirs: 1, Bytes: 3},
		check: []check{{"x", "<dir>"}, {"y", "<link:t>"}},
	}, {
		name: "file over directory",
		tar:  func(e *env) []byte { return mkTar(e.t, dir("d/"), file("d", "x")) },
		kind: wire.ErrInvalid, stats: TarStats{Dirs: 1},
	}, {
		name: "bad symlink target",
		tar:  func(e *env) []byte { return mkTar(e.t, symlink("s", "")) },
		kind: wire.ErrInvalid,
	}, {
		name: "garbage",
		tar:  func(e *env) []byte { return bytes.Repeat([]byte("not a tar "), 100) },
		kind: wire.ErrInvalid,
	}, {
		name: "truncated",
		tar:  func(e *env) []byte { b := mkTar(e.t, file("f", strings.Repeat("x", 2000))); return b[:1000] },
		kind: wire.ErrInvalid, check: []check{{"f", ""}},
	}, {
		name:  "empty",
		tar:   func(e *env) []byte { return nil },
		check: []check{{".", "<dir>"}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			must(t, os.Mkdir(e.path("dst"), 0o755))
			e.plant("dst")
			stats, err := e.r.ExtractTar(bytes.NewReader(tt.tar(e)), "dst", TarLimits{})
			if tt.kind == "" && err != nil {
				t.Fatalf("ExtractTar: %v", err)
			}
			wantKind(t, "ExtractTar", err, tt.kind)
			if stats != tt.stats {
				t.Errorf("stats = %+v, want %+v", stats, tt.stats)
			}
			for _, c := range tt.check {
				c.rel = strings.ReplaceAll(c.rel, "%MARK%", e.marker)
				p := filepath.Join(e.path("dst"), c.rel)
				fi, err := os.Lstat(p)
				switch {
				case c.want == "":
					if err == nil {
						t.Errorf("%s exists", c.rel)
					}
				case err != nil:
					t.Errorf("%s: %v", c.rel, err)
				case c.want == "<dir>":
					if !fi.IsDir() {
						t.Errorf("%s is %v, want a directory", c.rel, fi.Mode())
					}
				case strings.HasPrefix(c.want, "<link:"):
					target, _ := os.Readlink(p)
					if want := strings.ReplaceAll(c.want, "%OUT%", e.outside); "<link:"+target+">" != want {
						t.Errorf("%s -> %q, want %s", c.rel, target, c.want)
					}
				case strings.HasPrefix(c.want, "<mode:"):
					if "<mode:"+fi.Mode().String()+">" != c.want {
						t.Errorf("%s mode %v, want %s", c.rel, fi.Mode(), c.want)
					}
				default:
					if got := e.read(filepath.Join("dst", c.rel)); got != c.want || !fi.Mode().IsRegular() {
						t.Errorf("%s = %q (%v), want %q", c.rel, got, fi.Mode(), c.want)
					}
				}
			}
			if left := tempLeft(t, e.root); len(left) > 0 {
				t.Errorf("temporary files left: %v", left)
			}
		})
	}
}

func TestExtractTarLimits(t *testing.T) {
	var many []ent
	for i := range 11 {
		many = append(many, file(strings.Repeat("m", i+1), ""))
	}
	tests := []struct {
		name  string
		tar   []byte
		lim   TarLimits
		kind  string
		exist []string
		gone  []string
	}{
		{name: "huge header", tar: mkTar(t, file("ok", "ok"), ent{name: "big", size: 10 << 30}), kind: wire.ErrTooLarge, exist: []string{"ok"}, gone: []string{"big"}},
		{name: "entry size", tar: mkTar(t, file("big", strings.Repeat("x", 101))), lim: TarLimits{MaxEntrySize: 100}, kind: wire.ErrTooLarge, gone: []string{"big"}},
		// The header alone decides: no data is read (the body is missing).
		{name: "entry size header", tar: mkTar(t, ent{name: "big", size: 101}), lim: TarLimits{MaxEntrySize: 100}, kind: wire.ErrTooLarge, gone: []string{"big"}},
		{name: "total bytes header", tar: mkTar(t, file("a", strings.Repeat("x", 600)), ent{name: "big", size: 600}), lim: TarLimits{MaxBytes: 1000}, kind: wire.ErrTooLarge, exist: []string{"a"}, gone: []string{"big"}},
		{name: "entry size exact", tar: mkTar(t, file("big", strings.Repeat("x", 100))), lim: TarLimits{MaxEntrySize: 100}, exist: []string{"big"}},
		{name: "total bytes", tar: mkTar(t, file("a", strings.Repeat("x", 600)), file("b", strings.Repeat("x", 600))), lim: TarLimits{MaxBytes: 1000}, kind: wire.ErrTooLarge, exist: []string{"a"}, gone: []string{"b"}},
		{name: "entries", tar: mkTar(t, many...), lim: TarLimits{MaxEntries: 10}, kind: wire.ErrLimit, exist: []string{"mmmmmmmmmm"}, gone: []string{"mmmmmmmmmmm"}},
		{name: "entries exact", tar: mkTar(t, many...), lim: TarLimits{MaxEntries: 11}, exist: []string{"mmmmmmmmmmm"}},
		{name: "implicit dirs count", tar: mkTar(t, file("a/b/c/d/e/f", "x")), lim: TarLimits{MaxEntries: 4}, kind: wire.ErrLimit, gone: []string{"a/b/c/d/e/f"}},
		{name: "skipped entries count", tar: mkTar(t, ent{name: "c", typ: tar.TypeChar}, ent{name: "c", typ: tar.TypeChar}, file("f", "")), lim: TarLimits{MaxEntries: 2}, kind: wire.ErrLimit, gone: []string{"f"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			_, err := e.r.ExtractTar(bytes.NewReader(tt.tar), "dst", tt.lim)
			wantKind(t, "ExtractTar", err, tt.kind)
			for _, n := range tt.exist {
				if !e.exists("dst/" + n) {
					t.Errorf("%s missing", n)
				}
			}
			for _, n := range tt.gone {
				if e.exists("dst/" + n) {
					t.Errorf("%s exists", n)
				}
			}
			if left := tempLeft(t, e.root); len(left) > 0 {
				t.Errorf("temporary files left: %v", left)
			}
		})
	}
}

func TestExtractTarSourceError(t *testing.T) {
	e := newEnv(t)
	b := mkTar(t, file("f", strings.Repeat("x", 5000)))
	_, err := e.r.ExtractTar(io.MultiReader(bytes.NewReader(b[:2000]), errReader{}), "dst", TarLimits{})
	if !errors.Is(err, errBoom) || Kind(err) != wire.ErrInternal {
		t.Errorf("source error: %v (kind %s)", err, Kind(err))
	}
	if e.exists("dst/f") || len(tempLeft(t, e.root)) > 0 {
		t.Error("partial file left")
	}
}

// FuzzExtractTar extracts arbitrary bytes into a directory full of escape
// symlinks and checks nothing outside the root changed and no temporary
// file is left. The planted links lead into the test's temporary directory
// if followed outside the root (not to the host's "/"), so a confinement
// bug is caught by env.check rather than clobbering the host; the seeds'
// own links to "/" only carry marker names.
func FuzzExtractTar(f *testing.F) {
	m := markerName()
	seeds := [][]byte{
		mkTar(f, file("a", "x"), dir("d/"), file("d/b", "y"), symlink("s", "a"), hardlink("h", "a")),
		mkTar(f, file("../evil", "x"), file("/abs", "y")),
		mkTar(f, symlink("l", "/"), file("l/"+m, "1"), symlink("u", "../../../../.."), file("u/canary", "2")),
		mkTar(f, file("out/secret", "x"), file("up/canary", "x"), file("canarylink", "x"), hardlink("h", "outrel/secret")),
		mkTar(f, hardlink("h", "/etc/passwd"), hardlink("g", "../canary")),
		mkTar(f, ent{name: "c", typ: tar.TypeChar}, ent{name: "f", typ: tar.TypeFifo}, ent{name: "suid", body: "x", mode: 0o4755}),
		mkTar(f, file(strings.Repeat("p/", 60)+"q", "long"), file("bad\xff", "x")),
		mkTar(f, ent{name: "big", size: 10 << 30}),
	}
	for _, s := range seeds {
		f.Add(s)
	}
	// One environment per worker process: building a fresh one per
	// execution makes each run (and each of the many runs of input
	// minimization) slow enough to stall fuzzing.
	e := newEnv(f)
	dst := e.path("dst")
	f.Fuzz(func(t *testing.T, data []byte) {
		must(t, os.RemoveAll(dst))
		must(t, os.Mkdir(dst, 0o755))
		for name, target := range map[string]string{
			"abs":        e.base,
			"up":         "../../../../..",
			"out":        e.outside,
			"outrel":     "../../../../../outside",
			"canarylink": e.canary,
		} {
			must(t, os.Symlink(target, filepath.Join(dst, name)))
		}
		_, err := e.r.ExtractTar(bytes.NewReader(data), "dst", TarLimits{MaxBytes: 1 << 20, MaxEntries: 1000})
		switch Kind(err) {
		case "", wire.ErrInvalid, wire.ErrTooLarge, wire.ErrLimit, wire.ErrExists, wire.ErrNotFound:
		default:
			t.Errorf("unexpected error kind %q: %v", Kind(err), err)
		}
		if left := tempLeft(t, e.root); len(left) > 0 {
			t.Errorf("temporary files left: %v", left)
		}
		te := *e
		te.t = t
		te.check()
	})
}
