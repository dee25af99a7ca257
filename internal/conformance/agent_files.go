// The Files group: the file API. Write and read round trips, modes, stat,
// list, mkdir, remove and move; the agent sees the sandbox's own files (its
// /etc, never the host's); and hostile requests: paths that climb out,
// symlinks that escape the sandbox, non-regular files, writes over
// symlinks, and sizes over the limits.

package conformance

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/agent"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/wire"
)

func (h *Harness) agentFiles(t *testing.T) {
	s := h.newAgentSuite(t, backend.Config{})
	t.Run("RoundTrip", s.filesRoundTrip)
	t.Run("WriteMode", s.filesMode)
	t.Run("WriteErrors", s.filesWriteErrors)
	t.Run("Stat", s.filesStat)
	t.Run("List", s.filesList)
	t.Run("Mkdir", s.filesMkdir)
	t.Run("Remove", s.filesRemove)
	t.Run("Move", s.filesMove)
	t.Run("HostilePaths", s.filesHostilePaths)
	t.Run("SandboxOwnFiles", s.filesOwn)
	t.Run("SymlinkEscape", s.filesSymlinkEscape)
	t.Run("NonRegularReads", s.filesNonRegular)
	t.Run("WriteOverSymlink", s.filesWriteOverSymlink)
	t.Run("TooLarge", s.filesTooLarge)
	t.Run("StillHealthy", s.healthy)
}

func (s *agentSuite) write(t testing.TB, path string, data []byte, mode uint32) {
	t.Helper()
	if err := s.c.WriteFile(ctxFor(t, 60*time.Second), path, bytes.NewReader(data), mode); err != nil {
		t.Fatalf("write %s: %s", path, errInfo(err))
	}
}

func (s *agentSuite) read(t testing.TB, path string) []byte {
	t.Helper()
	b, err := s.c.ReadFile(ctxFor(t, 60*time.Second), path)
	if err != nil {
		t.Fatalf("read %s: %s", path, errInfo(err))
	}
	return b
}

func sha(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func (s *agentSuite) filesRoundTrip(t *testing.T) {
	var all []byte
	for range 64 {
		for b := range 256 {
			all = append(all, byte(b))
		}
	}
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"empty", []byte{}},
		{"binary", all},
		{"NULs only", make([]byte, 1000)},
		{"invalid UTF-8", []byte("\xff\xfe\xc3\x28\xed\xa0\x80")},
		{"5 MB random", randBytes(5 << 20)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := s.tmp + "/rt-" + strings.ReplaceAll(tc.name, " ", "-")
			s.write(t, p, tc.data, 0o644)
			if got := s.read(t, p); !bytes.Equal(got, tc.data) {
				t.Errorf("read back %d bytes %s; wrote %d", len(got), clip(got), len(tc.data))
			}
			// The file is in the sandbox, at that path, for its processes.
			out := s.sh(t, "sha256sum < "+p)
			if f := strings.Fields(out); len(f) == 0 || f[0] != sha(tc.data) {
				t.Errorf("sha256 inside the sandbox %q; want %s", out, sha(tc.data))
			}
		})
	}
	t.Run("overwrite with shorter", func(t *testing.T) {
		p := s.tmp + "/rt-overwrite"
		s.write(t, p, bytes.Repeat([]byte("long content "), 1000), 0o644)
		s.write(t, p, []byte("short"), 0o644)
		if got := s.read(t, p); string(got) != "short" {
			t.Errorf("after overwrite: %s", clip(got))
		}
	})
	t.Run("equivalent spellings", func(t *testing.T) {
		s.write(t, s.tmp+"/rt-spelling", []byte("same"), 0o644)
		rel := strings.TrimPrefix(s.tmp, "/")
		for _, p := range []string{rel + "/rt-spelling", "//" + rel + "//./rt-spelling", "/./" + rel + "/rt-spelling/"} {
			b, err := s.c.ReadFile(ctxFor(t, 10*time.Second), p)
			if err != nil || string(b) != "same" {
				t.Errorf("read %q: %q %s", p, b, errInfo(err))
			}
		}
	})
}

func (s *agentSuite) filesMode(t *testing.T) {
	for _, tc := range []struct {
		mode, want uint32
	}{
		{0o644, 0o644},
		{0o600, 0o600},
		{0o755, 0o755},
		{0o444, 0o444},
		{0o777, 0o777}, // exact: no umask
		{0o4755, 0o755},
		{0o2755, 0o755},
		{0o1777, 0o777},
	} {
		t.Run(fmt.Sprintf("%04o", tc.mode), func(t *testing.T) {
			p := fmt.Sprintf("%s/mode-%04o", s.tmp, tc.mode)
			s.write(t, p, []byte("x"), tc.mode)
			fi, err := s.c.Stat(ctxFor(t, 10*time.Second), p)
			if err != nil {
				t.Fatal(errInfo(err))
			}
			if got := fi.Mode & 0o7777; got != tc.want || os.FileMode(fi.Mode)&os.ModeType != 0 {
				t.Errorf("mode %04o (%v); want %04o, a plain file", got, os.FileMode(fi.Mode), tc.want)
			}
			if out := strings.TrimSpace(s.sh(t, "stat -c %a "+p)); out != strconv.FormatUint(uint64(tc.want), 8) {
				t.Errorf("stat inside the sandbox says %s; want %o", out, tc.want)
			}
		})
	}
	t.Run("out of range", func(t *testing.T) {
		p := s.tmp + "/mode-bad"
		err := s.c.WriteFile(ctxFor(t, 10*time.Second), p, strings.NewReader("x"), 0o10000)
		s.fresh()
		wantKind(t, err, wire.ErrInvalid, "write with mode 010000")
		if _, err := s.c.Stat(ctxFor(t, 10*time.Second), p); !agent.IsKind(err, wire.ErrNotFound) {
			t.Errorf("rejected write left a file: %s", errInfo(err))
		}
	})
}

func (s *agentSuite) filesWriteErrors(t *testing.T) {
	s.sh(t, "mkdir -p "+s.tmp+"/we-dir/sub")
	for _, tc := range []struct {
		name, path, kind string
	}{
		{"missing parent", s.tmp + "/we-missing/f", wire.ErrNotFound},
		{"parent is a file", s.tmp + "/rt-binary/f", wire.ErrInvalid},
		{"onto a directory", s.tmp + "/we-dir", ""},
		{"the root", "/", wire.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := s.c.WriteFile(ctxFor(t, 10*time.Second), tc.path, strings.NewReader("x"), 0o644)
			s.fresh()
			if tc.kind == "" {
				if err == nil {
					t.Errorf("write onto a directory succeeded")
				}
			} else {
				wantKind(t, err, tc.kind, "write "+tc.path)
			}
		})
	}
	if out := s.sh(t, "ls -A "+s.tmp+"/we-dir"); out != "sub\n" {
		t.Errorf("failed writes left files behind: %q", out)
	}
}

func (s *agentSuite) filesStat(t *testing.T) {
	d := s.tmp + "/stat"
	s.sh(t, fmt.Sprintf("mkdir -p %[1]s/dir && printf 12345 > %[1]s/f && chmod 640 %[1]s/f && ln -s target-x %[1]s/lnk && ln -s dir %[1]s/dirlink && mkfifo %[1]s/fifo", d))
	now := time.Now()
	for _, tc := range []struct {
		name, path, wname, wpath, typ, target string
		size                                  int64
		modeType                              os.FileMode
		perm                                  uint32
	}{
		{"file", d + "/f", "f", d + "/f", "file", "", 5, 0, 0o640},
		{"dir", d + "/dir", "dir", d + "/dir", "dir", "", -1, os.ModeDir, 0o755},
		{"symlink not followed", d + "/lnk", "lnk", d + "/lnk", "symlink", "target-x", -1, os.ModeSymlink, 0o777},
		{"dir symlink not followed", d + "/dirlink", "dirlink", d + "/dirlink", "symlink", "dir", -1, os.ModeSymlink, 0o777},
		{"dotdot after a symlink", d + "/dirlink/../f", "", "", "", "", 0, 0, 0}, // ".." is rejected
		{"fifo", d + "/fifo", "fifo", d + "/fifo", "other", "", 0, os.ModeNamedPipe, 0},
		{"root", "/", "/", "/", "dir", "", -1, os.ModeDir, 0},
		{"root empty", "", "/", "/", "dir", "", -1, os.ModeDir, 0},
		{"messy spelling", "//" + strings.TrimPrefix(d, "/") + "/./f", "f", d + "/f", "file", "", 5, 0, 0o640},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fi, err := s.c.Stat(ctxFor(t, 10*time.Second), tc.path)
			if tc.typ == "" {
				wantKind(t, err, wire.ErrInvalid, "stat "+tc.path)
				return
			}
			if err != nil {
				t.Fatal(errInfo(err))
			}
			m := os.FileMode(fi.Mode)
			if fi.Name != tc.wname || fi.Path != tc.wpath || fi.Type != tc.typ || fi.Target != tc.target || m&os.ModeType != tc.modeType {
				t.Errorf("stat %q: %+v (mode %v); want name %q path %q type %q target %q mode type %v", tc.path, fi, m, tc.wname, tc.wpath, tc.typ, tc.target, tc.modeType)
			}
			if tc.size >= 0 && fi.Size != tc.size {
				t.Errorf("size %d, want %d", fi.Size, tc.size)
			}
			if tc.perm != 0 && fi.Mode&0o777 != tc.perm {
				t.Errorf("perm %o, want %o", fi.Mode&0o777, tc.perm)
			}
			if tc.path != "/" && tc.path != "" {
				if d := fi.ModTime.Sub(now); d < -10*time.Minute || d > 10*time.Minute {
					t.Errorf("mod_time %v is far from now %v", fi.ModTime, now)
				}
			}
		})
	}
	t.Run("through an intermediate symlink", func(t *testing.T) {
		s.sh(t, "echo hi > "+d+"/dir/inner")
		fi, err := s.c.Stat(ctxFor(t, 10*time.Second), d+"/dirlink/inner")
		if err != nil || fi.Type != "file" || fi.Size != 3 {
			t.Errorf("%+v %s", fi, errInfo(err))
		}
	})
	t.Run("missing", func(t *testing.T) {
		_, err := s.c.Stat(ctxFor(t, 10*time.Second), d+"/nope")
		wantKind(t, err, wire.ErrNotFound, "stat of a missing file")
	})
}

func (s *agentSuite) filesList(t *testing.T) {
	d := s.tmp + "/list"
	s.sh(t, fmt.Sprintf("mkdir -p %[1]s/d && cd %[1]s && touch b a C _ a.txt 'sp ace' && ln -s a z && ln -s d dl", d))
	want := []string{"C", "_", "a", "a.txt", "b", "d", "dl", "sp ace", "z"}
	list, err := s.c.List(ctxFor(t, 10*time.Second), d)
	if err != nil {
		t.Fatal(errInfo(err))
	}
	var names []string
	for _, fi := range list {
		names = append(names, fi.Name)
		if fi.Path != d+"/"+fi.Name {
			t.Errorf("entry %q has path %q", fi.Name, fi.Path)
		}
	}
	if !slices.Equal(names, want) {
		t.Errorf("list %q; want %q (sorted bytewise)", names, want)
	}
	types := map[string]string{}
	for _, fi := range list {
		types[fi.Name] = fi.Type
	}
	if types["d"] != "dir" || types["z"] != "symlink" || types["dl"] != "symlink" || types["a"] != "file" {
		t.Errorf("types %v", types)
	}
	t.Run("through a dir symlink", func(t *testing.T) {
		s.sh(t, "touch "+d+"/d/inner")
		l, err := s.c.List(ctxFor(t, 10*time.Second), d+"/dl")
		if err != nil || len(l) != 1 || l[0].Name != "inner" {
			t.Errorf("%+v %s", l, errInfo(err))
		}
	})
	t.Run("empty", func(t *testing.T) {
		s.sh(t, "mkdir -p "+d+"/empty")
		l, err := s.c.List(ctxFor(t, 10*time.Second), d+"/empty")
		if err != nil || len(l) != 0 {
			t.Errorf("%+v %s", l, errInfo(err))
		}
	})
	t.Run("a file", func(t *testing.T) {
		_, err := s.c.List(ctxFor(t, 10*time.Second), d+"/a")
		wantKind(t, err, wire.ErrInvalid, "list of a file")
	})
	t.Run("missing", func(t *testing.T) {
		_, err := s.c.List(ctxFor(t, 10*time.Second), d+"/missing")
		wantKind(t, err, wire.ErrNotFound, "list of a missing dir")
	})
}

func (s *agentSuite) filesMkdir(t *testing.T) {
	d := s.tmp + "/mkdir"
	s.sh(t, fmt.Sprintf("mkdir -p %[1]s && touch %[1]s/file", d))
	for _, tc := range []struct {
		name    string
		req     wire.MkdirRequest
		kind    string
		perm    uint32 // checked when set
		checkup string // an intermediate directory to check for 0755
	}{
		{"simple", wire.MkdirRequest{Path: d + "/m1"}, "", 0o755, ""},
		{"exists", wire.MkdirRequest{Path: d + "/m1"}, wire.ErrExists, 0, ""},
		{"missing parent", wire.MkdirRequest{Path: d + "/m2/a/b"}, wire.ErrNotFound, 0, ""},
		{"parents", wire.MkdirRequest{Path: d + "/m2/a/b", Parents: true, Mode: 0o700}, "", 0o700, d + "/m2/a"},
		{"parents existing", wire.MkdirRequest{Path: d + "/m2/a/b", Parents: true}, "", 0, ""},
		{"mode exact", wire.MkdirRequest{Path: d + "/m3", Mode: 0o777}, "", 0o777, ""},
		{"parents over a file", wire.MkdirRequest{Path: d + "/file", Parents: true}, wire.ErrExists, 0, ""},
		{"over a file", wire.MkdirRequest{Path: d + "/file"}, wire.ErrExists, 0, ""},
		{"below a file", wire.MkdirRequest{Path: d + "/file/x", Parents: true}, "any", 0, ""},
		{"root", wire.MkdirRequest{Path: "/"}, wire.ErrExists, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := s.c.Mkdir(ctxFor(t, 10*time.Second), tc.req)
			switch tc.kind {
			case "":
				if err != nil {
					t.Fatalf("mkdir %+v: %s", tc.req, errInfo(err))
				}
			case "any":
				if err == nil {
					t.Fatalf("mkdir %+v succeeded", tc.req)
				}
				return
			default:
				wantKind(t, err, tc.kind, fmt.Sprintf("mkdir %+v", tc.req))
				return
			}
			fi, err := s.c.Stat(ctxFor(t, 10*time.Second), tc.req.Path)
			if err != nil || fi.Type != "dir" {
				t.Fatalf("stat after mkdir: %+v %s", fi, errInfo(err))
			}
			if tc.perm != 0 && fi.Mode&0o7777 != tc.perm {
				t.Errorf("mode %o, want %o", fi.Mode&0o7777, tc.perm)
			}
			if tc.checkup != "" {
				if up, err := s.c.Stat(ctxFor(t, 10*time.Second), tc.checkup); err != nil || up.Mode&0o777 != 0o755 {
					t.Errorf("intermediate %s: %+v %s; want mode 755", tc.checkup, up, errInfo(err))
				}
			}
		})
	}
}

func (s *agentSuite) filesRemove(t *testing.T) {
	d := s.tmp + "/remove"
	s.sh(t, fmt.Sprintf(`mkdir -p %[1]s/empty %[1]s/full/sub/deeper %[1]s/keep && cd %[1]s && touch f full/a full/sub/b full/sub/deeper/c keep/k &&
ln -s keep linkdir && ln -s / linkroot && ln -s keep/k linkfile`, d))
	for _, tc := range []struct {
		name       string
		req        wire.RemoveRequest
		kind       string
		stillThere []string
	}{
		{"file", wire.RemoveRequest{Path: d + "/f"}, "", nil},
		{"empty dir", wire.RemoveRequest{Path: d + "/empty"}, "", nil},
		{"non-empty dir", wire.RemoveRequest{Path: d + "/full"}, wire.ErrInvalid, []string{d + "/full/sub/deeper/c"}},
		{"recursive", wire.RemoveRequest{Path: d + "/full", Recursive: true}, "", nil},
		{"symlink to dir, recursive", wire.RemoveRequest{Path: d + "/linkdir", Recursive: true}, "", []string{d + "/keep/k"}},
		{"symlink to root, recursive", wire.RemoveRequest{Path: d + "/linkroot", Recursive: true}, "", []string{"/etc/passwd", d + "/keep/k"}},
		{"symlink to file", wire.RemoveRequest{Path: d + "/linkfile"}, "", []string{d + "/keep/k"}},
		{"missing", wire.RemoveRequest{Path: d + "/nope"}, wire.ErrNotFound, nil},
		{"root", wire.RemoveRequest{Path: "/", Recursive: true}, wire.ErrPermission, []string{"/etc/passwd"}},
		{"root spelled empty", wire.RemoveRequest{Path: "", Recursive: true}, wire.ErrPermission, []string{"/etc/passwd"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := s.c.Remove(ctxFor(t, 30*time.Second), tc.req)
			if tc.kind != "" {
				wantKind(t, err, tc.kind, fmt.Sprintf("remove %+v", tc.req))
			} else {
				if err != nil {
					t.Fatalf("remove %+v: %s", tc.req, errInfo(err))
				}
				if _, err := s.c.Stat(ctxFor(t, 10*time.Second), tc.req.Path); !agent.IsKind(err, wire.ErrNotFound) {
					t.Errorf("%s still there: %s", tc.req.Path, errInfo(err))
				}
			}
			for _, p := range tc.stillThere {
				if _, err := s.c.Stat(ctxFor(t, 10*time.Second), p); err != nil {
					t.Errorf("%s went away: %s", p, errInfo(err))
				}
			}
		})
	}
}

func (s *agentSuite) filesMove(t *testing.T) {
	d := s.tmp + "/move"
	s.sh(t, fmt.Sprintf(`mkdir -p %[1]s/dir/sub && cd %[1]s && echo a > a && echo b > b && echo c > dir/sub/c && ln -s a lnk`, d))
	t.Run("file", func(t *testing.T) {
		if err := s.c.Move(ctxFor(t, 10*time.Second), d+"/a", d+"/a2"); err != nil {
			t.Fatal(errInfo(err))
		}
		if got := s.read(t, d+"/a2"); string(got) != "a\n" {
			t.Errorf("moved content %q", got)
		}
		if _, err := s.c.Stat(ctxFor(t, 10*time.Second), d+"/a"); !agent.IsKind(err, wire.ErrNotFound) {
			t.Errorf("source still there: %s", errInfo(err))
		}
	})
	t.Run("replaces a file", func(t *testing.T) {
		if err := s.c.Move(ctxFor(t, 10*time.Second), d+"/a2", d+"/b"); err != nil {
			t.Fatal(errInfo(err))
		}
		if got := s.read(t, d+"/b"); string(got) != "a\n" {
			t.Errorf("replaced content %q", got)
		}
	})
	t.Run("directory", func(t *testing.T) {
		if err := s.c.Move(ctxFor(t, 10*time.Second), d+"/dir", d+"/dir2"); err != nil {
			t.Fatal(errInfo(err))
		}
		if got := s.read(t, d+"/dir2/sub/c"); string(got) != "c\n" {
			t.Errorf("content after dir move %q", got)
		}
	})
	t.Run("symlink itself", func(t *testing.T) {
		if err := s.c.Move(ctxFor(t, 10*time.Second), d+"/lnk", d+"/lnk2"); err != nil {
			t.Fatal(errInfo(err))
		}
		fi, err := s.c.Stat(ctxFor(t, 10*time.Second), d+"/lnk2")
		if err != nil || fi.Type != "symlink" || fi.Target != "a" {
			t.Errorf("moved link: %+v %s", fi, errInfo(err))
		}
	})
	for _, tc := range []struct {
		name, from, to, kind string
	}{
		{"missing source", d + "/nope", d + "/x", wire.ErrNotFound},
		{"missing target parent", d + "/b", d + "/nope/x", wire.ErrNotFound},
		{"the root", "/", d + "/rootcopy", wire.ErrInvalid},
		{"onto the root", d + "/b", "/", wire.ErrInvalid},
		{"dir into itself", d + "/dir2", d + "/dir2/sub/inside", wire.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := s.c.Move(ctxFor(t, 10*time.Second), tc.from, tc.to)
			wantKind(t, err, tc.kind, fmt.Sprintf("move %q -> %q", tc.from, tc.to))
		})
	}
	if _, err := s.c.Stat(ctxFor(t, 10*time.Second), "/etc/passwd"); err != nil {
		t.Errorf("sandbox root damaged: %s", errInfo(err))
	}
}

func emptyTar() []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	_ = tw.Close()
	return b.Bytes()
}

func (s *agentSuite) filesHostilePaths(t *testing.T) {
	victim := s.tmp + "/hp-victim"
	s.write(t, victim, []byte("victim"), 0o644)
	passwd := s.read(t, "/etc/passwd")
	marker := "hp-" + randHex(4)
	paths := []struct{ name, path string }{
		{"dotdot", "../../etc/passwd"},
		{"inner dotdot", "a/../../x"},
		{"absolute dotdot", "/tmp/../etc/passwd"},
		{"bare dotdot", ".."},
		{"trailing dotdot", s.tmp + "/.."},
		{"dotdot escape name", "../../../../" + marker},
		{"NUL", "x\x00y"},
		{"NUL suffix", "/etc/passwd\x00.txt"},
		{"path over 4096 bytes", "/" + strings.Repeat("a/", 2048)},
		{"name over 255 bytes", s.tmp + "/" + strings.Repeat("n", 256)},
	}
	ops := []struct {
		name string
		do   func(ctx context.Context, p string) error
	}{
		{"ReadFile", func(ctx context.Context, p string) error { _, err := s.c.ReadFile(ctx, p); return err }},
		{"WriteFile", func(ctx context.Context, p string) error {
			return s.c.WriteFile(ctx, p, strings.NewReader("intruder:x:0:0::/:/bin/sh\n"), 0o644)
		}},
		{"Stat", func(ctx context.Context, p string) error { _, err := s.c.Stat(ctx, p); return err }},
		{"List", func(ctx context.Context, p string) error { _, err := s.c.List(ctx, p); return err }},
		{"Mkdir", func(ctx context.Context, p string) error { return s.c.Mkdir(ctx, wire.MkdirRequest{Path: p}) }},
		{"MkdirParents", func(ctx context.Context, p string) error {
			return s.c.Mkdir(ctx, wire.MkdirRequest{Path: p, Parents: true})
		}},
		{"Remove", func(ctx context.Context, p string) error { return s.c.Remove(ctx, wire.RemoveRequest{Path: p}) }},
		{"RemoveRecursive", func(ctx context.Context, p string) error {
			return s.c.Remove(ctx, wire.RemoveRequest{Path: p, Recursive: true})
		}},
		{"MoveFrom", func(ctx context.Context, p string) error { return s.c.Move(ctx, p, s.tmp+"/hp-moved") }},
		{"MoveTo", func(ctx context.Context, p string) error { return s.c.Move(ctx, victim, p) }},
		{"DownloadTar", func(ctx context.Context, p string) error {
			rc, err := s.c.DownloadTar(ctx, p)
			if err == nil {
				_ = rc.Close()
			}
			return err
		}},
		{"UploadTar", func(ctx context.Context, p string) error { return s.c.UploadTar(ctx, p, bytes.NewReader(emptyTar())) }},
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			for _, op := range ops {
				t.Run(op.name, func(t *testing.T) {
					err := op.do(ctxFor(t, 10*time.Second), p.path)
					s.fresh()
					wantKind(t, err, wire.ErrInvalid, fmt.Sprintf("%s %s", op.name, clip([]byte(p.path))))
				})
			}
		})
	}
	if got := s.read(t, "/etc/passwd"); !bytes.Equal(got, passwd) {
		t.Errorf("sandbox /etc/passwd changed")
	}
	if got := s.read(t, victim); string(got) != "victim" {
		t.Errorf("move source changed: %q", got)
	}
	hostAbsent(t, marker)
}

func (s *agentSuite) filesOwn(t *testing.T) {
	t.Run("/etc/hostname", func(t *testing.T) {
		in := s.mustExec(t, &wire.ExecRequest{Argv: []string{"cat", "/etc/hostname"}})
		got, err := s.c.ReadFile(ctxFor(t, 10*time.Second), "/etc/hostname")
		if in.Code == 0 {
			if err != nil || !bytes.Equal(got, in.Stdout) {
				t.Errorf("agent read %q %s; the sandbox's processes read %q", got, errInfo(err), in.Stdout)
			}
		} else {
			wantKind(t, err, wire.ErrNotFound, "read /etc/hostname, which the sandbox lacks")
		}
		marker := "sandbox-" + randHex(6) + "\n"
		s.write(t, "/etc/hostname", []byte(marker), 0o644)
		if r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"cat", "/etc/hostname"}}); string(r.Stdout) != marker {
			t.Errorf("sandbox processes read %v after the agent wrote %q", r, marker)
		}
		if host, _ := os.ReadFile("/etc/hostname"); string(host) == marker {
			t.Errorf("the host's /etc/hostname was written")
		}
	})
	t.Run("/etc/passwd", func(t *testing.T) {
		in := s.mustExec(t, &wire.ExecRequest{Argv: []string{"cat", "/etc/passwd"}})
		if got := s.read(t, "/etc/passwd"); in.Code != 0 || !bytes.Equal(got, in.Stdout) {
			t.Errorf("agent and sandbox disagree on /etc/passwd")
		}
	})
	t.Run("new file in /etc", func(t *testing.T) {
		name := "warren-marker-" + randHex(6)
		s.write(t, "/etc/"+name, []byte("inside"), 0o644)
		if r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"cat", "/etc/" + name}}); string(r.Stdout) != "inside" {
			t.Errorf("sandbox reads %v", r)
		}
		hostAbsent(t, name)
	})
}

func (s *agentSuite) filesSymlinkEscape(t *testing.T) {
	d := s.tmp + "/esc"
	s.sh(t, "mkdir -p "+d)
	for i, tc := range []struct {
		name, target string
		// inside is where the write lands in the sandbox when followed
		// inside the root; "" when the link must be refused.
		inside string
	}{
		{"absolute root", "/", "/"},
		{"dotdot chain", "../../../../../../../../", "/"},
		{"dotdot root-relative", "../../../..", "/"},
		{"absolute dotdots", "/../../../..", "/"},
		{"to tmp via dotdots", "../../../../../tmp", "/tmp/"},
		{"proc 1 root", "/proc/1/root", ""},
		{"proc self cwd", "/proc/self/cwd", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			link := fmt.Sprintf("%s/link%d", d, i)
			s.sh(t, fmt.Sprintf("ln -s '%s' %s", tc.target, link))
			name := "escape-" + randHex(6)
			content := []byte("written through " + tc.target)
			werr := s.c.WriteFile(ctxFor(t, 10*time.Second), link+"/"+name, bytes.NewReader(content), 0o644)
			s.fresh()
			merr := s.c.Mkdir(ctxFor(t, 10*time.Second), wire.MkdirRequest{Path: link + "/" + name + "-dir/x", Parents: true})
			hostAbsent(t, name, name+"-dir")
			if tc.inside == "" {
				if werr == nil || merr == nil {
					// Following the link is only acceptable if it
					// stays in the sandbox.
					r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "cat /" + name + " && test -d /" + name + "-dir/x"}})
					if r.Code != 0 {
						t.Errorf("write through %s succeeded (%s, %s) but the files are not in the sandbox root: %v", tc.target, errInfo(werr), errInfo(merr), r)
					}
				}
				return
			}
			if werr != nil || merr != nil {
				t.Fatalf("write through a link to %s (followed inside the root) failed: %s / %s", tc.target, errInfo(werr), errInfo(merr))
			}
			at := tc.inside + name
			r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "cat " + at + " && test -d " + at + "-dir/x"}})
			if r.Code != 0 || !bytes.Equal(r.Stdout, content) {
				t.Errorf("the file should be at %s in the sandbox: %v", at, r)
			}
			if got := s.read(t, at); !bytes.Equal(got, content) {
				t.Errorf("read of %s: %q", at, got)
			}
		})
	}
}

func (s *agentSuite) filesNonRegular(t *testing.T) {
	d := s.tmp + "/nonreg"
	s.sh(t, fmt.Sprintf("mkdir -p %[1]s/dir && echo x > %[1]s/dir/f && mkfifo %[1]s/fifo", d))
	s.mustExec(t, &wire.ExecRequest{Argv: []string{"python3", "-c", "import socket; socket.socket(socket.AF_UNIX).bind('" + d + "/sock')"}})
	// A reader stuck opening the FIFO is released by a writer.
	defer s.mustExec(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "exec 3<>" + d + "/fifo; sleep 0.2"}, TimeoutMs: 5000})
	for _, tc := range []struct{ name, path string }{
		{"directory", d + "/dir"},
		{"root", "/"},
		{"fifo", d + "/fifo"},
		{"socket", d + "/sock"},
		{"/dev/null", "/dev/null"},
		{"/dev/zero", "/dev/zero"},
		{"/dev/urandom", "/dev/urandom"},
		{"/proc/self/exe", "/proc/self/exe"},
		{"/proc/self/root/etc/passwd", "/proc/self/root/etc/passwd"},
		{"/proc/1/cwd", "/proc/1/cwd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			b, err := s.c.ReadFile(ctxFor(t, 5*time.Second), tc.path)
			if took := time.Since(start); took > 4*time.Second {
				t.Errorf("read of %s hung for %v", tc.path, took)
			}
			wantKind(t, err, wire.ErrInvalid, fmt.Sprintf("read of %s (got %d bytes)", tc.path, len(b)))
		})
	}
	t.Run("tar of a fifo", func(t *testing.T) {
		rc, err := s.c.DownloadTar(ctxFor(t, 5*time.Second), d+"/fifo")
		if err != nil {
			wantKind(t, err, wire.ErrInvalid, "tar of a fifo")
			return
		}
		defer func() { _ = rc.Close() }()
		tr := tar.NewReader(rc)
		hdr, rerr := tr.Next()
		// An empty, cleanly ended answer would tell the client the FIFO
		// is an empty archive.
		if rerr == io.EOF || (rerr == nil && hdr != nil) {
			t.Errorf("tar of a fifo answered success (first entry %v, %v); want an error of kind invalid", hdr, rerr)
		}
	})
	t.Run("tar of a dir skips special files", func(t *testing.T) {
		names := tarNames(t, s, d)
		if !slices.Equal(names, []string{"dir/", "dir/f"}) {
			t.Errorf("tar of %s: %q; want the directory and its file, no fifo or socket", d, names)
		}
	})
}

func tarNames(t testing.TB, s *agentSuite, p string) []string {
	t.Helper()
	rc, err := s.c.DownloadTar(ctxFor(t, 30*time.Second), p)
	if err != nil {
		t.Fatalf("download %s: %s", p, errInfo(err))
	}
	defer func() { _ = rc.Close() }()
	var names []string
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names
		}
		if err != nil {
			t.Fatalf("tar of %s: %v", p, err)
		}
		names = append(names, hdr.Name)
	}
}

func (s *agentSuite) filesWriteOverSymlink(t *testing.T) {
	d := s.tmp + "/over"
	s.sh(t, fmt.Sprintf("mkdir -p %[1]s && ln -s /etc/passwd %[1]s/to-passwd && ln -s %[1]s/no-such-target %[1]s/dangling", d))
	passwd := s.read(t, "/etc/passwd")
	for _, name := range []string{"to-passwd", "dangling"} {
		t.Run(name, func(t *testing.T) {
			p := d + "/" + name
			s.write(t, p, []byte("replaced"), 0o600)
			fi, err := s.c.Stat(ctxFor(t, 10*time.Second), p)
			if err != nil || fi.Type != "file" || fi.Size != 8 {
				t.Errorf("after write: %+v %s; want a regular file replacing the link", fi, errInfo(err))
			}
			if got := s.read(t, "/etc/passwd"); !bytes.Equal(got, passwd) {
				t.Errorf("the link's target /etc/passwd was written")
			}
			if _, err := s.c.Stat(ctxFor(t, 10*time.Second), d+"/no-such-target"); !agent.IsKind(err, wire.ErrNotFound) {
				t.Errorf("the dangling link's target was created: %s", errInfo(err))
			}
		})
	}
}

// zeros is an io.Reader of n zero bytes.
type zeros struct{ n int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	k := min(int64(len(p)), z.n)
	clear(p[:k])
	z.n -= k
	return int(k), nil
}

func (s *agentSuite) filesTooLarge(t *testing.T) {
	d := s.tmp + "/large"
	s.sh(t, fmt.Sprintf("mkdir -p %[1]s && truncate -s %[2]d %[1]s/over && truncate -s %[3]d %[1]s/under", d, wire.MaxFileRead+1, 1<<20))
	t.Run("read over MaxFileRead", func(t *testing.T) {
		_, err := s.c.ReadFile(ctxFor(t, 30*time.Second), d+"/over")
		wantKind(t, err, wire.ErrTooLarge, "read of a MaxFileRead+1 byte file")
	})
	t.Run("sparse read under the limit", func(t *testing.T) {
		if b := s.read(t, d+"/under"); len(b) != 1<<20 || !bytes.Equal(b, make([]byte, 1<<20)) {
			t.Errorf("read %d bytes", len(b))
		}
	})
	t.Run("write over MaxFileWrite", func(t *testing.T) {
		p := d + "/too-big"
		err := s.c.WriteFile(ctxFor(t, 120*time.Second), p, &zeros{wire.MaxFileWrite + 1}, 0o644)
		s.fresh()
		wantKind(t, err, wire.ErrTooLarge, "write of MaxFileWrite+1 bytes")
		list, lerr := s.c.List(ctxFor(t, 10*time.Second), d)
		if lerr != nil {
			t.Fatal(errInfo(lerr))
		}
		for _, fi := range list {
			if fi.Name != "over" && fi.Name != "under" {
				t.Errorf("failed write left %s (%d bytes)", fi.Name, fi.Size)
			}
		}
	})
}
