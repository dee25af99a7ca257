package guest

import (
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/warren-sandbox/warren/internal/oci"
)

// TestStagedFits: what a pooled agent staged is used only for a spec that
// asks for exactly that, wherever the standard mounts sit among the others.
func TestStagedFits(t *testing.T) {
	build := func(edit func(*oci.Params)) *specs.Spec {
		p := oci.Params{RootPath: "/r", UserNS: &oci.IDMap{Host: 1 << 20, Size: 65536},
			ImageMounts: []specs.Mount{{Destination: "/usr", Type: "bind", Source: "/usr", Options: []string{"rbind", "ro"}}}}
		if edit != nil {
			edit(&p)
		}
		s, err := oci.Build(p)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	bind := func(dst string) []specs.Mount {
		return []specs.Mount{{Destination: dst, Type: "bind", Source: "/srv/v", Options: []string{"bind"}}}
	}
	st := &Staged{}
	for _, c := range []struct {
		name string
		spec *specs.Spec
		at   int // -1: does not fit
	}{
		{"standard, after one image mount", build(nil), 1},
		{"no image mounts", build(func(p *oci.Params) { p.ImageMounts = nil }), 0},
		{"a volume elsewhere", build(func(p *oci.Params) { p.Volumes = bind("/data") }), 1},
		{"a volume below /dev", build(func(p *oci.Params) { p.Volumes = bind("/dev/../dev/x") }), -1},
		{"a volume on /proc", build(func(p *oci.Params) { p.Volumes = bind("proc") }), -1},
		{"an image mount below /sys", build(func(p *oci.Params) { p.ImageMounts = bind("/sys/fs/x") }), -1},
		{"/devices is not /dev", build(func(p *oci.Params) { p.Volumes = bind("/devices") }), 1},
		{"other masked paths", func() *specs.Spec {
			s := build(nil)
			s.Linux.MaskedPaths = s.Linux.MaskedPaths[1:]
			return s
		}(), -1},
		{"other read-only paths", func() *specs.Spec {
			s := build(nil)
			s.Linux.ReadonlyPaths = append(s.Linux.ReadonlyPaths, "/proc/x")
			return s
		}(), -1},
		{"a standard mount changed", func() *specs.Spec {
			s := build(nil)
			s.Mounts[2].Options = append(s.Mounts[2].Options, "size=1g")
			return s
		}(), -1},
		{"a standard mount missing", func() *specs.Spec {
			s := build(nil)
			s.Mounts = append(s.Mounts[:3], s.Mounts[4:]...)
			return s
		}(), -1},
	} {
		at, ok := st.fits(SpecFrom(c.spec))
		if !ok {
			at = -1
		}
		if at != c.at {
			t.Errorf("%s: fits at %d, want %d", c.name, at, c.at)
		}
	}
}
