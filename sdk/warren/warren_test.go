package warren

import (
	"bytes"
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

type recorded struct {
	Method, Path, RawQuery string
	Header                 http.Header
	Body                   map[string]any // JSON-RPC envelope (RPC route only)
	Raw                    []byte
}

func (r recorded) rpcMethod() string      { s, _ := r.Body["method"].(string); return s }
func (r recorded) params() map[string]any { p, _ := r.Body["params"].(map[string]any); return p }

type reply struct {
	status int
	body   string // a full body; for status 200 on the RPC route, the result
}

// fake is a Warren server double that records requests and answers from
// canned replies.
type fake struct {
	t       *testing.T
	srv     *httptest.Server
	mu      sync.Mutex
	reqs    []recorded
	replies map[string]reply
	hook    func(method string) // called before answering an RPC
}

var info1 = `{"namespace":"default","name":"sb1","state":"running","error":"","image":"python","memory_mib":512,"cpus":1,"labels":{"team":"a"},"created_at":"2025-01-02T03:04:05Z","started_at":"2025-01-02T03:04:06Z","idle_timeout":600,"max_lifetime":3600,"isolation":"native"}`

var defaultResults = map[string]string{
	"sandbox.create":         info1,
	"sandbox.get":            info1,
	"sandbox.list":           `{"sandboxes":[` + info1 + `]}`,
	"sandbox.remove":         `{"removed":true}`,
	"sandbox.stop":           `"Sandbox sb1 stopped successfully"`,
	"sandbox.pause":          info1,
	"sandbox.resume":         info1,
	"sandbox.logs":           `{"lines":["created","started"]}`,
	"sandbox.exec":           `{"exit_code":0,"signal":"","timed_out":false,"oom_killed":false,"truncated":false,"stdout":"out\n","stderr":"err\n","duration_ms":1.5}`,
	"sandbox.shell":          `{"exit_code":0,"stdout":"hi\n","stderr":"","duration_ms":2}`,
	"sandbox.repl.run":       `{"status":"success","language":"python","output":[{"stream":"stdout","text":"2"}],"has_error":false,"result":"2"}`,
	"sandbox.file.read":      `{"data":"aGVsbG8=","size":5}`,
	"sandbox.file.write":     `{"size":5}`,
	"sandbox.file.list":      `{"entries":[{"name":"a.txt","path":"/tmp/a.txt","size":3,"mode":420,"type":"file","mod_time":"2025-01-02T03:04:05Z"}]}`,
	"sandbox.file.stat":      `{"name":"tmp","path":"/tmp","size":0,"mode":2147484159,"type":"dir","mod_time":"2025-01-02T03:04:05Z"}`,
	"sandbox.process.start":  `{"id":"p1","argv":["sleep","9"],"pid":12,"running":true,"started_at":"2025-01-02T03:04:05Z"}`,
	"sandbox.process.list":   `{"processes":[{"id":"p1","argv":["sleep","9"],"pid":12,"running":false,"started_at":"2025-01-02T03:04:05Z","exit":{"code":0,"signal":"","timed_out":false,"duration_ms":1000}}]}`,
	"sandbox.process.get":    `{"id":"p1","argv":["sleep","9"],"pid":12,"running":true,"started_at":"2025-01-02T03:04:05Z"}`,
	"sandbox.process.wait":   `{"id":"p1","argv":["sleep","9"],"pid":12,"running":false,"started_at":"2025-01-02T03:04:05Z","exit":{"code":137,"signal":"SIGKILL","timed_out":false,"duration_ms":5}}`,
	"sandbox.process.output": `{"offset":0,"data":"aGk=","next_offset":2,"dropped":0,"eof":true}`,
}

func newFake(t *testing.T) *fake {
	f := &fake{t: t, replies: map[string]reply{}}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fake) serve(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	rec := recorded{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Header: r.Header.Clone(), Raw: raw}
	key := r.Method + " " + r.URL.Path
	if r.URL.Path == "/api/v1/rpc" {
		if err := json.Unmarshal(raw, &rec.Body); err != nil {
			f.t.Errorf("request body is not JSON: %s", raw)
		}
		key = rec.rpcMethod()
	}
	f.mu.Lock()
	f.reqs = append(f.reqs, rec)
	rep, ok := f.replies[key]
	hook := f.hook
	f.mu.Unlock()
	if hook != nil {
		hook(key)
	}
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path != "/api/v1/rpc" {
		if !ok {
			rep = reply{200, `{"ok":true}`}
		}
		w.WriteHeader(rep.status)
		_, _ = io.WriteString(w, rep.body)
		return
	}
	if !ok {
		res, known := defaultResults[key]
		if !known {
			res = `{}`
		}
		rep = reply{200, res}
	}
	id, _ := json.Marshal(rec.Body["id"])
	if rep.status == 200 {
		_, _ = io.WriteString(w, `{"jsonrpc":"2.0","result":`+rep.body+`,"id":`+string(id)+`}`)
		return
	}
	w.WriteHeader(rep.status)
	_, _ = io.WriteString(w, rep.body)
}

func (f *fake) set(key string, status int, body string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.replies[key] = reply{status, body}
}

func (f *fake) all() []recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]recorded(nil), f.reqs...)
}

func (f *fake) last() recorded {
	all := f.all()
	if len(all) == 0 {
		f.t.Fatal("no request")
	}
	return all[len(all)-1]
}

func (f *fake) methods() []string {
	var out []string
	for _, r := range f.all() {
		if r.Body != nil {
			out = append(out, r.rpcMethod())
		}
	}
	return out
}

func errBody(code int, msg, kind string) string {
	c, _ := json.Marshal(code)
	m, _ := json.Marshal(msg)
	return `{"jsonrpc":"2.0","error":{"code":` + string(c) + `,"message":` + string(m) + `,"data":{"kind":"` + kind + `","sandbox":"sb1"}},"id":"1"}`
}

func TestRequestShapes(t *testing.T) {
	sdktest.ClearEnv(t)
	type call func(ctx context.Context, c *Client) error
	sb := func(c *Client) *Sandbox { return c.Sandbox("sb1") }
	tests := []struct {
		name   string
		ns     string
		do     call
		method string
		params map[string]any
	}{
		{"create defaults", "", func(ctx context.Context, c *Client) error {
			_, err := c.Create(ctx, Spec{Name: "sb1"})
			return err
		}, "sandbox.create", map[string]any{"name": "sb1", "memory_mib": 512, "cpus": 1}},
		{"create full", "team", func(ctx context.Context, c *Client) error {
			_, err := c.Create(ctx, Spec{Name: "sb1", Image: "node", MemoryMiB: 1024, CPUs: 0.5, Env: []string{"A=1"},
				Workdir: "/w", Labels: map[string]string{"team": "a"}, IdleTimeout: 90 * time.Second, MaxLifetime: 1500 * time.Millisecond,
				Workspace: "ws", Secrets: []string{"db"}, Egress: []string{"pypi.org"}, Ports: []string{"8080:80"}, Isolation: IsolationGvisor})
			return err
		}, "sandbox.create", map[string]any{"name": "sb1", "namespace": "team", "image": "node", "memory_mib": 1024, "cpus": 0.5,
			"env": []string{"A=1"}, "workdir": "/w", "labels": map[string]string{"team": "a"}, "idle_timeout": 90, "max_lifetime": 1.5,
			"workspace": "ws", "secrets": []string{"db"}, "egress": []string{"pypi.org"}, "ports": []string{"8080:80"}, "isolation": "gvisor"}},
		{"get", "", func(ctx context.Context, c *Client) error { _, err := c.Get(ctx, "sb1"); return err },
			"sandbox.get", map[string]any{"sandbox": "sb1"}},
		{"list all", "", func(ctx context.Context, c *Client) error { _, err := c.List(ctx, ListOptions{}); return err },
			"sandbox.list", map[string]any{}},
		{"list filtered", "team", func(ctx context.Context, c *Client) error {
			_, err := c.List(ctx, ListOptions{State: StateRunning, Labels: map[string]string{"k": "v"}})
			return err
		}, "sandbox.list", map[string]any{"namespace": "team", "state": "running", "labels": map[string]string{"k": "v"}}},
		{"list star overrides", "team", func(ctx context.Context, c *Client) error {
			_, err := c.List(ctx, ListOptions{Namespace: "*"})
			return err
		}, "sandbox.list", map[string]any{"namespace": "*"}},
		{"remove", "", func(ctx context.Context, c *Client) error { return c.Remove(ctx, "sb1") },
			"sandbox.remove", map[string]any{"sandbox": "sb1"}},
		{"info ns", "team", func(ctx context.Context, c *Client) error { _, err := sb(c).Info(ctx); return err },
			"sandbox.get", map[string]any{"sandbox": "sb1", "namespace": "team"}},
		{"stop", "", func(ctx context.Context, c *Client) error { return sb(c).Stop(ctx) },
			"sandbox.stop", map[string]any{"sandbox": "sb1"}},
		{"kill is stop", "", func(ctx context.Context, c *Client) error { return sb(c).Kill(ctx) },
			"sandbox.stop", map[string]any{"sandbox": "sb1"}},
		{"pause", "team", func(ctx context.Context, c *Client) error { return sb(c).Pause(ctx) },
			"sandbox.pause", map[string]any{"sandbox": "sb1", "namespace": "team"}},
		{"resume", "", func(ctx context.Context, c *Client) error { return sb(c).Resume(ctx) },
			"sandbox.resume", map[string]any{"sandbox": "sb1"}},
		{"logs all", "", func(ctx context.Context, c *Client) error { _, err := sb(c).Logs(ctx, 0); return err },
			"sandbox.logs", map[string]any{"sandbox": "sb1"}},
		{"logs tail", "", func(ctx context.Context, c *Client) error { _, err := sb(c).Logs(ctx, 5); return err },
			"sandbox.logs", map[string]any{"sandbox": "sb1", "tail": 5}},
		{"exec plain", "", func(ctx context.Context, c *Client) error {
			_, err := sb(c).Exec(ctx, "ls", nil)
			return err
		}, "sandbox.exec", map[string]any{"sandbox": "sb1", "argv": []string{"ls"}}},
		{"exec options", "", func(ctx context.Context, c *Client) error {
			_, err := sb(c).Exec(ctx, "cat", []string{"-n"}, ExecTimeout(2500*time.Millisecond), ExecEnv("A=1", "B=2"),
				ExecCwd("/tmp"), ExecUser("1000:1000"), ExecStdin(""), ExecOutputLimit(4096))
			return err
		}, "sandbox.exec", map[string]any{"sandbox": "sb1", "argv": []string{"cat", "-n"}, "timeout": 2.5, "env": []string{"A=1", "B=2"},
			"cwd": "/tmp", "user": "1000:1000", "stdin": "", "output_limit": 4096}},
		{"shell", "", func(ctx context.Context, c *Client) error {
			_, err := sb(c).Shell(ctx, "echo hi | wc -c", ExecTimeout(time.Minute))
			return err
		}, "sandbox.shell", map[string]any{"sandbox": "sb1", "script": "echo hi | wc -c", "timeout": 60}},
		{"repl", "", func(ctx context.Context, c *Client) error {
			_, err := sb(c).RunCode(ctx, "python", "1+1", 3*time.Second)
			return err
		}, "sandbox.repl.run", map[string]any{"sandbox": "sb1", "language": "python", "code": "1+1", "timeout": 3}},
		{"file read", "", func(ctx context.Context, c *Client) error { _, err := sb(c).ReadFile(ctx, "/a"); return err },
			"sandbox.file.read", map[string]any{"sandbox": "sb1", "path": "/a"}},
		{"file write default mode", "", func(ctx context.Context, c *Client) error { return sb(c).WriteFile(ctx, "/a", []byte("hello"), 0) },
			"sandbox.file.write", map[string]any{"sandbox": "sb1", "path": "/a", "data": "aGVsbG8="}},
		{"file write mode", "", func(ctx context.Context, c *Client) error { return sb(c).WriteFile(ctx, "/a", []byte{0xff}, 0o600) },
			"sandbox.file.write", map[string]any{"sandbox": "sb1", "path": "/a", "data": "/w==", "mode": 0o600}},
		{"file list", "", func(ctx context.Context, c *Client) error { _, err := sb(c).ListFiles(ctx, "/tmp"); return err },
			"sandbox.file.list", map[string]any{"sandbox": "sb1", "path": "/tmp"}},
		{"file stat", "", func(ctx context.Context, c *Client) error { _, err := sb(c).Stat(ctx, "/tmp"); return err },
			"sandbox.file.stat", map[string]any{"sandbox": "sb1", "path": "/tmp"}},
		{"mkdir", "", func(ctx context.Context, c *Client) error { return sb(c).Mkdir(ctx, "/d", 0) },
			"sandbox.file.mkdir", map[string]any{"sandbox": "sb1", "path": "/d"}},
		{"mkdir all", "", func(ctx context.Context, c *Client) error { return sb(c).MkdirAll(ctx, "/d/e", 0o700) },
			"sandbox.file.mkdir", map[string]any{"sandbox": "sb1", "path": "/d/e", "parents": true, "mode": 0o700}},
		{"remove file", "", func(ctx context.Context, c *Client) error { return sb(c).RemoveFile(ctx, "/a") },
			"sandbox.file.remove", map[string]any{"sandbox": "sb1", "path": "/a"}},
		{"remove all", "", func(ctx context.Context, c *Client) error { return sb(c).RemoveAll(ctx, "/d") },
			"sandbox.file.remove", map[string]any{"sandbox": "sb1", "path": "/d", "recursive": true}},
		{"move", "", func(ctx context.Context, c *Client) error { return sb(c).Move(ctx, "/a", "/b") },
			"sandbox.file.move", map[string]any{"sandbox": "sb1", "from": "/a", "to": "/b"}},
		{"process start", "", func(ctx context.Context, c *Client) error {
			_, err := sb(c).StartProcess(ctx, "sleep", []string{"9"}, ExecEnv("A=1"), ExecCwd("/"), ExecUser("root"), ExecTTY(), ExecStdin("x"))
			return err
		}, "sandbox.process.start", map[string]any{"sandbox": "sb1", "argv": []string{"sleep", "9"}, "env": []string{"A=1"}, "cwd": "/",
			"user": "root", "tty": true, "stdin": "x"}},
		{"process list", "", func(ctx context.Context, c *Client) error { _, err := sb(c).Processes(ctx); return err },
			"sandbox.process.list", map[string]any{"sandbox": "sb1"}},
		{"process get", "", func(ctx context.Context, c *Client) error { _, err := sb(c).Process("p1").Info(ctx); return err },
			"sandbox.process.get", map[string]any{"sandbox": "sb1", "id": "p1"}},
		{"process output", "", func(ctx context.Context, c *Client) error {
			_, err := sb(c).Process("p1").Output(ctx, Stderr, 10, 2*time.Second)
			return err
		}, "sandbox.process.output", map[string]any{"sandbox": "sb1", "id": "p1", "stream": "stderr", "offset": 10, "wait": 2, "binary": true}},
		{"process wait", "", func(ctx context.Context, c *Client) error {
			_, err := sb(c).Process("p1").Wait(ctx, 30*time.Second)
			return err
		}, "sandbox.process.wait", map[string]any{"sandbox": "sb1", "id": "p1", "timeout": 30}},
		{"process signal", "", func(ctx context.Context, c *Client) error { return sb(c).Process("p1").Signal(ctx, "SIGTERM") },
			"sandbox.process.signal", map[string]any{"sandbox": "sb1", "id": "p1", "signal": "SIGTERM"}},
		{"process stdin", "", func(ctx context.Context, c *Client) error { return sb(c).Process("p1").WriteStdin(ctx, "data\n", true) },
			"sandbox.process.stdin", map[string]any{"sandbox": "sb1", "id": "p1", "data": "data\n", "close": true}},
		{"process resize", "", func(ctx context.Context, c *Client) error { return sb(c).Process("p1").Resize(ctx, 24, 80) },
			"sandbox.process.resize", map[string]any{"sandbox": "sb1", "id": "p1", "rows": 24, "cols": 80}},
		{"process remove", "team", func(ctx context.Context, c *Client) error { return sb(c).Process("p1").Remove(ctx) },
			"sandbox.process.remove", map[string]any{"sandbox": "sb1", "namespace": "team", "id": "p1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			c := New(WithServerURL(f.srv.URL), WithNamespace(tt.ns))
			if err := tt.do(t.Context(), c); err != nil {
				t.Fatalf("call: %v", err)
			}
			got := f.last()
			if got.Method != http.MethodPost || got.Path != "/api/v1/rpc" {
				t.Errorf("request %s %s", got.Method, got.Path)
			}
			if got.rpcMethod() != tt.method {
				t.Errorf("method %q, want %q", got.rpcMethod(), tt.method)
			}
			if got.Body["jsonrpc"] != "2.0" {
				t.Errorf("jsonrpc %v", got.Body["jsonrpc"])
			}
			if id, _ := got.Body["id"].(string); !sdktest.UUIDRE.MatchString(id) {
				t.Errorf("id %v is not a UUID", got.Body["id"])
			}
			if !reflect.DeepEqual(got.params(), sdktest.RoundTrip(t, tt.params)) {
				t.Errorf("params\n got %#v\nwant %#v", got.params(), sdktest.RoundTrip(t, tt.params))
			}
		})
	}
}

func TestResults(t *testing.T) {
	sdktest.ClearEnv(t)
	f := newFake(t)
	c := New(WithServerURL(f.srv.URL))
	ctx := t.Context()

	sb, err := c.Create(ctx, Spec{Name: "sb1"})
	if err != nil || sb.Name != "sb1" {
		t.Fatalf("create: %v %v", sb, err)
	}
	info, err := sb.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := SandboxInfo{Namespace: "default", Name: "sb1", State: StateRunning, Image: "python", MemoryMiB: 512, CPUs: 1,
		Labels: map[string]string{"team": "a"}, CreatedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
		StartedAt: time.Date(2025, 1, 2, 3, 4, 6, 0, time.UTC), IdleTimeout: 10 * time.Minute, MaxLifetime: time.Hour, Isolation: IsolationNative}
	if !reflect.DeepEqual(info, want) {
		t.Errorf("info\n got %+v\nwant %+v", info, want)
	}
	list, err := c.List(ctx, ListOptions{})
	if err != nil || len(list) != 1 || list[0].Name != "sb1" {
		t.Errorf("list %v %v", list, err)
	}

	res, err := sb.Exec(ctx, "x", nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Output() != "out\nerr\n" || !res.OK() || res.Duration != 1500*time.Microsecond {
		t.Errorf("exec %+v", res)
	}
	f.set("sandbox.exec", 200, `{"exit_code":137,"signal":"SIGKILL","timed_out":true,"oom_killed":false,"truncated":true,"stdout":"AP8=","stderr":"","duration_ms":1000}`)
	res, err = sb.Exec(ctx, "x", nil, ExecBinary())
	if err != nil {
		t.Fatal(err)
	}
	if res.OK() || !res.TimedOut || res.Signal != "SIGKILL" || res.ExitCode != 137 || !res.Truncated || res.Stdout != "\x00\xff" {
		t.Errorf("binary exec %+v", res)
	}
	if body := f.last().params(); body["binary"] != true {
		t.Errorf("binary not sent: %v", body)
	}

	logs, err := sb.Logs(ctx, 0)
	if err != nil || logs != "created\nstarted\n" {
		t.Errorf("logs %q %v", logs, err)
	}

	cr, err := sb.RunCode(ctx, "python", "1+1", 0)
	if err != nil || cr.Stdout() != "2\n" || cr.Result != "2" || cr.HasError() || cr.Status != "success" {
		t.Errorf("repl %+v %v", cr, err)
	}
	f.set("sandbox.repl.run", 200, `{"status":"success","language":"python","output":[{"stream":"stderr","text":"Traceback"}]}`)
	if cr, _ = sb.RunCode(ctx, "python", "x", 0); !cr.HasError() || cr.Stderr() != "Traceback\n" {
		t.Errorf("repl stderr %+v", cr)
	}

	data, err := sb.ReadFile(ctx, "/a")
	if err != nil || string(data) != "hello" {
		t.Errorf("read %q %v", data, err)
	}
	entries, err := sb.ListFiles(ctx, "/tmp")
	if err != nil || len(entries) != 1 || entries[0].Mode != 0o644 || entries[0].Type != TypeFile {
		t.Errorf("list files %+v %v", entries, err)
	}
	fi, err := sb.Stat(ctx, "/tmp")
	if err != nil || !fi.IsDir() || !fi.Mode.IsDir() || fi.Mode.Perm() != 0o777 {
		t.Errorf("stat %+v %v", fi, err)
	}

	p, err := sb.StartProcess(ctx, "sleep", []string{"9"})
	if err != nil || p.ID != "p1" || p.Started.Pid != 12 || !p.Started.Running {
		t.Fatalf("start process %+v %v", p, err)
	}
	chunk, err := p.Output(ctx, Stdout, 0, 0)
	if err != nil || string(chunk.Data) != "hi" || chunk.NextOffset != 2 || !chunk.EOF {
		t.Errorf("output %+v %v", chunk, err)
	}
	pi, err := p.Wait(ctx, 0)
	if err != nil || pi.Running || pi.Exit == nil || pi.Exit.Code != 137 || pi.Exit.Signal != "SIGKILL" || pi.Exit.Duration != 5*time.Millisecond {
		t.Errorf("wait %+v %v", pi, err)
	}
	ps, err := sb.Processes(ctx)
	if err != nil || len(ps) != 1 || ps[0].Exit == nil || ps[0].Exit.Duration != time.Second {
		t.Errorf("processes %+v %v", ps, err)
	}
}

func TestAuthAndEnv(t *testing.T) {
	tests := []struct {
		name     string
		envKey   string
		opts     []Option
		wantAuth string
	}{
		{"no key: no header", "", nil, ""},
		{"option", "", []Option{WithAPIKey("msb_o")}, "Bearer msb_o"},
		{"env", "msb_e", nil, "Bearer msb_e"},
		{"option wins", "msb_e", []Option{WithAPIKey("msb_o")}, "Bearer msb_o"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			t.Setenv("MSB_API_KEY", tt.envKey)
			t.Setenv("MSB_SERVER_URL", f.srv.URL+"/")
			c := New(tt.opts...)
			if err := c.Remove(t.Context(), "sb1"); err != nil {
				t.Fatal(err)
			}
			rc, err := c.Sandbox("sb1").DownloadTar(t.Context(), "/")
			if err != nil {
				t.Fatal(err)
			}
			_ = rc.Close()
			for _, r := range f.all() {
				if got := r.Header.Get("Authorization"); got != tt.wantAuth {
					t.Errorf("%s: Authorization %q, want %q", r.Path, got, tt.wantAuth)
				}
				if _, ok := r.Header["Authorization"]; ok && tt.wantAuth == "" {
					t.Errorf("%s: Authorization header sent without a key", r.Path)
				}
			}
		})
	}
	t.Run("defaults", func(t *testing.T) {
		sdktest.ClearEnv(t)
		c := New()
		if c.ServerURL() != DefaultServerURL || c.Namespace() != "" || c.image != DefaultImage {
			t.Errorf("defaults %+v", c)
		}
	})
}

func TestErrors(t *testing.T) {
	sdktest.ClearEnv(t)
	tests := []struct {
		name   string
		status int
		body   string
		want   Error
		is     func(error) bool
	}{
		{"not found", 404, errBody(-32003, "no sandbox sb1 in namespace default", "not_found"),
			Error{Kind: KindNotFound, Message: "no sandbox sb1 in namespace default", HTTPStatus: 404, Code: -32003}, IsNotFound},
		{"conflict", 409, errBody(-32004, "sandbox sb1 exists", "conflict"),
			Error{Kind: KindConflict, Message: "sandbox sb1 exists", HTTPStatus: 409, Code: -32004}, IsConflict},
		{"invalid params", 400, errBody(-32602, "unknown field \"x\"", "invalid_params"),
			Error{Kind: KindInvalidParams, Message: "unknown field \"x\"", HTTPStatus: 400, Code: -32602}, IsInvalidParams},
		{"unauthorized", 401, errBody(-32001, "key expired", "unauthorized"),
			Error{Kind: KindUnauthorized, Message: "key expired", HTTPStatus: 401, Code: -32001}, IsUnauthorized},
		{"forbidden", 403, errBody(-32002, "namespace other", "forbidden"),
			Error{Kind: KindForbidden, Message: "namespace other", HTTPStatus: 403, Code: -32002}, IsForbidden},
		{"too large", 413, errBody(-32005, "file over 64 MiB", "too_large"),
			Error{Kind: KindTooLarge, Message: "file over 64 MiB", HTTPStatus: 413, Code: -32005}, IsTooLarge},
		{"limit", 429, errBody(-32006, "too many sandboxes", "limit"),
			Error{Kind: KindLimit, Message: "too many sandboxes", HTTPStatus: 429, Code: -32006}, IsLimit},
		{"timeout", 504, errBody(-32007, "ran past 1s", "timeout"),
			Error{Kind: KindTimeout, Message: "ran past 1s", HTTPStatus: 504, Code: -32007}, IsTimeout},
		{"exec failed", 422, errBody(-32008, "nope: not found", "exec_failed"),
			Error{Kind: KindExecFailed, Message: "nope: not found", HTTPStatus: 422, Code: -32008}, IsExecFailed},
		{"unavailable", 503, errBody(-32009, "shutting down", "unavailable"),
			Error{Kind: KindUnavailable, Message: "shutting down", HTTPStatus: 503, Code: -32009}, IsUnavailable},
		{"internal", 500, errBody(-32603, "disk full", "internal"),
			Error{Kind: KindInternal, Message: "disk full", HTTPStatus: 500, Code: -32603}, IsInternal},
		{"kind from code when data lacks it", 404, `{"jsonrpc":"2.0","error":{"code":-32003,"message":"gone"},"id":"1"}`,
			Error{Kind: KindNotFound, Message: "gone", HTTPStatus: 404, Code: -32003}, IsNotFound},
		{"non-JSON body", 409, "busy",
			Error{Kind: KindConflict, Message: "server answered HTTP 409: busy", HTTPStatus: 409}, IsConflict},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			f.set("sandbox.get", tt.status, tt.body)
			c := New(WithServerURL(f.srv.URL))
			_, err := c.Get(t.Context(), "sb1")
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v (%T) is not *Error", err, err)
			}
			got := *e
			got.Data = nil
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("error %+v, want %+v", got, tt.want)
			}
			if err.Error() != tt.want.Message {
				t.Errorf("Error() %q", err.Error())
			}
			if !tt.is(err) || KindOf(err) != tt.want.Kind {
				t.Errorf("helper does not match %v", err)
			}
			if tt.want.Kind != KindNotFound && IsNotFound(err) {
				t.Error("IsNotFound matches another kind")
			}
		})
	}
	t.Run("data fields", func(t *testing.T) {
		f := newFake(t)
		f.set("sandbox.get", 404, errBody(-32003, "gone", "not_found"))
		_, err := New(WithServerURL(f.srv.URL)).Get(t.Context(), "sb1")
		var e *Error
		if !errors.As(err, &e) || e.Data["sandbox"] != "sb1" {
			t.Errorf("data %v", e)
		}
	})
	t.Run("tar errors", func(t *testing.T) {
		f := newFake(t)
		f.set("GET /api/v1/sandboxes/-/sb1/tar", 404, errBody(-32003, "no file /x", "not_found"))
		f.set("PUT /api/v1/sandboxes/-/sb1/tar", 413, errBody(-32005, "tar over 1 GiB", "too_large"))
		sb := New(WithServerURL(f.srv.URL)).Sandbox("sb1")
		if _, err := sb.DownloadTar(t.Context(), "/x"); !IsNotFound(err) || err.Error() != "no file /x" {
			t.Errorf("download: %v", err)
		}
		if err := sb.UploadTar(t.Context(), "/", strings.NewReader("x")); !IsTooLarge(err) {
			t.Errorf("upload: %v", err)
		}
	})
	t.Run("not a server error", func(t *testing.T) {
		c := New(WithServerURL("http://127.0.0.1:1"))
		err := c.Remove(t.Context(), "sb1")
		if err == nil || KindOf(err) != "" {
			t.Errorf("connection refused: %v", err)
		}
	})
}

func TestTar(t *testing.T) {
	sdktest.ClearEnv(t)
	f := newFake(t)
	f.set("GET /api/v1/sandboxes/team/sb1/tar", 200, "TARDATA")
	c := New(WithServerURL(f.srv.URL), WithNamespace("team"), WithAPIKey("k"))
	sb := c.Sandbox("sb1")
	if err := sb.UploadTar(t.Context(), "/work dir", bytes.NewReader([]byte("tarbytes"))); err != nil {
		t.Fatal(err)
	}
	up := f.last()
	if up.Method != http.MethodPut || up.Path != "/api/v1/sandboxes/team/sb1/tar" || up.RawQuery != "path=%2Fwork+dir" ||
		string(up.Raw) != "tarbytes" || up.Header.Get("Content-Type") != "application/x-tar" {
		t.Errorf("upload request %+v", up)
	}
	rc, err := sb.DownloadTar(t.Context(), "/out")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	_ = rc.Close()
	down := f.last()
	if string(b) != "TARDATA" || down.Method != http.MethodGet || down.RawQuery != "path=%2Fout" {
		t.Errorf("download %q %+v", b, down)
	}
	// No namespace set: the route names "-", the server's default for the
	// key (as for RPC requests that name none).
	f.set("GET /api/v1/sandboxes/-/sb1/tar", 200, "X")
	rc, err = New(WithServerURL(f.srv.URL)).Sandbox("sb1").DownloadTar(t.Context(), "/")
	if err != nil {
		t.Fatal(err)
	}
	_ = rc.Close()
	if p := f.last().Path; p != "/api/v1/sandboxes/-/sb1/tar" {
		t.Errorf("path %q", p)
	}
}

func TestRunOnce(t *testing.T) {
	sdktest.ClearEnv(t)
	nameRE := regexp.MustCompile(`^(py|sh)-[0-9a-f]{8}$`)
	tests := []struct {
		name        string
		shell       bool
		opts        []RunOption
		clientOpts  []Option
		fail        map[string]reply
		cancelOn    string // cancel the caller's ctx when this method arrives
		wantErr     func(error) bool
		wantMethods []string
		wantImage   string
		wantExec    map[string]any // params of the run, name aside
	}{
		{
			name:        "python ok",
			wantMethods: []string{"sandbox.create", "sandbox.exec", "sandbox.stop", "sandbox.remove"},
			wantImage:   "python",
			wantExec:    map[string]any{"argv": []string{"python3", "-c", "print(1)"}},
		},
		{
			name:        "shell ok with image and exec options",
			shell:       true,
			opts:        []RunOption{RunImage("alpine"), RunExecOptions(ExecTimeout(5 * time.Second))},
			wantMethods: []string{"sandbox.create", "sandbox.shell", "sandbox.stop", "sandbox.remove"},
			wantImage:   "alpine",
			wantExec:    map[string]any{"script": "print(1)", "timeout": 5},
		},
		{
			name:        "client default image and spec",
			clientOpts:  []Option{WithDefaultImage("py311")},
			opts:        []RunOption{RunSpec(Spec{Name: "ignored", MemoryMiB: 256})},
			wantMethods: []string{"sandbox.create", "sandbox.exec", "sandbox.stop", "sandbox.remove"},
			wantImage:   "py311",
			wantExec:    map[string]any{"argv": []string{"python3", "-c", "print(1)"}},
		},
		{
			name:        "exec fails: still cleaned up",
			fail:        map[string]reply{"sandbox.exec": {422, errBody(-32008, "python3: not found", "exec_failed")}},
			wantErr:     IsExecFailed,
			wantMethods: []string{"sandbox.create", "sandbox.exec", "sandbox.stop", "sandbox.remove"},
			wantImage:   "python",
		},
		{
			name:        "shell fails: still cleaned up",
			shell:       true,
			fail:        map[string]reply{"sandbox.shell": {500, errBody(-32603, "agent died", "internal")}},
			wantErr:     IsInternal,
			wantMethods: []string{"sandbox.create", "sandbox.shell", "sandbox.stop", "sandbox.remove"},
			wantImage:   "python",
		},
		{
			name:        "stop fails: remove still tried, result kept",
			fail:        map[string]reply{"sandbox.stop": {500, errBody(-32603, "stop failed", "internal")}},
			wantMethods: []string{"sandbox.create", "sandbox.exec", "sandbox.stop", "sandbox.remove"},
			wantImage:   "python",
		},
		{
			name:        "ctx cancelled during exec: cleaned up with a fresh ctx",
			cancelOn:    "sandbox.exec",
			wantErr:     func(err error) bool { return errors.Is(err, context.Canceled) },
			wantMethods: []string{"sandbox.create", "sandbox.exec", "sandbox.stop", "sandbox.remove"},
			wantImage:   "python",
		},
		{
			name:        "create refused: the name is cleaned up anyway",
			fail:        map[string]reply{"sandbox.create": {429, errBody(-32006, "too many sandboxes", "limit")}},
			wantErr:     IsLimit,
			wantMethods: []string{"sandbox.create", "sandbox.stop", "sandbox.remove"},
			wantImage:   "python",
		},
		{
			name:        "create failed on the server: cleaned up",
			fail:        map[string]reply{"sandbox.create": {500, errBody(-32603, "start sandbox: image store unreadable", "internal")}},
			wantErr:     IsInternal,
			wantMethods: []string{"sandbox.create", "sandbox.stop", "sandbox.remove"},
			wantImage:   "python",
		},
		{
			name:        "create conflict: someone else's sandbox is left alone",
			fail:        map[string]reply{"sandbox.create": {409, errBody(-32004, "sandbox exists", "conflict")}},
			wantErr:     IsConflict,
			wantMethods: []string{"sandbox.create"},
			wantImage:   "python",
		},
		{
			name:        "create cut short: cleaned up anyway",
			cancelOn:    "sandbox.create",
			wantErr:     func(err error) bool { return errors.Is(err, context.Canceled) },
			wantMethods: []string{"sandbox.create", "sandbox.stop", "sandbox.remove"},
			wantImage:   "python",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			for m, r := range tt.fail {
				f.set(m, r.status, r.body)
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if tt.cancelOn != "" {
				release := make(chan struct{})
				var once sync.Once
				f.hook = func(m string) {
					if m == tt.cancelOn {
						once.Do(func() {
							cancel()
							// Hold the answer until the client has given up.
							go func() { time.Sleep(50 * time.Millisecond); close(release) }()
							<-release
						})
					}
				}
			}
			c := New(append([]Option{WithServerURL(f.srv.URL)}, tt.clientOpts...)...)
			var err error
			if tt.shell {
				_, err = c.RunShell(ctx, "print(1)", tt.opts...)
			} else {
				_, err = c.RunPython(ctx, "print(1)", tt.opts...)
			}
			if tt.wantErr == nil && err != nil {
				t.Fatalf("run: %v", err)
			}
			if tt.wantErr != nil && !tt.wantErr(err) {
				t.Fatalf("run error %v", err)
			}
			if got := f.methods(); !reflect.DeepEqual(got, tt.wantMethods) {
				t.Fatalf("methods %v, want %v", got, tt.wantMethods)
			}
			reqs := f.all()
			create := reqs[0].params()
			name, _ := create["name"].(string)
			if !nameRE.MatchString(name) || (tt.shell != strings.HasPrefix(name, "sh-")) {
				t.Errorf("name %q", name)
			}
			if create["image"] != tt.wantImage {
				t.Errorf("image %v, want %v", create["image"], tt.wantImage)
			}
			for _, r := range reqs[1:] {
				if r.params()["sandbox"] != name {
					t.Errorf("%s names sandbox %v, want %v", r.rpcMethod(), r.params()["sandbox"], name)
				}
			}
			if tt.wantExec != nil {
				want := sdktest.RoundTrip(t, tt.wantExec).(map[string]any)
				want["sandbox"] = name
				if got := reqs[1].params(); !reflect.DeepEqual(got, want) {
					t.Errorf("run params\n got %v\nwant %v", got, want)
				}
			}
		})
	}
}
