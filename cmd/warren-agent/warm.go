package main

import (
	"bufio"
	"encoding/json"
	"io"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/warren-sandbox/warren/internal/guest"
	"github.com/warren-sandbox/warren/internal/guest/httpd"
	"github.com/warren-sandbox/warren/internal/oci"
	"github.com/warren-sandbox/warren/internal/wire"
)

// warmUp runs, once, the code a sandbox's first moments need: decoding a
// config shaped like the real one (encoding/json builds its per-type caches
// on first use: 0.8 ms for the OCI spec in a fresh agent), encoding exec
// events, and parsing and answering an HTTP request. It runs while the
// agent waits for its config, which for a pooled agent is long before the
// sandbox is started; it touches nothing outside this process.
func warmUp() {
	m := &oci.IDMap{Host: 1, Size: 1}
	sp, err := oci.Build(oci.Params{
		RootPath: "/", Hostname: "warm", UserNS: m, MemoryBytes: 1 << 30, CPUs: 1, PidsMax: 1,
		ImageMounts: []specs.Mount{{Destination: "/usr", Type: "bind", Source: "/usr", Options: []string{"rbind", "ro"}}},
	})
	if err != nil {
		return
	}
	b, err := json.Marshal(guest.Config{Spec: sp, SeccompFilter: []byte{1, 2, 3, 4, 5, 6, 7, 8}, Rootfs: guest.Rootfs{Lower: []string{"/"}}})
	if err != nil {
		return
	}
	var cfg guest.Config
	_ = json.Unmarshal(b, &cfg)
	enc := json.NewEncoder(io.Discard)
	_ = enc.Encode(wire.ExecEvent{Stream: wire.Stdout, Data: []byte("x")})
	_ = enc.Encode(wire.ExecEvent{Exit: &wire.ExitStatus{Code: 1}})
	var req wire.ExecRequest
	_ = json.Unmarshal([]byte(`{"argv":["/bin/true"],"env":["A=b"],"timeout_ms":1}`), &req)
	httpd.WarmUp(bufio.NewReader(strings.NewReader("POST /v1/exec HTTP/1.1\r\nHost: agent\r\nContent-Length: 2\r\n\r\n{}")))
}
