package testenv

import (
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// runscBin is the pinned runsc scripts/runsc.sh built, "" when there is none.
var runscBin = sync.OnceValue(func() string {
	out, err := exec.Command(filepath.Join(ModuleRoot(), "scripts", "runsc.sh"), "--cached").Output() //nolint:gosec // the module's own script
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
})

// RunscBinary returns gVisor's runsc at the version scripts/runsc.sh pins,
// which that script builds once (`make test` runs it; tests do not, the
// build taking minutes). Without it the test fails (strict) or skips.
func RunscBinary(t testing.TB) string {
	t.Helper()
	p := runscBin()
	Require(t, p != "", "runsc (build it with scripts/runsc.sh)")
	return p
}
