package netplumb_test

import (
	"slices"
	"testing"

	"github.com/warren-sandbox/warren/internal/netplumb"
)

// TestRemoveInstance: an instance no Host holds any more (its process is
// gone) is found by its table's name and removed, veths and table.
func TestRemoveInstance(t *testing.T) {
	requireNet(t)
	s := newServices(t)
	cfg := s.config(testPrefix())
	h, err := netplumb.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ns := newNetns(t)
	if _, err := h.Attach("sb", ns.f); err != nil {
		_ = h.Remove()
		t.Fatal(err)
	}
	vp := h.VethPrefix()
	// The process lets go without removing anything, as one killed would.
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if ts, err := netplumb.Tables(cfg.Prefix); err != nil || !slices.Equal(ts, []string{cfg.Prefix}) {
		t.Fatalf("Tables(%q) = %v, %v", cfg.Prefix, ts, err)
	}
	if n := vethsOf(t, vp); len(n) != 1 {
		t.Fatalf("veths before: %v, want one", n)
	}
	if err := netplumb.RemoveInstance(cfg.Prefix); err != nil {
		t.Fatal(err)
	}
	if n := vethsOf(t, vp); len(n) != 0 {
		t.Errorf("veths left: %v", n)
	}
	if _, err := listTable(cfg.Prefix); err == nil {
		t.Errorf("table %s left", cfg.Prefix)
	}
	if ts, err := netplumb.Tables(cfg.Prefix); err != nil || len(ts) != 0 {
		t.Errorf("Tables after removal: %v, %v", ts, err)
	}
	// What is gone already is no error; a prefix that is no instance's is.
	if err := netplumb.RemoveInstance(cfg.Prefix); err != nil {
		t.Errorf("second removal: %v", err)
	}
	if err := netplumb.RemoveInstance(""); err == nil {
		t.Error("empty prefix accepted")
	}
}
