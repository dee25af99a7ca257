package bench_test

import (
	"os"
	"testing"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// TestMain removes the binaries the tests built (testenv), so that a test
// run leaves no build directories in the temporary directory.
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.RemoveBuilt()
	os.Exit(code)
}
