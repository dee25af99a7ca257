package hostile

import (
	"bytes"
	"io"
	"log"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

var (
	regOnce sync.Once
	regURL  string
)

// pushLayer pushes an image of one layer (the crafted tar bytes) to a
// loopback registry the suite runs, and returns its reference.
func pushLayer(t *testing.T, tag string, layer []byte) string {
	t.Helper()
	regOnce.Do(func() {
		reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
		regURL = strings.TrimPrefix(reg.URL, "http://")
	})
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	ref := regURL + "/hostile/" + tag + ":1"
	parsed, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(parsed, img); err != nil {
		t.Fatal(err)
	}
	return ref
}
