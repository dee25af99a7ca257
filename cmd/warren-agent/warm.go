package main

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"strings"

	"github.com/warren-sandbox/warren/internal/guest/httpd"
	"github.com/warren-sandbox/warren/internal/wire"
)

// warmUp runs, once, the code a sandbox's first moments need: encoding exec
// events and decoding an exec request (encoding/json builds its per-type
// caches on first use), and parsing and answering an HTTP request. It runs
// while the agent waits for its config or sets up; it touches nothing
// outside this process.
//
// A pooled agent, which waits long before its sandbox exists, also makes
// package os check once that pidfds work (a probe that forks a child),
// which the sandbox's first command would otherwise pay for. Any other
// agent would only move that fork from the first command to its start.
func warmUp(pooled bool) {
	if pooled {
		if p, err := os.FindProcess(os.Getpid()); err == nil {
			_ = p.Release()
		}
	}
	enc := json.NewEncoder(io.Discard)
	_ = enc.Encode(wire.ExecEvent{Stream: wire.Stdout, Data: []byte("x")})
	_ = enc.Encode(wire.ExecEvent{Exit: &wire.ExitStatus{Code: 1}})
	var req wire.ExecRequest
	_ = json.Unmarshal([]byte(`{"argv":["/bin/true"],"env":["A=b"],"timeout_ms":1}`), &req)
	httpd.WarmUp(bufio.NewReader(strings.NewReader("POST /v1/exec HTTP/1.1\r\nHost: agent\r\nContent-Length: 2\r\n\r\n{}")))
}
