package warren_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMakeInstall: `make install` (staged with DESTDIR, under another
// PREFIX) puts a warren that runs and a systemd unit whose ExecStart is
// that binary; where systemd-analyze exists, the unit verifies with no
// complaint but the one systemd before 254 makes about DelegateSubgroup.
func TestMakeInstall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds warren")
	}
	dest := t.TempDir()
	out, err := exec.Command("make", "install", "DESTDIR="+dest, "PREFIX=/opt/warren").CombinedOutput()
	if err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	bin := filepath.Join(dest, "opt/warren/bin/warren")
	if out, err := exec.Command(bin, "help").CombinedOutput(); err != nil || !strings.Contains(string(out), "serve") {
		t.Fatalf("the installed warren: %v\n%s", err, out)
	}
	unitPath := filepath.Join(dest, "etc/systemd/system/warren.service")
	unit, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ExecStart=/opt/warren/bin/warren serve", "Delegate=yes", "DelegateSubgroup=supervisor", "KillMode=process"} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("the unit lacks %q:\n%s", want, unit)
		}
	}
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		return
	}
	// verify checks that ExecStart's binary exists: point it at the staged one.
	staged := filepath.Join(t.TempDir(), "warren.service")
	if err := os.WriteFile(staged, []byte(strings.ReplaceAll(string(unit), "/opt/warren/bin/warren", bin)), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _ = exec.Command("systemd-analyze", "verify", staged).CombinedOutput()
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line != "" && !strings.Contains(line, "Unknown key 'DelegateSubgroup'") {
			t.Errorf("systemd-analyze verify: %s", line)
		}
	}
}
