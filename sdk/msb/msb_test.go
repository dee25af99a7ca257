package msb

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/sdk/internal/sdktest"
)

// recorded is one request the fake server received.
type recorded struct {
	Path   string
	Header http.Header
	Body   map[string]any // the whole JSON-RPC envelope
}

func (r recorded) method() string         { s, _ := r.Body["method"].(string); return s }
func (r recorded) params() map[string]any { p, _ := r.Body["params"].(map[string]any); return p }

// reply is a canned answer: HTTP status and body.
type reply struct {
	status int
	body   string
}

// fake is a microsandbox server double: it records every request and answers
// from replies by method, defaulting to protocol-shaped successes.
type fake struct {
	t       *testing.T
	srv     *httptest.Server
	mu      sync.Mutex
	reqs    []recorded
	replies map[string]reply
}

var okResults = map[string]string{
	"sandbox.start":       `"Sandbox sb1 started successfully"`,
	"sandbox.stop":        `"Sandbox sb1 stopped successfully"`,
	"sandbox.repl.run":    `{"status":"success","language":"python","output":[{"stream":"stdout","text":"hi"}]}`,
	"sandbox.command.run": `{"command":"ls","args":[],"exit_code":0,"success":true,"output":[{"stream":"stdout","text":"a"}]}`,
	"sandbox.metrics.get": `{"sandboxes":[{"namespace":"default","name":"sb1","running":true,"cpu_usage":12.5,"memory_usage":100,"disk_usage":4096}]}`,
}

func newFake(t *testing.T) *fake {
	f := &fake{t: t, replies: map[string]reply{}}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fake) serve(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		f.t.Errorf("request body is not JSON: %s", raw)
	}
	rec := recorded{Path: r.URL.Path, Header: r.Header.Clone(), Body: body}
	f.mu.Lock()
	f.reqs = append(f.reqs, rec)
	rep, ok := f.replies[rec.method()]
	f.mu.Unlock()
	if r.Method != http.MethodPost || r.URL.Path != "/api/v1/rpc" {
		f.t.Errorf("request %s %s, want POST /api/v1/rpc", r.Method, r.URL.Path)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		f.t.Errorf("Content-Type %q", ct)
	}
	id, _ := json.Marshal(body["id"])
	w.Header().Set("Content-Type", "application/json")
	if !ok {
		rep = reply{200, `{"jsonrpc":"2.0","result":` + okResults[rec.method()] + `,"id":` + string(id) + `}`}
	}
	w.WriteHeader(rep.status)
	_, _ = io.WriteString(w, rep.body)
}

func (f *fake) set(method string, status int, body string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.replies[method] = reply{status, body}
}

func (f *fake) last() recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reqs) == 0 {
		f.t.Fatal("no request received")
	}
	return f.reqs[len(f.reqs)-1]
}

func (f *fake) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.reqs)
}

func TestRequestShapes(t *testing.T) {
	sdktest.ClearEnv(t)
	tests := []struct {
		name       string
		node       bool
		opts       []Option
		do         func(t *testing.T, s *Sandbox) error
		wantMethod string
		wantParams map[string]any
	}{
		{
			name:       "start python defaults",
			do:         func(t *testing.T, s *Sandbox) error { return s.Start(StartConfig{}) },
			wantMethod: "sandbox.start",
			wantParams: map[string]any{"sandbox": "sb1", "config": map[string]any{"image": "microsandbox/python", "memory": 512.0, "cpus": 1.0}},
		},
		{
			name:       "start node defaults",
			node:       true,
			do:         func(t *testing.T, s *Sandbox) error { return s.Start(StartConfig{Memory: -1}) },
			wantMethod: "sandbox.start",
			wantParams: map[string]any{"sandbox": "sb1", "config": map[string]any{"image": "microsandbox/node", "memory": 512.0, "cpus": 1.0}},
		},
		{
			name: "start full config with namespace",
			opts: []Option{WithNamespace("team")},
			do: func(t *testing.T, s *Sandbox) error {
				return s.StartContext(t.Context(), StartConfig{
					Image: "host", Memory: 1024, CPUs: 2, Volumes: []string{"/a:/b"}, Ports: []string{"80:8080"},
					Envs: []string{"A=1"}, DependsOn: []string{"db"}, Workdir: "/w", Shell: "/bin/bash",
					Scripts: map[string]string{"t": "make test"}, Exec: "sleep 1",
				})
			},
			wantMethod: "sandbox.start",
			wantParams: map[string]any{"sandbox": "sb1", "namespace": "team", "config": map[string]any{
				"image": "host", "memory": 1024.0, "cpus": 2.0, "volumes": []any{"/a:/b"}, "ports": []any{"80:8080"},
				"envs": []any{"A=1"}, "depends_on": []any{"db"}, "workdir": "/w", "shell": "/bin/bash",
				"scripts": map[string]any{"t": "make test"}, "exec": "sleep 1",
			}},
		},
		{
			name:       "stop",
			do:         func(t *testing.T, s *Sandbox) error { mustStart(s); return s.Stop() },
			wantMethod: "sandbox.stop",
			wantParams: map[string]any{"sandbox": "sb1"},
		},
		{
			name:       "stop with namespace",
			opts:       []Option{WithNamespace("ns1")},
			do:         func(t *testing.T, s *Sandbox) error { mustStart(s); return s.StopContext(t.Context()) },
			wantMethod: "sandbox.stop",
			wantParams: map[string]any{"sandbox": "sb1", "namespace": "ns1"},
		},
		{
			name: "repl python",
			do: func(t *testing.T, s *Sandbox) error {
				mustStart(s)
				_, err := s.Code().Run("print(1)")
				return err
			},
			wantMethod: "sandbox.repl.run",
			wantParams: map[string]any{"sandbox": "sb1", "language": "python", "code": "print(1)"},
		},
		{
			name: "repl node with timeout in seconds",
			node: true,
			opts: []Option{WithTimeout(2500 * time.Millisecond)},
			do: func(t *testing.T, s *Sandbox) error {
				mustStart(s)
				_, err := s.Code().RunContext(t.Context(), "1+1")
				return err
			},
			wantMethod: "sandbox.repl.run",
			wantParams: map[string]any{"sandbox": "sb1", "language": "nodejs", "code": "1+1", "timeout": 2.5},
		},
		{
			name: "command nil args sends null",
			do: func(t *testing.T, s *Sandbox) error {
				mustStart(s)
				_, err := s.Command().Run("ls", nil)
				return err
			},
			wantMethod: "sandbox.command.run",
			wantParams: map[string]any{"sandbox": "sb1", "command": "ls", "args": nil},
		},
		{
			name: "command empty args sends array",
			do: func(t *testing.T, s *Sandbox) error {
				mustStart(s)
				_, err := s.Command().Run("ls", []string{})
				return err
			},
			wantMethod: "sandbox.command.run",
			wantParams: map[string]any{"sandbox": "sb1", "command": "ls", "args": []any{}},
		},
		{
			name: "command timeout from http client",
			opts: []Option{WithHTTPClient(&http.Client{Timeout: 90 * time.Second})},
			do: func(t *testing.T, s *Sandbox) error {
				mustStart(s)
				_, err := s.Command().RunContext(t.Context(), "ls", []string{"-la"})
				return err
			},
			wantMethod: "sandbox.command.run",
			wantParams: map[string]any{"sandbox": "sb1", "command": "ls", "args": []any{"-la"}, "timeout": 90.0},
		},
		{
			name: "metrics",
			do: func(t *testing.T, s *Sandbox) error {
				mustStart(s)
				_, err := s.Metrics().All()
				return err
			},
			wantMethod: "sandbox.metrics.get",
			wantParams: map[string]any{"sandbox": "sb1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			opts := append([]Option{WithServerUrl(f.srv.URL), WithName("sb1")}, tt.opts...)
			s := NewPythonSandbox(opts...)
			if tt.node {
				s = NewNodeSandbox(opts...)
			}
			if err := tt.do(t, s); err != nil {
				t.Fatalf("call: %v", err)
			}
			got := f.last()
			if got.method() != tt.wantMethod {
				t.Errorf("method %q, want %q", got.method(), tt.wantMethod)
			}
			if got.Body["jsonrpc"] != "2.0" {
				t.Errorf("jsonrpc %v", got.Body["jsonrpc"])
			}
			if id, _ := got.Body["id"].(string); !sdktest.UUIDRE.MatchString(id) {
				t.Errorf("id %v is not a UUID string", got.Body["id"])
			}
			if !reflect.DeepEqual(got.params(), sdktest.RoundTrip(t, tt.wantParams)) {
				t.Errorf("params\n got %#v\nwant %#v", got.params(), tt.wantParams)
			}
		})
	}
}

func TestAuthHeader(t *testing.T) {
	tests := []struct {
		name    string
		envKey  string
		opts    []Option
		wantHdr string
	}{
		{name: "no key, no header", wantHdr: ""},
		{name: "option", opts: []Option{WithApiKey("msb_opt")}, wantHdr: "Bearer msb_opt"},
		{name: "env", envKey: "msb_env", wantHdr: "Bearer msb_env"},
		{name: "option wins over env", envKey: "msb_env", opts: []Option{WithApiKey("msb_opt")}, wantHdr: "Bearer msb_opt"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			t.Setenv("MSB_API_KEY", tt.envKey)
			t.Setenv("MSB_SERVER_URL", f.srv.URL) // the env fallback for the URL
			s := NewPythonSandbox(tt.opts...)     // must not panic without a key
			if err := s.Start(StartConfig{}); err != nil {
				t.Fatal(err)
			}
			h := f.last().Header
			if got := h.Get("Authorization"); got != tt.wantHdr {
				t.Errorf("Authorization %q, want %q", got, tt.wantHdr)
			}
			if _, ok := h["Authorization"]; tt.wantHdr == "" && ok {
				t.Error("Authorization header present without a key")
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	sdktest.ClearEnv(t)
	s := NewPythonSandbox()
	if s.b.cfg.serverUrl != "http://127.0.0.1:5555" {
		t.Errorf("server url %q", s.b.cfg.serverUrl)
	}
	if !regexp.MustCompile(`^sandbox-[0-9a-f]{8}$`).MatchString(s.Name()) {
		t.Errorf("random name %q", s.Name())
	}
	if s.b.cfg.namespace != "" {
		t.Errorf("namespace %q, want none", s.b.cfg.namespace)
	}
}

func TestLifecycleErrors(t *testing.T) {
	sdktest.ClearEnv(t)
	f := newFake(t)
	s := NewPythonSandbox(WithServerUrl(f.srv.URL), WithName("sb1"))
	if _, err := s.Code().Run("1"); !errors.Is(err, ErrSandboxNotStarted) {
		t.Errorf("run before start: %v", err)
	}
	if _, err := s.Command().Run("ls", nil); !errors.Is(err, ErrSandboxNotStarted) {
		t.Errorf("command before start: %v", err)
	}
	if _, err := s.Metrics().CPU(); !errors.Is(err, ErrSandboxNotStarted) {
		t.Errorf("metrics before start: %v", err)
	}
	if err := s.Stop(); !errors.Is(err, ErrSandboxNotStarted) {
		t.Errorf("stop before start: %v", err)
	}
	if n := f.count(); n != 0 {
		t.Errorf("%d requests sent for calls on an unstarted sandbox", n)
	}
	if err := s.Start(StartConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(StartConfig{}); !errors.Is(err, ErrSandboxAlreadyStarted) {
		t.Errorf("second start: %v", err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(); !errors.Is(err, ErrSandboxNotStarted) {
		t.Errorf("second stop: %v", err)
	}
}

func TestServerErrors(t *testing.T) {
	sdktest.ClearEnv(t)
	errBody := func(code int, msg, kind string) string {
		return `{"jsonrpc":"2.0","error":{"code":` + itoa(code) + `,"message":"` + msg + `","data":{"kind":"` + kind + `","sandbox":"sb1"}},"id":"x"}`
	}
	tests := []struct {
		name       string
		method     string
		status     int
		body       string
		do         func(s *Sandbox) error
		sentinel   error
		want       RPCError
		wantReqErr bool // errors.Is(err, ErrRequestFailed)
	}{
		{
			name: "start forbidden", method: "sandbox.start", status: 403,
			body:     errBody(-32002, "key may not touch namespace other", "forbidden"),
			do:       func(s *Sandbox) error { return s.Start(StartConfig{}) },
			sentinel: ErrFailedToStartSandbox,
			want:     RPCError{Code: -32002, Message: "key may not touch namespace other", Kind: "forbidden", HTTPStatus: 403}, wantReqErr: true,
		},
		{
			name: "unauthorized", method: "sandbox.start", status: 401,
			body:     errBody(-32001, "missing API key", "unauthorized"),
			do:       func(s *Sandbox) error { return s.Start(StartConfig{}) },
			sentinel: ErrFailedToStartSandbox,
			want:     RPCError{Code: -32001, Message: "missing API key", Kind: "unauthorized", HTTPStatus: 401}, wantReqErr: true,
		},
		{
			name: "stop conflict", method: "sandbox.stop", status: 409,
			body:     errBody(-32004, "sandbox sb1 is starting", "conflict"),
			do:       func(s *Sandbox) error { mustStart(s); return s.Stop() },
			sentinel: ErrFailedToStopSandbox,
			want:     RPCError{Code: -32004, Message: "sandbox sb1 is starting", Kind: "conflict", HTTPStatus: 409}, wantReqErr: true,
		},
		{
			name: "repl timeout", method: "sandbox.repl.run", status: 504,
			body:     errBody(-32007, "code ran past its timeout of 1s", "timeout"),
			do:       func(s *Sandbox) error { mustStart(s); _, err := s.Code().Run("while True: pass"); return err },
			sentinel: ErrFailedToRunCode,
			want:     RPCError{Code: -32007, Message: "code ran past its timeout of 1s", Kind: "timeout", HTTPStatus: 504}, wantReqErr: true,
		},
		{
			name: "command exec failed", method: "sandbox.command.run", status: 422,
			body:     errBody(-32008, "command nope not found", "exec_failed"),
			do:       func(s *Sandbox) error { mustStart(s); _, err := s.Command().Run("nope", nil); return err },
			sentinel: ErrFailedToRunCommand,
			want:     RPCError{Code: -32008, Message: "command nope not found", Kind: "exec_failed", HTTPStatus: 422}, wantReqErr: true,
		},
		{
			name: "metrics not found", method: "sandbox.metrics.get", status: 404,
			body:     errBody(-32003, "no sandbox sb1", "not_found"),
			do:       func(s *Sandbox) error { mustStart(s); _, err := s.Metrics().IsRunning(); return err },
			sentinel: ErrFailedToGetMetrics,
			want:     RPCError{Code: -32003, Message: "no sandbox sb1", Kind: "not_found", HTTPStatus: 404}, wantReqErr: true,
		},
		{
			name: "non-JSON 502 from a proxy", method: "sandbox.start", status: 502,
			body:     "<html>bad gateway</html>",
			do:       func(s *Sandbox) error { return s.Start(StartConfig{}) },
			sentinel: ErrFailedToStartSandbox,
			want:     RPCError{Message: "server answered HTTP 502: <html>bad gateway</html>", HTTPStatus: 502}, wantReqErr: true,
		},
		{
			name: "200 with error member", method: "sandbox.repl.run", status: 200,
			body:     errBody(-32603, "agent died", "internal"),
			do:       func(s *Sandbox) error { mustStart(s); _, err := s.Code().Run("1"); return err },
			sentinel: ErrFailedToRunCode,
			want:     RPCError{Code: -32603, Message: "agent died", Kind: "internal", HTTPStatus: 200},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			f.set(tt.method, tt.status, tt.body)
			s := NewPythonSandbox(WithServerUrl(f.srv.URL), WithName("sb1"))
			err := tt.do(s)
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, tt.sentinel) {
				t.Errorf("error %v does not wrap %v", err, tt.sentinel)
			}
			var re *RPCError
			if !errors.As(err, &re) {
				t.Fatalf("error %v is not an *RPCError", err)
			}
			if *re != tt.want {
				t.Errorf("RPCError %+v, want %+v", *re, tt.want)
			}
			if re.Error() != tt.want.Message {
				t.Errorf("Error() %q, want the server's message", re.Error())
			}
			if !strings.Contains(err.Error(), tt.want.Message) {
				t.Errorf("wrapped error %q lacks the server's message", err)
			}
			if !errors.Is(err, ErrRPCCall) {
				t.Error("not ErrRPCCall")
			}
			if errors.Is(err, ErrRequestFailed) != tt.wantReqErr {
				t.Errorf("errors.Is(ErrRequestFailed) = %v", !tt.wantReqErr)
			}
		})
	}
}

// mustStart is used by tables that need a started sandbox.
func mustStart(s *Sandbox) {
	if err := s.Start(StartConfig{}); err != nil {
		panic(err)
	}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

func TestStartFailureAllowsRetry(t *testing.T) {
	sdktest.ClearEnv(t)
	f := newFake(t)
	f.set("sandbox.start", 503, `{"jsonrpc":"2.0","error":{"code":-32009,"message":"shutting down","data":{"kind":"unavailable"}},"id":"1"}`)
	s := NewPythonSandbox(WithServerUrl(f.srv.URL), WithName("sb1"))
	if err := s.Start(StartConfig{}); !errors.Is(err, ErrFailedToStartSandbox) {
		t.Fatalf("start: %v", err)
	}
	f.set("sandbox.start", 200, `{"jsonrpc":"2.0","result":"Sandbox sb1 started successfully","id":"2"}`)
	if err := s.Start(StartConfig{}); err != nil {
		t.Fatalf("retry: %v", err)
	}
}

func TestContextCancel(t *testing.T) {
	sdktest.ClearEnv(t)
	f := newFake(t)
	s := NewPythonSandbox(WithServerUrl(f.srv.URL), WithName("sb1"))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := s.StartContext(ctx, StartConfig{})
	if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrFailedToStartSandbox) || !errors.Is(err, ErrSendRequestFailed) {
		t.Fatalf("start with cancelled ctx: %v", err)
	}
}

func TestExecutionHelpers(t *testing.T) {
	sdktest.ClearEnv(t)
	tests := []struct {
		name                 string
		result               string
		wantOut, wantErr     string
		wantHasErr           bool
		wantStatus, wantLang string
	}{
		{"success", `{"status":"success","language":"python","output":[{"stream":"stdout","text":"a"},{"stream":"stdout","text":"b"}]}`, "a\nb", "", false, "success", "python"},
		{"stderr line", `{"status":"success","language":"python","output":[{"stream":"stdout","text":"a"},{"stream":"stderr","text":"warn"}]}`, "a", "warn", true, "success", "python"},
		{"exception", `{"status":"exception","language":"python","output":[]}`, "", "", true, "exception", "python"},
		{"server has_error", `{"status":"success","language":"python","output":[],"has_error":true}`, "", "", true, "success", "python"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			f.set("sandbox.repl.run", 200, `{"jsonrpc":"2.0","result":`+tt.result+`,"id":"1"}`)
			s := NewPythonSandbox(WithServerUrl(f.srv.URL), WithName("sb1"))
			mustStart(s)
			ex, err := s.Code().Run("x")
			if err != nil {
				t.Fatal(err)
			}
			out, _ := ex.GetOutput()
			errOut, _ := ex.GetError()
			if out != tt.wantOut || errOut != tt.wantErr || ex.HasError() != tt.wantHasErr ||
				ex.GetStatus() != tt.wantStatus || ex.GetLanguage() != tt.wantLang {
				t.Errorf("got out=%q err=%q hasErr=%v status=%q lang=%q", out, errOut, ex.HasError(), ex.GetStatus(), ex.GetLanguage())
			}
			if string(ex.Output) != tt.result {
				t.Errorf("raw output %s", ex.Output)
			}
		})
	}

	t.Run("command", func(t *testing.T) {
		f := newFake(t)
		f.set("sandbox.command.run", 200, `{"jsonrpc":"2.0","result":{"command":"sh","args":["-c","exit 3"],"exit_code":3,"success":false,"output":[{"stream":"stderr","text":"boom"}]},"id":"1"}`)
		s := NewPythonSandbox(WithServerUrl(f.srv.URL), WithName("sb1"))
		mustStart(s)
		ex, err := s.Command().Run("sh", []string{"-c", "exit 3"})
		if err != nil {
			t.Fatal(err)
		}
		errOut, _ := ex.GetError()
		if ex.GetExitCode() != 3 || ex.IsSuccess() || !ex.HasError() || errOut != "boom" ||
			ex.GetCommand() != "sh" || !reflect.DeepEqual(ex.GetArgs(), []string{"-c", "exit 3"}) {
			t.Errorf("command execution %+v", ex)
		}
	})

	t.Run("unparsed", func(t *testing.T) {
		var ce CodeExecution
		if _, err := ce.GetOutput(); !errors.Is(err, ErrExecutionNotParsed) {
			t.Error(err)
		}
		if ce.GetStatus() != "unknown" || ce.HasError() {
			t.Error("zero CodeExecution")
		}
		var cm CommandExecution
		if cm.GetExitCode() != -1 || cm.IsSuccess() {
			t.Error("zero CommandExecution")
		}
	})
}

func TestMetrics(t *testing.T) {
	sdktest.ClearEnv(t)
	tests := []struct {
		name   string
		result string
		want   Metrics
	}{
		{"values", okResults["sandbox.metrics.get"], Metrics{Name: "sb1", IsRunning: true, CPU: 12.5, MemoryMiB: 100, DiskBytes: 4096}},
		{"nulls", `{"sandboxes":[{"namespace":"default","name":"sb1","running":false,"cpu_usage":null,"memory_usage":null,"disk_usage":null}]}`, Metrics{Name: "sb1"}},
		{"empty", `{"sandboxes":[]}`, Metrics{Name: "sb1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			f.set("sandbox.metrics.get", 200, `{"jsonrpc":"2.0","result":`+tt.result+`,"id":"1"}`)
			s := NewPythonSandbox(WithServerUrl(f.srv.URL), WithName("sb1"))
			mustStart(s)
			m, err := s.Metrics().AllContext(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if m != tt.want {
				t.Errorf("metrics %+v, want %+v", m, tt.want)
			}
			cpu, _ := s.Metrics().CPU()
			mem, _ := s.Metrics().MemoryMiB()
			disk, _ := s.Metrics().DiskBytes()
			run, _ := s.Metrics().IsRunning()
			if cpu != tt.want.CPU || mem != tt.want.MemoryMiB || disk != tt.want.DiskBytes || run != tt.want.IsRunning {
				t.Errorf("single metrics %v %v %v %v", cpu, mem, disk, run)
			}
		})
	}
}

func TestReqIdProducerAndLogger(t *testing.T) {
	sdktest.ClearEnv(t)
	f := newFake(t)
	var l testLogger
	s := NewPythonSandbox(WithServerUrl(f.srv.URL), WithName("sb1"), WithReqIdProducer(func() string { return "req-1" }), WithLogger(&l))
	mustStart(s)
	if id := f.last().Body["id"]; id != "req-1" {
		t.Errorf("id %v", id)
	}
	if l.n.Load() == 0 {
		t.Error("logger not used")
	}
}

type testLogger struct{ n atomicInt }

type atomicInt struct {
	mu sync.Mutex
	v  int
}

func (a *atomicInt) add() { a.mu.Lock(); a.v++; a.mu.Unlock() }
func (a *atomicInt) Load() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.v
}

func (l *testLogger) Debug(string, ...any) { l.n.add() }
func (l *testLogger) Info(string, ...any)  { l.n.add() }
func (l *testLogger) Error(string, ...any) { l.n.add() }
