package httpd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// serve starts a server on a unix socket and returns a net/http client for
// it: the client the host really uses.
func serve(t *testing.T, m *Mux) *http.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() { _ = Serve(l, m) }() // returns when the listener closes
	var dials atomic.Int64
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func TestRoutesBodiesAndKeepAlive(t *testing.T) {
	var m Mux
	m.HandleFunc("GET /v1/items/{id}/name", func(w ResponseWriter, r *Request) {
		fmt.Fprintf(w, "id=%s q=%s", r.PathValue("id"), r.Query.Get("q"))
	})
	m.HandleFunc("PUT /v1/echo", func(w ResponseWriter, r *Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(400)
			return
		}
		w.Header()["Content-Length"] = fmt.Sprint(len(b))
		_, _ = w.Write(b) // the client's reads are what the test checks
	})
	m.HandleFunc("POST /v1/empty", func(w ResponseWriter, r *Request) { w.WriteHeader(204) })
	c := serve(t, &m)

	for range 3 { // several requests over one kept-alive connection
		resp, err := c.Get("http://x/v1/items/a%20b/name?q=z")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if string(b) != "id=a b q=z" {
			t.Errorf("got %q", b)
		}
	}
	big := bytes.Repeat([]byte{0, 1, 2, 0xff}, 300000)
	// An io.Reader of unknown length makes net/http send a chunked body.
	req, _ := http.NewRequest("PUT", "http://x/v1/echo", io.MultiReader(bytes.NewReader(big)))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if !bytes.Equal(b, big) {
		t.Errorf("chunked echo: got %d bytes", len(b))
	}
	resp, err = c.Post("http://x/v1/empty", "", nil)
	if err != nil || resp.StatusCode != 204 {
		t.Fatalf("204: %v %v", resp, err)
	}
	_ = resp.Body.Close()
	for path, want := range map[string]int{"/v1/nope": 404, "/v1/items/a/name/x": 404} {
		resp, err := c.Get("http://x" + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: %d want %d", path, resp.StatusCode, want)
		}
	}
	resp, err = c.Post("http://x/v1/items/a/name", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Errorf("wrong method: %d", resp.StatusCode)
	}
}

func TestStreamingAndClientHangup(t *testing.T) {
	var m Mux
	cancelled := make(chan struct{})
	m.HandleFunc("POST /v1/stream", func(w ResponseWriter, r *Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		for i := 0; ; i++ {
			fmt.Fprintf(w, "line %d\n", i)
			w.Flush()
			select {
			case <-r.Context().Done():
				close(cancelled)
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
	c := serve(t, &m)
	resp, err := c.Post("http://x/v1/stream", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 7)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "line 0\n" {
		t.Fatalf("first streamed line: %q %v", buf, err)
	}
	_ = resp.Body.Close() // hang up mid-stream
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("handler's context not cancelled after the client hung up")
	}
}

func TestHostileRequests(t *testing.T) {
	var m Mux
	m.HandleFunc("GET /", func(w ResponseWriter, r *Request) {})
	sock := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	go func() { _ = Serve(l, &m) }() // returns when the listener closes
	for name, raw := range map[string]string{
		"garbage":          "hello\r\n\r\n",
		"long header":      "GET / HTTP/1.1\r\nX: " + strings.Repeat("a", MaxHeaderBytes+10) + "\r\n\r\n",
		"many headers":     "GET / HTTP/1.1\r\n" + strings.Repeat("X: y\r\n", MaxHeaders+5) + "\r\n",
		"bad length":       "GET / HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
		"bad encoding":     "GET / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
		"bad chunk":        "PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"bad target":       "GET %zz HTTP/1.1\r\n\r\n",
		"wrong version":    "GET / SPDY/3\r\n\r\n",
		"truncated":        "GET / HTTP/1.1\r\nHost: x",
		"no line end ever": strings.Repeat("A", 200000),
	} {
		t.Run(name, func(t *testing.T) {
			c, err := net.Dial("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = c.Close() }()
			if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
				t.Fatal(err)
			}
			go func() { _, _ = io.WriteString(c, raw); _ = c.(*net.UnixConn).CloseWrite() }() // the server may hang up first
			b, err := io.ReadAll(c)
			// A reset is a close too: the server may hang up while the
			// client is still sending.
			if err != nil && !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("server did not close the connection: %v", err)
			}
			if s := string(b); s != "" && !strings.HasPrefix(s, "HTTP/1.1 ") {
				t.Errorf("answer %q", s)
			}
		})
	}
}

func TestLimitBody(t *testing.T) {
	b, err := io.ReadAll(LimitBody(strings.NewReader("12345"), 5))
	if err != nil || string(b) != "12345" {
		t.Errorf("at the limit: %q %v", b, err)
	}
	b, err = io.ReadAll(LimitBody(strings.NewReader("123456"), 5))
	if !errors.Is(err, ErrBodyTooLarge) || len(b) > 5 {
		t.Errorf("past the limit: %q %v", b, err)
	}
}
