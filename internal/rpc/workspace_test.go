package rpc_test

import (
	"archive/tar"
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/rpc"
	s3client "github.com/warren-sandbox/warren/internal/s3"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/testenv"
	"github.com/warren-sandbox/warren/internal/workspace"
)

// newWorkspaceEnv is a native server with workspaces under its data
// directory, as warren serve wires them.
func newWorkspaceEnv(t *testing.T, stores ...func(root string) (string, workspace.Store)) (*env, *workspace.Manager) {
	var wm *workspace.Manager
	e := newEnv(t, false, func(o *sandbox.Options) {
		uid, gid := o.Backend.(interface{ RootIDs() (int, int) }).RootIDs()
		var err error
		// The env's directory is known only through the log dir here.
		root := filepath.Join(filepath.Dir(o.LogDir), "workspaces")
		named := map[string]workspace.Store{}
		for _, f := range stores {
			n, st := f(root)
			named[n] = st
		}
		wm, err = workspace.New(workspace.Options{Root: root, UID: uid, GID: gid, Stores: named})
		if err != nil {
			t.Fatal(err)
		}
		o.Workspaces = wm
	})
	e.rpcOptions = func(o *rpc.Options) { o.Workspaces = wm }
	e.restart() // the first start had no workspaces in the API
	return e, wm
}

type wsExec struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
}

func (e *env) sh(t *testing.T, sb, script string) wsExec {
	t.Helper()
	var res wsExec
	e.must("sandbox.exec", map[string]any{"sandbox": sb, "argv": []string{"sh", "-c", script}}, &res)
	return res
}

func tarOf(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for name, data := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write([]byte(data))
	}
	_ = tw.Close()
	return b.Bytes()
}

func (e *env) wsTar(t *testing.T, method, name string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, e.url+"/api/v1/workspaces/-/"+name+"/tar", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp := e.do(t, req, e.admin)
	raw, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, raw
}

// Two sandboxes of a namespace mount one workspace and see each other's
// writes at once; an upload lands for both; the workspace outlives them
// and a server restart; it cannot be removed while mounted.
func TestWorkspaceShared(t *testing.T) {
	e, _ := newWorkspaceEnv(t)
	var info struct {
		Name  string `json:"name"`
		Store string `json:"store"`
		Quota int64  `json:"quota"`
		Usage *int64 `json:"usage"`
	}
	e.must("workspace.create", map[string]any{"name": "proj", "quota": 1 << 20}, &info)
	if info.Store != "local" || info.Quota != 1<<20 {
		t.Fatalf("created %+v", info)
	}
	if r := e.call("sandbox.create", map[string]any{"name": "none", "workspace": "missing"}); r.kind() != "not_found" {
		t.Fatalf("missing workspace: %s", r.Raw)
	}
	if r := e.call("sandbox.get", map[string]any{"sandbox": "none"}); r.kind() != "not_found" {
		t.Fatalf("a sandbox refused for its workspace left a record: %s", r.Raw)
	}
	e.must("sandbox.create", map[string]any{"name": "a", "workspace": "proj"}, nil)
	e.must("sandbox.create", map[string]any{"name": "b", "workspace": "proj"}, nil)
	if r := e.sh(t, "a", "echo from-a > /workspace/note && mkdir -p /workspace/d && id -u > /workspace/d/uid"); r.ExitCode != 0 {
		t.Fatalf("write in a: %+v", r)
	}
	if r := e.sh(t, "b", "cat /workspace/note /workspace/d/uid; echo from-b >> /workspace/note"); r.ExitCode != 0 || r.Stdout != "from-a\n0\n" {
		t.Fatalf("b reads a's write: %+v", r)
	}
	if r := e.sh(t, "a", "cat /workspace/note"); r.Stdout != "from-a\nfrom-b\n" {
		t.Fatalf("a reads b's write: %+v", r)
	}
	// An upload is written as the sandboxes' root: they can replace it.
	if resp, raw := e.wsTar(t, "PUT", "proj", tarOf(t, map[string]string{"up/x.txt": "uploaded"})); resp != 200 {
		t.Fatalf("upload: %d %s", resp, raw)
	}
	if r := e.sh(t, "b", "cat /workspace/up/x.txt && echo changed > /workspace/up/x.txt && stat -c %u /workspace/up/x.txt"); r.ExitCode != 0 || r.Stdout != "uploaded0\n" {
		t.Fatalf("b reads and replaces the upload: %+v", r)
	}
	if r := e.call("workspace.remove", map[string]any{"workspace": "proj"}); r.kind() != "conflict" {
		t.Fatalf("remove while mounted: %s", r.Raw)
	}
	e.restart()
	e.must("sandbox.remove", map[string]any{"sandbox": "a"}, nil)
	e.must("sandbox.remove", map[string]any{"sandbox": "b"}, nil)
	e.restart()
	e.must("workspace.get", map[string]any{"workspace": "proj"}, &info)
	if info.Usage == nil || *info.Usage <= 0 || *info.Usage > info.Quota {
		t.Fatalf("usage after restart: %+v", info)
	}
	e.must("sandbox.create", map[string]any{"name": "c", "workspace": "proj"}, nil)
	if r := e.sh(t, "c", "cat /workspace/note /workspace/up/x.txt"); r.Stdout != "from-a\nfrom-b\nchanged\n" {
		t.Fatalf("a new sandbox after a restart: %+v", r)
	}
	resp, raw := e.wsTar(t, "GET", "proj", nil)
	if resp != 200 {
		t.Fatalf("download: %d %s", resp, raw)
	}
	names := map[string]bool{}
	tr := tar.NewReader(bytes.NewReader(raw))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names[strings.TrimSuffix(h.Name, "/")] = true
	}
	for _, n := range []string{"note", "d/uid", "up/x.txt"} {
		if !names[n] {
			t.Errorf("download lacks %s: %v", n, names)
		}
	}
	e.must("sandbox.remove", map[string]any{"sandbox": "c"}, nil)
	e.must("workspace.remove", map[string]any{"workspace": "proj"}, nil)
	if r := e.call("workspace.get", map[string]any{"workspace": "proj"}); r.kind() != "not_found" {
		t.Fatalf("removed workspace: %s", r.Raw)
	}
}

// An upload past the quota fails with limit; a workspace over its quota
// is not mounted.
func TestWorkspaceQuota(t *testing.T) {
	e, _ := newWorkspaceEnv(t)
	e.must("workspace.create", map[string]any{"name": "small", "quota": 64 << 10}, nil)
	big := strings.Repeat("x", 100<<10)
	resp, raw := e.wsTar(t, "PUT", "small", tarOf(t, map[string]string{"big": big}))
	if resp == 200 || !strings.Contains(string(raw), "quota") {
		t.Fatalf("upload past the quota: %d %s", resp, raw)
	}
	if resp, raw := e.wsTar(t, "PUT", "small", tarOf(t, map[string]string{"fits": "ok"})); resp != 200 {
		t.Fatalf("upload within: %d %s", resp, raw)
	}
	// Sandboxes write past it (no per-directory limit inside here); the
	// next mount is refused with the numbers.
	e.must("sandbox.create", map[string]any{"name": "w", "workspace": "small"}, nil)
	if r := e.sh(t, "w", "head -c 200000 /dev/zero > /workspace/fill"); r.ExitCode != 0 {
		t.Fatalf("fill: %+v", r)
	}
	e.must("sandbox.stop", map[string]any{"sandbox": "w"}, nil)
	r := e.call("sandbox.create", map[string]any{"name": "w2", "workspace": "small"})
	if r.kind() != "limit" || !strings.Contains(string(r.Raw), "quota of 65536 bytes") {
		t.Fatalf("mount over the quota: %s", r.Raw)
	}
	if resp, raw := e.wsTar(t, "PUT", "small", tarOf(t, map[string]string{"more": "x"})); resp == 200 || !strings.Contains(string(raw), "limit") {
		t.Fatalf("upload over the quota: %d %s", resp, raw)
	}
}

// The S3 store with real sandboxes against a real S3 server: what a
// sandbox writes is in the bucket once it stopped; a new sandbox, after
// the host's copy was lost, sees it and what was put in the bucket
// meanwhile.
func TestWorkspaceS3(t *testing.T) {
	s3 := testenv.StartS3(t)
	t.Setenv("TEST_S3_KEY", s3.AccessKey)
	t.Setenv("TEST_S3_SECRET", s3.SecretKey)
	var cache string
	e, _ := newWorkspaceEnv(t, func(root string) (string, workspace.Store) {
		cache = filepath.Join(root, ".s3", "s3")
		st, err := workspace.NewS3(t.Context(), workspace.S3Options{Endpoint: s3.Endpoint, Bucket: "warren", Region: "us-east-1",
			AccessKeyEnv: "TEST_S3_KEY", SecretKeyEnv: "TEST_S3_SECRET", Cache: cache})
		if err != nil {
			t.Fatal(err)
		}
		return "s3", st
	})
	e.must("workspace.create", map[string]any{"name": "data", "store": "s3"}, nil)
	e.must("sandbox.create", map[string]any{"name": "w", "workspace": "data"}, nil)
	if r := e.sh(t, "w", "mkdir -p /workspace/out && echo result > /workspace/out/r.txt"); r.ExitCode != 0 {
		t.Fatalf("write: %+v", r)
	}
	e.must("sandbox.stop", map[string]any{"sandbox": "w"}, nil)
	c, err := s3client.New(s3.Endpoint, "", s3.AccessKey, s3.SecretKey)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := c.GetObject(t.Context(), "warren", "default/data/out/r.txt")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(obj)
	if err != nil || string(got) != "result\n" {
		t.Fatalf("object after the stop: %q %v", got, err)
	}
	if _, err := c.PutObject(t.Context(), "warren", "default/data/in.txt", strings.NewReader("from the bucket"), 15, ""); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(cache, "default", "data", "out")); err != nil {
		t.Fatal(err)
	}
	e.must("sandbox.create", map[string]any{"name": "n", "workspace": "data"}, nil)
	if r := e.sh(t, "n", "cat /workspace/out/r.txt /workspace/in.txt"); r.Stdout != "result\nfrom the bucket" {
		t.Fatalf("a new sandbox sees: %+v", r)
	}
	var st struct {
		Sent      int      `json:"sent"`
		Conflicts []string `json:"conflicts"`
	}
	if r := e.sh(t, "n", "echo more > /workspace/more.txt"); r.ExitCode != 0 {
		t.Fatalf("write: %+v", r)
	}
	e.must("workspace.sync", map[string]any{"workspace": "data"}, &st)
	if st.Sent != 1 || len(st.Conflicts) != 0 {
		t.Fatalf("sync: %+v", st)
	}
}
