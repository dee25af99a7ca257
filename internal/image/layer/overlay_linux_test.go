package layer

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/testenv"
)

const helperEnv = "WARREN_LAYER_TEST_MOUNT"

// TestMain runs the mount helper when re-executed by mountAndList: it mounts
// a read-only overlay (in the private mount namespace it was started in)
// and prints every path under it.
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		if err := mountHelper(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func mountHelper() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	mnt := os.Getenv("MNT")
	opts := "lowerdir=" + os.Getenv("LOWER")
	if os.Getenv("USERXATTR") == "1" {
		opts += ",userxattr"
	}
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, opts); err != nil {
		return fmt.Errorf("mount overlay %s: %w", opts, err)
	}
	return filepath.WalkDir(mnt, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if rel, _ := filepath.Rel(mnt, p); rel != "." {
			fmt.Println(rel)
		}
		return nil
	})
}

// mountAndList mounts lowers (top-most first) as an overlay in a child
// process with its own mount namespace and, when userns, its own user
// namespace (root mapped to host uid 100000), and returns the paths it sees.
func mountAndList(t *testing.T, lowers []string, userns, userxattr bool) []string {
	t.Helper()
	mnt := filepath.Join(filepath.Dir(lowers[0]), "mnt")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	// /proc/self/exe needs no search permission on the test binary's
	// directory, which the user namespace's root does not have.
	cmd := exec.Command("/proc/self/exe", "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", "MNT="+mnt, "LOWER="+strings.Join(lowers, ":"))
	if userxattr {
		cmd.Env = append(cmd.Env, "USERXATTR=1")
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	if userns {
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}}
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true}
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("mount helper: %v: %s", err, stderr.String())
	}
	return strings.Fields(string(out))
}

func TestOverlayMount(t *testing.T) {
	testenv.RequireRoot(t)
	for _, c := range []struct {
		name            string
		userns          bool
		unpackUserXattr bool
		mountUserXattr  bool
		want            string
	}{
		{"trusted", false, false, false, "b d d/y"},
		{"userxattr-in-userns", true, true, true, "b d d/y"},
		// Control: trusted.overlay.opaque means nothing to a userxattr
		// mount, so d merges (shows the test can tell).
		{"trusted-layer-userxattr-mount", true, false, true, "b d d/x d/y"},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := t.TempDir()
			// The user namespace's root (host uid 100000) must be able to
			// reach the layers.
			for _, d := range []string{base, filepath.Dir(base)} {
				if err := os.Chmod(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			lower, upper := filepath.Join(base, "lower"), filepath.Join(base, "upper")
			opt := Options{UserXattr: c.unpackUserXattr, IDShift: IDMap{HostBase: 100000, Size: 65536}}
			for _, l := range []struct {
				dir  string
				ents []ent
			}{
				{lower, []ent{reg("a", "a", 0o644), reg("b", "b", 0o644), dirE("d", 0o755), reg("d/x", "x", 0o644)}},
				{upper, []ent{reg(".wh.a", "", 0), dirE("d", 0o755), reg("d/.wh..wh..opq", "", 0), reg("d/y", "y", 0o644)}},
			} {
				if err := os.Mkdir(l.dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if _, err := Unpack(bytes.NewReader(tarOf(t, l.ents...)), l.dir, opt); err != nil {
					t.Fatal(err)
				}
			}
			got := strings.Join(mountAndList(t, []string{upper, lower}, c.userns, c.mountUserXattr), " ")
			if got != c.want {
				t.Errorf("overlay shows %q, want %q", got, c.want)
			}
		})
	}
}
