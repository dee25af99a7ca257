package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/wire"
)

// FuzzExecStream feeds arbitrary agent output to the host's exec decoder: it
// must never panic, and must only deliver output for the two known streams.
func FuzzExecStream(f *testing.F) {
	f.Add([]byte(`{"stream":"stdout","data":"aGk="}` + "\n" + `{"exit":{"code":0,"duration_ms":1}}` + "\n"))
	f.Add([]byte(`{"stream":"x","data":"aGk="}`))
	f.Add([]byte(`{"exit":null}` + "\n"))
	f.Add(bytes.Repeat([]byte("a"), 2<<20))
	f.Add([]byte(`{"stream":"stdout","data":"aGk\u003d"}` + "\n" + `{"stream":"stderr","data":"aG\rk="}` + "\n"))
	f.Add([]byte(`{"stream":"stdout","data":"aGk=","exit":{"code":0}}` + "\n" + `{"stream":"stdout","data":"aGk"}` + "\n"))
	f.Add([]byte(`{"stream":"stdout","data":"a==="}` + "\n" + `{"stream":"stdout","data":"aG==aGk="}` + "\n" + `{"stream":"stdout","data":""}` + "\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = readExecStream(bytes.NewReader(b), 1<<20, func(stream string, data []byte) {
			if stream != wire.Stdout && stream != wire.Stderr {
				t.Fatalf("output for stream %q", stream)
			}
		})
		// The fast path reads a line as encoding/json does, or leaves it.
		for _, line := range bytes.Split(b, []byte("\n")) {
			fast, ok := outputEvent(line)
			if !ok {
				continue
			}
			var slow wire.ExecEvent
			if err := json.Unmarshal(line, &slow); err != nil || slow.Stream != fast.Stream || !bytes.Equal(slow.Data, fast.Data) || slow.Exit != nil {
				t.Fatalf("%q: fast path %s %q, encoding/json %s %q %v", line, fast.Stream, fast.Data, slow.Stream, slow.Data, err)
			}
		}
	})
}

// BenchmarkExecStream decodes 16 MiB of output in the agent's 32 KiB
// events: the host's CPU per byte of a run's output outside the server's
// bulk turns.
func BenchmarkExecStream(b *testing.B) {
	var stream bytes.Buffer
	enc := json.NewEncoder(&stream)
	chunk := bytes.Repeat([]byte{1}, 32<<10)
	for range 512 {
		_ = enc.Encode(wire.ExecEvent{Stream: wire.Stdout, Data: chunk})
	}
	_ = enc.Encode(wire.ExecEvent{Exit: &wire.ExitStatus{}})
	b.SetBytes(512 << 15)
	for b.Loop() {
		if _, err := readExecStream(bytes.NewReader(stream.Bytes()), 1<<30, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func TestExecStreamErrors(t *testing.T) {
	for name, in := range map[string]string{
		"empty":          "",
		"no exit":        `{"stream":"stdout","data":"aGk="}` + "\n",
		"garbage":        "not json\n",
		"unknown stream": `{"stream":"evil","data":"aGk="}` + "\n",
		"huge line":      string(bytes.Repeat([]byte("a"), 2<<20)),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := readExecStream(bytes.NewReader([]byte(in)), 1<<20, nil); err == nil {
				t.Error("want an error")
			}
		})
	}
	st, err := readExecStream(bytes.NewReader([]byte(`{"stream":"stderr","data":"/w=="}`+"\n"+`{"exit":{"code":3,"signal":"SIGTERM","duration_ms":2}}`+"\n")), 1<<20, func(s string, d []byte) {
		if s != wire.Stderr || !bytes.Equal(d, []byte{0xff}) {
			t.Errorf("got %s %q", s, d)
		}
	})
	if err != nil || st.Code != 3 || st.Signal != "SIGTERM" {
		t.Errorf("got %+v %v", st, err)
	}
}

// FuzzAnswers answers every request of the host's agent client with the
// same status and body, as a hostile agent may: each method either fails
// or returns what the body decodes to; an error status is an *Error with a
// kind; a REPL answer delivers at most maxReplLines lines and an exec only
// known streams; nothing panics.
func FuzzAnswers(f *testing.F) {
	for _, s := range []struct {
		status int
		body   string
	}{
		{200, `{"version":"` + wire.Version + `"}`},
		{200, `{"id":"p1","pid":7,"argv":["cat"],"running":true,"exit":{"code":0,"duration_ms":1}}`},
		{200, `[{"id":"p1","pid":7},{"id":"p2"}]`},
		{200, `{"data":"aGk=","next_offset":2,"eof":true,"dropped":5}`},
		{200, `[{"name":"a","path":"/a","size":1,"mode":420,"type":"file","mod_time":"2020-01-01T00:00:00Z"}]`},
		{200, `{"status":"success","language":"python","output":[{"stream":"stdout","text":"1"}],"has_error":false,"result":"1"}`},
		{200, `{"output":[` + strings.Repeat(`{"stream":"stdout","text":""},`, 50) + `{}],"output":[]}`},
		{200, `{"stream":"stdout","data":"aGk="}` + "\n" + `{"exit":{"code":0,"duration_ms":1}}` + "\n"},
		{404, `{"kind":"not_found","message":"no such process"}`},
		{500, `not json`},
		{409, `{"kind":"","message":"x"}`},
		{200, ``},
		{200, `{"output":{}}`},
	} {
		f.Add(s.status, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		if status < 200 || status > 599 {
			status = 200 + (status%400+400)%400
		}
		c := NewClientDial(func(context.Context) (net.Conn, error) {
			client, agent := net.Pipe()
			go answer(agent, status, body)
			return client, nil
		})
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		check := func(what string, err error) {
			t.Helper()
			if err == nil {
				if status >= 300 {
					t.Fatalf("%s: status %d answered without an error", what, status)
				}
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("%s: did not finish: %v", what, err)
			}
			var ae *Error
			if status >= 300 && (!errors.As(err, &ae) || ae.Kind == "" || ae.Status != status) {
				t.Fatalf("%s: status %d gave %#v", what, status, err)
			}
		}
		_, err := c.Health(ctx)
		if err == nil && status >= 300 {
			t.Fatalf("health: status %d answered without an error", status)
		}
		_, err = c.StartProcess(ctx, &wire.ExecRequest{Argv: []string{"cat"}})
		check("start process", err)
		_, err = c.Processes(ctx)
		check("processes", err)
		_, err = c.Process(ctx, "p1")
		check("process", err)
		_, err = c.Output(ctx, "p1", wire.Stdout, 0, time.Millisecond)
		check("output", err)
		_, err = c.Wait(ctx, "p1", time.Millisecond)
		check("wait", err)
		check("signal", c.Signal(ctx, "p1", "SIGTERM"))
		check("stdin", c.WriteStdin(ctx, "p1", []byte("x"), true))
		check("resize", c.Resize(ctx, "p1", 1, 1))
		check("remove process", c.RemoveProcess(ctx, "p1"))
		b, err := c.ReadFile(ctx, "/a")
		check("read file", err)
		if len(b) > wire.MaxFileRead+1 {
			t.Fatalf("read file: %d bytes", len(b))
		}
		check("write file", c.WriteFile(ctx, "/a", bytes.NewReader([]byte("x")), 0o644))
		_, err = c.Stat(ctx, "/a")
		check("stat", err)
		_, err = c.List(ctx, "/")
		check("list", err)
		check("mkdir", c.Mkdir(ctx, wire.MkdirRequest{Path: "/d"}))
		check("remove", c.Remove(ctx, wire.RemoveRequest{Path: "/d"}))
		check("move", c.Move(ctx, "/a", "/b"))
		check("upload tar", c.UploadTar(ctx, "/", bytes.NewReader(nil)))
		if r, err := c.DownloadTar(ctx, "/"); err == nil {
			_, _ = io.Copy(io.Discard, r)
			_ = r.Close()
		} else {
			check("download tar", err)
		}
		lines := 0
		_, err = c.ReplStream(ctx, wire.ReplRequest{Language: "python", Code: "1"}, func(wire.OutputLine) { lines++ })
		if status < 300 && lines > maxReplLines {
			t.Fatalf("repl: %d lines", lines)
		}
		if status >= 300 {
			check("repl", err)
		}
		_, err = c.Exec(ctx, &wire.ExecRequest{Argv: []string{"x"}}, func(stream string, _ []byte) {
			if stream != wire.Stdout && stream != wire.Stderr {
				t.Fatalf("exec: output for stream %q", stream)
			}
		})
		if status >= 300 {
			check("exec", err)
		}
	})
}

// answer serves one request on conn with status and body.
func answer(conn net.Conn, status int, body []byte) {
	defer func() { _ = conn.Close() }()
	r := bufio.NewReader(conn)
	req, err := http.ReadRequest(r)
	if err != nil {
		return
	}
	go func() { _, _ = io.Copy(io.Discard, req.Body) }()
	_, _ = fmt.Fprintf(conn, "HTTP/1.1 %d X\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", status, len(body))
	_, _ = conn.Write(body)
}
