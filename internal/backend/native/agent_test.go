package native_test

import (
	"testing"

	"github.com/warren-sandbox/warren/internal/conformance"
)

// TestAgentConformance runs the agent protocol suite against the real agent
// in native sandboxes.
func TestAgentConformance(t *testing.T) { conformance.RunAgent(t, harness(t)) }
