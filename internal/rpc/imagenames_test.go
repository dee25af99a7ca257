package rpc_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// newResolverEnv is newEnv (native) or newFakeEnv with the server's image
// names as warren serve resolves them (image.Resolver): language names to
// the host image's language views, anything else to the store, pulled on
// demand when od is set.
func newResolverEnv(t *testing.T, native bool, od *image.OnDemand) (*env, *image.Resolver) {
	t.Helper()
	res := &image.Resolver{Python: image.HostName, Node: image.HostName, OnDemand: od}
	// The env's store and host image exist only once the env does; the
	// manager resolves nothing before the first start.
	tweak := func(o *sandbox.Options) {
		o.Images = func(ctx context.Context, name string) (*image.Image, error) { return res.Resolve(ctx, name) }
		o.Pull = func(ctx context.Context, ns, name string, logf func(string, ...any)) error {
			return res.Pull(ctx, ns, name, logf)
		}
	}
	var e *env
	if native {
		e = newEnv(t, true, tweak)
		res.Host = e.be.HostImage
	} else {
		e = newFakeEnv(t, true, tweak)
		host := &image.Image{Layers: []string{"/"}}
		res.Host = func() (*image.Image, error) { return host, nil }
	}
	res.Store = e.images
	return e, res
}

type commandResult struct {
	ExitCode int  `json:"exit_code"`
	Success  bool `json:"success"`
	Output   []struct {
		Stream string `json:"stream"`
		Text   string `json:"text"`
	} `json:"output"`
}

func (r commandResult) text() string {
	var b strings.Builder
	for _, l := range r.Output {
		b.WriteString(l.Text + "\n")
	}
	return b.String()
}

// TestLanguageNamesRunLikeMicrosandboxImages starts sandboxes as the SDKs
// do, by microsandbox's image names and by language name, on the default
// mapping (the host image), and runs what microsandbox's python and node
// images offer and the SDKs' command examples run.
func TestLanguageNamesRunLikeMicrosandboxImages(t *testing.T) {
	testenv.RequireFile(t, "/usr/bin/pip3")
	testenv.RequireFile(t, "/usr/bin/node")
	testenv.RequireFile(t, "/usr/bin/npm")
	e, _ := newResolverEnv(t, true, nil)
	python := [][]string{
		{"python", "-c", "import os; print(6*7, os.environ['PYTHONUNBUFFERED'])"},
		{"python3", "--version"},
		{"pip", "--version"},
		{"pip3", "--version"},
	}
	node := [][]string{
		{"node", "-e", "console.log(6*7, process.env.NODE_ENV)"},
		{"npm", "--version"},
	}
	for _, tc := range []struct {
		image string
		cmds  [][]string
		want  []string // in the first command's output
	}{
		{"microsandbox/python", python, []string{"42 1"}},
		{"python", python, []string{"42 1"}},
		{"microsandbox/node", node, []string{"42 development"}},
		{"node", node, []string{"42 development"}},
	} {
		t.Run(strings.ReplaceAll(tc.image, "/", "_"), func(t *testing.T) {
			sb := "lang-" + strings.ReplaceAll(tc.image, "/", "-")
			e.must("sandbox.start", map[string]any{"sandbox": sb, "config": map[string]any{"image": tc.image, "memory": 512}}, nil)
			defer e.must("sandbox.stop", map[string]any{"sandbox": sb}, nil)
			for i, argv := range tc.cmds {
				var r commandResult
				e.must("sandbox.command.run", map[string]any{"sandbox": sb, "command": argv[0], "args": argv[1:]}, &r)
				if r.ExitCode != 0 || !r.Success || len(r.Output) == 0 {
					t.Errorf("%v in %s: exit %d, output %q", argv, tc.image, r.ExitCode, r.text())
					continue
				}
				if i == 0 && !strings.Contains(r.text(), tc.want[0]) {
					t.Errorf("%v in %s: output %q, want %q", argv, tc.image, r.text(), tc.want[0])
				}
			}
		})
	}
	// The host image itself is unchanged: no python command of Warren's.
	e.must("sandbox.start", map[string]any{"sandbox": "plainhost", "config": map[string]any{"image": "host"}}, nil)
	var r commandResult
	e.must("sandbox.command.run", map[string]any{"sandbox": "plainhost", "command": "sh", "args": []string{"-c", "echo $PATH"}}, &r)
	if strings.Contains(r.text(), image.LangBin) {
		t.Errorf("host image's PATH %q has %s", r.text(), image.LangBin)
	}
}

// greetingImage pushes a one-layer image with /etc/greeting to a new
// registry on loopback and returns its reference (host/test/greeting:1).
// gate, when set, wraps the registry's handler.
func greetingImage(t *testing.T, gate func(http.Handler) http.Handler) string {
	t.Helper()
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if gate != nil {
		h = gate(h)
	}
	reg := httptest.NewServer(h)
	t.Cleanup(reg.Close)
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	for _, d := range []string{"etc/", "tmp/"} {
		_ = tw.WriteHeader(&tar.Header{Name: d, Mode: 0o755, Typeflag: tar.TypeDir})
	}
	_ = tw.WriteHeader(&tar.Header{Name: "etc/greeting", Mode: 0o644, Size: 6, Typeflag: tar.TypeReg})
	_, _ = tw.Write([]byte("hello\n"))
	_ = tw.Close()
	layerBytes := tb.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerBytes)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	ref := strings.TrimPrefix(reg.URL, "http://") + "/test/greeting:1"
	parsed, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(parsed, img); err != nil {
		t.Fatal(err)
	}
	return ref
}

// TestStartPullsMissingImage starts a real sandbox with an image the
// store lacks: it is pulled, the sandbox runs on it, the sandbox's log
// tells the pull, and the image stays in the store.
func TestStartPullsMissingImage(t *testing.T) {
	ref := greetingImage(t, nil)
	e, _ := newResolverEnv(t, true, &image.OnDemand{Private: true})
	e.must("sandbox.start", map[string]any{"sandbox": "pulled", "config": map[string]any{"image": ref}}, nil)
	var rd struct {
		Data string `json:"data"`
	}
	e.must("sandbox.file.read", map[string]any{"sandbox": "pulled", "path": "/etc/greeting"}, &rd)
	if b, _ := base64.StdEncoding.DecodeString(rd.Data); string(b) != "hello\n" {
		t.Fatalf("file from the pulled image: %q", b)
	}
	if _, err := e.images.Get(ref); err != nil {
		t.Fatalf("pulled image not in the store: %v", err)
	}
	logs, err := e.mgr.Logs("default", "pulled", 0)
	if err != nil {
		t.Fatal(err)
	}
	if all := strings.Join(logs, "\n"); !strings.Contains(all, "pulling image "+ref) || !strings.Contains(all, "pulled image "+ref) {
		t.Errorf("sandbox log does not tell the pull:\n%s", all)
	}
}

// TestOnDemandPulls covers the server's side of on-demand pulls on the
// fake backend: one pull for concurrent starts, the setting off, failures
// that leave nothing, the bounds and the policy seam.
func TestOnDemandPulls(t *testing.T) {
	t.Run("concurrent starts share one pull", func(t *testing.T) {
		testenv.RequireRoot(t) // unpacking a layer gives its files their owners
		var manifests atomic.Int32
		release := make(chan struct{})
		ref := greetingImage(t, func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/manifests/") {
					manifests.Add(1)
					<-release // the starts pile up behind the first pull
				}
				h.ServeHTTP(w, r)
			})
		})
		e, _ := newResolverEnv(t, false, &image.OnDemand{Private: true})
		const n = 4
		var wg sync.WaitGroup
		replies := make([]*rpcReply, n)
		for i := range n {
			wg.Go(func() {
				replies[i] = e.call("sandbox.start", map[string]any{"sandbox": "c" + string(rune('0'+i)), "config": map[string]any{"image": ref}})
			})
		}
		time.Sleep(500 * time.Millisecond)
		close(release)
		wg.Wait()
		for i, r := range replies {
			if r.Status != 200 || r.Error != nil {
				t.Errorf("start %d: %s", i, r.Raw)
			}
		}
		if got := manifests.Load(); got != 1 {
			t.Errorf("%d concurrent starts fetched the manifest %d times, want 1 (one pull)", n, got)
		}
	})

	t.Run("setting off refuses", func(t *testing.T) {
		ref := greetingImage(t, nil)
		e, _ := newResolverEnv(t, false, nil)
		r := e.call("sandbox.start", map[string]any{"sandbox": "off", "config": map[string]any{"image": ref}})
		if r.Status != 400 || r.kind() != "invalid_params" || !strings.Contains(r.Error.Message, "does not pull images") {
			t.Fatalf("start with a missing image, pulls off: %s", r.Raw)
		}
		if recs, _ := e.images.List(); len(recs) != 0 {
			t.Errorf("store after a refused start: %+v", recs)
		}
		if len(e.mgr.List(sandbox.Filter{})) != 0 {
			t.Errorf("a refused start left a sandbox")
		}
	})

	t.Run("failure leaves nothing", func(t *testing.T) {
		// The layer blob is cut short mid-transfer.
		ref := greetingImage(t, func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, r)
					if rec.Body.Len() > 64 && !json.Valid(rec.Body.Bytes()) {
						w.Header().Set("Content-Length", "100000")
						w.WriteHeader(http.StatusOK)
						_, _ = w.Write(rec.Body.Bytes()[:64])
						return
					}
					for k, v := range rec.Header() {
						w.Header()[k] = v
					}
					w.WriteHeader(rec.Code)
					_, _ = w.Write(rec.Body.Bytes())
					return
				}
				h.ServeHTTP(w, r)
			})
		})
		e, _ := newResolverEnv(t, false, &image.OnDemand{Private: true})
		missing := strings.Replace(ref, "greeting:1", "nothing:1", 1)
		for _, c := range []struct{ image, want string }{
			{missing, "not found"},
			{ref, "could not be pulled"},
		} {
			r := e.call("sandbox.start", map[string]any{"sandbox": "fails", "config": map[string]any{"image": c.image}})
			if r.Error == nil || !strings.Contains(r.Error.Message, c.want) || !strings.Contains(r.Error.Message, c.image) {
				t.Errorf("start with %s: %s; want an error naming it and %q", c.image, r.Raw, c.want)
			}
			if r.Status == 500 {
				t.Errorf("start with %s: status 500 for a registry failure: %s", c.image, r.Raw)
			}
		}
		if recs, _ := e.images.List(); len(recs) != 0 {
			t.Errorf("store after failed pulls: %+v", recs)
		}
		if len(e.mgr.List(sandbox.Filter{})) != 0 {
			t.Errorf("failed pulls left a sandbox")
		}
		layers, err := os.ReadDir(filepath.Join(e.dir, "data", "images", "store", "layers", "sha256"))
		if err != nil || len(layers) != 0 {
			t.Errorf("layer directories after failed pulls: %v, %v", layers, err)
		}
	})

	t.Run("bounds and policy", func(t *testing.T) {
		ref := greetingImage(t, nil)
		var asked []string
		od := &image.OnDemand{Private: true, MaxBytes: 100, Allow: func(_ context.Context, ns, ref string) error {
			asked = append(asked, ns+" "+ref)
			if strings.Contains(ref, "forbidden") {
				return errForbiddenTest
			}
			return nil
		}}
		e, _ := newResolverEnv(t, false, od)
		r := e.call("sandbox.start", map[string]any{"sandbox": "big", "config": map[string]any{"image": ref}})
		if r.Error == nil || r.kind() != "limit" {
			t.Errorf("start with an image over the pull bound: %s", r.Raw)
		}
		r = e.call("sandbox.start", map[string]any{"namespace": "team", "sandbox": "no", "config": map[string]any{"image": "example.com/forbidden:1"}})
		if r.Error == nil || !strings.Contains(r.Error.Message, errForbiddenTest.Error()) {
			t.Errorf("start with an image the policy refuses: %s", r.Raw)
		}
		if len(asked) != 2 || asked[0] != "default "+ref || asked[1] != "team example.com/forbidden:1" {
			t.Errorf("policy asked %q", asked)
		}
		if len(e.mgr.List(sandbox.Filter{})) != 0 {
			t.Errorf("refused pulls left a sandbox")
		}
	})
}

var errForbiddenTest = testError("images from example.com/forbidden are not allowed in this namespace")

type testError string

func (e testError) Error() string { return string(e) }
