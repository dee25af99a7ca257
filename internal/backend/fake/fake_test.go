package fake_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/warren-sandbox/warren/internal/agent"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/fake"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/wire"
)

func started(t *testing.T, b *fake.Backend, id string) backend.Sandbox {
	t.Helper()
	sb, err := b.Create(t.Context(), backend.Config{ID: id, Image: &image.Image{Layers: []string{"/"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	return sb
}

// TestExec: the fake's commands through the real client and backend.Exec,
// exit statuses and OOM kills included.
func TestExec(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := fake.New()
		defer b.Close()
		sb := started(t, b, "x")
		if h, err := sb.Agent().Health(t.Context()); err != nil || h.Version != wire.Version {
			t.Fatalf("health: %+v %v", h, err)
		}
		for _, tc := range []struct {
			argv   []string
			stdin  string
			out    string
			code   int
			signal string
			oom    bool
		}{
			{argv: []string{"echo", "a", "b"}, out: "a b\n"},
			{argv: []string{"true"}},
			{argv: []string{"false"}, code: 1},
			{argv: []string{"exit", "3"}, code: 3},
			{argv: []string{"cat"}, stdin: "in", out: "in"},
			{argv: []string{"sleep", "1"}},
			{argv: []string{"oom"}, code: 137, signal: "SIGKILL", oom: true},
			{argv: []string{"nonesuch"}, code: 127},
		} {
			var out bytes.Buffer
			res, err := backend.Exec(t.Context(), sb, &wire.ExecRequest{Argv: tc.argv, Stdin: []byte(tc.stdin)},
				func(_ string, b []byte) { out.Write(b) })
			if err != nil || res.Code != tc.code || res.Signal != tc.signal || res.OOMKilled != tc.oom || out.String() != tc.out {
				t.Errorf("%v: %+v %q %v", tc.argv, res, out.String(), err)
			}
		}
		res, err := backend.Exec(t.Context(), sb, &wire.ExecRequest{Argv: []string{"sleep", "10"}, TimeoutMs: 1000}, nil)
		if err != nil || !res.TimedOut || res.Signal != "SIGKILL" {
			t.Errorf("sleep past its timeout: %+v %v", res, err)
		}
	})
}

// TestUnresponsiveAgent: an agent that misses the host's deadline gets its
// sandbox stopped, as backend.Exec promises.
func TestUnresponsiveAgent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := fake.New()
		defer b.Close()
		sb := started(t, b, "x")
		res, err := backend.Exec(t.Context(), sb, &wire.ExecRequest{Argv: []string{"hang"}, TimeoutMs: 100}, nil)
		if !errors.Is(err, backend.ErrAgentUnresponsive) || !res.TimedOut {
			t.Fatalf("%+v %v", res, err)
		}
		select {
		case <-sb.Done():
		default:
			t.Error("the sandbox still runs")
		}
		if got := b.Calls(); got[len(got)-1] != (fake.Call{Op: "stop", ID: "x"}) {
			t.Errorf("calls %v", got)
		}
	})
}

// TestDie: an init that dies closes Done and breaks a command in flight.
func TestDie(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := fake.New()
		defer b.Close()
		sb := started(t, b, "x")
		errc := make(chan error, 1)
		go func() {
			_, err := backend.Exec(context.Background(), sb, &wire.ExecRequest{Argv: []string{"sleep", "60"}}, nil)
			errc <- err
		}()
		synctest.Wait()
		b.Sandbox("x").Die()
		<-sb.Done()
		if err := <-errc; err == nil || !strings.Contains(err.Error(), "stopped while the command ran") {
			t.Errorf("exec across the death: %v", err)
		}
		if _, err := sb.Stats(); err == nil {
			t.Error("stats of a dead sandbox")
		}
		// It starts again.
		if err := sb.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		if _, err := sb.Agent().Health(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
}

// TestFilesKeptAcrossStops: the in-memory files behave as a writable
// layer: kept by Stop, gone with Remove.
func TestFilesKeptAcrossStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := fake.New()
		defer b.Close()
		sb := started(t, b, "x")
		if err := sb.Agent().WriteFile(t.Context(), "/f", strings.NewReader("data"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := sb.Stop(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := sb.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		if got, err := sb.Agent().ReadFile(t.Context(), "/f"); err != nil || string(got) != "data" {
			t.Fatalf("after a restart: %q %v", got, err)
		}
		if _, err := sb.Agent().ReadFile(t.Context(), "/none"); !agent.IsKind(err, wire.ErrNotFound) {
			t.Errorf("missing file: %v", err)
		}
		if err := sb.Remove(t.Context()); err != nil {
			t.Fatal(err)
		}
		if ids, _ := b.IDs(); len(ids) != 0 {
			t.Errorf("ids after remove: %v", ids)
		}
		if err := sb.Start(t.Context()); err == nil {
			t.Error("a removed sandbox started")
		}
	})
}

// TestStartHook: a failing hook fails the start with nothing running; the
// next start succeeds.
func TestStartHook(t *testing.T) {
	b := fake.New()
	defer b.Close()
	boom := errors.New("boom")
	b.SetStartHook(func(string) error { return boom })
	sb, err := b.Create(t.Context(), backend.Config{ID: "x", Image: &image.Image{Layers: []string{"/"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Start(t.Context()); !errors.Is(err, boom) {
		t.Fatalf("start: %v", err)
	}
	if r := b.Running(); len(r) != 0 {
		t.Fatalf("running after a failed start: %v", r)
	}
	b.SetStartHook(nil)
	if err := sb.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if r := b.Running(); len(r) != 1 {
		t.Fatalf("running: %v", r)
	}
	if _, err := b.Create(t.Context(), backend.Config{ID: "x", Image: &image.Image{Layers: []string{"/"}}}); err == nil {
		t.Error("created twice")
	}
	if _, err := b.Create(t.Context(), backend.Config{ID: "BAD"}); err == nil {
		t.Error("an invalid config was accepted")
	}
}
