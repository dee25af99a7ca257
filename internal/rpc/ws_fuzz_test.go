package rpc_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/errdefs"
)

// wsFrame is a client frame: FIN set, masked with the zero key (so the
// fuzzer sees the payload as it is).
func wsFrame(opcode byte, payload string) []byte {
	b := []byte{0x80 | opcode}
	switch n := len(payload); {
	case n < 126:
		b = append(b, 0x80|byte(n))
	case n < 1<<16:
		b = append(b, 0x80|126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, 0x80|127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	b = append(b, 0, 0, 0, 0)
	return append(b, payload...)
}

// FuzzWebSocket sends arbitrary bytes after the WebSocket handshake of
// /api/v1/ws, as a client of sandbox fuzz/box: the frame reader
// (fragments, control frames, lengths up to 2^63, the 1 MiB message
// bound), then the start message and every later message. Whatever
// arrives, the server ends the session once the client has stopped
// sending, and everything it sent is well-formed frames whose text is a
// message of a documented type; an error message carries a kind other
// than internal.
func FuzzWebSocket(f *testing.F) {
	e := newFakeEnv(f, false, nil)
	start := `{"argv":["cat"],"env":["A=1"],"cwd":"/","tty":false,"rows":24,"cols":80}`
	for _, s := range [][]byte{
		cat(wsFrame(1, start), wsFrame(1, `{"type":"stdin","data":"aGkK"}`), wsFrame(1, `{"type":"eof"}`)),
		cat(wsFrame(1, `{"argv":["sh","-c","echo x; exit 3"],"tty":true}`), wsFrame(1, `{"type":"resize","rows":10,"cols":20}`),
			wsFrame(1, `{"type":"signal","signal":"SIGINT"}`), wsFrame(1, `{"type":"nope"}`)),
		cat(wsFrame(1, start), wsFrame(9, "ping"), wsFrame(8, "\x03\xe8")),
		// A message in two fragments.
		cat([]byte{0x01, 0x80 | 5, 0, 0, 0, 0}, []byte(`{"arg`), []byte{0x80, 0x80 | 15, 0, 0, 0, 0}, []byte(`v":["echo","x"]}`)),
		// A frame that says it holds 2^62 bytes.
		{0x81, 0xff, 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		wsFrame(1, `{"argv":[]}`),
		wsFrame(2, start),
		wsFrame(1, strings.Repeat(" ", 1<<20)+start),
		[]byte("not a frame"),
		{},
	} {
		f.Add(s)
	}
	addr := strings.TrimPrefix(e.url, "http://")
	f.Fuzz(func(t *testing.T, in []byte) {
		ensureBox(t, e.mgr)
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		hs := "GET /api/v1/ws?namespace=fuzz&sandbox=box HTTP/1.1\r\nHost: " + addr + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
			"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nOrigin: http://" + addr + "\r\n" +
			"Authorization: Bearer " + e.admin + "\r\n\r\n"
		if _, err := io.WriteString(c, hs); err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(c)
		status, err := r.ReadString('\n')
		if err != nil || !strings.Contains(status, " 101 ") {
			t.Fatalf("handshake: %q %v", status, err)
		}
		for {
			l, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("handshake: %v", err)
			}
			if l == "\r\n" {
				break
			}
		}
		// The server may stop reading early (a refused first message): a
		// write that fails then is not a finding.
		_, _ = c.Write(in)
		_ = c.(*net.TCPConn).CloseWrite()
		out, err := io.ReadAll(r)
		if err != nil && !isReset(err) {
			t.Fatalf("the session did not end once the client stopped sending: %v (%d bytes read)", err, len(out))
		}
		checkServerFrames(t, out)
	})
}

func cat(bs ...[]byte) []byte { return bytes.Join(bs, nil) }

func isReset(err error) bool {
	return strings.Contains(err.Error(), "connection reset")
}

// checkServerFrames parses what the server sent: unmasked frames, each
// text frame a JSON message of a documented type.
func checkServerFrames(t *testing.T, b []byte) {
	t.Helper()
	for len(b) > 0 {
		if len(b) < 2 {
			t.Fatalf("truncated frame header %q", b)
		}
		op, n, h := b[0]&0x0f, int(b[1]&0x7f), 2
		if b[1]&0x80 != 0 {
			t.Fatalf("server frame is masked")
		}
		switch n {
		case 126:
			if len(b) < 4 {
				t.Fatalf("truncated frame header %q", b)
			}
			n, h = int(binary.BigEndian.Uint16(b[2:])), 4
		case 127:
			if len(b) < 10 {
				t.Fatalf("truncated frame header %q", b)
			}
			n, h = int(binary.BigEndian.Uint64(b[2:])), 10
		}
		if n < 0 || len(b)-h < n {
			t.Fatalf("frame of %d bytes, %d sent", n, len(b)-h)
		}
		payload := b[h : h+n]
		b = b[h+n:]
		switch op {
		case 1:
		case 8, 9, 10:
			continue
		default:
			t.Fatalf("server frame of opcode %d", op)
		}
		var m struct {
			Type string `json:"type"`
			Kind string `json:"kind"`
		}
		if err := json.Unmarshal(payload, &m); err != nil {
			t.Fatalf("server message %q: %v", payload, err)
		}
		switch m.Type {
		case "started", "stdout", "stderr", "dropped", "exit":
		case "error":
			if m.Kind == "" || m.Kind == errdefs.Internal {
				t.Fatalf("error message of kind %q: %s", m.Kind, payload)
			}
		default:
			t.Fatalf("server message of type %q: %s", m.Type, payload)
		}
	}
}
