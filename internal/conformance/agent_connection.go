// The Connection group: a request the agent rejects without reading its
// body does not disturb the next request on the same kept-alive connection.

package conformance

import (
	"bytes"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/agent"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/wire"
)

// unsized hides a reader's length, so the client sends it chunked.
type unsized struct{ r io.Reader }

func (u unsized) Read(p []byte) (int, error) { return u.r.Read(p) }

func (h *Harness) agentConnection(t *testing.T) {
	s := h.newAgentSuite(t, backend.Config{})
	// A request whose body the agent rejects without reading it must not
	// disturb the next request on the same (pooled, keep-alive)
	// connection.
	for _, tc := range []struct {
		name string
		body func() io.Reader
	}{
		{"sized body", func() io.Reader { return bytes.NewReader(make([]byte, 1000)) }},
		{"chunked body", func() io.Reader { return unsized{bytes.NewReader(make([]byte, 1000))} }},
	} {
		t.Run("request after a rejected "+tc.name, func(t *testing.T) {
			s.fresh()
			const rounds = 150
			var failures []string
			for i := range rounds {
				err := s.c.WriteFile(ctxFor(t, 10*time.Second), "../rejected", tc.body(), 0o644)
				if !agent.IsKind(err, wire.ErrInvalid) {
					failures = append(failures, fmt.Sprintf("round %d: rejected write: %s", i, errInfo(err)))
				}
				if _, err := s.c.Stat(ctxFor(t, 10*time.Second), s.tmp); err != nil {
					failures = append(failures, fmt.Sprintf("round %d: next request: %s", i, errInfo(err)))
				}
			}
			if len(failures) > 0 {
				t.Errorf("%d of %d rounds went wrong; first: %s", len(failures), rounds, failures[0])
			}
		})
	}
	s.fresh()
	t.Run("StillHealthy", s.healthy)
}
