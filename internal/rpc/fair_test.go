package rpc_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/rpc"
)

// TestBulkFairness: one tenant's bulk requests take turns behind each
// other, and nothing of another tenant's waits behind them. Tenant A's
// first big file.write sends half its body and stalls, as a slow client
// does: it is A's bulk request until its body is read and decoded. A's
// second big write waits for it; tenant B's small request and B's own big
// write are answered meanwhile. Once A's first body ends, both of A's
// writes are answered. Order is asserted, not speed.
func TestBulkFairness(t *testing.T) {
	e := newFakeEnv(t, false, nil)
	keys := map[string]string{}
	for _, ns := range []string{"fair-a", "fair-b"} {
		k, _, err := e.keys.Create(t.Context(), ns, time.Hour, "")
		if err != nil {
			t.Fatal(err)
		}
		keys[ns] = k
		if r := e.callAs(k, "sandbox.start", map[string]any{"sandbox": "box"}); r.Error != nil {
			t.Fatalf("start in %s: %s", ns, r.Raw)
		}
	}
	data := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("x"), rpc.BulkBytes+rpc.BulkBytes/2))
	write := func(path string) []byte {
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "sandbox.file.write",
			"params": map[string]any{"sandbox": "box", "path": path, "data": data}})
		return b
	}
	// send posts body (read from r) as ns; the answer's status, or -1.
	send := func(ns string, r io.Reader) <-chan string {
		done := make(chan string, 1)
		go func() {
			req, _ := http.NewRequest("POST", e.url+"/api/v1/rpc", r)
			req.Header.Set("Authorization", "Bearer "+keys[ns])
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				done <- err.Error()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			done <- fmt.Sprintf("%d %.200s", resp.StatusCode, b)
		}()
		return done
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting until %s", what)
			}
		}
	}
	pending := func(c <-chan string) bool {
		select {
		case s := <-c:
			t.Fatalf("answered too early: %s", s)
		default:
		}
		return true
	}

	// A1: a chunked body (no length) stalled after its first bulkBytes+.
	body1 := write("/tmp/a1")
	pr, pw := io.Pipe()
	t.Cleanup(func() { _ = pw.CloseWithError(io.ErrUnexpectedEOF) }) // before the server closes
	a1 := send("fair-a", pr)
	cut := rpc.BulkBytes + 4096
	if _, err := pw.Write(body1[:cut]); err != nil {
		t.Fatal(err)
	}
	waitFor("A's first write is A's bulk request", func() bool { return e.srv.BulkWaiting("fair-a") == 1 })

	// A2, with a length: it waits to be A's bulk request.
	a2 := send("fair-a", bytes.NewReader(write("/tmp/a2")))
	waitFor("A's second write waits", func() bool { return e.srv.BulkWaiting("fair-a") == 2 })

	// B is not held up by A's bulk: neither B's small request nor B's
	// own bulk one.
	if r := e.callAs(keys["fair-b"], "sandbox.list", map[string]any{}); r.Status != 200 {
		t.Fatalf("B's small request: %s", r.Raw)
	}
	if s := <-send("fair-b", bytes.NewReader(write("/tmp/b"))); !strings.HasPrefix(s, "200 ") {
		t.Fatalf("B's bulk write: %s", s)
	}
	pending(a1)
	pending(a2)
	if n := e.srv.BulkWaiting("fair-a"); n != 2 {
		t.Fatalf("A's requests in or waiting for their turn: %d, want 2", n)
	}

	// A1's body ends: both of A's writes are answered.
	go func() {
		_, _ = pw.Write(body1[cut:])
		_ = pw.Close()
	}()
	for _, c := range []<-chan string{a1, a2} {
		if s := <-c; !strings.HasPrefix(s, "200 ") {
			t.Fatalf("A's write: %s", s)
		}
	}
	waitFor("A has no bulk request left", func() bool { return e.srv.BulkWaiting("fair-a") == 0 })
}
