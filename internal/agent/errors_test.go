package agent

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/wire"
)

// TestErrorKinds pins the kind the server reports for each kind of error
// the agent answers, as the client returns it.
func TestErrorKinds(t *testing.T) {
	// The agent's answer, chosen per request by the test below.
	var (
		mu     sync.Mutex
		status int
		body   string
	)
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body)) // the client's reading is under test
	})}
	go func() { _ = srv.Serve(l) }() // returns ErrServerClosed at Cleanup
	t.Cleanup(func() { _ = srv.Close() })
	c := NewClient(sock)
	t.Cleanup(c.Close)

	errBody := func(kind string) string {
		b, _ := json.Marshal(wire.ErrorBody{Kind: kind, Message: "m"})
		return string(b)
	}
	for _, tc := range []struct {
		status int
		body   string
		want   string
	}{
		{400, errBody(wire.ErrInvalid), "invalid_params"},
		{404, errBody(wire.ErrNotFound), "not_found"},
		{409, errBody(wire.ErrExists), "conflict"},
		{403, errBody(wire.ErrPermission), "forbidden"},
		{413, errBody(wire.ErrTooLarge), "too_large"},
		{429, errBody(wire.ErrLimit), "limit"},
		{500, errBody(wire.ErrInternal), errdefs.Internal},
		{400, errBody("no_such_kind"), errdefs.Internal},
		{502, "not json", errdefs.Internal},
	} {
		mu.Lock()
		status, body = tc.status, tc.body
		mu.Unlock()
		_, err := c.Health(context.Background())
		var ae *Error
		if !errors.As(err, &ae) {
			t.Errorf("%d %s: %v is not an agent error", tc.status, tc.body, err)
			continue
		}
		if got := errdefs.Kind(err); got != tc.want {
			t.Errorf("%d %s: kind %q, want %q", tc.status, tc.body, got, tc.want)
		}
	}
	// A kind given around an agent error wins over the agent's.
	err = errdefs.Errorf(errdefs.ErrConflict, "stopped: %w", &Error{ErrorBody: wire.ErrorBody{Kind: wire.ErrNotFound}})
	if got := errdefs.Kind(err); got != "conflict" {
		t.Errorf("kind around an agent error: %q, want conflict", got)
	}
}

// TestLongPathRefused: a path far past PATH_MAX is refused before it is
// sent, as invalid, with a short message (the transport error it caused
// quoted the whole URL: 40 MiB in an API answer).
func TestLongPathRefused(t *testing.T) {
	var got atomic.Int32
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		got.Add(1)
		_, _ = w.Write([]byte(`{"name":"p"}`))
	})}
	go func() { _ = srv.Serve(l) }() // returns ErrServerClosed at Cleanup
	t.Cleanup(func() { _ = srv.Close() })
	c := NewClient(sock)
	t.Cleanup(c.Close)
	_, err = c.Stat(context.Background(), "/"+strings.Repeat("p", 4<<20))
	if !errors.Is(err, errdefs.ErrInvalid) || len(err.Error()) > 200 {
		t.Fatalf("a 4 MiB path: %.300v", err)
	}
	if _, err := c.Stat(context.Background(), "/"+strings.Repeat("p", 4000)); err != nil {
		t.Fatalf("a 4000-byte path: %v", err)
	}
	if n := got.Load(); n != 1 {
		t.Fatalf("the agent got %d requests, want only the short path's", n)
	}
}
