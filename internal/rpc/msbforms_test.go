package rpc_test

import (
	"encoding/json"
	"strings"
	"testing"
)

// The request forms of microsandbox's clients that Warren once refused or
// answered differently (docs/compat.md), each sent as those clients send
// it.

// TestGoSDKCommandTimeout: the Go SDK sends its HTTP client's timeout in
// nanoseconds as the command's timeout (60 s is 60000000000); the command
// runs, its timeout held to Warren's maximum. A timeout that is not a
// non-negative number is still refused, naming it.
func TestGoSDKCommandTimeout(t *testing.T) {
	e := newFakeEnv(t, true, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "g"}, nil)
	r := e.post("", []byte(`{"jsonrpc":"2.0","method":"sandbox.command.run","params":{"namespace":"default","sandbox":"g","command":"echo","args":["hi"],"timeout":60000000000},"id":"c1"}`))
	var res struct {
		ExitCode int `json:"exit_code"`
		Output   []struct{ Stream, Text string }
	}
	if r.Status != 200 || json.Unmarshal(r.Result, &res) != nil || res.ExitCode != 0 || len(res.Output) != 1 || res.Output[0].Text != "hi" {
		t.Fatalf("Go SDK command with a 60 s (in ns) timeout: %d %s", r.Status, r.Raw)
	}
	for _, bad := range []string{`"60"`, `-1`, `true`} {
		r := e.post("", []byte(`{"jsonrpc":"2.0","method":"sandbox.command.run","params":{"sandbox":"g","command":"echo","timeout":`+bad+`},"id":"c2"}`))
		if r.Status != 400 || r.kind() != "invalid_params" || !strings.Contains(r.Error.Message, "timeout") {
			t.Errorf("timeout %s: %d %s, want invalid_params naming the timeout", bad, r.Status, r.Raw)
		}
	}
}
