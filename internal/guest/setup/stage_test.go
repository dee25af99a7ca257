package setup

import (
	"maps"
	"os"
	"strconv"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/warren-sandbox/warren/internal/oci"
	"github.com/warren-sandbox/warren/internal/testenv"
	"github.com/warren-sandbox/warren/internal/wire/boot"
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
		at, ok := st.fits(boot.SpecFrom(c.spec))
		if !ok {
			at = -1
		}
		if at != c.at {
			t.Errorf("%s: fits at %d, want %d", c.name, at, c.at)
		}
	}
}

// TestStagedLauncher: the staged launcher is handed out only for the
// default capabilities; otherwise it is ended.
func TestStagedLauncher(t *testing.T) {
	fewer := oci.ProcessCapabilities()
	fewer.Bounding = fewer.Bounding[1:]
	for _, c := range []struct {
		name string
		caps *specs.LinuxCapabilities
		want bool
	}{
		{"default", oci.ProcessCapabilities(), true},
		{"fewer capabilities", fewer, false},
		{"none", nil, false},
	} {
		l := &Launcher{reqs: make(chan func())} // no thread: only its identity matters here
		st := &Staged{launcher: l}
		got := st.takeLauncher(c.caps)
		if (got == l) != c.want || (got != nil && got != l) {
			t.Errorf("%s: got %p, want staged=%v", c.name, got, c.want)
		}
		if st.launcher != nil {
			t.Errorf("%s: staging still holds the launcher", c.name)
		}
		if !c.want {
			select {
			case _, open := <-l.reqs:
				if open {
					t.Errorf("%s: launcher got a request", c.name)
				}
			default:
				t.Errorf("%s: launcher not ended", c.name)
			}
		}
	}
}

// TestStagedLauncherCapabilities: a staged launcher thread has the
// sandbox's bounding set and CAP_SYS_ADMIN besides the default sets; once
// finished it is in a cgroup namespace of its own and has exactly the
// default sets. (Run on a thread of this test process, which ends it.)
func TestStagedLauncherCapabilities(t *testing.T) {
	testenv.RequireRoot(t)
	def, err := oci.CapMask(oci.ProcessCapabilities().Effective)
	if err != nil {
		t.Fatal(err)
	}
	bnd, err := oci.CapMask(oci.ProcessCapabilities().Bounding)
	if err != nil {
		t.Fatal(err)
	}
	l, err := startLauncher(stageLauncher)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	status := func() (map[string]uint64, string) {
		m := map[string]uint64{}
		var ns string
		if err := l.Run(func() error {
			b, err := os.ReadFile("/proc/thread-self/status")
			for _, line := range strings.Split(string(b), "\n") {
				if k, v, ok := strings.Cut(line, ":"); ok && strings.HasPrefix(k, "Cap") {
					m[k], _ = strconv.ParseUint(strings.TrimSpace(v), 16, 64)
				}
			}
			ns, _ = os.Readlink("/proc/thread-self/ns/cgroup")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return m, ns
	}
	got, before := status()
	if want := (map[string]uint64{"CapEff": def | capSysAdmin, "CapPrm": def | capSysAdmin, "CapBnd": bnd, "CapInh": 0, "CapAmb": 0}); !maps.Equal(got, want) {
		t.Errorf("staged: %v, want %v", got, want)
	}
	if err := l.Run(func() error { return finishStaged(true, 0) }); err != nil {
		t.Fatal(err)
	}
	got, after := status()
	if want := (map[string]uint64{"CapEff": def, "CapPrm": def, "CapBnd": bnd, "CapInh": 0, "CapAmb": 0}); !maps.Equal(got, want) {
		t.Errorf("finished: %v, want %v", got, want)
	}
	if after == before || before == "" {
		t.Errorf("finished launcher's cgroup namespace %q, the same as before (%q)", after, before)
	}
}
