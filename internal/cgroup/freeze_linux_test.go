package cgroup

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestFreeze freezes a busy loop: its CPU time stops, Frozen says so (also
// through another Manager, as a restarted daemon sees it), it goes on after
// Thaw, and a frozen cgroup is killed and destroyed without a hang.
func TestFreeze(t *testing.T) {
	m := newTestManager(t)
	requireController(t, m, "freezer")
	c := mustCreate(t, m, "freeze", Limits{})
	cmd := command(t, "sh", "-c", "while :; do :; done")
	spawn(t, c, cmd)
	cpu := func() int64 {
		t.Helper()
		s, err := c.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return s.CPUUsageNs
	}
	if !waitFor(2*time.Second, func() bool { return cpu() > 0 }) {
		t.Fatal("the loop used no CPU")
	}
	if f, err := c.Frozen(); err != nil || f {
		t.Fatalf("Frozen before Freeze = %v, %v", f, err)
	}
	if err := c.Freeze(time.Second); err != nil {
		t.Fatal(err)
	}
	before := cpu()
	time.Sleep(200 * time.Millisecond)
	if after := cpu(); after != before {
		t.Errorf("frozen loop used %v of CPU in 200ms", time.Duration(after-before))
	}
	other, err := New(m.prefix)
	if err != nil {
		t.Fatal(err)
	}
	oc, err := other.Open("freeze")
	if err != nil {
		t.Fatal(err)
	}
	if f, err := oc.Frozen(); err != nil || !f {
		t.Errorf("Frozen through another Manager = %v, %v", f, err)
	}
	if err := c.Thaw(); err != nil {
		t.Fatal(err)
	}
	if f, err := c.Frozen(); err != nil || f {
		t.Errorf("Frozen after Thaw = %v, %v", f, err)
	}
	thawed := cpu()
	if !waitFor(2*time.Second, func() bool { return cpu() > thawed+int64(10*time.Millisecond) }) {
		t.Error("the loop did not run again after Thaw")
	}

	if err := c.Freeze(time.Second); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("Kill of a frozen cgroup took %v", d)
	}
	if f, err := c.Frozen(); err != nil || f {
		t.Errorf("Frozen after Kill = %v, %v (Kill thaws)", f, err)
	}
}

// TestFreezeOldCgroup: a cgroup made without the freezer's hierarchy (by
// an earlier version) still opens, and Freeze says why it cannot.
func TestFreezeOldCgroup(t *testing.T) {
	m := newTestManager(t)
	if m.Mode() != ModeV1 {
		// No hierarchy of its own to be missing: every v2 cgroup has
		// cgroup.freeze, so one an older version made freezes like a
		// new one (a skip here would fail the v2 lane, which counts
		// skips as hidden capabilities).
		mustCreate(t, m, "old", Limits{})
		oc, err := m.Open("old")
		if err != nil {
			t.Fatal(err)
		}
		if err := oc.Freeze(time.Second); err != nil {
			t.Fatalf("Freeze of a v2 cgroup opened again: %v", err)
		}
		if frozen, err := oc.Frozen(); err != nil || !frozen {
			t.Errorf("Frozen = %v, %v; want true", frozen, err)
		}
		if err := oc.Thaw(); err != nil {
			t.Fatal(err)
		}
		return
	}
	requireController(t, m, "freezer")
	c := mustCreate(t, m, "old", Limits{})
	d := c.dirOf("freezer")
	if err := os.Remove(d); err != nil {
		t.Fatal(err)
	}
	oc, err := m.Open("old")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(d, "freezer.state")); err != nil {
		t.Errorf("Open did not make the freezer's directory again: %v", err)
	}
	if err := oc.Freeze(time.Second); !errors.Is(err, ErrControllerUnavailable) {
		t.Errorf("Freeze of an old cgroup = %v, want ErrControllerUnavailable", err)
	}
}
