package image

import (
	"errors"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
)

func TestSelectImage(t *testing.T) {
	s := &Store{maxConfigBytes: 4 << 20}
	img := func() v1.Image {
		i, err := random.Image(64, 1)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	amd, arm, plain, plain2, att := img(), img(), img(), img(), img()
	idx := func(adds ...mutate.IndexAddendum) v1.ImageIndex { return mutate.AppendManifests(empty.Index, adds...) }
	at := func(i v1.Image, os, arch string) mutate.IndexAddendum {
		return mutate.IndexAddendum{Add: i, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: os, Architecture: arch}}}
	}
	bare := func(i v1.Image) mutate.IndexAddendum { return mutate.IndexAddendum{Add: i} }
	nested := mutate.IndexAddendum{Add: idx(at(arm, "linux", "arm64"))}
	want := func(i v1.Image) v1.Image { return i }
	for _, tc := range []struct {
		name   string
		idx    v1.ImageIndex
		plat   string
		want   v1.Image
		errHas []string
	}{
		{"match", idx(at(amd, "linux", "amd64"), at(arm, "linux", "arm64")), "linux/arm64", want(arm), nil},
		{"nested index", idx(at(amd, "linux", "amd64"), nested), "linux/arm64", want(arm), nil},
		{"attestation ignored", idx(at(att, "unknown", "unknown"), at(amd, "linux", "amd64")), "linux/amd64", want(amd), nil},
		{"one unlabelled", idx(bare(plain)), "linux/amd64", want(plain), nil},
		{"two unlabelled", idx(bare(plain), bare(plain2)), "linux/amd64", nil, []string{"2 without a platform"}},
		{"missing lists the others", idx(at(amd, "linux", "amd64"), at(att, "unknown", "unknown"), nested), "linux/s390x", nil, []string{"linux/s390x", "available: linux/amd64, linux/arm64"}},
		{"labelled beats a lone unlabelled", idx(at(amd, "linux", "amd64"), bare(plain)), "linux/arm64", nil, []string{"1 without a platform"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := v1.ParsePlatform(tc.plat)
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.selectImage(tc.idx, *p)
			if tc.want == nil {
				if !errors.Is(err, errNoPlatform) {
					t.Fatalf("want errNoPlatform, got %v", err)
				}
				for _, w := range tc.errHas {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			gd, _ := got.Digest()
			wd, _ := tc.want.Digest()
			if gd != wd {
				t.Errorf("picked %s, want %s", gd, wd)
			}
		})
	}
}
