package image_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/conformance"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/image/layer"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// This file is package image_test: the end-to-end test starts a sandbox,
// and the native backend imports package image.

// baseStore opens an image store in a fresh directory and returns it with
// its directory (tmp/ in it is the store's scratch space).
func baseStore(t *testing.T, base string, shift layer.IDMap) (*image.Store, string) {
	t.Helper()
	db, err := store.Open(filepath.Join(base, "warren.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	dir := filepath.Join(base, "images")
	s, err := image.OpenStore(dir, db, shift)
	if err != nil {
		t.Fatal(err)
	}
	return s, dir
}

func testShift() layer.IDMap {
	if os.Geteuid() == 0 {
		return layer.IDMap{HostBase: 300000, Size: 65536}
	}
	return layer.IDMap{}
}

// assertClean checks that a build left nothing behind: no record, nothing
// in the store's tmp.
// scratchDir is where a store in dir unpacks, in this process.
func scratchDir(dir string) string { return filepath.Join(dir, "tmp", strconv.Itoa(os.Getpid())) }

func assertClean(t *testing.T, s *image.Store, dir string) {
	t.Helper()
	if recs, err := s.List(); err != nil || len(recs) != 0 {
		t.Errorf("images recorded: %v, %v", recs, err)
	}
	ents, err := os.ReadDir(scratchDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("left in the store's tmp: %s", e.Name())
	}
}

// fakeMmdebstrap writes a stand-in for mmdebstrap: it records its
// arguments and TMPDIR in $FAKE_MM_ARGS, then runs body with $target set
// to the tarball it must write.
func fakeMmdebstrap(t *testing.T, body string) (bin, argsFile string) {
	t.Helper()
	dir := t.TempDir()
	bin = filepath.Join(dir, "mmdebstrap")
	argsFile = filepath.Join(dir, "args")
	script := `#!/bin/sh
set -e
printf '%s\n' "$@" > "$FAKE_MM_ARGS"
echo "TMPDIR=${TMPDIR:-}" >> "$FAKE_MM_ARGS"
while [ "$1" != "--" ]; do shift; done
target=$3
` + body
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("FAKE_MM_ARGS", argsFile)
	return bin, argsFile
}

// fakeRootfs is a fake build's body: progress lines with control
// characters, then a small rootfs with an "interpreter".
const fakeRootfs = `printf 'I: one\r\nI: \033[31mtwo\033[0m\n' >&2
echo 'I: three on stdout'
root=$(mktemp -d)
mkdir -p "$root/usr/bin" "$root/etc"
printf '#!/bin/sh\necho fake\n' > "$root/usr/bin/python3"
chmod 755 "$root/usr/bin/python3"
tar -C "$root" -cf "$target" .
rm -rf "$root"
`

// lines collects what BuildBase logs; each Write is one line.
type lines struct {
	mu     sync.Mutex
	got    []string
	onLine func(string)
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.got = append(l.got, string(p))
	f := l.onLine
	l.mu.Unlock()
	if f != nil {
		f(string(p))
	}
	return len(p), nil
}

func TestBuildBaseRejectsBadInput(t *testing.T) {
	s, dir := baseStore(t, t.TempDir(), layer.IDMap{})
	bin, argsFile := fakeMmdebstrap(t, fakeRootfs)
	long := strings.Repeat("a", 65)
	for _, tc := range []struct {
		lang string
		opt  image.BaseOptions
		want error
	}{
		{"", image.BaseOptions{}, image.ErrInvalidBase},
		{"ruby", image.BaseOptions{}, image.ErrInvalidBase},
		{"python3", image.BaseOptions{}, image.ErrInvalidBase},
		{"Python", image.BaseOptions{}, image.ErrInvalidBase},
		{"../python", image.BaseOptions{}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Suite: "--mode=chrootless"}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Suite: "-"}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Suite: "Bookworm"}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Suite: "bookworm main"}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Suite: "bookworm\n"}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Suite: "../etc"}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Suite: "bookworm/updates"}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Suite: long}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Mirror: "-"}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Mirror: "/etc/apt/sources.list"}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Mirror: "file:///srv/mirror"}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Mirror: "ftp://ftp.debian.org/debian"}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Mirror: "deb http://deb.debian.org/debian bookworm main"}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Mirror: "http://deb.debian.org/debian bookworm main"}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Mirror: "http://deb.debian.org/debian\nbookworm"}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Mirror: "[trusted=yes] http://evil.example/debian"}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Mirror: "http://"}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Mirror: "http:///debian"}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Mirror: "http://user:secret@mirror.example/debian"}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Mirror: "http://mirror.example/debian?x=1"}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Mirror: "http://mirror.example/debian#x"}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Mirror: `http://mirror.example/deb"ian`}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Mirror: "http://mirror.example/" + strings.Repeat("a", 1024)}, image.ErrInvalidBase},
		{"python", image.BaseOptions{Name: "Bad Name"}, image.ErrInvalidName},
		{"python", image.BaseOptions{Name: "host"}, image.ErrInvalidName},
		{"python", image.BaseOptions{Name: "a/../b"}, image.ErrInvalidName},
		{"python", image.BaseOptions{Suite: "x" + strings.Repeat("y", 60), Name: ""}, nil}, // valid: proves the table runs the fake
	} {
		opt := tc.opt
		opt.Mmdebstrap = bin
		_, err := s.BuildBase(context.Background(), tc.lang, opt)
		if tc.want == nil {
			if err != nil {
				t.Errorf("BuildBase(%q, %+v): %v", tc.lang, tc.opt, err)
			}
			continue
		}
		if !errors.Is(err, tc.want) {
			t.Errorf("BuildBase(%q, %+v) = %v, want %v", tc.lang, tc.opt, err, tc.want)
		}
		if _, serr := os.Stat(argsFile); serr == nil {
			t.Fatalf("BuildBase(%q, %+v) ran mmdebstrap before rejecting the input", tc.lang, tc.opt)
		}
	}
	if err := s.Remove("warren/python:x" + strings.Repeat("y", 60)); err != nil {
		t.Fatal(err)
	}
	assertClean(t, s, dir)

	_, err := s.BuildBase(context.Background(), "python", image.BaseOptions{Mmdebstrap: filepath.Join(t.TempDir(), "mmdebstrap")})
	if !errors.Is(err, image.ErrNoMmdebstrap) || !strings.Contains(err.Error(), "apt-get install mmdebstrap") {
		t.Errorf("missing mmdebstrap: %v", err)
	}
}

// TestBuildBaseFake runs the whole build with a stand-in for mmdebstrap:
// its command line, the progress lines, the image's config and record.
func TestBuildBaseFake(t *testing.T) {
	s, dir := baseStore(t, t.TempDir(), testShift())
	bin, argsFile := fakeMmdebstrap(t, fakeRootfs)
	log := &lines{}
	rec, err := s.BuildBase(context.Background(), "python", image.BaseOptions{Mmdebstrap: bin, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Name != "warren/python:bookworm" || len(rec.Layers) != 1 {
		t.Errorf("record: %+v", rec)
	}
	if want := []string{"I: one\n", "I: [31mtwo[0m\n", "I: three on stdout\n"}; !slices.Equal(log.got, want) {
		t.Errorf("progress lines %q, want %q", log.got, want)
	}
	raw, err := os.ReadFile(argsFile)
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n")
	tmpdir := strings.TrimPrefix(args[len(args)-1], "TMPDIR=")
	args = args[:len(args)-1]
	mode := "--mode=unshare"
	if os.Geteuid() == 0 {
		mode = "--mode=root"
		// The build's scratch space is in the store's tmp.
		if !strings.HasPrefix(tmpdir, filepath.Join(dir, "tmp")+"/") {
			t.Errorf("TMPDIR=%q, want a directory in the store's tmp", tmpdir)
		}
	}
	for _, want := range []string{"--variant=apt", mode, "--format=tar", "--include=python3,tzdata,ca-certificates",
		"--dpkgopt=path-exclude=/usr/share/doc/*", "--aptopt=APT::Install-Recommends \"false\""} {
		if !slices.Contains(args, want) {
			t.Errorf("mmdebstrap args lack %q: %q", want, args)
		}
	}
	dd := slices.Index(args, "--")
	if dd < 0 || len(args) != dd+3 || args[dd+1] != "bookworm" || !strings.HasSuffix(args[dd+2], ".tar") {
		t.Errorf("positional args: %q", args)
	}
	d, err := s.Inspect(rec.Name)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.Cmd, []string{"python3"}) || !slices.Contains(d.Env, "LANG=C.UTF-8") || !slices.ContainsFunc(d.Env, func(e string) bool { return strings.HasPrefix(e, "PATH=") }) {
		t.Errorf("config: env %q cmd %q", d.Env, d.Cmd)
	}
	img, err := s.Get(rec.Name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(img.Layers[0], "usr/bin/python3")); err != nil {
		t.Error(err)
	}

	// The config is part of the id: the same layer imported as a plain
	// rootfs is another image, with no config.
	tarball := filepath.Join(t.TempDir(), "rootfs.tar")
	if err := writeTarOf(img.Layers[0], tarball); err != nil {
		t.Fatal(err)
	}
	plain, err := s.Import(context.Background(), tarball, "plain")
	if err != nil {
		t.Fatal(err)
	}
	if plain.ID == rec.ID {
		t.Error("a plain rootfs import got the base image's id")
	}
	if pd, err := s.Inspect("plain"); err != nil || pd.Cmd != nil || pd.Env != nil {
		t.Errorf("plain import config: %+v, %v", pd, err)
	}

	// node, another suite and name, a mirror: all reach the command line.
	bin, argsFile = fakeMmdebstrap(t, strings.ReplaceAll(fakeRootfs, "python3", "node"))
	rec, err = s.BuildBase(context.Background(), "node", image.BaseOptions{Mmdebstrap: bin, Suite: "trixie", Mirror: "https://mirror.example:8443/debian/", Name: "my/node"})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ = os.ReadFile(argsFile)
	args = strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n")
	args = args[:len(args)-1]
	dd = slices.Index(args, "--")
	if rec.Name != "my/node" || !slices.Contains(args, "--include=nodejs,tzdata,ca-certificates") ||
		len(args) != dd+4 || args[dd+1] != "trixie" || args[dd+3] != "https://mirror.example:8443/debian/" {
		t.Errorf("node build: %+v, args %q", rec, args)
	}
	if d, err := s.Inspect("my/node"); err != nil || !slices.Equal(d.Cmd, []string{"node"}) {
		t.Errorf("node config: %+v, %v", d, err)
	}
	ents, _ := os.ReadDir(scratchDir(dir))
	if len(ents) != 0 {
		t.Errorf("store tmp not cleaned: %v", ents)
	}
}

// writeTarOf writes the tree at root as a tarball (through tar(1): the
// test only needs some tarball of the same files).
func writeTarOf(root, dst string) error {
	out, err := exec.Command("tar", "--owner=0", "--group=0", "--numeric-owner", "-C", root, "-cf", dst, ".").CombinedOutput()
	if err != nil {
		return fmt.Errorf("tar: %w: %s", err, out)
	}
	return nil
}

func TestBuildBaseFailure(t *testing.T) {
	s, dir := baseStore(t, t.TempDir(), testShift())
	bin, _ := fakeMmdebstrap(t, `echo "I: working" >&2; echo "E: the mirror said no" >&2; exit 1`)
	_, err := s.BuildBase(context.Background(), "python", image.BaseOptions{Mmdebstrap: bin})
	if err == nil || !strings.Contains(err.Error(), "E: the mirror said no") || !strings.Contains(err.Error(), "exit status 1") {
		t.Errorf("failed build: %v", err)
	}
	// Exit 0 without a tarball.
	bin, _ = fakeMmdebstrap(t, `exit 0`)
	if _, err := s.BuildBase(context.Background(), "python", image.BaseOptions{Mmdebstrap: bin}); err == nil {
		t.Error("a build without a tarball succeeded")
	}
	assertClean(t, s, dir)
}

// TestBuildBaseCancel: cancelling kills mmdebstrap and what it started
// (its process group), and a timeout does the same with its own error.
func TestBuildBaseCancel(t *testing.T) {
	s, dir := baseStore(t, t.TempDir(), testShift())
	pidFile := filepath.Join(t.TempDir(), "pid")
	bin, _ := fakeMmdebstrap(t, `sleep 300 &
echo $! > `+pidFile+`
echo "I: started" >&2
wait
`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := &lines{onLine: func(l string) {
		if strings.HasPrefix(l, "I: started") {
			cancel()
		}
	}}
	start := time.Now()
	_, err := s.BuildBase(ctx, "python", image.BaseOptions{Mmdebstrap: bin, Log: log})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled build: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("cancel took %v", d)
	}
	assertGone(t, pidFile)
	assertClean(t, s, dir)

	_, err = s.BuildBase(context.Background(), "python", image.BaseOptions{Mmdebstrap: bin, Timeout: 500 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "did not finish within 500ms") {
		t.Fatalf("timed-out build: %v", err)
	}
	assertGone(t, pidFile)
	assertClean(t, s, dir)
}

// assertGone waits for the process whose pid is in pidFile to end.
func assertGone(t *testing.T, pidFile string) {
	t.Helper()
	raw, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(st), ") Z ") {
			return // gone, or dead and not yet reaped
		}
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	t.Errorf("process %d started by mmdebstrap survived the cancellation", pid)
}

// requireBuild checks what a real build needs: root, mmdebstrap and
// Debian's mirror. Under WARREN_TEST_PRIVILEGED=1 a missing one fails.
func requireBuild(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t)
	_, err := exec.LookPath("mmdebstrap")
	testenv.Require(t, err == nil, "mmdebstrap (apt-get install mmdebstrap; scripts/setup.sh installs it)")
	// Three tries: one request timing out is the network's moment, not
	// a mirror out of reach (a CI run failed on one).
	c := &http.Client{Timeout: 10 * time.Second}
	reached := false
	for try := 0; try < 3 && !reached; try++ {
		resp, err := c.Head("http://deb.debian.org/debian/dists/" + image.DefaultBaseSuite + "/Release")
		if err == nil {
			_ = resp.Body.Close()
			reached = resp.StatusCode == http.StatusOK
		}
	}
	testenv.Require(t, reached, "Debian's mirror deb.debian.org")
}

// TestBuildBasePython builds the real python image from Debian's mirror
// (~35 s here), checks what is in it, and runs Python in a sandbox
// started from it.
func TestBuildBasePython(t *testing.T) {
	requireBuild(t)
	agentPath := testenv.AgentBinary(t)
	base, err := os.MkdirTemp("", "warren-base-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	// Sandbox root maps to an unprivileged uid that must reach the data dir.
	if err := os.Chmod(base, 0o711); err != nil {
		t.Fatal(err)
	}
	be, err := native.New(native.Options{
		DataDir: filepath.Join(base, "data"), RunDir: filepath.Join(base, "run"), AgentPath: agentPath,
		SpawnerPath: testenv.SpawnerBinary(t), CgroupPrefix: fmt.Sprintf("warren-basetest-%d", os.Getpid()),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = be.ReapOrphans(nil)
		_ = be.Close()
	})
	shift := layer.IDMap{}
	if m := be.UserNS(); m != nil {
		shift = layer.IDMap{HostBase: m.Host, Size: m.Size}
	}
	s, dir := baseStore(t, filepath.Join(base, "data"), shift)

	start := time.Now()
	rec, err := s.BuildBase(context.Background(), "python", image.BaseOptions{Log: testLog{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built %s: %d layer(s), %.1f MiB in %.1fs", rec.Name, len(rec.Layers), float64(rec.Size)/(1<<20), time.Since(start).Seconds())
	if len(rec.Layers) != 1 {
		t.Errorf("%d layers, want 1", len(rec.Layers))
	}
	// ~130 MiB on disk for bookworm; the bound catches a build that lost
	// its slimming (docs, locales, or perl through usrmerge).
	if rec.Size < 40<<20 || rec.Size > 180<<20 {
		t.Errorf("image size %.1f MiB, want 40-180 MiB", float64(rec.Size)/(1<<20))
	}
	img, err := s.Get(rec.Name)
	if err != nil {
		t.Fatal(err)
	}
	top := img.Layers[0]
	for _, p := range []string{"usr/bin/python3", "usr/lib/python3/dist-packages", "usr/share/zoneinfo/Europe/Berlin", "etc/ssl/certs/ca-certificates.crt"} {
		if _, err := os.Lstat(filepath.Join(top, p)); err != nil {
			t.Errorf("image lacks %s: %v", p, err)
		}
	}
	// Left out: documentation (but for copyright files), man pages,
	// translations, apt's downloads, the host's hostname and resolver
	// configuration, and perl (usrmerge's dependency).
	err = filepath.WalkDir(filepath.Join(top, "usr/share/doc"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && d.Type()&fs.ModeSymlink == 0 && d.Name() != "copyright" {
			t.Errorf("documentation in the image: %s", strings.TrimPrefix(p, top))
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	for _, p := range []string{"usr/share/man/man1", "usr/share/locale/de", "etc/hostname", "etc/resolv.conf", "usr/bin/perl5.36-x86_64-linux-gnu", "usr/share/perl"} {
		if _, err := os.Lstat(filepath.Join(top, p)); err == nil {
			t.Errorf("image has %s", p)
		}
	}
	for _, d := range []string{"var/lib/apt/lists", "var/cache/apt/archives"} {
		_ = filepath.WalkDir(filepath.Join(top, d), func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.Type().IsRegular() {
				if fi, err := e.Info(); err == nil && fi.Size() > 0 {
					t.Errorf("apt download left in the image: %s", strings.TrimPrefix(p, top))
				}
			}
			return nil
		})
	}
	if ents, _ := os.ReadDir(scratchDir(dir)); len(ents) != 0 {
		t.Errorf("store tmp not cleaned: %v", ents)
	}

	// A sandbox from it runs the image's own Python, found through the
	// image's PATH.
	ctx := context.Background()
	sb, err := be.Create(ctx, backend.Config{ID: fmt.Sprintf("basepy-%d", os.Getpid()), Image: img})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sb.Remove(ctx) }()
	if err := sb.Start(ctx); err != nil {
		t.Fatal(err)
	}
	r := conformance.Exec(t, sb, 30*time.Second, "python3", "-c", "import json,sys; print(sys.version)")
	if r.Code != 0 || !regexp.MustCompile(`^3\.\d+\.\d+`).MatchString(r.Stdout) {
		t.Fatalf("python3 in the sandbox: %+v stdout %q stderr %q", r.ExitStatus, r.Stdout, r.Stderr)
	}
	t.Logf("sandbox python: %s", strings.TrimSpace(r.Stdout))
	r = conformance.Exec(t, sb, 30*time.Second, "python3", "-c",
		"import sqlite3, ssl, zoneinfo, code, venv; print(zoneinfo.ZoneInfo('Europe/Berlin').key)")
	if r.Code != 0 || !strings.HasPrefix(r.Stdout, "Europe/Berlin") {
		t.Errorf("standard library in the sandbox: %+v stdout %q stderr %q", r.ExitStatus, r.Stdout, r.Stderr)
	}
}

// TestBuildBaseCancelReal cancels a real build while its chroot has /proc,
// /sys and /dev mounted: nothing may stay mounted on the host, nothing
// recorded, and the scratch space must be gone.
func TestBuildBaseCancelReal(t *testing.T) {
	requireBuild(t)
	base := t.TempDir()
	s, dir := baseStore(t, base, testShift())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Cancel as soon as mmdebstrap has mounts (in its own namespace), or
	// when it starts the last install step without any seen.
	sawMounts := make(chan bool, 1)
	go func() {
		for ctx.Err() == nil {
			if mountedUnder(t, dir, true) {
				sawMounts <- true
				cancel()
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	log := &lines{onLine: func(l string) {
		t.Log(strings.TrimSuffix(l, "\n"))
		if strings.HasPrefix(l, "I: installing remaining packages") {
			cancel()
		}
	}}
	_, err := s.BuildBase(ctx, "python", image.BaseOptions{Log: log})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled build: %v", err)
	}
	select {
	case <-sawMounts:
	default:
		t.Error("saw no mount of mmdebstrap's before cancelling: the test proves nothing")
	}
	if mountedUnder(t, dir, false) {
		t.Error("a mount under the store survived the cancelled build")
	}
	// The namespace goes with its last process, which may take a moment.
	for deadline := time.Now().Add(5 * time.Second); mountedUnder(t, dir, true); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Error("mmdebstrap's mount namespace outlived the cancelled build")
			break
		}
	}
	assertClean(t, s, dir)
}

// mountedUnder reports whether anything is mounted under dir: in this
// process's mount namespace, or (all) in any process's.
func mountedUnder(t *testing.T, dir string, all bool) bool {
	t.Helper()
	files := []string{"/proc/self/mountinfo"}
	if all {
		files, _ = filepath.Glob("/proc/[0-9]*/mountinfo")
	}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			continue // the process ended
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			// Field 5 is the mount point.
			if fields := strings.Fields(sc.Text()); len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
				_ = fh.Close()
				return true
			}
		}
		_ = fh.Close()
	}
	return false
}

// testLog sends each line to the test log.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
