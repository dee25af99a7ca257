package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestSmallDependencies keeps the agent small: every sandbox maps and starts
// it, so its size is paid in start latency and resident memory per sandbox.
func TestSmallDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	// crypto/rand alone brings the FIPS module, whose init costs every
	// agent start a few tenths of a millisecond: use unix.Getrandom.
	for _, banned := range []string{"net/http", "crypto/tls", "crypto/x509", "crypto/rand", "modernc.org/sqlite"} {
		for _, d := range deps {
			if d == banned {
				t.Errorf("warren-agent depends on %s", banned)
			}
		}
	}
	if strings.Contains(string(out), "/internal/agent\n") {
		t.Error("warren-agent depends on the host's agent client; use internal/wire")
	}
}
