//go:build embedagent

package agentbin

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

// TestEmbeddedDigests: the digests `make build` wrote are the embedded
// binaries' (the install checks it too, but only once).
func TestEmbeddedDigests(t *testing.T) {
	for name, c := range map[string]struct {
		bin []byte
		sum string
	}{"agent": {embeddedAgent, embeddedAgentSum}, "spawner": {embeddedSpawner, embeddedSpawnerSum}} {
		s := sha256.Sum256(c.bin)
		if got := strings.TrimSpace(c.sum); got != hex.EncodeToString(s[:]) {
			t.Errorf("%s: embedded digest %q is not its bytes'", name, got)
		}
	}
}
