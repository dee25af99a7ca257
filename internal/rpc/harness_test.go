package rpc_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/fake"
	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/image/layer"
	"github.com/warren-sandbox/warren/internal/mcp"
	"github.com/warren-sandbox/warren/internal/metrics"
	"github.com/warren-sandbox/warren/internal/rpc"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/store"
	"github.com/warren-sandbox/warren/internal/testenv"
	"github.com/warren-sandbox/warren/internal/timerslack"
)

var envSeq atomic.Int64

// env is a real server: a backend, SQLite, manager, HTTP on loopback. The
// backend is the native one (newEnv: root, real sandboxes) or the fake
// (newFakeEnv: in-memory sandboxes, no root); everything above it is the
// same code either way.
type env struct {
	t       testing.TB
	dir     string
	be      *native.Backend // nil on the fake
	fake    *fake.Backend   // nil on native
	backend backend.Backend // whichever of the two
	db      *store.Store
	mgr     *sandbox.Manager
	srv     *rpc.Server
	http    *httptest.Server
	url     string
	keys    *auth.Keys
	signer  *auth.Signer
	admin   string // a key for namespace "*"
	dev     bool
	options sandbox.Options
	images  *image.Store
	// rpcOptions, when set, adjusts the server's options at every start.
	rpcOptions func(*rpc.Options)
}

// brokenImage is an image name the test servers fail to resolve with a
// host failure (not a refusal): the image store cannot be read.
const brokenImage = "test-broken-store"

// newEnv starts a server on the native backend, for tests of what only
// real sandboxes do (real processes' env, users and terminals, real
// interpreters, images, volumes, a real PID 1 dying or reattached, the
// kernel's measurements). Privileged: fails under WARREN_TEST_PRIVILEGED=1
// without root.
func newEnv(t testing.TB, dev bool, tweak func(*sandbox.Options)) *env {
	t.Helper()
	return newNativeEnv(t, dev, nil, tweak)
}

// newNativeEnv is newEnv with rpcOptions set from the server's start.
func newNativeEnv(t testing.TB, dev bool, rpcOptions func(*rpc.Options), tweak func(*sandbox.Options)) *env {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireFile(t, "/usr/bin/python3")
	agentPath := testenv.AgentBinary(t)
	e := newBareEnv(t, dev)
	e.rpcOptions = rpcOptions
	// As `warren serve` runs (cmd/warren's hostFlags.backend).
	if err := timerslack.Coarsen(timerslack.Coarse); err != nil {
		t.Fatal(err)
	}
	var err error
	e.be, err = native.New(native.Options{
		DataDir: filepath.Join(e.dir, "data"), RunDir: filepath.Join(e.dir, "run"), AgentPath: agentPath,
		SpawnerPath:  testenv.SpawnerBinary(t),
		CgroupPrefix: fmt.Sprintf("warren-rpctest-%d-%d", os.Getpid(), envSeq.Add(1)), Prewarm: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.backend = e.be
	shift := layer.IDMap{}
	if m := e.be.UserNS(); m != nil {
		shift = layer.IDMap{HostBase: m.Host, Size: m.Size}
	}
	e.open(shift, e.be.HostImage, tweak)
	return e
}

// newFakeEnv starts a server on the fake backend: no root, no agent
// binary. Its sandboxes' agent serves the whole wire protocol with the
// fake's means (internal/backend/fake/agent.go: a few commands, a sh -c
// of them, an in-memory file tree, a tiny REPL language); the tests on it
// are of what the server does above the backend (protocol, auth,
// namespaces, limits, lifecycle, errors, metrics, the shapes of results).
func newFakeEnv(t testing.TB, dev bool, tweak func(*sandbox.Options)) *env {
	t.Helper()
	e := newBareEnv(t, dev)
	e.fake = fake.New()
	e.backend = e.fake
	host := &image.Image{Layers: []string{"/"}}
	e.open(layer.IDMap{}, func() (*image.Image, error) { return host, nil }, tweak)
	return e
}

// newBareEnv is an env with its directory, nothing else yet.
func newBareEnv(t testing.TB, dev bool) *env {
	t.Helper()
	base, err := os.MkdirTemp("", "warren-rpc-test-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base, 0o711); err != nil {
		t.Fatal(err)
	}
	return &env{t: t, dir: base, dev: dev}
}

// open opens the store, keys and images on e's backend and starts the
// server; hostImage is the backend's host image.
func (e *env) open(shift layer.IDMap, hostImage func() (*image.Image, error), tweak func(*sandbox.Options)) {
	t := e.t
	t.Helper()
	var err error
	e.db, err = store.Open(filepath.Join(e.dir, "data", "warren.db"))
	if err != nil {
		t.Fatal(err)
	}
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	e.signer, err = auth.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	e.keys = auth.NewKeys(e.signer, e.db.DB())
	e.admin, _, err = e.keys.Create(context.Background(), "*", time.Hour, "test admin")
	if err != nil {
		t.Fatal(err)
	}
	e.images, err = image.OpenStore(filepath.Join(e.dir, "data", "images", "store"), e.db, shift)
	if err != nil {
		t.Fatal(err)
	}
	// As warren serve resolves by default: language names get the host
	// image's language views, anything else is looked up in the store.
	names := &image.Resolver{Host: hostImage, Store: e.images, Python: image.HostName, Node: image.HostName}
	resolve := func(ctx context.Context, name string) (*image.Image, error) {
		if name == brokenImage {
			return nil, errors.New("read the image store: input/output error")
		}
		return names.Resolve(ctx, name)
	}
	e.options = sandbox.Options{Backend: e.backend, DB: e.db.DB(), LogDir: filepath.Join(e.dir, "data", "logs"),
		Images: resolve, Tick: 100 * time.Millisecond}
	if tweak != nil {
		tweak(&e.options)
	}
	e.start()
	t.Cleanup(e.close)
}

// start (re)starts the manager and HTTP server on the env's state.
func (e *env) start() {
	e.t.Helper()
	var err error
	e.mgr, err = sandbox.New(context.Background(), e.options)
	if err != nil {
		e.t.Fatal(err)
	}
	opts := rpc.Options{Manager: e.mgr, Dev: e.dev, Metrics: metrics.NewRegistry(), Images: e.images}
	if !e.dev {
		opts.Keys = e.keys
	}
	if e.rpcOptions != nil {
		e.rpcOptions(&opts)
	}
	e.srv, err = rpc.New(opts)
	if err != nil {
		e.t.Fatal(err)
	}
	e.http = httptest.NewServer(e.srv.Handler())
	e.url = e.http.URL
}

// mountMCP serves MCP at /mcp as warren serve does (cmd/warren's
// routes): beside the API, behind its front door.
func (e *env) mountMCP() {
	mux := http.NewServeMux()
	mux.Handle("/", e.srv.Handler())
	mux.Handle("/mcp", e.srv.Authenticated(mcp.Handler(e.srv, nil)))
	e.http.Config.Handler = mux
}

// restart is a daemon restart: everything but the sandboxes goes away.
func (e *env) restart() {
	e.http.Close()
	e.mgr.Close()
	e.start()
}

func (e *env) close() {
	e.http.Close()
	for _, in := range e.mgr.List(sandbox.Filter{}) {
		_, _ = e.mgr.Remove(context.Background(), in.Namespace, in.Name)
	}
	e.mgr.Close()
	_, _ = e.backend.ReapOrphans(nil)
	if e.be != nil {
		_ = e.be.Close()
	} else {
		e.fake.Close()
	}
	_ = e.db.Close()
	_ = os.RemoveAll(e.dir)
}

// rpcReply is a decoded answer.
type rpcReply struct {
	Status int
	Result json.RawMessage
	Error  *struct {
		Code    int            `json:"code"`
		Message string         `json:"message"`
		Data    map[string]any `json:"data"`
	}
	ID  json.RawMessage
	Raw []byte
}

func (r *rpcReply) kind() string {
	if r.Error == nil {
		return ""
	}
	k, _ := r.Error.Data["kind"].(string)
	return k
}

// do sends req with key as its bearer token (none when empty); the caller
// closes the body.
func (e *env) do(t testing.TB, req *http.Request, key string) *http.Response {
	t.Helper()
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// post sends body to the RPC endpoint with key (none when empty).
func (e *env) post(key string, body []byte) *rpcReply {
	e.t.Helper()
	req, err := http.NewRequest("POST", e.url+"/api/v1/rpc", bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp := e.do(e.t, req, key)
	defer func() { _ = resp.Body.Close() }()
	raw, _ := io.ReadAll(resp.Body)
	var out struct {
		Result json.RawMessage `json:"result"`
		Error  json.RawMessage `json:"error"`
		ID     json.RawMessage `json:"id"`
	}
	r := &rpcReply{Status: resp.StatusCode, Raw: raw}
	if err := json.Unmarshal(raw, &out); err != nil {
		e.t.Fatalf("answer is not JSON (status %d): %q", resp.StatusCode, raw)
	}
	r.Result, r.ID = out.Result, out.ID
	if len(out.Error) > 0 {
		if err := json.Unmarshal(out.Error, &r.Error); err != nil {
			e.t.Fatal(err)
		}
		// The kind is in data.kind; the message is words for a person
		// (errdefs.Errorf keeps the two apart).
		if k := r.kind(); k != "" && (strings.HasPrefix(r.Error.Message, k+":") || strings.Contains(r.Error.Message, ": "+k)) {
			e.t.Errorf("error message carries its kind %q: %q", k, r.Error.Message)
		}
	}
	return r
}

// call sends a well-formed request as the admin key.
func (e *env) call(method string, params any) *rpcReply {
	e.t.Helper()
	return e.callAs(e.admin, method, params)
}

func (e *env) callAs(key, method string, params any) *rpcReply {
	e.t.Helper()
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method, "params": params, "id": "1"})
	if err != nil {
		e.t.Fatal(err)
	}
	return e.post(key, body)
}

// must calls and fails the test unless the call succeeded; it decodes the
// result into out (if not nil).
func (e *env) must(method string, params any, out any) {
	e.t.Helper()
	r := e.call(method, params)
	if r.Status != 200 || r.Error != nil {
		e.t.Fatalf("%s %v: status %d: %s", method, params, r.Status, r.Raw)
	}
	if out != nil {
		if err := json.Unmarshal(r.Result, out); err != nil {
			e.t.Fatalf("%s result %s: %v", method, r.Result, err)
		}
	}
}

func backendConfig(id string, img *image.Image) backend.Config {
	return backend.Config{ID: id, Image: img}
}

func mustSigner(t testing.TB, secret []byte) *auth.Signer {
	t.Helper()
	for i := range secret {
		secret[i] = byte(i + 7)
	}
	s, err := auth.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
