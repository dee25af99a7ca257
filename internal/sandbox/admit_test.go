package sandbox_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/oci"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

// TestCaps: a request above the operator's caps (issue 18's finding 5:
// 1 TiB and 256 CPUs on a small host) is refused as invalid, naming the
// caps, and leaves nothing behind; at the caps it starts, and the sandbox
// gets the pids and open files the operator set.
func TestCaps(t *testing.T) {
	e := newEnv(t, sandbox.Options{Limits: sandbox.Limits{MaxMemoryMiB: 4096, MaxCPUs: 2, Pids: 100, OpenFiles: 300}})
	m := e.manager(t)
	_, err := m.Start(t.Context(), "ns", "big", sandbox.Spec{Image: "base", MemoryMiB: 1 << 20, CPUs: 256}, false)
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("1 TiB and 256 cpus: %v, want invalid", err)
	}
	for _, want := range []string{"memory 1048576 MiB is above this server's cap of 4096 MiB", "cpus 256 is above this server's cap of 2"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if !gone(m, "big") || e.rows(t) != 0 || len(e.be.Running()) != 0 {
		t.Error("a refused start left something behind")
	}
	// A stopped sandbox restarted with a spec above the caps is refused too.
	mustStart(t, m, "a", sandbox.Spec{Image: "base", MemoryMiB: 4096, CPUs: 2})
	if err := m.Stop(t.Context(), "ns", "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Start(t.Context(), "ns", "a", sandbox.Spec{Image: "base", MemoryMiB: 4097, CPUs: 1}, false); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("restart above the memory cap: %v", err)
	}
	info := mustStart(t, m, "a", sandbox.Spec{Image: "base", MemoryMiB: 4096, CPUs: 2})
	cfg := e.be.Sandbox(info.ID).Config()
	if cfg.MemoryBytes != 4096<<20 || cfg.CPUs != 2 || cfg.PidsMax != 100 || cfg.NoFile != 300 {
		t.Errorf("the backend got memory %d, cpus %v, pids %d, open files %d", cfg.MemoryBytes, cfg.CPUs, cfg.PidsMax, cfg.NoFile)
	}
}

// TestAdmissionPids: issue 18's finding 7. Sandboxes whose pids together
// exceed the host's are not all started: those that fit run, the next is
// refused with limit, saying what is left, until one stops. A stopped
// sandbox's restart is admitted like a new start; sandboxes reattached
// after a server restart are counted, never refused, even when the
// capacity has shrunk below them.
func TestAdmissionPids(t *testing.T) {
	const pids = 1024
	const need = pids + backend.AgentPids // each sandbox's and its agent's
	e := newEnv(t, sandbox.Options{Limits: sandbox.Limits{Pids: pids, OpenFiles: 64}, Capacity: sandbox.Capacity{Pids: 3*need + 500}})
	m := e.manager(t)
	for _, name := range []string{"a", "b", "c"} {
		mustStart(t, m, name, spec)
	}
	_, err := m.Start(t.Context(), "ns", "d", spec, false)
	if !errors.Is(err, errdefs.ErrLimit) || !strings.Contains(err.Error(), fmt.Sprintf("pids: 500 of %d left, this sandbox needs %d", 3*need+500, need)) {
		t.Fatalf("fourth start: %v, want limit saying 500 pids are left", err)
	}
	if !gone(m, "d") || e.rows(t) != 3 || len(e.be.Running()) != 3 {
		t.Errorf("the refused start left a record or a sandbox: rows %d, running %v", e.rows(t), e.be.Running())
	}
	if err := m.Stop(t.Context(), "ns", "a"); err != nil {
		t.Fatal(err)
	}
	mustStart(t, m, "d", spec)
	if _, err := m.Start(t.Context(), "ns", "a", spec, false); !errors.Is(err, errdefs.ErrLimit) {
		t.Errorf("restart of a stopped sandbox past the capacity: %v", err)
	}
	if g, _ := m.Admission(); g.Pids != 3*need || g.Files != 3*pids*64 || g.Ptys != 3*oci.MaxPtys {
		t.Errorf("granted %+v, want 3 sandboxes' pids, files and ptys", g)
	}
	// Starting a running sandbox again is no new grant.
	mustStart(t, m, "b", spec)

	// A server restart with room for one sandbox reattaches all three.
	m.Close()
	e.opts.Capacity = sandbox.Capacity{Pids: need}
	m2 := e.manager(t)
	for _, name := range []string{"b", "c", "d"} {
		if st := state(t, m2, name); st != sandbox.Running {
			t.Errorf("%s after the restart: %s, want running", name, st)
		}
	}
	if g, c := m2.Admission(); g.Pids != 3*need || c.Pids != need {
		t.Errorf("after the restart: granted %d pids of %d, want the reattached sandboxes' %d", g.Pids, c.Pids, 3*need)
	}
	if _, err := m2.Start(t.Context(), "ns", "a", spec, false); !errors.Is(err, errdefs.ErrLimit) || !strings.Contains(err.Error(), fmt.Sprintf("pids: 0 of %d left", need)) {
		t.Errorf("start while the reattached sandboxes hold more than the capacity: %v", err)
	}
	for _, name := range []string{"b", "c"} {
		if err := m2.Stop(t.Context(), "ns", name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m2.Start(t.Context(), "ns", "a", spec, false); !errors.Is(err, errdefs.ErrLimit) {
		t.Errorf("start with d still holding the capacity: %v", err)
	}
	if _, err := m2.Remove(t.Context(), "ns", "d"); err != nil {
		t.Fatal(err)
	}
	mustStart(t, m2, "a", spec)
}

// TestAdmissionEachResource: each resource's capacity refuses the start
// that would exceed it, naming the resource and what is left.
func TestAdmissionEachResource(t *testing.T) {
	lim := sandbox.Limits{Pids: 100, OpenFiles: 1000}
	two := spec // 512 MiB, 1 CPU, 100 pids, 16 ptys, 100000 files each
	for _, tc := range []struct {
		name string
		c    sandbox.Capacity
		want string
	}{
		{"memory", sandbox.Capacity{MemoryBytes: 1200 << 20}, "memory: 176 MiB of 1200 MiB left, this sandbox needs 512 MiB"},
		{"cpus", sandbox.Capacity{CPUs: 2.5}, "cpus: 0.50 of 2.50 left, this sandbox needs 1"},
		{"ptys", sandbox.Capacity{Ptys: 40}, "ptys: 8 of 40 left, this sandbox needs 16"},
		{"open files", sandbox.Capacity{Files: 250000}, "open files: 50000 of 250000 left, this sandbox needs 100000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, sandbox.Options{Limits: lim, Capacity: tc.c})
			m := e.manager(t)
			mustStart(t, m, "a", two)
			mustStart(t, m, "b", two)
			_, err := m.Start(t.Context(), "ns", "c", two, false)
			if errdefs.Kind(err) != "limit" || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("third start: %v, want limit with %q", err, tc.want)
			}
			// A smaller sandbox that fits is admitted.
			if tc.name == "memory" {
				mustStart(t, m, "small", sandbox.Spec{Image: "base", MemoryMiB: 176, CPUs: 1})
			}
		})
	}
}

// TestAdmissionConcurrent: concurrent starts cannot together take more
// than the capacity.
func TestAdmissionConcurrent(t *testing.T) {
	e := newEnv(t, sandbox.Options{Capacity: sandbox.Capacity{MemoryBytes: 5 * 512 << 20}})
	m := e.manager(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	kinds := map[string]int{}
	for i := range 20 {
		wg.Go(func() {
			_, err := m.Start(t.Context(), "ns", fmt.Sprintf("s%d", i), spec, false)
			mu.Lock()
			kinds[errdefs.Kind(err)]++
			mu.Unlock()
		})
	}
	wg.Wait()
	// errdefs.Kind(nil) is internal: count successes by the backend.
	if n := len(e.be.Running()); n != 5 || kinds["limit"] != 15 {
		t.Errorf("%d running, answers %v; want 5 running and 15 refused with limit", n, kinds)
	}
}
