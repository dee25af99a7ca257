package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCp: files, directories and symlinks both ways through a real server,
// into existing directories and onto new names, and tar streams on stdin
// and stdout.
func TestCp(t *testing.T) {
	dir, client, cmd := serverClient(t)
	if r := client("", "create", "box"); r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	defer client("", "rm", "-f", "box")
	h := filepath.Join(dir, "host")
	for p, data := range map[string]string{"src/a": "a\n", "src/sub/b": "b\n", "file": "f\n"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(h, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(h, p), []byte(data), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(h, "src/lnk")); err != nil {
		t.Fatal(err)
	}
	must := func(stdin string, args ...string) string {
		t.Helper()
		r := client(stdin, args...)
		if r.code != 0 {
			t.Fatalf("%v: %+v", args, r)
		}
		return r.stdout
	}
	must("", "cp", filepath.Join(h, "src"), "box:/tmp")          // into a directory
	must("", "cp", filepath.Join(h, "file"), "box:/tmp/renamed") // onto a new name
	must("", "cp", filepath.Join(h, "src"), "box:/tmp/src2")     // a directory onto a new name
	if got := must("", "exec", "box", "--", "sh", "-c", "cat /tmp/src/a /tmp/src/sub/b /tmp/renamed /tmp/src2/a; readlink /tmp/src/lnk; stat -c %a /tmp/renamed"); got != "a\nb\nf\na\n/etc/passwd\n640\n" {
		t.Fatalf("in the sandbox: %q", got)
	}
	out := filepath.Join(h, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	must("", "cp", "box:/tmp/src", out)                            // into a directory
	must("", "cp", "box:/tmp/renamed", filepath.Join(out, "copy")) // onto a new name
	must("", "cp", "box:/tmp/src", filepath.Join(h, "out2"))       // a directory onto a new name
	for p, want := range map[string]string{"out/src/a": "a\n", "out/src/sub/b": "b\n", "out/copy": "f\n", "out2/sub/b": "b\n"} {
		if b, err := os.ReadFile(filepath.Join(h, p)); err != nil || string(b) != want {
			t.Errorf("%s: %q, %v", p, b, err)
		}
	}
	if l, err := os.Readlink(filepath.Join(out, "src/lnk")); err != nil || l != "/etc/passwd" {
		t.Errorf("symlink copied out: %q, %v", l, err)
	}
	// Tar streams: out of the sandbox on stdout, into it from stdin.
	c := cmd("cp", "box:/tmp/src", "-")
	tarOut, err := c.Output()
	if err != nil {
		t.Fatal(err)
	}
	names := tarNames(t, tarOut)
	if !strings.Contains(names, "sub/b") || !strings.Contains(names, "lnk") {
		t.Fatalf("tar on stdout: %s", names)
	}
	must(string(tarOut), "cp", "-", "box:/tmp/fromtar")
	if got := must("", "exec", "box", "--", "cat", "/tmp/fromtar/sub/b"); got != "b\n" {
		t.Fatalf("tar from stdin: %q", got)
	}
	for _, tc := range []struct {
		args      []string
		code      int
		stderrHas string
	}{
		{[]string{"cp", "box:/no/such", out}, 1, "box:/no/such: no such file or directory"},
		{[]string{"cp", filepath.Join(h, "nosuch"), "box:/tmp"}, 1, "no such file"},
		{[]string{"cp", filepath.Join(h, "file"), "box:/no/dir/x"}, 1, "box:/no/dir: no such directory"},
		{[]string{"cp", filepath.Join(h, "src"), "box:/tmp/renamed"}, 1, "is not a directory"},
		{[]string{"cp", h, out}, 2, "one of SRC and DST must be NAME:PATH"},
		{[]string{"cp", "box:tmp", out}, 2, "must be absolute"},
		{[]string{"cp", "box:/tmp"}, 2, "want SRC and DST"},
	} {
		if r := client("", tc.args...); r.code != tc.code || !strings.Contains(r.stderr, tc.stderrHas) {
			t.Errorf("%v: %+v, want code %d and %q", tc.args, r, tc.code, tc.stderrHas)
		}
	}
}

func tarNames(t *testing.T, b []byte) string {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	var names []string
	for {
		hdr, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, hdr.Name)
	}
	return strings.Join(names, " ")
}

// TestCpHostileTar: a server (standing in for a sandbox whose agent was
// taken over) answers warren cp with tars made to write outside the
// directory copied into: none of them does.
func TestCpHostileTar(t *testing.T) {
	type entry struct {
		name, link string
		typ        byte
		data       string
	}
	for _, tc := range []struct {
		name    string
		srcType string // what the stat answers
		entries []entry
		errHas  string
	}{
		{"dot-dot", "dir", []entry{{name: "../escaped", typ: tar.TypeReg, data: "x"}}, `contains a ".." component`},
		{"absolute", "dir", []entry{{name: "/escaped", typ: tar.TypeReg, data: "x"}}, ""},
		{"through a symlink", "dir", []entry{{name: "l", link: "../..", typ: tar.TypeSymlink}, {name: "l/escaped", typ: tar.TypeReg, data: "x"}}, ""},
		{"through an absolute symlink", "dir", []entry{{name: "l", link: "/", typ: tar.TypeSymlink}, {name: "l/escaped", typ: tar.TypeReg, data: "x"}}, ""},
		{"hard link out", "dir", []entry{{name: "h", link: "../secret", typ: tar.TypeLink}}, `contains a ".." component`},
		{"a file that became a directory", "file", []entry{{name: "a", typ: tar.TypeReg, data: "x"}, {name: "../escaped", typ: tar.TypeReg, data: "x"}}, "more than the one file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tb bytes.Buffer
			tw := tar.NewWriter(&tb)
			for _, e := range tc.entries {
				hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.data))}
				if err := tw.WriteHeader(hdr); err != nil {
					t.Fatal(err)
				}
				if _, err := tw.Write([]byte(e.data)); err != nil {
					t.Fatal(err)
				}
			}
			if err := tw.Close(); err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/api/v1/rpc" {
					_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": 1, "result": map[string]any{"type": tc.srcType}})
					return
				}
				w.Header().Set("Content-Type", "application/x-tar")
				_, _ = w.Write(tb.Bytes())
			}))
			defer srv.Close()
			// base/target is copied into; base/secret is beside it.
			base := t.TempDir()
			target := filepath.Join(base, "target")
			if err := os.Mkdir(target, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(base, "secret"), []byte("s"), 0o600); err != nil {
				t.Fatal(err)
			}
			dst := target
			if tc.srcType == "file" {
				dst = filepath.Join(target, "new")
			}
			c := warren(t, t.TempDir(), "cp", "--server", srv.URL, "box:/x", dst)
			r := run(t, c, "")
			if tc.errHas != "" && (r.code != 1 || !strings.Contains(r.stderr, tc.errHas)) {
				t.Errorf("%+v, want an error with %q", r, tc.errHas)
			}
			if tc.errHas == "" && r.code != 0 {
				t.Errorf("%+v: want the tar unpacked, confined to the target", r)
			}
			// Nothing beside target, and nothing outside base.
			ents, err := os.ReadDir(base)
			if err != nil {
				t.Fatal(err)
			}
			if len(ents) != 2 {
				t.Errorf("%d entries beside the target, want 2 (target, secret): %v", len(ents), ents)
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(base), "escaped")); err == nil {
				t.Errorf("a file was written above the target's directory")
			}
			if _, err := os.Lstat("/escaped"); err == nil {
				t.Errorf("/escaped was written")
			}
		})
	}
}

func TestParseCpRef(t *testing.T) {
	for in, want := range map[string]cpRef{
		"box:/tmp":                      {"box", "/tmp"},
		"b_x-1:/a:b":                    {"b_x-1", "/a:b"},
		"./box:/tmp":                    {path: "./box:/tmp"},
		"/abs/path":                     {path: "/abs/path"},
		"-":                             {path: "-"},
		"-x:/a":                         {path: "-x:/a"},
		"a b:/x":                        {path: "a b:/x"},
		"é:/x":                          {path: "é:/x"},
		strings.Repeat("a", 63) + ":/x": {strings.Repeat("a", 63), "/x"},
		strings.Repeat("a", 64) + ":/x": {path: strings.Repeat("a", 64) + ":/x"},
	} {
		if got := parseCpRef(in); got != want {
			t.Errorf("parseCpRef(%q) = %+v, want %+v", in, got, want)
		}
	}
}
