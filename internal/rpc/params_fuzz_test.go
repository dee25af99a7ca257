package rpc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/metrics"
	"github.com/warren-sandbox/warren/internal/rpc"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

// paramSeeds are real requests of every method, on the sandbox fuzz/box
// the target keeps running (and on names that do not exist).
var paramSeeds = map[string][]string{
	"sandbox.start": {`{"sandbox":"box","namespace":"fuzz","config":{"image":"python","memory":512,"cpus":1,"envs":["A=1"],"ports":["8080:80"],"volumes":["/tmp:/mnt:ro"],"scripts":{"run":"echo hi"},"exec":"run","depends_on":["other"]}}`,
		`{"sandbox":"new1","namespace":"fuzz"}`},
	"sandbox.stop":        {`{"sandbox":"gone","namespace":"fuzz"}`},
	"sandbox.repl.run":    {`{"sandbox":"box","namespace":"fuzz","language":"python","code":"print(1)","timeout":0.1}`},
	"sandbox.command.run": {`{"sandbox":"box","namespace":"fuzz","command":"echo","args":["hi"],"timeout":1}`},
	"sandbox.metrics.get": {`{"sandbox":"box","namespace":"fuzz"}`, `{"namespace":"*"}`},
	"sandbox.create": {`{"name":"new2","namespace":"fuzz","image":"host","memory_mib":256,"cpus":0.5,"env":["K=v"],"workdir":"/w","labels":{"a":"b"},"idle_timeout":60,"max_lifetime":3600,"workspace":"ws","volumes":["/tmp:/mnt"]}`,
		`{"name":"new3","secrets":["S"],"egress":["example.com"],"idle_action":"pause"}`},
	"sandbox.get":        {`{"sandbox":"box","namespace":"fuzz"}`},
	"sandbox.list":       {`{"namespace":"fuzz","state":"running","labels":{"a":"b"}}`, `{}`},
	"sandbox.remove":     {`{"sandbox":"gone","namespace":"fuzz"}`},
	"sandbox.pause":      {`{"sandbox":"box","namespace":"fuzz"}`, `{"sandbox":"gone"}`},
	"sandbox.resume":     {`{"sandbox":"box","namespace":"fuzz"}`},
	"sandbox.checkpoint": {`{"sandbox":"box","namespace":"fuzz","snapshot":"s1"}`, `{"sandbox":"box","snapshot":"../x"}`},
	"sandbox.restore":    {`{"snapshot":"s1","name":"copy","namespace":"fuzz"}`, `{"snapshot":"gone","name":"box"}`},
	"sandbox.fork":       {`{"sandbox":"box","namespace":"fuzz","count":2}`, `{"sandbox":"box","names":["f1","f2"]}`, `{"sandbox":"box","count":17}`},
	"snapshot.list":      {`{"namespace":"fuzz"}`, `{}`},
	"snapshot.get":       {`{"snapshot":"s1","namespace":"fuzz"}`},
	"snapshot.remove":    {`{"snapshot":"s1","namespace":"fuzz"}`},
	"sandbox.logs":       {`{"sandbox":"box","namespace":"fuzz","tail":10}`},
	"sandbox.egress.get": {`{"sandbox":"box","namespace":"fuzz"}`},
	"workspace.create":   {`{"name":"ws","namespace":"fuzz","store":"local","quota":1048576}`},
	"workspace.list":     {`{"namespace":"fuzz"}`, `{"namespace":"*"}`},
	"workspace.get":      {`{"workspace":"ws","namespace":"fuzz"}`},
	"workspace.remove":   {`{"workspace":"gone","namespace":"fuzz"}`},
	"workspace.sync":     {`{"workspace":"ws","namespace":"fuzz","push_only":true}`},
	"sandbox.egress.set": {`{"sandbox":"box","namespace":"fuzz","rules":["pypi.org","*.example.com:8443","203.0.113.7:22"]}`, `{"sandbox":"box","rules":[]}`, `{"sandbox":"box","rules":["https://x/"]}`},
	"sandbox.egress.log": {`{"sandbox":"box","namespace":"fuzz","since":3,"limit":10}`, `{"sandbox":"box","limit":-1}`},
	"sandbox.port.expose": {`{"sandbox":"box","namespace":"fuzz","guest":8000}`, `{"sandbox":"box","guest":8000,"host":18000,"address":"127.0.0.1"}`,
		`{"sandbox":"box","guest":70000,"host":-1,"address":"::1%eth0"}`},
	"sandbox.port.list":     {`{"sandbox":"box","namespace":"fuzz"}`},
	"sandbox.port.unexpose": {`{"sandbox":"box","namespace":"fuzz","host":18000}`, `{"sandbox":"box","host":0,"address":"x"}`},
	"sandbox.exec": {`{"sandbox":"box","namespace":"fuzz","argv":["echo","hi"],"stdin":"x","env":["A=1"],"cwd":"/","user":"root","timeout":1,"output_limit":1024,"binary":true,"resume":true}`,
		`{"sandbox":"box","namespace":"fuzz","script":"x"}`},
	"sandbox.shell":          {`{"sandbox":"box","namespace":"fuzz","script":"echo hi >&2","timeout":1}`},
	"sandbox.process.start":  {`{"sandbox":"box","namespace":"fuzz","argv":["cat"],"env":["A=1"],"cwd":"/","tty":true,"rows":24,"cols":80,"stdin":"hi"}`},
	"sandbox.process.list":   {`{"sandbox":"box","namespace":"fuzz"}`},
	"sandbox.process.get":    {`{"sandbox":"box","namespace":"fuzz","id":"p1"}`},
	"sandbox.process.output": {`{"sandbox":"box","namespace":"fuzz","id":"p1","stream":"stderr","offset":3,"wait":0.05,"binary":true}`},
	"sandbox.process.wait":   {`{"sandbox":"box","namespace":"fuzz","id":"p1","timeout":0.05}`},
	"sandbox.process.signal": {`{"sandbox":"box","namespace":"fuzz","id":"p1","signal":"SIGTERM"}`},
	"sandbox.process.stdin":  {`{"sandbox":"box","namespace":"fuzz","id":"p1","data":"aGk=","close":true}`},
	"sandbox.process.resize": {`{"sandbox":"box","namespace":"fuzz","id":"p1","rows":50,"cols":132}`},
	"sandbox.process.remove": {`{"sandbox":"box","namespace":"fuzz","id":"p1"}`},
	"sandbox.file.read":      {`{"sandbox":"box","namespace":"fuzz","path":"/etc/hostname"}`},
	"sandbox.file.write":     {`{"sandbox":"box","namespace":"fuzz","path":"/tmp/f","data":"aGk=","mode":420}`},
	"sandbox.file.list":      {`{"sandbox":"box","namespace":"fuzz","path":"/"}`},
	"sandbox.file.stat":      {`{"sandbox":"box","namespace":"fuzz","path":"/tmp/f"}`},
	"sandbox.file.mkdir":     {`{"sandbox":"box","namespace":"fuzz","path":"/tmp/a/b","parents":true,"mode":493}`},
	"sandbox.file.remove":    {`{"sandbox":"box","namespace":"fuzz","path":"/tmp/a","recursive":true}`},
	"sandbox.file.move":      {`{"sandbox":"box","namespace":"fuzz","from":"/tmp/f","to":"/tmp/g"}`},
	"namespace.usage":        {`{}`, `{"namespace":"fuzz"}`, `{"namespace":"*"}`},
	"image.list":             {`{}`},
	"image.pull":             {`{"ref":"127.0.0.1:1/x:latest","name":"x","platform":"linux/amd64","insecure":true}`},
	"key.create":             {`{"namespace":"fuzz","expire":3600,"description":"d"}`},
	"key.list":               {`{}`},
	"key.revoke":             {`{"id":"abc"}`},
}

// FuzzMethodParams runs every method with arbitrary params, as a caller
// with every right, on a server over the fake backend with one running
// sandbox (fuzz/box). Params are the method's decoder's to judge, then its
// checks', then the manager's and the agent's: whatever they are, the
// method must not panic, an answer is a well-formed JSON-RPC response
// whose error has a kind other than internal (hostile params are the
// caller's mistake, never the server's), and params that are not a JSON
// object are refused as invalid_params.
func FuzzMethodParams(f *testing.F) {
	e := newFakeEnv(f, false, func(o *sandbox.Options) { o.MaxSandboxes, o.MaxRunning = 8, 8 })
	logs := &syncBuffer{}
	// Images nil: image.pull would reach out to registries (and outlive
	// the request); its params are checked before that.
	srv, err := rpc.New(rpc.Options{Manager: e.mgr, Keys: e.keys, Metrics: metrics.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		f.Fatal(err)
	}
	h := srv.Handler()
	names := srv.MethodNames()
	for name := range paramSeeds {
		if !slices.Contains(names, name) {
			f.Fatalf("seed for %s, which the server does not serve", name)
		}
	}
	for _, name := range names {
		seeds := paramSeeds[name]
		if len(seeds) == 0 {
			f.Fatalf("method %s has no seed: add its real requests to paramSeeds", name)
		}
		for _, s := range seeds {
			f.Add(name, []byte(s))
		}
		f.Add(name, []byte(`{"sandbox":"box","namespace":"fuzz","Path":"/x","extra":1}`))
	}
	f.Add("sandbox.exec", []byte(`[1]`))
	f.Add("sandbox.get", []byte(`{"sandbox":"box"`))
	admin := auth.Claims{Namespace: "*"}

	f.Fuzz(func(t *testing.T, method string, params []byte) {
		// Any string picks a method, so a mutation of the name still runs one.
		if !slices.Contains(names, method) {
			sum := 0
			for _, c := range []byte(method) {
				sum += int(c)
			}
			method = names[sum%len(names)]
		}
		ensureBox(t, e.mgr)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		if len(params) > 0 && !json.Valid(params) {
			_, err := srv.Call(ctx, admin, method, params)
			if k := errdefs.Kind(err); k != "invalid_params" {
				t.Fatalf("%s with params %q: kind %q (%v), want invalid_params", method, params, k, err)
			}
		} else {
			body := []byte(`{"jsonrpc":"2.0","id":7,"method":"` + method + `"}`)
			if len(params) > 0 {
				body = []byte(`{"jsonrpc":"2.0","id":7,"method":"` + method + `","params":` + string(params) + `}`)
			}
			req := httptest.NewRequestWithContext(ctx, "POST", "/api/v1/rpc", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+e.admin)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			checkAnswer(t, method, params, w)
		}
		if strings.Contains(logs.String(), "panic in method") {
			t.Fatalf("%s with params %q panicked:\n%s", method, params, logs.String())
		}
		logs.Reset()
	})
}

// checkAnswer checks one JSON-RPC answer to a method called with params.
func checkAnswer(t *testing.T, method string, params []byte, w *httptest.ResponseRecorder) {
	t.Helper()
	var a struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  json.RawMessage `json:"result"`
		Error   *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Data    struct {
				Kind string `json:"kind"`
			} `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &a); err != nil {
		t.Fatalf("%s with params %q: answer %d is not JSON: %v: %.300q", method, params, w.Code, err, w.Body.Bytes())
	}
	if a.JSONRPC != "2.0" || string(a.ID) != "7" || (a.Error == nil) == (a.Result == nil) {
		t.Fatalf("%s with params %q: malformed answer %.300q", method, params, w.Body.Bytes())
	}
	if a.Error == nil {
		if w.Code != 200 {
			t.Fatalf("%s with params %q: a result with status %d", method, params, w.Code)
		}
		return
	}
	k := a.Error.Data.Kind
	if k == "" || k == errdefs.Internal || w.Code == 500 || a.Error.Code >= 0 {
		t.Fatalf("%s with params %q: error of kind %q (status %d, code %d): %s", method, params, k, w.Code, a.Error.Code, a.Error.Message)
	}
	if p := bytes.TrimSpace(params); len(p) > 0 && p[0] != '{' && !bytes.Equal(p, []byte("null")) && k != "invalid_params" {
		t.Fatalf("%s with params %q: kind %q, want invalid_params", method, params, k)
	}
}

// ensureBox leaves fuzz/box running and no other sandbox: every input
// starts from the same state, so a failing input fails again when run alone.
func ensureBox(t *testing.T, mgr *sandbox.Manager) {
	t.Helper()
	ctx := context.Background()
	for _, in := range mgr.List(sandbox.Filter{}) {
		if in.Namespace != "fuzz" || in.Name != "box" {
			if _, err := mgr.Remove(ctx, in.Namespace, in.Name); err != nil {
				t.Fatalf("remove %s/%s: %v", in.Namespace, in.Name, err)
			}
		}
	}
	if in, err := mgr.Get("fuzz", "box"); err == nil && in.State == sandbox.Running {
		return
	}
	if _, err := mgr.Start(ctx, "fuzz", "box", sandbox.Spec{}, false); err != nil {
		t.Fatalf("start fuzz/box: %v", err)
	}
}

// syncBuffer is a bytes.Buffer safe for the server's concurrent logging.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncBuffer) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.Reset()
}
