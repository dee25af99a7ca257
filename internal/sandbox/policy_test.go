package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/warren-sandbox/warren/internal/backend/fake"
	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

// policies is a swappable table of namespace policies, as a server's
// reload swaps its file's.
type policies struct {
	p atomic.Pointer[map[string]sandbox.NamespacePolicy]
}

func (ps *policies) set(m map[string]sandbox.NamespacePolicy) { ps.p.Store(&m) }
func (ps *policies) get(ns string) sandbox.NamespacePolicy    { return (*ps.p.Load())[ns] }
func (ps *policies) names() []string {
	var out []string
	for ns := range *ps.p.Load() {
		out = append(out, ns)
	}
	return out
}

func policyEnv(t *testing.T, opts sandbox.Options, m map[string]sandbox.NamespacePolicy) (*env, *sandbox.Manager, *policies) {
	t.Helper()
	ps := &policies{}
	ps.set(m)
	opts.Policy, opts.Namespaces = ps.get, ps.names
	e := newEnv(t, opts)
	return e, e.manager(t), ps
}

func startIn(m *sandbox.Manager, ns, name string, s sandbox.Spec) error {
	_, err := m.Start(context.Background(), ns, name, s, false)
	return err
}

// wantLimit checks err is ErrLimit saying want.
func wantLimit(t *testing.T, what string, err error, want string) {
	t.Helper()
	if !errors.Is(err, errdefs.ErrLimit) || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: %v, want limit saying %q", what, err, want)
	}
}

// TestNamespaceQuotas: each quota refuses with its numbers, a refused
// start leaves nothing, a stopped sandbox's restart is held to the quotas
// (and to a policy changed meanwhile), another namespace is not limited.
func TestNamespaceQuotas(t *testing.T) {
	e, m, ps := policyEnv(t, sandbox.Options{}, map[string]sandbox.NamespacePolicy{
		"team-a": {MaxMemoryMiB: 1024, MaxCPUs: 1, TotalMemoryMiB: 2048, TotalCPUs: 1.5, MaxSandboxes: 3},
	})
	s := func(mem int64, cpus float64) sandbox.Spec {
		return sandbox.Spec{Image: "base", MemoryMiB: mem, CPUs: cpus}
	}
	wantLimit(t, "memory", startIn(m, "team-a", "big", s(2048, 0.5)), `memory 2048 MiB is above namespace "team-a"'s max_memory of 1024 MiB`)
	wantLimit(t, "cpus", startIn(m, "team-a", "big", s(256, 2)), `cpus 2 is above namespace "team-a"'s max_cpus of 1`)
	if e.rows(t) != 0 || len(e.be.Running()) != 0 {
		t.Fatal("a refused start left something behind")
	}
	for _, n := range []string{"a", "b"} {
		if err := startIn(m, "team-a", n, s(1024, 0.5)); err != nil {
			t.Fatal(err)
		}
	}
	wantLimit(t, "total memory", startIn(m, "team-a", "c", s(512, 0.25)),
		`memory 512 MiB would bring namespace "team-a"'s running sandboxes to 2560 MiB, above its total_memory of 2048 MiB (0 MiB left)`)
	if err := m.Stop(t.Context(), "team-a", "b"); err != nil {
		t.Fatal(err)
	}
	if err := startIn(m, "team-a", "c", s(512, 0.75)); err != nil {
		t.Fatal(err)
	}
	// a 0.5 + c 0.75: the restart of b (0.5) would make 1.75.
	wantLimit(t, "total cpus (restart)", startIn(m, "team-a", "b", s(256, 0.5)),
		`cpus 0.5 would bring namespace "team-a"'s running sandboxes to 1.75, above its total_cpus of 1.5 (0.25 left)`)
	if err := startIn(m, "team-a", "d", s(256, 0.25)); err != nil {
		t.Fatal(err)
	}
	wantLimit(t, "max sandboxes", startIn(m, "team-a", "b", s(128, 0.1)), `namespace "team-a" runs 3 sandboxes, its max_sandboxes of 3`)
	// Others are not held to team-a's quotas.
	for i := range 4 {
		if err := startIn(m, "team-b", fmt.Sprint("x", i), s(2048, 2)); err != nil {
			t.Fatal(err)
		}
	}
	// A policy changed while b was stopped holds its restart.
	if err := m.Stop(t.Context(), "team-a", "d"); err != nil {
		t.Fatal(err)
	}
	ps.set(map[string]sandbox.NamespacePolicy{"team-a": {MaxMemoryMiB: 128}})
	wantLimit(t, "changed policy", startIn(m, "team-a", "b", s(256, 0.1)), "max_memory of 128 MiB")
	if err := startIn(m, "team-a", "b", s(128, 0.1)); err != nil {
		t.Fatal(err)
	}

	us := m.NamespaceUsage(nil)
	if len(us) != 2 || us[0].Namespace != "team-a" || us[1].Namespace != "team-b" {
		t.Fatalf("usage %+v", us)
	}
	if a := us[0]; a.Sandboxes != 4 || a.Running != 3 || a.MemoryMiB != 1024+512+128 || a.CPUs != 0.5+0.75+0.1 || a.Policy.MaxMemoryMiB != 128 {
		t.Errorf("team-a usage %+v", a)
	}
	if b := m.NamespaceUsage([]string{"team-b"}); len(b) != 1 || b[0].Running != 4 || b[0].MemoryMiB != 4*2048 {
		t.Errorf("team-b usage %+v", b)
	}
	ps.set(map[string]sandbox.NamespacePolicy{"team-c": {MaxSandboxes: 1}})
	if c := m.NamespaceUsage([]string{"team-c"}); len(c) != 1 || c[0].Sandboxes != 0 || c[0].Policy.MaxSandboxes != 1 {
		t.Errorf("a namespace with a policy and no sandboxes: %+v", c)
	}
}

// TestNamespaceQuotaRace: concurrent starts in a namespace never run more
// than its max_sandboxes, nor more than its total memory.
func TestNamespaceQuotaRace(t *testing.T) {
	_, m, _ := policyEnv(t, sandbox.Options{}, map[string]sandbox.NamespacePolicy{
		"team-a": {MaxSandboxes: 5, TotalMemoryMiB: 4 * 256},
	})
	var wg sync.WaitGroup
	var ok, limited atomic.Int32
	for i := range 16 {
		wg.Go(func() {
			err := startIn(m, "team-a", fmt.Sprint("s", i), sandbox.Spec{Image: "base", MemoryMiB: 256, CPUs: 0.1})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, errdefs.ErrLimit):
				limited.Add(1)
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 4 || limited.Load() != 12 {
		t.Errorf("%d started, %d limited; want 4 and 12", ok.Load(), limited.Load())
	}
}

// TestNamespaceImages: an image is allowed when its name as asked or the
// name it resolves to matches a pattern; a refused one is never pulled.
func TestNamespaceImages(t *testing.T) {
	var pulls atomic.Int32
	opts := sandbox.Options{Pull: func(context.Context, string, string, func(string, ...any)) error {
		pulls.Add(1)
		return errors.New("no registry here")
	}}
	e, _, _ := policyEnv(t, opts, map[string]sandbox.NamespacePolicy{
		"team-a": {Images: []string{"base", "docker.io/library/*"}},
	})
	e.opts.Images = func(ctx context.Context, name string) (*image.Image, error) {
		if name == "py" || name == "sha256:p" { // an alias the server maps to a stored image
			return &image.Image{Name: "docker.io/library/python:3", ID: "sha256:p", Layers: []string{"/p"}}, nil
		}
		if name == "evil" || name == "sha256:e" {
			return &image.Image{Name: "docker.io/evil/python:3", ID: "sha256:e", Layers: []string{"/e"}}, nil
		}
		return resolve(ctx, name)
	}
	m := e.manager(t)
	for _, img := range []string{"base", "py"} {
		if err := startIn(m, "team-a", img, sandbox.Spec{Image: img}); err != nil {
			t.Errorf("image %s: %v", img, err)
		}
	}
	for _, img := range []string{"evil", "docker.io/evil/python:3", "host", "docker.io/library/python/../../evil/x"} {
		wantLimit(t, img, startIn(m, "team-a", "x", sandbox.Spec{Image: img}),
			fmt.Sprintf(`image %q is not among namespace "team-a"'s images (base, docker.io/library/*)`, img))
	}
	if pulls.Load() != 0 {
		t.Errorf("%d pulls of refused images", pulls.Load())
	}
	// Another namespace has no image list: its unknown image is pulled.
	if err := startIn(m, "team-b", "x", sandbox.Spec{Image: "docker.io/evil/other:1"}); err == nil || pulls.Load() != 1 {
		t.Errorf("unlisted namespace: %v, %d pulls", err, pulls.Load())
	}
}

// TestNamespaceEgress: rules a sandbox asks for, at create and by
// SetEgress, must be covered by its namespace's patterns; one that asks
// for none gets the namespace's default; an empty pattern list allows
// nothing, a nil one anything.
func TestNamespaceEgress(t *testing.T) {
	_, m, _ := policyEnv(t, sandbox.Options{Egress: egress.NewRegistry()}, map[string]sandbox.NamespacePolicy{
		"team-a": {Egress: []string{"pypi.org", "*.example.com", "10.0.0.0/8:5432"}, EgressDefault: []string{"pypi.org"}},
		"closed": {Egress: []string{}},
	})
	s := func(rules ...string) sandbox.Spec { return sandbox.Spec{Image: "base", Egress: rules} }
	if err := startIn(m, "team-a", "a", s("pypi.org:443", "a.b.example.com", "10.1.2.3:5432")); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"evil.com", "example.com", "*.com", "pypi.org:*", "10.1.2.3", "169.254.169.254"} {
		err := startIn(m, "team-a", "b", s("pypi.org", r))
		if r == "*.com" {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("%s: %v, want invalid", r, err)
			}
			continue
		}
		wantLimit(t, r, err, fmt.Sprintf(`egress rule %q is not covered by namespace "team-a"'s egress patterns (pypi.org, *.example.com, 10.0.0.0/8:5432)`, r))
	}
	if err := startIn(m, "team-a", "d", s()); err != nil {
		t.Fatal(err)
	}
	if rules, _ := m.Egress("team-a", "d"); !slices.Equal(rules, []string{"pypi.org"}) {
		t.Errorf("default egress: %q", rules)
	}
	if _, err := m.SetEgress(t.Context(), "team-a", "d", []string{"x.example.com", "evil.com"}); err == nil {
		t.Error("SetEgress past the patterns was allowed")
	} else {
		wantLimit(t, "SetEgress", err, `egress rule "evil.com" is not covered`)
	}
	if rules, _ := m.Egress("team-a", "d"); !slices.Equal(rules, []string{"pypi.org"}) {
		t.Errorf("a refused SetEgress changed the rules: %q", rules)
	}
	if _, err := m.SetEgress(t.Context(), "team-a", "d", []string{"x.example.com"}); err != nil {
		t.Error(err)
	}
	// An explicit empty list lets nothing out and stays empty over a restart.
	if _, err := m.SetEgress(t.Context(), "team-a", "d", []string{}); err != nil {
		t.Error(err)
	}
	if err := m.Stop(t.Context(), "team-a", "d"); err != nil {
		t.Fatal(err)
	}
	if err := startIn(m, "team-a", "d", s()); err != nil {
		t.Fatal(err)
	}
	if rules, _ := m.Egress("team-a", "d"); len(rules) != 0 {
		t.Errorf("restart got the default again: %q", rules)
	}
	wantLimit(t, "closed", startIn(m, "closed", "a", s("pypi.org")), `egress rule "pypi.org" is not covered by namespace "closed"'s egress patterns (none)`)
	if err := startIn(m, "closed", "b", s()); err != nil {
		t.Error(err)
	}
	if err := startIn(m, "open", "a", s("anything.example.org")); err != nil {
		t.Error(err)
	}
}

// TestLabelsCarried: a sandbox's labels reach what records are written
// from (Labels, Usage), as copies, and List filters by them.
func TestLabelsCarried(t *testing.T) {
	m := newEnv(t, sandbox.Options{}).manager(t)
	s := spec
	s.Labels = map[string]string{"team": "ml", "cost": "x1"}
	mustStart(t, m, "a", s)
	mustStart(t, m, "b", spec)
	l := m.Labels("ns", "a")
	if l["team"] != "ml" || len(l) != 2 {
		t.Fatalf("Labels = %v", l)
	}
	l["team"] = "changed"
	u, err := m.Usage("ns", "a")
	if err != nil || u.Labels["team"] != "ml" || u.Labels["cost"] != "x1" {
		t.Errorf("Usage labels %v, %v (or a caller's change reached the sandbox)", u.Labels, err)
	}
	if got := m.List(sandbox.Filter{Labels: map[string]string{"team": "ml"}}); len(got) != 1 || got[0].Name != "a" {
		t.Errorf("List by label: %+v", got)
	}
	if l := m.Labels("ns", "nope"); l != nil {
		t.Errorf("Labels of a sandbox that does not exist: %v", l)
	}
}

// named is a fake backend under another tier's name.
type named struct {
	*fake.Backend
	name string
}

func (n named) Name() string { return n.name }

// TestNamespaceIsolation: a server with two tiers (its default "fake"
// and a second one named gvisor) and a third it cannot run. A namespace
// that requires a tier gets it when it asks for none and is forbidden
// another; one allowing several gets the server's default; a tier the
// server cannot run is unavailable with its reason, an unknown one
// invalid; a sandbox keeps its tier across a restart (of it or of the
// server), asking it for another is a conflict, and a restart is held to
// the namespace's policy of now.
func TestNamespaceIsolation(t *testing.T) {
	second := named{fake.New(), "gvisor"}
	t.Cleanup(second.Close)
	e, m, ps := policyEnv(t, sandbox.Options{
		Tiers:    map[string]sandbox.Tier{"gvisor": {Backend: second}},
		TiersOff: map[string]string{"native": "no native here (a test)"},
	}, map[string]sandbox.NamespacePolicy{
		"strict": {Isolation: []string{"gvisor"}},
		"either": {Isolation: []string{"gvisor", "fake"}},
	})
	tierOf := func(ns, name string) string {
		t.Helper()
		info, err := m.Get(ns, name)
		if err != nil {
			t.Fatal(err)
		}
		return info.Spec.Isolation
	}
	if err := startIn(m, "strict", "x", sandbox.Spec{Image: "base"}); err != nil {
		t.Fatalf("strict, no tier asked: %v", err)
	}
	if got := tierOf("strict", "x"); got != "gvisor" {
		t.Errorf("strict's sandbox got %q, want its required gvisor", got)
	}
	if len(second.Running()) != 1 || len(e.be.Running()) != 0 {
		t.Errorf("running: gvisor tier %v, default %v; want one on the gvisor tier", second.Running(), e.be.Running())
	}
	err := startIn(m, "strict", "y", sandbox.Spec{Image: "base", Isolation: "fake"})
	if !errors.Is(err, errdefs.ErrForbidden) || !strings.Contains(err.Error(), `isolation "fake" is not among namespace "strict"'s isolation tiers (gvisor)`) {
		t.Errorf("strict asking for fake: %v, want forbidden", err)
	}
	if err := startIn(m, "either", "x", sandbox.Spec{Image: "base"}); err != nil {
		t.Fatalf("either: %v", err)
	}
	if got := tierOf("either", "x"); got != "fake" {
		t.Errorf("either's sandbox got %q, want the server's default", got)
	}
	if err := startIn(m, "open", "x", sandbox.Spec{Image: "base"}); err != nil {
		t.Errorf("no policy: %v", err)
	}
	err = startIn(m, "open", "n", sandbox.Spec{Image: "base", Isolation: "native"})
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "no native here (a test)") {
		t.Errorf("native: %v, want unavailable with the reason", err)
	}
	err = startIn(m, "open", "b", sandbox.Spec{Image: "base", Isolation: "kvm"})
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("kvm: %v, want invalid", err)
	}
	if _, err := m.Get("open", "n"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a refused tier left a sandbox: %v", err)
	}
	// A restart keeps the tier; another one is a conflict.
	if err := m.Stop(t.Context(), "strict", "x"); err != nil {
		t.Fatal(err)
	}
	err = startIn(m, "strict", "x", sandbox.Spec{Image: "base", Isolation: "fake"})
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("restart asking another tier: %v, want conflict", err)
	}
	if err := startIn(m, "strict", "x", sandbox.Spec{Image: "base"}); err != nil {
		t.Fatal(err)
	}
	if got := tierOf("strict", "x"); got != "gvisor" || len(second.Running()) != 1 {
		t.Errorf("restarted on %q (gvisor tier runs %v), want gvisor", got, second.Running())
	}
	// A new manager (a server restart) finds each sandbox in its tier.
	m.Close()
	m2 := e.manager(t)
	for _, k := range [][3]string{{"strict", "x", "gvisor"}, {"either", "x", "fake"}} {
		info, err := m2.Get(k[0], k[1])
		if err != nil || info.Spec.Isolation != k[2] || info.State != sandbox.Running {
			t.Errorf("after a restart %s/%s: %+v %v, want running on %s", k[0], k[1], info, err, k[2])
		}
	}
	// A restart is held to the namespace's policy of now.
	ps.set(map[string]sandbox.NamespacePolicy{"strict": {Isolation: []string{"fake"}}})
	if err := m2.Stop(t.Context(), "strict", "x"); err != nil {
		t.Fatal(err)
	}
	if err := startIn(m2, "strict", "x", sandbox.Spec{Image: "base"}); !errors.Is(err, errdefs.ErrForbidden) {
		t.Errorf("restart of a gvisor sandbox in a namespace now requiring fake: %v, want forbidden", err)
	}
}
