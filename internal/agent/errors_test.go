package agent

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"sync"
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
