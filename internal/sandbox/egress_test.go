package sandbox_test

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

// netAddr is the address the registry holds name under while it runs.
func netAddr(t *testing.T, e *env, m *sandbox.Manager, name string) netip.Addr {
	t.Helper()
	info, err := m.Get("ns", name)
	if err != nil {
		t.Fatal(err)
	}
	sb := e.be.Sandbox(info.ID)
	if sb == nil {
		t.Fatalf("%s: no backend sandbox", name)
	}
	return sb.NetAddr()
}

// TestEgressRegistration: with networking on, a running sandbox's egress
// state is in the registry under its link's address, with its rules, and
// only while it runs; a live change reaches it at once and is stored for
// the next start; its log stays readable after a stop.
func TestEgressRegistration(t *testing.T) {
	reg := egress.NewRegistry()
	e := newEnv(t, sandbox.Options{Egress: reg})
	m := e.manager(t)
	s := spec
	s.Egress = []string{"pypi.org", "*.example.com:8443"}
	info := mustStart(t, m, "a", s)
	if cfg := e.be.Sandbox(info.ID).Config(); cfg.Network != backend.NetworkEgress {
		t.Errorf("backend network %q, want %q", cfg.Network, backend.NetworkEgress)
	}
	addr := netAddr(t, e, m, "a")
	if !addr.IsValid() {
		t.Fatal("a running sandbox with networking has no address")
	}
	es := reg.Lookup(addr)
	if es == nil {
		t.Fatal("the running sandbox is not in the registry")
	}
	if _, ok := es.AllowName("pypi.org"); !ok {
		t.Error("pypi.org is not allowed by the registered state")
	}
	if _, ok := es.AllowName("evil.test"); ok {
		t.Error("evil.test is allowed by the registered state")
	}
	// A live change: the registered state follows, the stored spec too.
	got, err := m.SetEgress(t.Context(), "ns", "a", []string{"api.example.org:443"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []string{"api.example.org:443"}) {
		t.Errorf("SetEgress answered %q", got)
	}
	if _, ok := es.AllowName("pypi.org"); ok {
		t.Error("pypi.org still allowed after the rules were replaced")
	}
	if rules, _ := m.Egress("ns", "a"); !slices.Equal(rules, got) {
		t.Errorf("Egress = %q after the change, want %q", rules, got)
	}
	// Invalid rules are refused as invalid, naming the rule; nothing changes.
	if _, err := m.SetEgress(t.Context(), "ns", "a", []string{"https://x.test/"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("SetEgress of a URL: %v, want invalid", err)
	}
	// Stopped: out of the registry; the log stays.
	es.Record(egress.Record{Kind: "tcp", Verdict: "deny", Reason: "test"})
	if err := m.Stop(t.Context(), "ns", "a"); err != nil {
		t.Fatal(err)
	}
	if reg.Lookup(addr) != nil {
		t.Error("a stopped sandbox is still in the registry")
	}
	recs, err := m.EgressLog("ns", "a", 0, 100)
	if err != nil || len(recs) == 0 {
		t.Errorf("log after stop: %d records, %v", len(recs), err)
	}
	// Restarted as it last ran (as sandbox.start without a config does):
	// registered again with the stored rules.
	stored, err := m.Get("ns", "a")
	if err != nil {
		t.Fatal(err)
	}
	mustStart(t, m, "a", stored.Spec)
	es2 := reg.Lookup(netAddr(t, e, m, "a"))
	if es2 == nil {
		t.Fatal("restarted sandbox not registered")
	}
	if _, ok := es2.AllowName("api.example.org"); !ok {
		t.Error("the restart lost the rules set live")
	}
	// Removed: gone from the registry, its log with it.
	addr2 := netAddr(t, e, m, "a")
	if _, err := m.Remove(t.Context(), "ns", "a"); err != nil {
		t.Fatal(err)
	}
	if reg.Lookup(addr2) != nil {
		t.Error("a removed sandbox is still in the registry")
	}
	if _, err := m.EgressLog("ns", "a", 0, 10); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("log of a removed sandbox: %v, want not found", err)
	}
}

// TestEgressWithoutNetwork: a server without networking refuses egress
// rules (never silently runs a sandbox that cannot reach what it asked
// for), and invalid rules are refused naming them, networking or not.
func TestEgressWithoutNetwork(t *testing.T) {
	m := newEnv(t, sandbox.Options{}).manager(t)
	s := spec
	s.Egress = []string{"pypi.org"}
	if _, err := m.Start(t.Context(), "ns", "a", s, true); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("egress without networking: %v, want invalid", err)
	}
	if !gone(m, "a") {
		t.Error("the refused start left a sandbox")
	}
	mn := newEnv(t, sandbox.Options{Egress: egress.NewRegistry()}).manager(t)
	s.Egress = []string{"pypi.org", "*"}
	_, err := mn.Start(t.Context(), "ns", "b", s, true)
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), `"*"`) {
		t.Errorf("an invalid rule: %v, want invalid naming it", err)
	}
}
