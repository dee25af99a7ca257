package msb_test

import (
	"os"
	"testing"

	"github.com/warren-sandbox/warren/sdk/internal/testserver"
)

// The examples run against a real `warren serve --dev` (see testserver).
func TestMain(m *testing.M) { os.Exit(testserver.Main(m)) }
