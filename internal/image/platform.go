package image

import (
	"fmt"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// errNoPlatform: an index holds no image for the platform asked for.
var errNoPlatform = fmt.Errorf("%w: no image for the platform", ErrFormat)

// selectImage finds the image for plat in an index, following nested
// indexes (bounded): the manifest whose platform matches, or, when no
// manifest says its platform, the only image. Attestation manifests
// (platform unknown/unknown) are ignored. Both import (OCI layouts) and pull
// use it; the error for no match names the platforms the index offers.
func (s *Store) selectImage(idx v1.ImageIndex, plat v1.Platform) (v1.Image, error) {
	w := platformWalk{s: s, plat: plat}
	img, err := w.walk(idx, 0)
	if img != nil || err != nil {
		return img, err
	}
	if len(w.unlabelled) == 1 && len(w.seen) == 0 {
		return w.unlabelled[0]()
	}
	seen := slices.Compact(slices.Sorted(slices.Values(w.seen)))
	if n := len(w.unlabelled); n > 0 {
		seen = append(seen, fmt.Sprintf("%d without a platform", n))
	}
	return nil, fmt.Errorf("%w %s; available: %s", errNoPlatform, plat.String(), strings.Join(seen, ", "))
}

type platformWalk struct {
	s          *Store
	plat       v1.Platform
	seen       []string
	unlabelled []func() (v1.Image, error)
}

func (w *platformWalk) walk(idx v1.ImageIndex, depth int) (v1.Image, error) {
	if depth > maxIndexDepth {
		return nil, fmt.Errorf("%w: image indexes nested deeper than %d", ErrLimit, maxIndexDepth)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("%w: index: %w", ErrFormat, err)
	}
	for _, d := range im.Manifests {
		if d.Size > w.s.maxConfigBytes {
			return nil, fmt.Errorf("%w: manifest %s is %d bytes", ErrLimit, d.Digest, d.Size)
		}
		switch {
		case d.MediaType.IsIndex():
			sub, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, fmt.Errorf("%w: index %s: %w", ErrFormat, d.Digest, err)
			}
			if img, err := w.walk(sub, depth+1); img != nil || err != nil {
				return img, err
			}
		case d.MediaType.IsImage() || d.MediaType == "":
			switch {
			case d.Platform == nil:
				w.unlabelled = append(w.unlabelled, func() (v1.Image, error) { return idx.Image(d.Digest) })
			case d.Platform.OS == "unknown": // attestations
			case d.Platform.Satisfies(w.plat):
				return idx.Image(d.Digest)
			default:
				w.seen = append(w.seen, d.Platform.String())
			}
		}
	}
	return nil, nil
}
