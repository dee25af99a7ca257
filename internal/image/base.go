package image

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"
)

// Base images: a small Debian root filesystem with one language's
// interpreter, made by mmdebstrap from a Debian mirror, so a host without
// a registry still gets a real image for the python and node names.

// Defaults of BaseOptions.
const (
	DefaultBaseSuite   = "bookworm"
	DefaultBaseTimeout = 20 * time.Minute
)

// Errors of BuildBase.
var (
	ErrInvalidBase  = errors.New("invalid base image option")
	ErrNoMmdebstrap = errors.New("mmdebstrap not found")
)

// BaseOptions tunes BuildBase. The zero value builds from Debian's own
// mirror for bookworm.
type BaseOptions struct {
	// Suite is the Debian suite: a code name (bookworm, trixie, sid) or
	// a symbolic one (stable, testing). Default DefaultBaseSuite.
	Suite string
	// Mirror is the http(s) URL of a Debian mirror, used alone. Empty
	// means deb.debian.org plus, for a release that has them, its
	// -updates and -security suites (mmdebstrap's default sources):
	// naming deb.debian.org explicitly would drop security updates.
	Mirror string
	// Name is the image name; default "warren/<lang>:<suite>".
	Name string
	// Log receives mmdebstrap's output, one line per Write, without
	// control characters; nil discards it.
	Log io.Writer
	// Mmdebstrap is the mmdebstrap binary; default looked up in PATH.
	Mmdebstrap string
	// Timeout bounds mmdebstrap's run; default DefaultBaseTimeout.
	Timeout time.Duration
}

// baseLang is what one language's image installs and runs.
type baseLang struct {
	pkg string   // the interpreter's Debian package
	cmd []string // the image's Cmd
}

// baseLangs are the languages BuildBase knows. python3, not
// python3-minimal: the minimal package lacks most of the standard library
// (json, code — which the REPL needs —, sqlite3, venv ...).
var baseLangs = map[string]baseLang{
	"python": {pkg: "python3", cmd: []string{"python3"}},
	"node":   {pkg: "nodejs", cmd: []string{"node"}},
}

// baseExtra is installed in every base image: tzdata for time zones
// (Python's zoneinfo reads the system database) and ca-certificates so
// TLS clients work once a sandbox may reach the network.
var baseExtra = []string{"tzdata", "ca-certificates"}

// baseEnv is every base image's environment.
var baseEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}

// Slimming. The path filters are written into the image's dpkg
// configuration too, so later installs stay slim (as Debian's own "slim"
// images do). Copyright files are kept: they are the packages' licences,
// and an image may be passed on.
var (
	baseDpkgOpts = []string{
		"path-exclude=/usr/share/doc/*",
		"path-include=/usr/share/doc/*/copyright",
		"path-exclude=/usr/share/man/*",
		"path-exclude=/usr/share/info/*",
		"path-exclude=/usr/share/groff/*",
		"path-exclude=/usr/share/lintian/*",
		"path-exclude=/usr/share/linda/*",
		"path-exclude=/usr/share/locale/*",
		"path-include=/usr/share/locale/locale.alias",
	}
	// Also kept in the image: apt in a sandbox installs no recommends
	// either.
	baseAptOpts = []string{
		`APT::Install-Recommends "false"`,
		`APT::Install-Suggests "false"`,
		`Acquire::Languages "none"`, // no translated descriptions to download
	}
	// baseCustomize runs in the finished chroot ($1). Package lists and
	// caches are downloads, not the image; the host's hostname and
	// resolv.conf, which mmdebstrap copies in for the build, must not
	// leak into it.
	baseCustomize = `rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/cache/apt/archives/*.deb ` +
		`"$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old "$1"/etc/hostname "$1"/etc/resolv.conf`
)

// suiteRE accepts Debian suite names. Anything else could be read by
// mmdebstrap as an option or a path.
// Compiled on first use, not at package initialisation, which every warren
// command pays (docs/performance.md).
var suiteRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z][a-z0-9-]{0,63}$`) })

// mirrorRE is the character set allowed in a mirror URL: no spaces,
// quotes, brackets or control characters, so the value cannot turn into
// a sources.list line with options of its own.
// Compiled on first use, not at package initialisation, which every warren
// command pays (docs/performance.md).
var mirrorRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^https?://[A-Za-z0-9._~%:/+-]+$`) })

// validateMirror checks that m is a plain http(s) URL of a host: no
// credentials (they would end up in the image's sources.list), query or
// fragment, nothing outside mirrorRE().
func validateMirror(m string) error {
	bad := func(why string) error { return fmt.Errorf("%w: mirror %q: %s", ErrInvalidBase, m, why) }
	if len(m) > 1024 {
		return bad("longer than 1024 bytes")
	}
	u, err := url.Parse(m)
	if err != nil {
		return bad(err.Error())
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return bad("want an http:// or https:// URL")
	case u.User != nil:
		return bad("credentials are not allowed")
	case u.Opaque != "" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return bad("want a plain URL, without query or fragment")
	case u.Hostname() == "":
		return bad("no host")
	case !mirrorRE().MatchString(m):
		return bad("want letters, digits and . _ ~ % : / + - only")
	}
	return nil
}

// BuildBase builds a Debian image with lang's interpreter ("python" or
// "node") and records it under opt.Name, replacing what the name pointed
// at. It runs mmdebstrap, which needs a Debian mirror (the network) and,
// unless run as root, working unprivileged user namespaces with subuids.
// Cancelling ctx kills mmdebstrap and everything it started; nothing is
// recorded unless the whole build succeeds.
func (s *Store) BuildBase(ctx context.Context, lang string, opt BaseOptions) (*Record, error) {
	spec, ok := baseLangs[lang]
	if !ok {
		return nil, fmt.Errorf("%w: language %q: want one of %s", ErrInvalidBase, lang, strings.Join(slices.Sorted(maps.Keys(baseLangs)), ", "))
	}
	opt.Suite = cmp.Or(opt.Suite, DefaultBaseSuite)
	if !suiteRE().MatchString(opt.Suite) {
		return nil, fmt.Errorf("%w: suite %q: want a Debian suite name like bookworm or stable", ErrInvalidBase, opt.Suite)
	}
	if opt.Mirror != "" {
		if err := validateMirror(opt.Mirror); err != nil {
			return nil, err
		}
	}
	opt.Name = cmp.Or(opt.Name, "warren/"+lang+":"+opt.Suite)
	if err := ValidateName(opt.Name); err != nil {
		return nil, err
	}
	if opt.Timeout <= 0 {
		opt.Timeout = DefaultBaseTimeout
	}
	bin, err := exec.LookPath(cmp.Or(opt.Mmdebstrap, "mmdebstrap"))
	if err != nil {
		return nil, fmt.Errorf("%w (%w): install it (apt-get install mmdebstrap) to build base images", ErrNoMmdebstrap, err)
	}
	keyring, err := debianKeyring()
	if err != nil {
		return nil, err
	}

	scratch, err := os.MkdirTemp(s.tmpDir(), "base-")
	if err != nil {
		return nil, err
	}
	// mmdebstrap's mounts live in a mount namespace of its own (see
	// runMmdebstrap), so nothing is mounted below scratch here and
	// removing it cannot reach into a mounted /proc or /dev.
	defer func() { _ = os.RemoveAll(scratch) }()
	target := filepath.Join(scratch, "rootfs.tar")
	root := os.Geteuid() == 0
	args := mmdebstrapArgs(spec, opt.Suite, opt.Mirror, target, root, keyring, mergedUsrHooks(bin))
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "TMPDIR=") })
	if root {
		// mmdebstrap builds in a temporary directory under TMPDIR: keep
		// it in the store's tmp, cleaned at OpenStore should we die. An
		// unprivileged (unshare) build needs a directory its subuids
		// can reach, which the store's tmp (0700) is not: it keeps the
		// system's.
		env = append(env, "TMPDIR="+scratch)
	}
	out := &lineWriter{w: opt.Log}
	if err := runMmdebstrap(ctx, bin, args, scratch, env, opt.Timeout, out); err != nil {
		return nil, err
	}

	if !fileExists(target) {
		return nil, errors.New("build base image: mmdebstrap succeeded but wrote no tarball")
	}
	src, err := s.openRootfsTar(ctx, target, false)
	if err != nil {
		return nil, err
	}
	ls := src.layers[0]
	src, err = rootfsSource(ls.diffID, ls.open, runtimeConfig{Env: baseEnv, Cmd: spec.cmd})
	if err != nil {
		return nil, err
	}
	var pinned []string
	defer func() { s.unpin(pinned) }()
	return s.storeSource(ctx, src, opt.Name, &pinned, 1, 0, nil)
}

// mmdebstrapArgs is mmdebstrap's command line. Every value that came from
// the caller (suite, mirror) was validated and comes after "--", so none
// is read as an option.
//
// The apt variant (the essential packages plus apt) rather than minbase:
// minbase adds the remaining Priority:required packages, in bookworm
// e2fsprogs and mount (useless in a sandbox, which cannot mount) and
// tzdata (installed anyway, see baseExtra); apt itself is kept so that
// a sandbox with network access can install more. Measured for python3
// on bookworm: tarballs of 121 MB (minbase), 116 MB (apt), 99 MB
// (essential, no apt).
func mmdebstrapArgs(spec baseLang, suite, mirror, target string, root bool, keyring, hookDir string) []string {
	mode := "unshare"
	if root {
		mode = "root"
	}
	args := []string{
		"--variant=apt", "--mode=" + mode, "--format=tar",
		"--include=" + strings.Join(append([]string{spec.pkg}, baseExtra...), ","),
	}
	for _, o := range baseAptOpts {
		args = append(args, "--aptopt="+o)
	}
	for _, o := range baseDpkgOpts {
		args = append(args, "--dpkgopt="+o)
	}
	if keyring != "" {
		args = append(args, "--keyring="+keyring)
	}
	if hookDir != "" {
		args = append(args, "--hook-dir="+hookDir)
	}
	args = append(args, "--customize-hook="+baseCustomize, "--", suite, target)
	if mirror != "" {
		args = append(args, mirror)
	}
	return args
}

// mergedUsrHooks finds mmdebstrap's maybe-merged-usr hooks. Without them
// a bookworm chroot gets merged /usr from the usrmerge package, which
// pulls in perl (about 50 MB); the hooks make the symlinks the way
// debootstrap does and install the small usr-is-merged instead, when the
// suite has it. "" when they are not installed (a bigger image, but a
// working one).
func mergedUsrHooks(bin string) string {
	cands := []string{"/usr/share/mmdebstrap/hooks/maybe-merged-usr"}
	if real, err := filepath.EvalSymlinks(bin); err == nil {
		cands = append([]string{filepath.Join(filepath.Dir(real), "..", "share", "mmdebstrap", "hooks", "maybe-merged-usr")}, cands...)
	}
	for _, d := range cands {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			return filepath.Clean(d)
		}
	}
	return ""
}

// debianKeyring returns the keyring to pass to mmdebstrap's --keyring, or
// "" when the host's apt already trusts Debian's archive keys (on Debian,
// debian-archive-keyring puts them in /etc/apt/trusted.gpg.d). Elsewhere
// (Ubuntu) apt trusts only its own vendor's keys, and the Debian keyring
// has to be named.
func debianKeyring() (string, error) {
	for _, pat := range []string{"debian-archive-*.asc", "debian-archive-*.gpg"} {
		if m, _ := filepath.Glob(filepath.Join("/etc/apt/trusted.gpg.d", pat)); len(m) > 0 {
			return "", nil
		}
	}
	for _, p := range []string{"/usr/share/keyrings/debian-archive-keyring.gpg", "/usr/share/keyrings/debian-archive-keyring.pgp"} {
		if fileExists(p) {
			return p, nil
		}
	}
	return "", errors.New("build base image: Debian's archive keys are not installed: install debian-archive-keyring (apt-get install debian-archive-keyring)")
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// runMmdebstrap runs mmdebstrap in dir, its output going to out, bounded
// by timeout and ctx.
//
// It runs in a process group of its own, so cancellation kills apt, dpkg
// and maintainer scripts with it. As root it also runs in a private mount
// namespace: a killed mmdebstrap never unmounts the /proc, /sys and /dev
// it mounted into its chroot, and there they vanish with the namespace
// instead of staying on the host (where removing the build directory
// would then descend into them).
func runMmdebstrap(ctx context.Context, bin string, args []string, dir string, env []string, timeout time.Duration, out *lineWriter) error {
	runCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(runCtx, bin, args...)
	cmd.Dir = dir // an empty directory: an --aptopt naming an existing file would be read as one
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = out, out // one pipe: lines stay in order
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if os.Geteuid() == 0 {
		// Go makes the new namespace's mounts private (MS_REC|MS_PRIVATE
		// on /) before exec, so none propagates back.
		cmd.SysProcAttr.Unshareflags = syscall.CLONE_NEWNS
	}
	// The group is killed while mmdebstrap, its leader, is not yet
	// reaped, so its id cannot have been reused.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A process that escaped the group may hold the output pipe open:
	// stop waiting for it.
	cmd.WaitDelay = 5 * time.Second
	// Pdeathsig fires when the thread that started the child exits, not
	// the process: keep this goroutine on its thread until the end.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := time.Now()
	err := cmd.Run()
	out.flush()
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("build base image: %w", ctxErr)
	}
	if errors.Is(runCtx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("build base image: mmdebstrap did not finish within %v", timeout)
	}
	msg := fmt.Sprintf("build base image: mmdebstrap failed after %.0fs: %v", time.Since(start).Seconds(), err)
	if len(out.tail) > 0 {
		msg += "; last output:\n  " + strings.Join(out.tail, "\n  ")
	}
	return errors.New(msg)
}

// lineWriter splits a command's output into lines, forwards each to w
// without control characters (the output reaches terminals), and keeps
// the last few for an error message. It is used from one goroutine at a
// time.
type lineWriter struct {
	w    io.Writer
	buf  []byte
	tail []string
}

const (
	maxLineBytes = 4096
	tailLines    = 8
)

func (l *lineWriter) Write(p []byte) (int, error) {
	for _, c := range p {
		if c == '\n' || c == '\r' {
			l.flush()
		} else if len(l.buf) < maxLineBytes {
			l.buf = append(l.buf, c)
		}
	}
	return len(p), nil
}

// flush ends the current line.
func (l *lineWriter) flush() {
	line := strings.Map(func(r rune) rune {
		if unicode.IsControl(r) && r != '\t' {
			return -1
		}
		return r
	}, strings.ToValidUTF8(string(l.buf), "\uFFFD"))
	l.buf = l.buf[:0]
	line = strings.TrimRight(line, " \t")
	if line == "" {
		return
	}
	if l.w != nil {
		// A failing log must not fail the build.
		_, _ = io.WriteString(l.w, line+"\n")
	}
	if l.tail = append(l.tail, line); len(l.tail) > tailLines {
		l.tail = l.tail[1:]
	}
}
