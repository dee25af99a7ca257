package main

import (
	"bufio"
	"encoding/json"
	"io"
	"strings"

	"github.com/warren-sandbox/warren/internal/guest"
	"github.com/warren-sandbox/warren/internal/guest/httpd"
	"github.com/warren-sandbox/warren/internal/wire"
)

// warmUp runs, once, the code a sandbox's first moments need: decoding a
// config shaped like the real one (encoding/json builds its per-type caches
// on first use), encoding exec events, and parsing and answering an HTTP
// request. It runs while the agent waits for its config or sets up; it
// touches nothing outside this process.
//
// The config is decoded only by a pooled agent, whose config comes long
// after it starts. Any other agent has its config waiting when it starts,
// and decoding a second one alongside would only duplicate the caches'
// construction (0.2 ms of CPU) on the other CPU.
func warmUp(pooled bool) {
	if pooled {
		var cfg guest.Config
		_ = json.Unmarshal([]byte(warmConfig), &cfg)
	}
	enc := json.NewEncoder(io.Discard)
	_ = enc.Encode(wire.ExecEvent{Stream: wire.Stdout, Data: []byte("x")})
	_ = enc.Encode(wire.ExecEvent{Exit: &wire.ExitStatus{Code: 1}})
	var req wire.ExecRequest
	_ = json.Unmarshal([]byte(`{"argv":["/bin/true"],"env":["A=b"],"timeout_ms":1}`), &req)
	httpd.WarmUp(bufio.NewReader(strings.NewReader("POST /v1/exec HTTP/1.1\r\nHost: agent\r\nContent-Length: 2\r\n\r\n{}")))
}

// warmConfig is shaped like the config the host sends (TestWarmConfigShape
// keeps it so). A literal rather than an encoded oci.Build result: building
// encoding/json's encoders for the OCI types cost every agent as much CPU
// as the decoding it warms up.
const warmConfig = `{"spec":{
"process":{"env":["A=b"],"cwd":"/",
 "capabilities":{"bounding":["CAP_KILL"],"effective":["CAP_KILL"],"permitted":["CAP_KILL"]},
 "rlimits":[{"type":"RLIMIT_NOFILE","hard":1,"soft":1}],"noNewPrivileges":true},
"root":{"path":"/"},"hostname":"warm",
"mounts":[{"destination":"/usr","type":"bind","source":"/usr","options":["rbind","ro"]}],
"linux":{"namespaces":[{"type":"pid"}],"maskedPaths":["/proc/kcore"],"readonlyPaths":["/proc/sys"]}},
"seccomp_filter":"AQIDBAUGBwg=","rootfs":{"lower":["/"],"upper":"/u","work":"/w"},"python":"p","user":"u","lifeline":false}`
