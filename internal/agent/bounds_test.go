package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/wire"
)

// endlessAgent returns a client whose agent answers every request with
// status, no length, head and then piece repeated until the client hangs
// up, waiting pause before each piece; sent counts the bytes of body sent.
func endlessAgent(t *testing.T, status int, head, piece string, pause time.Duration) (c *Client, sent *atomic.Int64) {
	sent = new(atomic.Int64)
	c = NewClientDial(func(context.Context) (net.Conn, error) {
		client, agent := net.Pipe()
		go func() {
			defer func() { _ = agent.Close() }()
			req, err := http.ReadRequest(bufio.NewReader(agent))
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, req.Body) }()
			if _, err := fmt.Fprintf(agent, "HTTP/1.1 %d X\r\nConnection: close\r\n\r\n%s", status, head); err != nil {
				return
			}
			sent.Add(int64(len(head)))
			p := []byte(piece)
			if pause == 0 {
				p = bytes.Repeat(p, max(1, 64<<10/len(p)))
			}
			for {
				time.Sleep(pause)
				n, err := agent.Write(p)
				sent.Add(int64(n))
				if err != nil {
					return
				}
			}
		}()
		return client, nil
	})
	t.Cleanup(c.Close)
	return c, sent
}

// TestEndlessAnswers: an agent that answers any method without end (a
// sandbox that replaced what answers on the agent's socket) gets an error
// of kind too_large, once the client has read no more than the method's
// bound: the server does not grow with what the agent sends.
func TestEndlessAnswers(t *testing.T) {
	const slack = 1 << 20 // what the transport and decoders read ahead
	// A JSON string that never ends: a decoder must hold it whole.
	str := `"`
	// Smaller bounds than the client's own keep the test quick under the
	// race detector: what is under test is that each method has one.
	small := bounds{list: 3 << 20, process: 2 << 20, fileRead: 4 << 20}
	const replLimit = 64 << 10
	for _, tc := range []struct {
		name        string
		head, piece string
		bound       int64
		call        func(c *Client, ctx context.Context) error
	}{
		{"health", str, "a", maxSmallAnswer, func(c *Client, ctx context.Context) error { _, err := c.Health(ctx); return err }},
		{"start process", str, "a", small.process, func(c *Client, ctx context.Context) error {
			_, err := c.StartProcess(ctx, &wire.ExecRequest{Argv: []string{"cat"}})
			return err
		}},
		{"processes", str, "a", small.list, func(c *Client, ctx context.Context) error { _, err := c.Processes(ctx); return err }},
		{"process", str, "a", small.process, func(c *Client, ctx context.Context) error { _, err := c.Process(ctx, "p1"); return err }},
		{"output", str, "a", maxChunkAnswer, func(c *Client, ctx context.Context) error {
			_, err := c.Output(ctx, "p1", wire.Stdout, 0, time.Second)
			return err
		}},
		{"wait", str, "a", small.process, func(c *Client, ctx context.Context) error { _, err := c.Wait(ctx, "p1", time.Second); return err }},
		{"signal", "", "a", maxSmallAnswer, func(c *Client, ctx context.Context) error { return c.Signal(ctx, "p1", "SIGTERM") }},
		{"resize", "", "a", maxSmallAnswer, func(c *Client, ctx context.Context) error { return c.Resize(ctx, "p1", 1, 1) }},
		{"remove process", "", "a", maxSmallAnswer, func(c *Client, ctx context.Context) error { return c.RemoveProcess(ctx, "p1") }},
		{"read file", "", "a", small.fileRead, func(c *Client, ctx context.Context) error {
			b, err := c.ReadFile(ctx, "/a")
			if len(b) > 0 {
				return fmt.Errorf("%d bytes of file returned with %w", len(b), err)
			}
			return err
		}},
		{"stat", str, "a", maxSmallAnswer, func(c *Client, ctx context.Context) error { _, err := c.Stat(ctx, "/a"); return err }},
		{"list", "[", `{"name":"a","path":"/a","type":"file"},`, small.list, func(c *Client, ctx context.Context) error {
			_, err := c.List(ctx, "/")
			return err
		}},
		{"mkdir", "", "a", maxSmallAnswer, func(c *Client, ctx context.Context) error { return c.Mkdir(ctx, wire.MkdirRequest{Path: "/d"}) }},
		{"remove", "", "a", maxSmallAnswer, func(c *Client, ctx context.Context) error { return c.Remove(ctx, wire.RemoveRequest{Path: "/d"}) }},
		{"move", "", "a", maxSmallAnswer, func(c *Client, ctx context.Context) error { return c.Move(ctx, "/a", "/b") }},
		// 64 KiB of output asked for: the stream is cut past it.
		{"exec", "", `{"stream":"stdout","data":"YWFh"}` + "\n", 64 << 10 / 3 * 34, func(c *Client, ctx context.Context) error {
			var got int
			_, err := c.Exec(ctx, &wire.ExecRequest{Argv: []string{"yes"}, OutputLimit: 64 << 10}, func(_ string, d []byte) { got += len(d) })
			if got > 64<<10 {
				return fmt.Errorf("%d bytes of output delivered, over the limit of 64 KiB, with %w", got, err)
			}
			return err
		}},
		{"exec, a line without end", "", "a", 1 << 20, func(c *Client, ctx context.Context) error {
			_, err := c.Exec(ctx, &wire.ExecRequest{Argv: []string{"yes"}, OutputLimit: 1 << 20}, nil)
			return err
		}},
		{"repl", `{"status":"success","output":[`, `{"stream":"stdout","text":"` + strings.Repeat("a", 1000) + `"},`, replAnswerMax(replLimit), func(c *Client, ctx context.Context) error {
			var got int64
			_, err := c.ReplStream(ctx, wire.ReplRequest{Language: "python", Code: "1", OutputLimit: replLimit}, func(l wire.OutputLine) { got += int64(len(l.Text)) + 1 })
			if got > replLimit+replSlack {
				return fmt.Errorf("%d bytes of output delivered, over the limit of %d, with %w", got, replLimit, err)
			}
			return err
		}},
		{"repl, a line without end", `{"status":"success","output":[{"stream":"stdout","text":"`, "a", replAnswerMax(replLimit), func(c *Client, ctx context.Context) error {
			_, err := c.ReplStream(ctx, wire.ReplRequest{Language: "python", Code: "1", OutputLimit: replLimit}, func(wire.OutputLine) {})
			return err
		}},
		{"repl, another member without end", `{"status":"success","output":[],"result":"`, "a", replAnswerMax(replLimit), func(c *Client, ctx context.Context) error {
			_, err := c.ReplStream(ctx, wire.ReplRequest{Language: "python", Code: "1", OutputLimit: replLimit}, func(wire.OutputLine) {})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, sent := endlessAgent(t, 200, tc.head, tc.piece, 0)
			c.bounds = small
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			err := tc.call(c, ctx)
			if !errors.Is(err, ErrAnswerTooLarge) || errdefs.Kind(err) != "too_large" {
				t.Fatalf("got %.300v (kind %s), want too_large", err, errdefs.Kind(err))
			}
			if ctx.Err() != nil {
				t.Fatalf("took the whole minute: %v", err)
			}
			if n := sent.Load(); n > tc.bound+slack {
				t.Fatalf("the client read %d bytes of an answer bounded at %d", n, tc.bound)
			}
		})
	}
	t.Run("error answer", func(t *testing.T) {
		c, sent := endlessAgent(t, 500, `{"kind":"internal","message":"`, "a", 0)
		_, err := c.Health(t.Context())
		var ae *Error
		if !errors.As(err, &ae) || ae.Status != 500 || len(ae.Message) > maxSmallAnswer+100 {
			t.Fatalf("got %.300v", err)
		}
		if n := sent.Load(); n > maxSmallAnswer+slack {
			t.Fatalf("the client read %d bytes of an error answer", n)
		}
	})
}

// TestTricklingAnswers: an answer whose body trickles without end is a
// timeout once answerTime has passed, for the answers the agent writes at
// once, error answers included.
func TestTricklingAnswers(t *testing.T) {
	for _, status := range []int{200, 404} {
		c, _ := endlessAgent(t, status, `{"version":"`, "a", 20*time.Millisecond)
		c.minAnswerTime = 300 * time.Millisecond
		t0 := time.Now()
		_, err := c.Health(t.Context())
		took := time.Since(t0)
		if status < 300 && (!errors.Is(err, ErrAnswerSlow) || errdefs.Kind(err) != "timeout") {
			t.Fatalf("status %d: got %v (kind %s), want timeout", status, err, errdefs.Kind(err))
		}
		var ae *Error
		if status >= 300 && !errors.As(err, &ae) {
			t.Fatalf("status %d: got %v, want an agent error", status, err)
		}
		if took > 5*time.Second {
			t.Fatalf("status %d: took %v", status, took)
		}
	}
}

// TestAnswersAtTheirBound: an answer that fills its bound exactly is
// read whole; a byte more is too large.
func TestAnswersAtTheirBound(t *testing.T) {
	if defaultBounds.fileRead != wire.MaxFileRead {
		t.Fatalf("a file read is bounded at %d bytes, not the agent's read limit", defaultBounds.fileRead)
	}
	const limit = 1 << 20
	for _, extra := range []int{0, 1} {
		body := bytes.Repeat([]byte("a"), limit+extra)
		c := NewClientDial(func(context.Context) (net.Conn, error) {
			client, agent := net.Pipe()
			go answer(agent, 200, body)
			return client, nil
		})
		c.bounds.fileRead = limit
		b, err := c.ReadFile(t.Context(), "/a")
		switch {
		case extra == 0 && (err != nil || len(b) != limit):
			t.Errorf("a file of the read limit: %d bytes, %v", len(b), err)
		case extra == 1 && !errors.Is(err, ErrAnswerTooLarge):
			t.Errorf("a file a byte over the read limit: %d bytes, %v", len(b), err)
		}
		c.Close()
	}
}
