package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
)

func sha(b []byte) string {
	h := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(h[:])
}

// fuzzMediaTypes are the manifest types a registry may answer with.
var fuzzMediaTypes = []string{
	"application/vnd.oci.image.manifest.v1+json",
	"application/vnd.docker.distribution.manifest.v2+json",
	"application/vnd.oci.image.index.v1+json",
	"application/vnd.docker.distribution.manifest.list.v2+json",
	"application/vnd.docker.distribution.manifest.v1+json",
	"text/plain",
}

// FuzzPull pulls from a registry that answers with arbitrary manifests,
// indexes and configs: mt picks the manifest's media type, top is what the
// tag names, config is the one config blob. In top, $CD/$CS stand for the
// config's digest and size, $LD/$LS for a valid gzip layer's, $MD/$MS for
// those of a manifest of that config and layer (an index's child), so
// mutations keep reaching past the digest checks. Whatever the registry
// sends, a pull either fails and leaves no image of its name and no
// temporary directory, or records an image of 1 to maxLayers valid layers
// that Get then hands out.
func FuzzPull(f *testing.F) {
	var lb bytes.Buffer
	gz := gzip.NewWriter(&lb)
	tw := tar.NewWriter(gz)
	_ = tw.WriteHeader(&tar.Header{Name: "hello", Mode: 0o644, Size: 2, Typeflag: tar.TypeReg})
	_, _ = tw.Write([]byte("hi"))
	_ = tw.Close()
	_ = gz.Close()
	gzLayer := lb.Bytes()
	// The diff id is the digest of the uncompressed tar.
	var tb bytes.Buffer
	tw = tar.NewWriter(&tb)
	_ = tw.WriteHeader(&tar.Header{Name: "hello", Mode: 0o644, Size: 2, Typeflag: tar.TypeReg})
	_, _ = tw.Write([]byte("hi"))
	_ = tw.Close()
	diffID := sha(tb.Bytes())

	config := `{"architecture":"` + runtime.GOARCH + `","os":"linux","config":{"Env":["PATH=/bin"],"Cmd":["sh"],"WorkingDir":"/w","User":"1000"},"rootfs":{"type":"layers","diff_ids":["` + diffID + `"]}}`
	manifest := `{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",` +
		`"config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"$CD","size":$CS},` +
		`"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"$LD","size":$LS}]}`
	index := `{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[` +
		`{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"$MD","size":$MS,"platform":{"os":"linux","architecture":"` + runtime.GOARCH + `"}}]}`
	for _, s := range []struct {
		mt          uint8
		top, config string
	}{
		{0, manifest, config},
		{1, strings.ReplaceAll(strings.ReplaceAll(manifest, "oci.image.manifest.v1", "docker.distribution.manifest.v2"), "oci.image.layer.v1.tar", "docker.image.rootfs.diff.tar"), config},
		{2, index, config},
		{2, strings.ReplaceAll(index, runtime.GOARCH, "s390x"), config},
		{0, manifest, strings.ReplaceAll(config, `"os":"linux"`, `"os":"windows"`)},
		{0, manifest, strings.ReplaceAll(config, `["`+diffID+`"]`, `[]`)},
		{0, strings.ReplaceAll(manifest, `"layers":[`, `"layers":[{"digest":"$LD","size":-1},`), config},
		{0, strings.ReplaceAll(manifest, `$CS`, `99999999999`), config},
		{0, `{"schemaVersion":2,"config":{"digest":"$CD","size":$CS},"layers":[]}`, config},
		{4, `{"schemaVersion":1,"fsLayers":[]}`, config},
		{5, `not json`, `{}`},
	} {
		f.Add(s.mt, []byte(s.top), []byte(s.config))
	}

	s := newStore(f)

	var cur struct{ mt, top, config, child []byte }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		switch {
		case p == "/v2/":
		case strings.HasPrefix(p, "/v2/fuzz/img/manifests/"):
			ref := strings.TrimPrefix(p, "/v2/fuzz/img/manifests/")
			body, mt := cur.top, cur.mt
			if ref == sha(cur.child) {
				body, mt = cur.child, []byte(fuzzMediaTypes[0])
			} else if ref != "t" && ref != sha(cur.top) {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Type", string(mt))
			w.Header().Set("Docker-Content-Digest", sha(body))
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			if r.Method != http.MethodHead {
				_, _ = w.Write(body)
			}
		case strings.HasPrefix(p, "/v2/fuzz/img/blobs/"):
			switch strings.TrimPrefix(p, "/v2/fuzz/img/blobs/") {
			case sha(gzLayer):
				_, _ = w.Write(gzLayer)
			case sha(cur.config):
				_, _ = w.Write(cur.config)
			default:
				http.NotFound(w, r)
			}
		default:
			http.NotFound(w, r)
		}
	}))
	f.Cleanup(srv.Close)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/fuzz/img:t"

	pull := func(mt uint8, top, config []byte) (*Record, error) {
		_ = s.Remove("fuzz")
		child := strings.NewReplacer("$CD", sha(config), "$CS", fmt.Sprint(len(config)),
			"$LD", sha(gzLayer), "$LS", fmt.Sprint(len(gzLayer))).Replace(manifest)
		cur.mt = []byte(fuzzMediaTypes[int(mt)%len(fuzzMediaTypes)])
		cur.config, cur.child = config, []byte(child)
		cur.top = []byte(strings.NewReplacer("$CD", sha(config), "$CS", fmt.Sprint(len(config)),
			"$LD", sha(gzLayer), "$LS", fmt.Sprint(len(gzLayer)),
			"$MD", sha(cur.child), "$MS", fmt.Sprint(len(cur.child))).Replace(string(top)))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		rec, err := s.Pull(ctx, ref, "fuzz", PullOptions{Keychain: anonymous{}, Parallel: 1})
		if ctx.Err() != nil {
			err = fmt.Errorf("the pull did not end: %w", ctx.Err())
		}
		return rec, err
	}
	// The harness works: the first seeds (a manifest, an index) pull.
	for mt, top := range map[uint8]string{0: manifest, 2: index} {
		if _, err := pull(mt, []byte(top), []byte(config)); err != nil {
			f.Fatalf("pull of a valid image: %v", err)
		}
	}
	f.Fuzz(func(t *testing.T, mt uint8, top, config []byte) {
		rec, err := pull(mt, top, config)
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
		if ents, rerr := os.ReadDir(s.tmpDir()); rerr != nil || len(ents) != 0 {
			t.Fatalf("temporary directories left: %v %v", ents, rerr)
		}
		if err != nil {
			if _, gerr := s.Get("fuzz"); gerr == nil {
				t.Fatalf("a failed pull (%v) left an image", err)
			}
			return
		}
		if n := len(rec.Layers); n == 0 || n > s.maxLayers {
			t.Fatalf("recorded %d layers", n)
		}
		for _, l := range rec.Layers {
			if !validDigest(l) {
				t.Fatalf("recorded layer %q", l)
			}
		}
		if _, err := s.Get("fuzz"); err != nil {
			t.Fatalf("pulled, but: %v", err)
		}
	})
}

// FuzzReference checks the references a pull takes: a reference that
// parses prints as one that parses to the same, and the default image name
// a pull gives it (Pull: "@" made ":") is one ValidateName judges, with
// the same answer each time.
func FuzzReference(f *testing.F) {
	for _, s := range []string{
		"alpine", "docker.io/library/alpine:3.20", "127.0.0.1:5000/a/b:t",
		"localhost/x@sha256:" + strings.Repeat("a", 64), "ghcr.io/o/r:v1@sha256:" + strings.Repeat("0", 64),
		"[::1]:5000/x", "UPPER/case", "a/../b", "host", "sha256:" + strings.Repeat("f", 64), "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if r, err := name.ParseReference(s); err == nil {
			r2, err := name.ParseReference(r.String())
			if err != nil {
				t.Fatalf("%q parses to %q, which does not parse: %v", s, r.String(), err)
			}
			if r2.Name() != r.Name() || r2.Context().String() != r.Context().String() || r2.Identifier() != r.Identifier() {
				t.Fatalf("%q: %q then %q", s, r.Name(), r2.Name())
			}
			_ = isLoopback(r.Context().RegistryStr())
		}
		n := strings.ReplaceAll(s, "@", ":")
		err := ValidateName(n)
		if err == nil && (len(n) == 0 || len(n) > 255 || n == HostName || IsID(n) || strings.Contains(n, "..") || strings.ToLower(n) != n) {
			t.Fatalf("name %q accepted", n)
		}
		if (ValidateName(n) == nil) != (err == nil) {
			t.Fatalf("name %q judged two ways", n)
		}
	})
}
