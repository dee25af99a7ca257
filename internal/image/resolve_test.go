package image

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/errdefs"
)

// The host image's skeleton holds LangBin; the language views put it first
// on PATH with microsandbox's environment, and the host image itself keeps
// its default environment.
func TestHostLanguageViews(t *testing.T) {
	dir := t.TempDir()
	host, err := Host(dir, os.Getuid(), os.Getgid())
	if err != nil {
		t.Fatal(err)
	}
	if host.Env != nil {
		t.Errorf("host image env %q, want none (the default)", host.Env)
	}
	for name, target := range map[string]string{"python": "/usr/bin/python3", "pip": "/usr/bin/pip3"} {
		got, err := os.Readlink(filepath.Join(host.Layers[0], LangBin, name))
		if err != nil || got != target {
			t.Errorf("%s/%s -> %q, %v; want %s", LangBin, name, got, err, target)
		}
	}
	for _, tc := range []struct {
		lang string
		want []string
	}{
		{"python", []string{"PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1", "PIP_NO_CACHE_DIR=1", "HOME=/root"}},
		{"node", []string{"NODE_ENV=development", "HOME=/root"}},
	} {
		img, err := Language(host, tc.lang)
		if err != nil {
			t.Fatal(err)
		}
		if len(img.Env) == 0 || !strings.HasPrefix(img.Env[0], "PATH="+LangBin+":") || !strings.Contains(img.Env[0], ":/usr/bin:") {
			t.Errorf("%s view PATH: %q", tc.lang, img.Env)
		}
		for _, w := range tc.want {
			if !slices.Contains(img.Env, w) {
				t.Errorf("%s view env %q lacks %s", tc.lang, img.Env, w)
			}
		}
		if !slices.Equal(img.Layers, host.Layers) || len(img.Mounts) != len(host.Mounts) {
			t.Errorf("%s view is another filesystem: %+v", tc.lang, img)
		}
	}
	if host.Env != nil {
		t.Errorf("a language view changed the host image: %q", host.Env)
	}
	if _, err := Language(host, "cobol"); err == nil {
		t.Error("a view of an unknown language")
	}
}

func TestPublicAddr(t *testing.T) {
	for addr, want := range map[string]bool{
		"8.8.8.8": true, "2a00:1450::1": true, "127.0.0.1": false, "::1": false, "10.1.2.3": false,
		"172.16.0.1": false, "192.168.1.1": false, "169.254.169.254": false, "100.64.0.1": false,
		"0.0.0.0": false, "fd00::1": false, "fe80::1": false, "224.0.0.1": false,
	} {
		if got := publicAddr(netip.MustParseAddr(addr).Unmap()); got != want {
			t.Errorf("publicAddr(%s) = %v, want %v", addr, got, want)
		}
	}
}

func TestResolverNames(t *testing.T) {
	s := newStore(t)
	host := &Image{Name: HostName, Layers: []string{"/skel"}}
	r := &Resolver{Host: func() (*Image, error) { return host, nil }, Store: s, Python: HostName, Node: "my/node:1"}
	ctx := context.Background()
	for _, n := range []string{"python", "python3", "microsandbox/python"} {
		img, err := r.Resolve(ctx, n)
		if err != nil || len(img.Env) == 0 || !strings.Contains(img.Env[0], LangBin) {
			t.Errorf("%s: %+v, %v; want the host's python view", n, img, err)
		}
	}
	if img, err := r.Resolve(ctx, HostName); err != nil || img != host {
		t.Errorf("host: %+v, %v", img, err)
	}
	// A language name mapped to a stored image looks that image up.
	for _, n := range []string{"node", "microsandbox/node", "javascript"} {
		if _, err := r.Resolve(ctx, n); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "my/node:1") {
			t.Errorf("%s: %v; want my/node:1 not found", n, err)
		}
	}
	if err := r.Pull(ctx, "default", "example.com/app:1", func(string, ...any) {}); err == nil || !strings.Contains(err.Error(), "does not pull images") ||
		errdefs.Kind(err) != errdefs.ErrInvalid.Error() {
		t.Errorf("pull with on-demand pulls off: %v", err)
	}
	// The image configured for a language name is never pulled on demand.
	r.OnDemand = &OnDemand{Private: true}
	if err := r.Pull(ctx, "default", "node", func(string, ...any) {}); err == nil || !strings.Contains(err.Error(), `"my/node:1"`) ||
		!strings.Contains(err.Error(), "--node-image") || errdefs.Kind(err) != errdefs.ErrInvalid.Error() {
		t.Errorf("pull of a language name's missing image: %v", err)
	}
	if _, err := r.Resolve(ctx, "example.com/app@sha256:"+strings.Repeat("a", 64)); !errors.Is(err, ErrNotFound) ||
		!strings.Contains(err.Error(), "example.com/app:sha256:") {
		t.Errorf("digest reference looked up as %v; want the name a pull by digest stores", err)
	}
}

// TestResolverPins: what a sandbox records of its image (Image.Pin) takes it
// back to the same image when the language names point elsewhere.
func TestResolverPins(t *testing.T) {
	host := &Image{Name: HostName, Layers: []string{"/skel"}}
	r := &Resolver{Host: func() (*Image, error) { return host, nil }, Store: newStore(t), Python: HostName, Node: HostName}
	ctx := context.Background()
	if p := host.Pin(); p != HostName {
		t.Errorf("host image's pin %q", p)
	}
	if p := (&Image{Name: "app:1", ID: "sha256:x"}).Pin(); p != "sha256:x" {
		t.Errorf("stored image's pin %q, want its id", p)
	}
	for _, lang := range Languages {
		view, err := r.Resolve(ctx, lang)
		if err != nil {
			t.Fatal(err)
		}
		if view.Pin() != HostName+"+"+lang {
			t.Errorf("%s view's pin %q", lang, view.Pin())
		}
		// The operator maps the language elsewhere: the pin still
		// resolves to the host's view.
		r2 := *r
		r2.Python, r2.Node = "warren/python:bookworm", "warren/node:bookworm"
		again, err := r2.Resolve(ctx, view.Pin())
		if err != nil || again.Pin() != view.Pin() || !slices.Equal(again.Env, view.Env) || !slices.Equal(again.Layers, host.Layers) {
			t.Errorf("%s pin resolved to %+v, %v; want the host's %s view", lang, again, err, lang)
		}
	}
	if _, err := r.Resolve(ctx, HostName+"+cobol"); err == nil {
		t.Error("a view of an unknown language resolved")
	}
}

// On-demand pulls: bounded in size before any layer is fetched, refused by
// the policy seam with its kind, and the store's image once done.
func TestOnDemand(t *testing.T) {
	img := twoLayerImage(t)
	r := newTestRegistry(t, nil)
	ref := r.push(t, "test/od:v1", img)
	s := newStore(t)
	ctx := context.Background()
	var lines []string
	logf := func(f string, _ ...any) { lines = append(lines, f) }

	o := &OnDemand{Private: true, MaxBytes: 10}
	err := o.pull(ctx, s, "default", ref, logf)
	if errdefs.Kind(err) != errdefs.ErrLimit.Error() {
		t.Errorf("pull over the bound: %v (kind %s)", err, errdefs.Kind(err))
	}
	if n, _ := r.blobGets(); n != 0 {
		t.Errorf("a pull over the bound fetched %d blobs", n)
	}

	o = &OnDemand{Private: true, Allow: func(context.Context, string, string) error { return errors.New("not on the list") }}
	if err := o.pull(ctx, s, "team", ref, logf); errdefs.Kind(err) != errdefs.ErrForbidden.Error() ||
		!strings.Contains(err.Error(), "not on the list") || !strings.Contains(err.Error(), `"team"`) {
		t.Errorf("pull the policy refuses: %v", err)
	}

	// Without Private, the loopback registry is not dialed at all.
	r.reset()
	o = &OnDemand{}
	err = o.pull(ctx, s, "default", ref, logf)
	if !errors.Is(err, ErrNotPublic) || errdefs.Kind(err) != errdefs.ErrForbidden.Error() {
		t.Errorf("pull from a loopback registry: %v (kind %s)", err, errdefs.Kind(err))
	}
	t.Log(err)
	r.mu.Lock()
	if r.mans != 0 {
		t.Errorf("a refused registry got %d manifest requests", r.mans)
	}
	r.mu.Unlock()

	var serverLog bytes.Buffer
	o = &OnDemand{Private: true, Logger: slog.New(slog.NewTextHandler(&serverLog, nil))}
	if err := o.pull(ctx, s, "default", ref, logf); err != nil {
		t.Fatal(err)
	}
	if l := serverLog.String(); !strings.Contains(l, "pulled image on demand") || !strings.Contains(l, "namespace=default") {
		t.Errorf("server log: %s", l)
	}
	if _, err := s.Get(ref); err != nil {
		t.Fatal(err)
	}
	r.reset()
	// The store has it now: a second on-demand pull fetches nothing.
	if err := o.pull(ctx, s, "default", ref, logf); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	if r.mans != 0 {
		t.Errorf("a pull of a stored image asked the registry %d times", r.mans)
	}
	r.mu.Unlock()
	if len(lines) == 0 || !strings.HasPrefix(lines[0], "pulling image") {
		t.Errorf("progress lines: %q", lines)
	}
}

// Pulls of different images beyond MaxPulls are refused while the others
// run; a start of an image being pulled joins its pull instead.
func TestOnDemandMaxPulls(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 8)
	r := newTestRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/slow/manifests/") {
				started <- struct{}{}
				<-release
			}
			h.ServeHTTP(w, req)
		})
	})
	img := twoLayerImage(t)
	slow := r.push(t, "test/slow:v1", img)
	other := r.push(t, "test/other:v1", img)
	s := newStore(t)
	o := &OnDemand{Private: true, MaxPulls: 1}
	nop := func(string, ...any) {}
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- o.pull(context.Background(), s, "default", slow, nop) }()
	}
	<-started
	err := o.pull(context.Background(), s, "default", other, nop)
	if errdefs.Kind(err) != errdefs.ErrLimit.Error() || !strings.Contains(err.Error(), "1 images are being pulled") {
		t.Errorf("a second image while one is pulled, MaxPulls 1: %v", err)
	}
	close(release)
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("pull of the slow image: %v", err)
		}
	}
	if err := o.pull(context.Background(), s, "default", other, nop); err != nil {
		t.Errorf("once the pull is done: %v", err)
	}
}
