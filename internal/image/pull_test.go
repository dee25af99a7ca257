package image

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// testRegistry is an in-process registry on 127.0.0.1 that counts the
// GETs of each blob. wrap, when set, wraps the counting handler.
type testRegistry struct {
	host string // "127.0.0.1:port"
	mu   sync.Mutex
	gets map[string]int // blob digest -> GETs
	mans int            // manifest GETs
}

func newTestRegistry(t testing.TB, wrap func(http.Handler) http.Handler) *testRegistry {
	t.Helper()
	r := &testRegistry{gets: map[string]int{}}
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodGet {
			r.mu.Lock()
			if i := strings.LastIndex(req.URL.Path, "/blobs/"); i >= 0 {
				r.gets[req.URL.Path[i+len("/blobs/"):]]++
			} else if strings.Contains(req.URL.Path, "/manifests/") {
				r.mans++
			}
			r.mu.Unlock()
		}
		reg.ServeHTTP(w, req)
	})
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	r.host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

func (r *testRegistry) blobGets() (total int, per map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	per = map[string]int{}
	for d, n := range r.gets {
		per[d] = n
		total += n
	}
	return total, per
}

func (r *testRegistry) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gets = map[string]int{}
	r.mans = 0
}

func (r *testRegistry) push(t testing.TB, repo string, img v1.Image, opts ...remote.Option) string {
	t.Helper()
	ref := r.host + "/" + repo
	parsed, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(parsed, img, opts...); err != nil {
		t.Fatal(err)
	}
	return ref
}

// anonymous is a keychain with no credentials (the test never reads the
// user's Docker config).
type anonymous struct{}

func (anonymous) Resolve(authn.Resource) (authn.Authenticator, error) { return authn.Anonymous, nil }

type static struct{ user, pass string }

func (k static) Resolve(authn.Resource) (authn.Authenticator, error) {
	return authn.FromConfig(authn.AuthConfig{Username: k.user, Password: k.pass}), nil
}

func layerDigests(t testing.TB, img v1.Image) []string {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	var ds []string
	for _, l := range m.Layers {
		ds = append(ds, l.Digest.String())
	}
	return ds
}

func configDigest(t testing.TB, img v1.Image) string {
	t.Helper()
	d, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func TestPullTwoLayerByTagAndDigest(t *testing.T) {
	r := newTestRegistry(t, nil)
	img := twoLayerImage(t)
	ref := r.push(t, "test/two:v1", img)
	s := newStore(t)
	var mu sync.Mutex
	var events []Progress
	rec, err := s.Pull(context.Background(), ref, "two", PullOptions{Keychain: anonymous{}, Progress: func(p Progress) {
		mu.Lock()
		events = append(events, p)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Name != "two" {
		t.Errorf("record name %q", rec.Name)
	}
	checkTwoLayer(t, s, "two", img)
	assertTmpEmpty(t, s)
	// Progress: both layers finished, bytes complete.
	finished := map[string]bool{}
	for _, p := range events {
		if p.LayersTotal != 2 || p.Done > p.Total || p.Total <= 0 {
			t.Errorf("bad progress event %+v", p)
		}
		if p.Finished {
			finished[p.Layer] = true
			if p.Done != p.Total {
				t.Errorf("finished layer %s: %d of %d bytes", p.Layer, p.Done, p.Total)
			}
		}
	}
	if last := events[len(events)-1]; len(finished) != 2 || last.LayersDone != 2 || !last.Finished {
		t.Errorf("progress did not finish: %d finished, last %+v", len(finished), last)
	}

	// By digest, default name: the ref with '@' made ':'.
	dig, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	byDigest := r.host + "/test/two@" + dig.String()
	rec, err = s.Pull(context.Background(), byDigest, "", PullOptions{Keychain: anonymous{}})
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.ReplaceAll(byDigest, "@", ":"); rec.Name != want {
		t.Errorf("name %q, want %q", rec.Name, want)
	}
	checkTwoLayer(t, s, rec.Name, img)
	// Tag as given is the default name too.
	if rec, err = s.Pull(context.Background(), ref, "", PullOptions{Keychain: anonymous{}}); err != nil || rec.Name != ref {
		t.Fatalf("pull %s: %+v, %v", ref, rec, err)
	}
	// A missing tag is a clear error.
	_, err = s.Pull(context.Background(), r.host+"/test/two:nope", "x", PullOptions{Keychain: anonymous{}})
	if err == nil || !strings.Contains(err.Error(), "not found") || !strings.Contains(err.Error(), "test/two:nope") {
		t.Errorf("missing tag: %v", err)
	}
}

func otherArch() string {
	if runtime.GOARCH == "s390x" {
		return "riscv64"
	}
	return "s390x"
}

func TestPullMultiArch(t *testing.T) {
	r := newTestRegistry(t, nil)
	host := twoLayerImage(t)
	other, err := random.Image(1024, 2)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := other.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", otherArch()
	if other, err = mutate.ConfigFile(other, cf); err != nil {
		t.Fatal(err)
	}
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: other, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: otherArch()}}},
		mutate.IndexAddendum{Add: host, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}}},
	)
	ref := r.host + "/test/multi:latest"
	parsed, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(parsed, idx); err != nil {
		t.Fatal(err)
	}
	s := newStore(t)
	ctx := context.Background()
	rec, err := s.Pull(ctx, ref, "multi", PullOptions{Keychain: anonymous{}})
	if err != nil {
		t.Fatal(err)
	}
	if rec.ID != configDigest(t, host) {
		t.Errorf("host platform: got image %s, want %s", rec.ID, configDigest(t, host))
	}
	checkTwoLayer(t, s, "multi", host)
	rec, err = s.Pull(ctx, ref, "multi-other", PullOptions{Keychain: anonymous{}, Platform: "linux/" + otherArch()})
	if err != nil {
		t.Fatal(err)
	}
	if rec.ID != configDigest(t, other) {
		t.Errorf("--platform: got image %s, want %s", rec.ID, configDigest(t, other))
	}
	_, err = s.Pull(ctx, ref, "none", PullOptions{Keychain: anonymous{}, Platform: "linux/mips64le"})
	if err == nil {
		t.Fatal("pulled a platform the index lacks")
	}
	for _, want := range []string{"linux/mips64le", "linux/" + runtime.GOARCH, "linux/" + otherArch(), "available"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if _, err := s.Pull(ctx, ref, "bad", PullOptions{Keychain: anonymous{}, Platform: "linux"}); err == nil {
		t.Error("accepted platform \"linux\"")
	}
	// A single image for another platform is refused when a platform is asked for.
	single := r.push(t, "test/other:v1", other)
	_, err = s.Pull(ctx, single, "single", PullOptions{Keychain: anonymous{}, Platform: "linux/" + runtime.GOARCH})
	if err == nil || !strings.Contains(err.Error(), "linux/"+otherArch()) {
		t.Errorf("single image for another platform: %v", err)
	}
}

// flipWriter corrupts every response body it writes.
type flipWriter struct{ http.ResponseWriter }

func (w flipWriter) Write(p []byte) (int, error) {
	q := append([]byte(nil), p...)
	if len(q) > 0 {
		q[len(q)/2] ^= 0xff
	}
	return w.ResponseWriter.Write(q)
}

func TestPullCorruptBlob(t *testing.T) {
	img := twoLayerImage(t)
	cfg := configDigest(t, img)
	r := newTestRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/") && !strings.HasSuffix(req.URL.Path, cfg) {
				w = flipWriter{w}
			}
			h.ServeHTTP(w, req)
		})
	})
	ref := r.push(t, "test/corrupt:v1", img)
	s := newStore(t)
	_, err := s.Pull(context.Background(), ref, "corrupt", PullOptions{Keychain: anonymous{}})
	if err == nil {
		t.Fatal("pulled a corrupt image")
	}
	if !strings.Contains(err.Error(), ref) || !strings.Contains(err.Error(), "corrupt") || !strings.Contains(err.Error(), "layer sha256:") {
		t.Errorf("unclear error: %v", err)
	}
	t.Log(err)
	assertNoRecords(t, s)
	assertTmpEmpty(t, s)
	if d := layerDirs(t, s); len(d) != 0 {
		t.Errorf("corrupt layers stored: %v", d)
	}
}

func TestPullAuth(t *testing.T) {
	r := newTestRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if u, p, ok := req.BasicAuth(); !ok || u != "alice" || p != "s3cret" {
				w.Header().Set("WWW-Authenticate", `Basic realm="warren-test"`)
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			h.ServeHTTP(w, req)
		})
	})
	img := twoLayerImage(t)
	ref := r.push(t, "test/private:v1", img, remote.WithAuth(&authn.Basic{Username: "alice", Password: "s3cret"}))
	s := newStore(t)
	ctx := context.Background()
	_, err := s.Pull(ctx, ref, "private", PullOptions{Keychain: anonymous{}})
	if err == nil || !strings.Contains(err.Error(), "authentication") || !strings.Contains(err.Error(), "docker login") {
		t.Errorf("without credentials: %v", err)
	}
	_, err = s.Pull(ctx, ref, "private", PullOptions{Keychain: static{"alice", "wrong"}})
	if err == nil || !strings.Contains(err.Error(), "authentication") {
		t.Errorf("wrong credentials: %v", err)
	}
	assertNoRecords(t, s)
	if _, err := s.Pull(ctx, ref, "private", PullOptions{Keychain: static{"alice", "s3cret"}}); err != nil {
		t.Fatal(err)
	}
	checkTwoLayer(t, s, "private", img)

	// The default keychain reads the Docker config file.
	dir := t.TempDir()
	cfg := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, r.host, base64.StdEncoding.EncodeToString([]byte("alice:s3cret")))
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", dir)
	if _, err := s.Pull(ctx, ref, "private2", PullOptions{}); err != nil {
		t.Fatalf("with the Docker config: %v", err)
	}
}

func TestPullSecondTransfersNothing(t *testing.T) {
	r := newTestRegistry(t, nil)
	img := twoLayerImage(t)
	ref := r.push(t, "test/two:v1", img)
	s := newStore(t)
	ctx := context.Background()
	if _, err := s.Pull(ctx, ref, "two", PullOptions{Keychain: anonymous{}}); err != nil {
		t.Fatal(err)
	}
	_, per := r.blobGets()
	for _, d := range append(layerDigests(t, img), configDigest(t, img)) {
		if per[d] != 1 {
			t.Errorf("first pull: blob %s fetched %d times, want 1", d, per[d])
		}
	}
	r.reset()
	if _, err := s.Pull(ctx, ref, "two-again", PullOptions{Keychain: anonymous{}}); err != nil {
		t.Fatal(err)
	}
	if n, per := r.blobGets(); n != 0 {
		t.Errorf("second pull fetched blobs: %v", per)
	}
	checkTwoLayer(t, s, "two-again", img)

	// With the image forgotten but its layers still on disk, only the
	// config is fetched.
	for _, n := range []string{"two", "two-again"} {
		if err := s.Remove(n); err != nil {
			t.Fatal(err)
		}
	}
	r.reset()
	if _, err := s.Pull(ctx, ref, "two", PullOptions{Keychain: anonymous{}}); err != nil {
		t.Fatal(err)
	}
	if n, per := r.blobGets(); n != 1 || per[configDigest(t, img)] != 1 {
		t.Errorf("pull with layers present fetched %v, want the config only", per)
	}
	checkTwoLayer(t, s, "two", img)
}

func TestPullConcurrentShared(t *testing.T) {
	// Slow blobs keep the four pulls overlapping.
	r := newTestRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/") {
				time.Sleep(200 * time.Millisecond)
			}
			h.ServeHTTP(w, req)
		})
	})
	img := twoLayerImage(t)
	ref := r.push(t, "test/two:v1", img)
	s := newStore(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	recs := make([]*Record, 4)
	for i := range 4 {
		wg.Go(func() {
			recs[i], errs[i] = s.Pull(context.Background(), ref, "two", PullOptions{Keychain: anonymous{}})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("pull %d: %v", i, err)
		}
		if recs[i].ID != configDigest(t, img) {
			t.Errorf("pull %d: %+v", i, recs[i])
		}
	}
	n, per := r.blobGets()
	if n != 3 {
		t.Errorf("4 concurrent pulls made %d blob GETs, want 3 (config + 2 layers): %v", n, per)
	}
	r.mu.Lock()
	if r.mans != 1 {
		t.Errorf("%d manifest GETs, want 1", r.mans)
	}
	r.mu.Unlock()
	checkTwoLayer(t, s, "two", img)
}

// recordingTransport fails every request and records it: nothing leaves
// the machine.
type recordingTransport struct {
	mu   sync.Mutex
	urls []string
}

func (rt *recordingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	rt.mu.Lock()
	rt.urls = append(rt.urls, req.URL.String())
	rt.mu.Unlock()
	return nil, errors.New("test transport: no network")
}

func (rt *recordingTransport) take() []string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	u := rt.urls
	rt.urls = nil
	return u
}

// Registries go-containerregistry would reach over plain HTTP (RFC 1918
// addresses, *.localhost names) are refused unless Insecure. The requests go
// to a transport that fails them, so no traffic leaves the machine, and
// the names are never resolved.
func TestPullPlainHTTPPolicy(t *testing.T) {
	s := newStore(t)
	rt := &recordingTransport{}
	s.transport = rt
	ctx := context.Background()
	for _, ref := range []string{"10.1.2.3:5000/test/img:v1", "registry.localhost:5000/test/img:v1"} {
		_, err := s.Pull(ctx, ref, "x", PullOptions{Keychain: anonymous{}})
		if err == nil || !strings.Contains(err.Error(), "plain HTTP") || !strings.Contains(err.Error(), "--insecure") {
			t.Errorf("%s: %v", ref, err)
		}
		if u := rt.take(); len(u) != 0 {
			t.Errorf("%s: requests made before refusing: %v", ref, u)
		}
		// With Insecure it is tried over HTTP (after HTTPS).
		if _, err := s.Pull(ctx, ref, "x", PullOptions{Keychain: anonymous{}, Insecure: true}); err == nil {
			t.Errorf("%s: pulled through a failing transport", ref)
		}
		sawHTTP := false
		for _, u := range rt.take() {
			sawHTTP = sawHTTP || strings.HasPrefix(u, "http://")
		}
		if !sawHTTP {
			t.Errorf("%s with Insecure: no plain HTTP request", ref)
		}
	}
	// Anything else is HTTPS only.
	if _, err := s.Pull(ctx, "registry.example.invalid/test/img:v1", "x", PullOptions{Keychain: anonymous{}}); err == nil {
		t.Error("pulled through a failing transport")
	}
	for _, u := range rt.take() {
		if !strings.HasPrefix(u, "https://") {
			t.Errorf("non-HTTPS request %s", u)
		}
	}
	for _, h := range []string{"127.0.0.1:5000", "127.3.4.5", "localhost:80", "[::1]:5000", "::1"} {
		if !isLoopback(h) {
			t.Errorf("%s not loopback", h)
		}
	}
	for _, h := range []string{"10.1.2.3:5000", "localhost.example.com", "128.0.0.1", "example.com:443"} {
		if isLoopback(h) {
			t.Errorf("%s loopback", h)
		}
	}
}

// BenchmarkPull100MB pulls four 25 MiB random layers (gzip) from the
// loopback registry into a fresh store each iteration.
func BenchmarkPull100MB(b *testing.B) {
	const layers, size = 4, 25 << 20
	r := newTestRegistry(b, nil)
	img := empty.Image
	for range layers {
		l, err := random.Layer(size, types.DockerLayer)
		if err != nil {
			b.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			b.Fatal(err)
		}
	}
	ref := r.push(b, "bench/big:v1", img)
	b.ResetTimer()
	var elapsed time.Duration
	for range b.N {
		b.StopTimer()
		s := newStore(b)
		b.StartTimer()
		start := time.Now()
		if _, err := s.Pull(context.Background(), ref, "big", PullOptions{Keychain: anonymous{}}); err != nil {
			b.Fatal(err)
		}
		elapsed += time.Since(start)
		b.StopTimer()
		r.reset()
		if _, err := s.Pull(context.Background(), ref, "big", PullOptions{Keychain: anonymous{}}); err != nil {
			b.Fatal(err)
		}
		if n, per := r.blobGets(); n != 0 {
			b.Fatalf("second pull fetched %v", per)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(layers*size)*float64(b.N)/1e6/elapsed.Seconds(), "MB/s")
}

// A registry serving another, valid blob under a layer's digest: the
// content unpacks but its digest does not match.
func TestPullSwappedBlob(t *testing.T) {
	img := twoLayerImage(t)
	ds := layerDigests(t, img)
	r := newTestRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/blobs/"+ds[1]) {
				req = req.Clone(req.Context())
				req.URL.Path = strings.TrimSuffix(req.URL.Path, ds[1]) + ds[0]
			}
			h.ServeHTTP(w, req)
		})
	})
	ref := r.push(t, "test/swapped:v1", img)
	s := newStore(t)
	_, err := s.Pull(context.Background(), ref, "swapped", PullOptions{Keychain: anonymous{}})
	if err == nil || !strings.Contains(err.Error(), ref) || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("swapped blob: %v", err)
	}
	t.Log(err)
	assertNoRecords(t, s)
	assertTmpEmpty(t, s)
}

// Layers are fetched opt.Parallel at once.
func TestPullParallelLayers(t *testing.T) {
	var mu sync.Mutex
	inFlight, peak := 0, 0
	r := newTestRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/") {
				mu.Lock()
				inFlight++
				peak = max(peak, inFlight)
				mu.Unlock()
				time.Sleep(100 * time.Millisecond)
				defer func() { mu.Lock(); inFlight--; mu.Unlock() }()
			}
			h.ServeHTTP(w, req)
		})
	})
	img, err := random.Image(2048, 6)
	if err != nil {
		t.Fatal(err)
	}
	ref := r.push(t, "test/six:v1", img)
	for _, tc := range []struct{ parallel, min, max int }{{1, 1, 1}, {3, 3, 3}, {0, 4, 4}} {
		s := newStore(t)
		mu.Lock()
		peak = 0
		mu.Unlock()
		if _, err := s.Pull(context.Background(), ref, "six", PullOptions{Keychain: anonymous{}, Parallel: tc.parallel}); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		if peak < tc.min || peak > tc.max {
			t.Errorf("Parallel %d: %d blobs fetched at once, want %d to %d", tc.parallel, peak, tc.min, tc.max)
		}
		mu.Unlock()
	}
}

// A failed pull leaves neither an image nor the layers it unpacked before
// it failed.
func TestPullFailureDropsLayers(t *testing.T) {
	img := twoLayerImage(t)
	bad := layerDigests(t, img)[1]
	r := newTestRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, bad) {
				time.Sleep(300 * time.Millisecond) // the good layer is in place by then
				w = flipWriter{w}
			}
			h.ServeHTTP(w, req)
		})
	})
	ref := r.push(t, "test/half:v1", img)
	s := newStore(t)
	var finished int
	_, err := s.Pull(context.Background(), ref, "half", PullOptions{Keychain: anonymous{}, Progress: func(p Progress) {
		if p.Finished {
			finished++
		}
	}})
	if err == nil {
		t.Fatal("pulled an image with a corrupt layer")
	}
	if finished != 1 {
		t.Fatalf("%d layers were unpacked before the failure, want 1 (the test needs one)", finished)
	}
	assertNoRecords(t, s)
	if d := layerDirs(t, s); len(d) != 0 {
		t.Errorf("layers of the failed pull left: %v", d)
	}
}
