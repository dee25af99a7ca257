package layer

import (
	"bytes"
	"os"
	"testing"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// FuzzUnpack feeds arbitrary bytes as a layer: Unpack must not panic and
// must not change anything outside its directory (the sandbox check: the
// parent holds only the layer and an untouched canary directory).
func FuzzUnpack(f *testing.F) {
	seeds := [][]ent{
		{dirE("d", 0o755), reg("d/f", "x", 0o4755), sym("d/l", "../../canary"), hard("d/h", "d/f")},
		{sym("link", "../canary"), reg("link/f", "pwned", 0o644)},
		{sym("link", ".."), dirE("link/canary", 0o755)},
		{reg("../canary/f", "pwned", 0o644)},
		{reg("a/.wh.b", "", 0), reg("a/.wh..wh..opq", "", 0), dirE("a/b", 0o755), reg("a/.wh.b", "", 0)},
		{reg("f", "x", 0o644), dirE("f", 0o755), reg("f", "y", 0o644)},
		{dev("c", 'c', 1, 3), dev("p", '6', 0, 0)},
	}
	for _, s := range seeds {
		f.Add(tarOf(f, s...))
	}
	f.Add(shortBody(f, 1<<40))
	f.Fuzz(func(t *testing.T, data []byte) {
		testenv.RequireRoot(t)
		dir, check := sandbox(t)
		_, _ = Unpack(bytes.NewReader(data), dir, Options{MaxBytes: 1 << 20, MaxEntries: 200, Devices: CreateDevices})
		check()
		if _, err := os.Lstat(dir); err != nil {
			t.Fatalf("layer dir gone: %v", err)
		}
	})
}
