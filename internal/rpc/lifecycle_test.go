package rpc_test

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/sandbox"
)

// TestRefusedStartLeavesNoRecord: a create or start the server refuses as
// invalid (here: an image the store lacks) leaves nothing: no record to
// get or list, no name taken, nothing counted against --max-sandboxes, no
// row that comes back after a restart, nothing on the host.
func TestRefusedStartLeavesNoRecord(t *testing.T) {
	e := newEnv(t, true, func(o *sandbox.Options) { o.MaxSandboxes = 1 })
	for range 3 {
		r := e.call("sandbox.create", map[string]any{"name": "img1", "image": "nope:latest"})
		if r.Status != 400 || r.kind() != "invalid_params" || !strings.Contains(r.Error.Message, "nope:latest") {
			t.Fatalf("create from a missing image: %d %s", r.Status, r.Raw)
		}
		r = e.call("sandbox.start", map[string]any{"sandbox": "img2", "config": map[string]any{"image": "nope:latest"}})
		if r.Status != 400 || r.kind() != "invalid_params" {
			t.Fatalf("start from a missing image: %d %s", r.Status, r.Raw)
		}
	}
	check := func(when string) {
		t.Helper()
		for _, name := range []string{"img1", "img2"} {
			if r := e.call("sandbox.get", map[string]any{"sandbox": name}); r.Status != 404 {
				t.Fatalf("%s: sandbox.get %s: %d %s", when, name, r.Status, r.Raw)
			}
		}
		var list struct {
			Sandboxes []json.RawMessage `json:"sandboxes"`
		}
		e.must("sandbox.list", map[string]any{"namespace": "*"}, &list)
		if len(list.Sandboxes) != 0 {
			t.Fatalf("%s: refused starts left records: %s", when, list.Sandboxes)
		}
		if ids, err := e.be.IDs(); err != nil || len(ids) != 0 {
			t.Fatalf("%s: refused starts left sandboxes on the host: %v %v", when, ids, err)
		}
	}
	check("after the refusals")
	e.restart()
	check("after a restart")
	// The name is free, and so is the server's only place.
	e.must("sandbox.create", map[string]any{"name": "img1"}, nil)
}

// TestStopDuringCommand: a command or code run that a stop cuts short
// (the sandbox's maximum lifetime, a concurrent sandbox.stop or remove)
// is a conflict that says what happened, not an internal error with a
// transport message.
func TestStopDuringCommand(t *testing.T) {
	e := newEnv(t, true, nil)
	want := func(t *testing.T, r *rpcReply, what, why string) {
		t.Helper()
		if r.Status != 409 || r.kind() != "conflict" || !strings.Contains(r.Error.Message, "was stopped while "+what) ||
			!strings.Contains(r.Error.Message, why) || strings.Contains(r.Error.Message, "EOF") {
			t.Fatalf("answer %d %s, want a conflict saying the sandbox was stopped while %s (%s)", r.Status, r.Raw, what, why)
		}
	}
	stopSoon := func(method, name string) *sync.WaitGroup {
		var wg sync.WaitGroup
		wg.Go(func() {
			time.Sleep(time.Second)
			e.must(method, map[string]any{"sandbox": name}, nil)
		})
		return &wg
	}
	t.Run("max lifetime", func(t *testing.T) {
		e.must("sandbox.create", map[string]any{"name": "life", "max_lifetime": 1.5}, nil)
		r := e.call("sandbox.command.run", map[string]any{"sandbox": "life", "command": "sleep", "args": []string{"30"}})
		want(t, r, "the command ran", "maximum lifetime 1.5s reached")
	})
	t.Run("stop", func(t *testing.T) {
		e.must("sandbox.start", map[string]any{"sandbox": "st"}, nil)
		wg := stopSoon("sandbox.stop", "st")
		r := e.call("sandbox.command.run", map[string]any{"sandbox": "st", "command": "sleep", "args": []string{"30"}})
		wg.Wait()
		want(t, r, "the command ran", "a stop was requested")
		// The sandbox itself is fine: it starts again and runs commands.
		e.must("sandbox.start", map[string]any{"sandbox": "st"}, nil)
		e.must("sandbox.command.run", map[string]any{"sandbox": "st", "command": "true"}, nil)
	})
	t.Run("repl", func(t *testing.T) {
		e.must("sandbox.start", map[string]any{"sandbox": "rp"}, nil)
		wg := stopSoon("sandbox.stop", "rp")
		r := e.call("sandbox.repl.run", map[string]any{"sandbox": "rp", "language": "python", "code": "import time\ntime.sleep(30)"})
		wg.Wait()
		want(t, r, "the code ran", "a stop was requested")
	})
	t.Run("exec and remove", func(t *testing.T) {
		e.must("sandbox.start", map[string]any{"sandbox": "rm"}, nil)
		wg := stopSoon("sandbox.remove", "rm")
		r := e.call("sandbox.exec", map[string]any{"sandbox": "rm", "argv": []string{"sleep", "30"}})
		wg.Wait()
		want(t, r, "the command ran", "it was removed")
	})
}
