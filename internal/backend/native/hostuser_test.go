package native_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/conformance"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// asNobody runs argv as an unprivileged host user (uid and gid 65534, no
// supplementary groups) and returns its combined output and error. argv is
// exec'd by a shell already running as that user: setpriv itself execs
// while it still holds root's capabilities, which reach any path.
func asNobody(t *testing.T, argv ...string) (string, error) {
	t.Helper()
	testenv.RequireFile(t, "/usr/bin/setpriv")
	cmd := exec.Command("/usr/bin/setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", "--", "/bin/sh", "-c", `exec "$@"`, "sh"}, argv...)...) //nolint:gosec // the test's own commands
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestHostUserReachesNothing is issue #18's finding 2: a sandbox makes a
// setuid copy of a shell in its upper layer; a host user who knows the
// path (mountinfo showed it) must not be able to reach it, let alone run it
// with the sandbox's uid, nor anything else under the data and run
// directories.
func TestHostUserReachesNothing(t *testing.T) {
	h := harness(t)
	sb := h.Sandbox(t, backend.Config{})
	if r := conformance.Exec(t, sb, 0, "/bin/sh", "-c", "cp /bin/sh /sush && chmod 4755 /sush && ls -ln /sush"); r.Code != 0 {
		t.Fatalf("make a setuid shell: %+v %s", r.ExitStatus, r.Stderr)
	}
	upper := filepath.Join(sharedDirs.data, "sandboxes", sb.ID(), "upper")
	st, err := os.Stat(filepath.Join(upper, "sush"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode()&os.ModeSetuid == 0 {
		t.Fatalf("the sandbox's shell is not setuid (%v): the test proves nothing", st.Mode())
	}
	if out, err := asNobody(t, filepath.Join(upper, "sush"), "-p", "-c", "id -u"); err == nil {
		t.Errorf("a host user ran the sandbox's setuid shell: %s", out)
	}
	for _, p := range []string{
		sharedDirs.data, filepath.Join(sharedDirs.data, "sandboxes"), filepath.Join(sharedDirs.data, "images"),
		filepath.Join(sharedDirs.data, "sandboxes", sb.ID()), upper, sharedDirs.run, filepath.Join(sharedDirs.run, sb.ID()),
	} {
		if out, err := asNobody(t, "/usr/bin/stat", "-c", "%A", p+"/."); err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("a host user reaches %s: %q %v", p, out, err)
		}
	}
}
