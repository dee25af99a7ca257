package rpc_test

import (
	"archive/tar"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/rpc"
	"github.com/warren-sandbox/warren/sdk/warren"
)

// TestTimeoutBounds: every timeout, wait and lifetime is a number of
// seconds from 0 up to its documented maximum, checked before it is
// converted: one past the maximum, however large (1e10 overflowed into "no
// timeout" once), is invalid_params, and nothing runs; the timeouts of the
// microsandbox methods are held to theirs instead (docs/compat.md).
func TestTimeoutBounds(t *testing.T) {
	e := newFakeEnv(t, false, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "tb"}, nil)
	var sleeper, quick struct {
		ID string `json:"id"`
	}
	e.must("sandbox.process.start", map[string]any{"sandbox": "tb", "argv": []string{"sleep", "300"}}, &sleeper)
	e.must("sandbox.process.start", map[string]any{"sandbox": "tb", "argv": []string{"true"}}, &quick)
	var b timeoutBounds
	b.addHeld("sandbox.command.run", map[string]any{"sandbox": "tb", "command": "true"}, "timeout")
	b.add("sandbox.exec", map[string]any{"sandbox": "tb", "argv": []string{"true"}}, "timeout", 86400)
	b.add("sandbox.shell", map[string]any{"sandbox": "tb", "script": "true"}, "timeout", 86400)
	b.addHeld("sandbox.repl.run", map[string]any{"sandbox": "tb", "language": "python", "code": "1"}, "timeout")
	b.add("sandbox.process.wait", map[string]any{"sandbox": "tb", "id": quick.ID}, "timeout", 300)
	b.add("sandbox.process.output", map[string]any{"sandbox": "tb", "id": quick.ID}, "wait", 60)
	b.add("key.create", map[string]any{"namespace": "tb"}, "expire", 10*365*24*3600)
	for _, f := range []string{"idle_timeout", "max_lifetime"} {
		for _, v := range []float64{30*24*3600 + 0.001, 1e10, 1e19, -1} {
			b.cases = append(b.cases, timeoutCase{"sandbox.create", map[string]any{"name": "tb-create"}, f, v, false})
		}
	}
	b.check(t, e)
	if r := e.call("sandbox.get", map[string]any{"sandbox": "tb-create"}); r.Status != 404 {
		t.Errorf("a refused create left a sandbox: %s", r.Raw)
	}
	// Under a millisecond is a millisecond, not 0 (no timeout).
	r := e.call("sandbox.command.run", map[string]any{"sandbox": "tb", "command": "sleep", "args": []string{"5"}, "timeout": 0.0004})
	if r.Status != 504 || r.kind() != "timeout" {
		t.Errorf("command.run with a 0.4 ms timeout: %d %s", r.Status, r.Raw)
	}
	var res struct {
		TimedOut bool `json:"timed_out"`
	}
	e.must("sandbox.exec", map[string]any{"sandbox": "tb", "argv": []string{"sleep", "5"}, "timeout": 1e-9}, &res)
	if !res.TimedOut {
		t.Error("exec with a 1 ns timeout did not time out")
	}
	// A wait within its bound on a running process returns when it ends.
	var pi struct {
		Running bool `json:"running"`
	}
	e.must("sandbox.process.wait", map[string]any{"sandbox": "tb", "id": sleeper.ID, "timeout": 0.2}, &pi)
	if !pi.Running {
		t.Error("sleep 300 is not running any more")
	}
}

// timeoutBounds are calls of methods with a timeout at, around and far
// past its bound.
type timeoutBounds struct{ cases []timeoutCase }

type timeoutCase struct {
	method string
	params map[string]any
	field  string  // the timeout's name
	value  float64 // its value
	ok     bool
}

// add adds calls of method with field at max (valid) and past it either way.
func (b *timeoutBounds) add(method string, params map[string]any, field string, max float64) {
	for _, v := range []float64{max, max + 0.001, max * 2, 1e10, 1e19, 1e300, -1, -0.001} {
		b.cases = append(b.cases, timeoutCase{method, params, field, v, v == max})
	}
}

// addHeld adds calls of a microsandbox method whose timeout past its bound
// is held to it (limitSeconds): every non-negative value runs, the Go
// SDK's nanoseconds (6e10) among them; negative ones are invalid_params.
func (b *timeoutBounds) addHeld(method string, params map[string]any, field string) {
	for _, v := range []float64{0, 86400, 86400.001, 6e10, 1e19, 1e300, -1, -0.001} {
		b.cases = append(b.cases, timeoutCase{method, params, field, v, v >= 0})
	}
}

// check makes each call: the valid ones succeed, the others are
// invalid_params naming the field; none takes long.
func (b *timeoutBounds) check(t *testing.T, e *env) {
	t.Helper()
	for _, c := range b.cases {
		params := map[string]any{c.field: c.value}
		for k, v := range c.params {
			params[k] = v
		}
		t0 := time.Now()
		r := e.call(c.method, params)
		if took := time.Since(t0); took > 10*time.Second {
			t.Errorf("%s %s %g took %v", c.method, c.field, c.value, took)
		}
		switch {
		case c.ok && r.Status != 200:
			t.Errorf("%s %s %g: %d %s", c.method, c.field, c.value, r.Status, r.Raw)
		case !c.ok && (r.Status != 400 || r.kind() != "invalid_params" || !strings.Contains(r.Error.Message, c.field)):
			t.Errorf("%s %s %g: %d %s, want invalid_params naming %s", c.method, c.field, c.value, r.Status, r.Raw, c.field)
		}
	}
}

// TestFileWriteLimit: sandbox.file.write takes what fits the 64 MiB body
// once base64-encoded, 47 MiB, and says so past it; the tar route takes
// bigger files.
func TestFileWriteLimit(t *testing.T) {
	e := newFakeEnv(t, true, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "fw"}, nil)
	data := make([]byte, rpc.MaxFileWrite+1)
	for i := range data {
		data[i] = byte(i)
	}
	r := e.call("sandbox.file.write", map[string]any{"sandbox": "fw", "path": "/tmp/big", "data": base64.StdEncoding.EncodeToString(data)})
	if r.Status != 413 || r.kind() != "too_large" || !strings.Contains(r.Error.Message, "47 MiB") || !strings.Contains(r.Error.Message, "tar") {
		t.Fatalf("47 MiB + 1: %d %.300s", r.Status, r.Raw)
	}
	var w struct {
		Size int `json:"size"`
	}
	e.must("sandbox.file.write", map[string]any{"sandbox": "fw", "path": "/tmp/big", "data": base64.StdEncoding.EncodeToString(data[:rpc.MaxFileWrite])}, &w)
	if w.Size != rpc.MaxFileWrite {
		t.Fatalf("wrote %d", w.Size)
	}
}

// TestTarDownloadLimit: a tar download is bounded: a file over the limit
// is refused up front, a directory whose tar passes it is cut so that the
// client's read fails rather than ending on a tar that looks whole.
func TestTarDownloadLimit(t *testing.T) {
	e := newFakeEnv(t, true, nil)
	e.rpcOptions = func(o *rpc.Options) { o.MaxTarDownload = 1 << 20 }
	e.restart()
	e.must("sandbox.start", map[string]any{"sandbox": "td"}, nil)
	big := make([]byte, 2<<20)
	_, _ = rand.Read(big)
	for p, data := range map[string][]byte{"/tmp/big/f": big, "/tmp/small/f": []byte("hi\n")} {
		e.must("sandbox.file.mkdir", map[string]any{"sandbox": "td", "path": path.Dir(p)}, nil)
		e.must("sandbox.file.write", map[string]any{"sandbox": "td", "path": p, "data": base64.StdEncoding.EncodeToString(data)}, nil)
	}
	get := func(path string) (*http.Response, error) {
		return http.Get(e.url + "/api/v1/sandboxes/default/td/tar?path=" + path)
	}
	// A file over the limit: a proper error.
	resp, err := get("/tmp/big/f")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 413 || !strings.Contains(string(body), "too_large") || !strings.Contains(string(body), "--max-tar-download") {
		t.Fatalf("file over the limit: %d %.200q", resp.StatusCode, body)
	}
	// A directory over the limit: cut, and the read fails.
	resp, err = get("/tmp/big")
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get(rpc.TarLimitHeader) != "1048576" {
		t.Fatalf("directory: %d %v", resp.StatusCode, resp.Header)
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) || n != 1<<20 {
		t.Fatalf("directory over the limit: read %d bytes, then %v; want exactly the limit, then unexpected EOF", n, err)
	}
	// Within the limit: the whole tar.
	resp, err = get("/tmp/small")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	tr := tar.NewReader(resp.Body)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	if len(names) == 0 {
		t.Fatal("empty tar")
	}
	// The Go SDK says what happened.
	sb := warren.New(warren.WithServerURL(e.url)).Sandbox("td")
	if _, err := sb.DownloadTar(t.Context(), "/tmp/big/f"); !warren.IsTooLarge(err) {
		t.Fatalf("SDK, file over the limit: %v", err)
	}
	rc, err := sb.DownloadTar(t.Context(), "/tmp/big")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rc.Close() }()
	if _, err := io.Copy(io.Discard, rc); !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), "limit of 1048576 bytes") {
		t.Fatalf("SDK, directory over the limit: %v", err)
	}
}
