// The Tar group: directories and files downloaded and uploaded as tar
// archives, round trip; and hostile archives (dotdot and absolute names,
// hard links and symlinks out of the destination, oversized and short
// entries) that must land inside their destination or be refused.

package conformance

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/agent"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/wire"
)

func (h *Harness) agentTar(t *testing.T) {
	s := h.newAgentSuite(t, backend.Config{})
	t.Run("RoundTrip", s.tarRoundTrip)
	t.Run("Hostile", s.tarHostile)
	t.Run("StillHealthy", s.healthy)
}

type tarEnt struct {
	hdr  tar.Header
	body []byte
}

func buildTar(t testing.TB, ents []tarEnt) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range ents {
		hdr := e.hdr
		if hdr.ModTime.IsZero() {
			hdr.ModTime = time.Unix(1700000000, 0)
		}
		if hdr.Typeflag == tar.TypeReg || hdr.Typeflag == 0 {
			hdr.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(&hdr); err != nil {
			t.Fatalf("tar header %q: %v", hdr.Name, err)
		}
		if len(e.body) > 0 {
			if _, err := tw.Write(e.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

type tarItem struct {
	typ  byte
	mode int64
	link string
	body []byte
}

func readTar(t testing.TB, r io.Reader) (map[string]tarItem, []string) {
	t.Helper()
	m := map[string]tarItem{}
	var order []string
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return m, order
		}
		if err != nil {
			t.Fatalf("read tar: %v", err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("read tar entry %q: %v", hdr.Name, err)
		}
		m[hdr.Name] = tarItem{hdr.Typeflag, hdr.Mode, hdr.Linkname, body}
		order = append(order, hdr.Name)
	}
}

func (s *agentSuite) tarRoundTrip(t *testing.T) {
	bin := bytes.Repeat(func() []byte {
		b := make([]byte, 256)
		for i := range b {
			b[i] = byte(i)
		}
		return b
	}(), 64)
	rnd := randBytes(300000)
	ents := []tarEnt{
		{hdr: tar.Header{Name: "sub/", Typeflag: tar.TypeDir, Mode: 0o750}},
		{hdr: tar.Header{Name: "bin.dat", Typeflag: tar.TypeReg, Mode: 0o644}, body: bin},
		{hdr: tar.Header{Name: "random", Typeflag: tar.TypeReg, Mode: 0o600}, body: rnd},
		{hdr: tar.Header{Name: "empty", Typeflag: tar.TypeReg, Mode: 0o600}},
		{hdr: tar.Header{Name: "exec.sh", Typeflag: tar.TypeReg, Mode: 0o755}, body: []byte("#!/bin/sh\necho hi\n")},
		{hdr: tar.Header{Name: "sub/deep/x.txt", Typeflag: tar.TypeReg, Mode: 0o640}, body: []byte("deep")},
		{hdr: tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "sub/deep/x.txt"}},
		{hdr: tar.Header{Name: "abs-link", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"}},
		{hdr: tar.Header{Name: "dangling", Typeflag: tar.TypeSymlink, Linkname: "no/such"}},
		{hdr: tar.Header{Name: "hard", Typeflag: tar.TypeLink, Linkname: "bin.dat"}},
		{hdr: tar.Header{Name: "ünï cödé name", Typeflag: tar.TypeReg, Mode: 0o644}, body: []byte("u")},
	}
	src := s.tmp + "/tarrt/src"
	if err := s.c.UploadTar(ctxFor(t, 60*time.Second), src, bytes.NewReader(buildTar(t, ents))); err != nil {
		t.Fatalf("upload: %s", errInfo(err))
	}
	inside := s.sh(t, "cd "+src+` && cat sub/deep/x.txt && echo && readlink link abs-link dangling && stat -c '%a %h' exec.sh sub sub/deep bin.dat && sha256sum random | cut -d' ' -f1`)
	wantInside := "deep\nsub/deep/x.txt\n/etc/passwd\nno/such\n755 1\n750 3\n755 2\n644 2\n" + sha(rnd) + "\n"
	if inside != wantInside {
		t.Errorf("extracted tree seen from inside:\n%s\nwant:\n%s", inside, wantInside)
	}

	rc, err := s.c.DownloadTar(ctxFor(t, 60*time.Second), src)
	if err != nil {
		t.Fatalf("download: %s", errInfo(err))
	}
	raw, err := io.ReadAll(rc)
	_ = rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	got, order := readTar(t, bytes.NewReader(raw))
	want := map[string]tarItem{
		"sub/":           {tar.TypeDir, 0o750, "", []byte{}},
		"sub/deep/":      {tar.TypeDir, 0o755, "", []byte{}},
		"bin.dat":        {tar.TypeReg, 0o644, "", bin},
		"hard":           {tar.TypeReg, 0o644, "", bin},
		"random":         {tar.TypeReg, 0o600, "", rnd},
		"empty":          {tar.TypeReg, 0o600, "", []byte{}},
		"exec.sh":        {tar.TypeReg, 0o755, "", []byte("#!/bin/sh\necho hi\n")},
		"sub/deep/x.txt": {tar.TypeReg, 0o640, "", []byte("deep")},
		"link":           {tar.TypeSymlink, -1, "sub/deep/x.txt", []byte{}},
		"abs-link":       {tar.TypeSymlink, -1, "/etc/passwd", []byte{}},
		"dangling":       {tar.TypeSymlink, -1, "no/such", []byte{}},
		"ünï cödé name":  {tar.TypeReg, 0o644, "", []byte("u")},
	}
	for name, w := range want {
		g, ok := got[name]
		switch {
		case !ok:
			t.Errorf("download lacks %q (has %q)", name, order)
		case g.typ != w.typ || g.link != w.link || !bytes.Equal(g.body, w.body) || (w.mode >= 0 && g.mode&0o7777 != w.mode):
			t.Errorf("entry %q: type %c mode %o link %q body %s; want type %c mode %o link %q body %s", name, g.typ, g.mode, g.link, clip(g.body), w.typ, w.mode, w.link, clip(w.body))
		}
	}
	for _, name := range order {
		if _, ok := want[name]; !ok {
			t.Errorf("unexpected entry %q", name)
		}
		if strings.HasPrefix(name, "/") || slices.Contains(strings.Split(name, "/"), "..") {
			t.Errorf("unsafe entry name %q", name)
		}
	}

	t.Run("re-upload makes a copy", func(t *testing.T) {
		cp := s.tmp + "/tarrt/copy"
		if err := s.c.UploadTar(ctxFor(t, 60*time.Second), cp, bytes.NewReader(raw)); err != nil {
			t.Fatalf("upload: %s", errInfo(err))
		}
		list := `find . -printf '%p %y %m %s %l\n' | LC_ALL=C sort`
		a := s.sh(t, "cd "+src+" && "+list)
		b := s.sh(t, "cd "+cp+" && "+list)
		if a != b {
			t.Errorf("copy differs:\n%s\nvs\n%s", a, b)
		}
	})
	t.Run("single file", func(t *testing.T) {
		rc, err := s.c.DownloadTar(ctxFor(t, 30*time.Second), src+"/bin.dat")
		if err != nil {
			t.Fatal(errInfo(err))
		}
		defer func() { _ = rc.Close() }()
		m, order := readTar(t, rc)
		if len(order) != 1 || order[0] != "bin.dat" || !bytes.Equal(m["bin.dat"].body, bin) {
			t.Errorf("tar of one file: %q", order)
		}
	})
	t.Run("symlink not followed", func(t *testing.T) {
		rc, err := s.c.DownloadTar(ctxFor(t, 30*time.Second), src+"/abs-link")
		if err != nil {
			t.Fatal(errInfo(err))
		}
		defer func() { _ = rc.Close() }()
		m, order := readTar(t, rc)
		if len(order) != 1 || m["abs-link"].typ != tar.TypeSymlink || m["abs-link"].link != "/etc/passwd" {
			t.Errorf("tar of a symlink: %q %+v", order, m)
		}
	})
	t.Run("missing", func(t *testing.T) {
		_, err := s.c.DownloadTar(ctxFor(t, 30*time.Second), src+"/nope")
		wantKind(t, err, wire.ErrNotFound, "tar of a missing path")
	})
}

// shortTar is a tar whose only entry's header claims size bytes but whose
// stream ends after body.
func shortTar(t testing.TB, name string, size int64, body []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size, ModTime: time.Unix(1700000000, 0)}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(body); err != nil {
		t.Fatal(err)
	}
	return b.Bytes() // no Close: the stream is cut short
}

func (s *agentSuite) tarHostile(t *testing.T) {
	base := s.tmp + "/tarh"
	for i, tc := range []struct {
		name string
		pre  string // shell run in dest before the upload
		tar  func(r string) []byte
		kind string // "" = success; "any" = any error; "either" = not checked
		// present are paths relative to dest that must exist after;
		// absent must not.
		present, absent []string
		// check runs in dest after the upload and must print "ok".
		check string
	}{
		{name: "dotdot entry",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{
					{hdr: tar.Header{Name: "ok-first", Mode: 0o644}, body: []byte("1")},
					{hdr: tar.Header{Name: "../evil-" + r, Mode: 0o644}, body: []byte("evil")},
				})
			},
			kind: wire.ErrInvalid, present: []string{"ok-first"}},
		{name: "nested dotdot entry",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{{hdr: tar.Header{Name: "a/../../evil-" + r, Mode: 0o644}, body: []byte("evil")}})
			},
			kind: wire.ErrInvalid},
		{name: "deep dotdot entry",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{{hdr: tar.Header{Name: "../../../../../../tmp/evil-" + r, Mode: 0o644}, body: []byte("evil")}})
			},
			kind: wire.ErrInvalid},
		{name: "absolute entry lands in dest",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{{hdr: tar.Header{Name: "/abs-" + r, Mode: 0o644}, body: []byte("abs")}})
			},
			present: []string{"abs-R"}},
		{name: "hardlink to /etc/shadow",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{{hdr: tar.Header{Name: "h-" + r, Typeflag: tar.TypeLink, Linkname: "/etc/shadow"}}})
			},
			kind: wire.ErrInvalid, absent: []string{"h-R"}},
		{name: "hardlink to /etc/passwd outside dest",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{{hdr: tar.Header{Name: "h-" + r, Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}}})
			},
			kind: wire.ErrInvalid, absent: []string{"h-R"}},
		{name: "hardlink dotdot",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{{hdr: tar.Header{Name: "h-" + r, Typeflag: tar.TypeLink, Linkname: "../../x"}}})
			},
			kind: wire.ErrInvalid, absent: []string{"h-R"}},
		{name: "hardlink through a symlink to /etc",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{
					{hdr: tar.Header{Name: "etc-link", Typeflag: tar.TypeSymlink, Linkname: "/etc"}},
					{hdr: tar.Header{Name: "h-" + r, Typeflag: tar.TypeLink, Linkname: "etc-link/passwd"}},
				})
			},
			kind: wire.ErrInvalid, absent: []string{"h-R"}},
		{name: "hardlink to a symlink",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{
					{hdr: tar.Header{Name: "pl", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"}},
					{hdr: tar.Header{Name: "h-" + r, Typeflag: tar.TypeLink, Linkname: "pl"}},
				})
			},
			kind: wire.ErrInvalid, absent: []string{"h-R"}},
		{name: "write through a symlink to /",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{
					{hdr: tar.Header{Name: "root", Typeflag: tar.TypeSymlink, Linkname: "/"}},
					{hdr: tar.Header{Name: "root/tmp/esc-" + r, Mode: 0o644}, body: []byte("esc")},
					{hdr: tar.Header{Name: "root/etc/esc-" + r, Mode: 0o644}, body: []byte("esc")},
				})
			},
			present: []string{"tmp/esc-R", "etc/esc-R"}},
		{name: "write through a dotdot symlink",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{
					{hdr: tar.Header{Name: "up", Typeflag: tar.TypeSymlink, Linkname: "../../../../../.."}},
					{hdr: tar.Header{Name: "up/esc-" + r, Mode: 0o644}, body: []byte("esc")},
					{hdr: tar.Header{Name: "up/newdir-" + r + "/", Typeflag: tar.TypeDir, Mode: 0o755}},
				})
			},
			present: []string{"esc-R", "newdir-R"}},
		{name: "symlink to parent then dir",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{
					{hdr: tar.Header{Name: "p", Typeflag: tar.TypeSymlink, Linkname: ".."}},
					{hdr: tar.Header{Name: "p/pdir-" + r + "/f", Mode: 0o644}, body: []byte("x")},
				})
			},
			present: []string{"pdir-R/f"}},
		{name: "existing symlink in dest to /etc",
			pre: "ln -s /etc etc-pre",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{{hdr: tar.Header{Name: "etc-pre/pre-" + r, Mode: 0o644}, body: []byte("x")}})
			},
			// Refusing, or following the link inside dest, are both
			// fine; /etc must not change (checked for every case).
			kind: "either"},
		{name: "file replaces existing symlink",
			pre: "ln -s /etc/passwd victim",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{{hdr: tar.Header{Name: "victim", Mode: 0o644}, body: []byte("intruder:x:0:0::/:/bin/sh\n")}})
			},
			check: `test -f victim && ! test -L victim && echo ok`},
		{name: "dir replaces existing symlink",
			pre: "ln -s /etc dl",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{
					{hdr: tar.Header{Name: "dl/", Typeflag: tar.TypeDir, Mode: 0o755}},
					{hdr: tar.Header{Name: "dl/x-" + r, Mode: 0o644}, body: []byte("x")},
				})
			},
			present: []string{"dl/x-R"}, check: `test -d dl && ! test -L dl && echo ok`},
		{name: "10 GB size header with a short body",
			tar:  func(r string) []byte { return shortTar(t, "big-"+r, 10<<30, make([]byte, 1000)) },
			kind: wire.ErrTooLarge, absent: []string{"big-R"}},
		{name: "1 MB size header with a short body",
			tar:  func(r string) []byte { return shortTar(t, "short-"+r, 1<<20, make([]byte, 1000)) },
			kind: wire.ErrInvalid, absent: []string{"short-R"}},
		{name: "garbage",
			tar:  func(r string) []byte { return randBytes(4096) },
			kind: wire.ErrInvalid},
		{name: "setuid, device and fifo entries",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{
					{hdr: tar.Header{Name: "suid", Mode: 0o4755}, body: []byte("#!/bin/sh\n")},
					{hdr: tar.Header{Name: "null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}},
					{hdr: tar.Header{Name: "fifo", Typeflag: tar.TypeFifo, Mode: 0o644}},
				})
			},
			absent: []string{"null", "fifo"}, check: `test "$(stat -c %a suid)" = 755 && echo ok`},
		{name: "entry naming the destination as a file",
			tar: func(r string) []byte {
				return buildTar(t, []tarEnt{{hdr: tar.Header{Name: ".", Typeflag: tar.TypeReg, Mode: 0o644}}})
			},
			kind: wire.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := randHex(5)
			dest := fmt.Sprintf("%s/%d", base, i)
			stamp := fmt.Sprintf("%s/%d.stamp", base, i)
			pre := "true"
			if tc.pre != "" {
				pre = tc.pre
			}
			statStamp := "stat -c '%y %z %s %i %h' " + stamp
			stampBefore := s.sh(t, fmt.Sprintf("mkdir -p %s && cd %s && %s && sleep 0.02 && touch %s && sleep 0.02 && %s", dest, dest, pre, stamp, statStamp))
			err := s.c.UploadTar(ctxFor(t, 60*time.Second), dest, bytes.NewReader(tc.tar(r)))
			s.fresh()
			switch tc.kind {
			case "":
				if err != nil {
					t.Errorf("upload failed: %s", errInfo(err))
				}
			case "any":
				if err == nil {
					t.Errorf("upload succeeded; want an error")
				}
			case "either":
			default:
				wantKind(t, err, tc.kind, "upload")
			}
			// Nothing outside dest changed inside the sandbox. -cnewer
			// compares a file's ctime with the stamp's mtime, and the
			// stamp's own two were once seen a tick apart with nothing
			// touching it (in the cgroup v2 VM), so the stamp itself is
			// checked by comparing its stat before and after.
			changed := s.sh(t, fmt.Sprintf("find / /tmp /etc -xdev -cnewer %[1]s -not -path '%[1]s' -not -path '%[2]s' -not -path '%[2]s/*' 2>/dev/null | sort -u", stamp, dest))
			if changed != "" {
				t.Errorf("files outside the destination changed:\n%s", changed)
			}
			if after := s.sh(t, statStamp); after != stampBefore {
				t.Errorf("the stamp beside the destination changed: %q, then %q", stampBefore, after)
			}
			sub := func(p string) string { return strings.ReplaceAll(p, "R", r) }
			for _, p := range tc.present {
				if _, err := s.c.Stat(ctxFor(t, 10*time.Second), dest+"/"+sub(p)); err != nil {
					t.Errorf("%s missing in the destination: %s", sub(p), errInfo(err))
				}
			}
			for _, p := range tc.absent {
				if _, err := s.c.Stat(ctxFor(t, 10*time.Second), dest+"/"+sub(p)); !agent.IsKind(err, wire.ErrNotFound) {
					t.Errorf("%s should not exist: %s", sub(p), errInfo(err))
				}
			}
			if tc.check != "" {
				if out := s.sh(t, "cd "+dest+" && { "+tc.check+"; }"); out != "ok\n" {
					t.Errorf("check %q: %q", tc.check, out)
				}
			}
			if left := s.sh(t, "find "+dest+" -name '.warren-*' 2>/dev/null"); left != "" {
				t.Errorf("temporary files left: %s", left)
			}
			for _, n := range []string{"evil-", "esc-", "abs-", "h-", "newdir-", "pdir-", "pre-", "big-", "short-", "x-"} {
				hostAbsent(t, n+r)
			}
		})
	}
	if _, err := s.c.Stat(ctxFor(t, 10*time.Second), "/etc/passwd"); err != nil {
		t.Errorf("sandbox /etc/passwd: %s", errInfo(err))
	}
}
