package sandbox

import (
	"fmt"
	"strings"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/oci"
)

// Limits are the operator's caps on what one sandbox may ask for and the
// settings every sandbox gets. Zero fields mean the package's defaults.
type Limits struct {
	// MaxMemoryMiB and MaxCPUs cap a request's memory and cpus (default
	// MaxMemoryMiB, MaxCPUs). A request above a cap is refused, not
	// clamped: a caller that asked for 8 GiB and silently got 4 learns it
	// from an OOM kill, long after the start said yes.
	MaxMemoryMiB int64
	MaxCPUs      float64
	// Pids is each sandbox's process and thread limit (default
	// backend.DefaultPids).
	Pids int64
	// OpenFiles is RLIMIT_NOFILE of each process in a sandbox (default
	// oci's, 65536). A sandbox's processes are at most Pids, each with at
	// most OpenFiles descriptors, so a sandbox holds at most Pids ×
	// OpenFiles open files through descriptors.
	OpenFiles int64
}

func (l Limits) withDefaults() Limits {
	if l.MaxMemoryMiB == 0 {
		l.MaxMemoryMiB = MaxMemoryMiB
	}
	if l.MaxCPUs == 0 {
		l.MaxCPUs = MaxCPUs
	}
	if l.Pids == 0 {
		l.Pids = backend.DefaultPids
	}
	if l.OpenFiles == 0 {
		l.OpenFiles = oci.DefaultNoFile
	}
	return l
}

// checkCaps refuses a spec above the operator's caps, naming the cap.
func (l Limits) checkCaps(s Spec) error {
	var errs []string
	if s.MemoryMiB > l.MaxMemoryMiB {
		errs = append(errs, fmt.Sprintf("memory %d MiB is above this server's cap of %d MiB per sandbox", s.MemoryMiB, l.MaxMemoryMiB))
	}
	if s.CPUs > l.MaxCPUs {
		errs = append(errs, fmt.Sprintf("cpus %g is above this server's cap of %g per sandbox", s.CPUs, l.MaxCPUs))
	}
	if errs == nil {
		return nil
	}
	return errdefs.Errorf(errdefs.ErrInvalid, "%s; ask for less", strings.Join(errs, "; "))
}

// Capacity is what the host offers the running sandboxes together: the
// sum of what they are granted never exceeds it. A zero field does not
// limit.
type Capacity struct {
	MemoryBytes int64
	// CPUs is the host's CPUs times the operator's overcommit factor.
	CPUs  float64
	Pids  int64
	Ptys  int64
	Files int64
}

// Grant is what one running sandbox holds of each resource, or a sum.
type Grant struct {
	MemoryBytes int64
	CPUs        float64
	Pids        int64
	Ptys        int64
	Files       int64
}

func (g *Grant) add(o Grant) {
	g.MemoryBytes += o.MemoryBytes
	g.CPUs += o.CPUs
	g.Pids += o.Pids
	g.Ptys += o.Ptys
	g.Files += o.Files
}

// grant is what a sandbox with spec s holds while it runs. Every sandbox
// may open oci.MaxPtys terminals (its devpts instance's max=). Its pids
// are its own and its agent's, which are kept apart (backend.AgentPids).
func (l Limits) grant(s Spec) Grant {
	return Grant{MemoryBytes: s.MemoryMiB << 20, CPUs: s.CPUs, Pids: l.Pids + backend.AgentPids, Ptys: oci.MaxPtys, Files: l.Pids * l.OpenFiles}
}

// admit refuses g when, added to used, it exceeds c in any resource: the
// error names each such resource and what is left of it.
func (c Capacity) admit(used, g Grant) error {
	var over []string
	check := func(what string, capacity, used, want int64, unit string) {
		if capacity <= 0 || used+want <= capacity {
			return
		}
		over = append(over, fmt.Sprintf("%s: %d%s of %d%s left, this sandbox needs %d%s", what, max(capacity-used, 0), unit, capacity, unit, want, unit))
	}
	check("memory", c.MemoryBytes>>20, used.MemoryBytes>>20, g.MemoryBytes>>20, " MiB")
	if c.CPUs > 0 && used.CPUs+g.CPUs > c.CPUs+1e-9 {
		over = append(over, fmt.Sprintf("cpus: %.2f of %.2f left, this sandbox needs %g", max(c.CPUs-used.CPUs, 0), c.CPUs, g.CPUs))
	}
	check("pids", c.Pids, used.Pids, g.Pids, "")
	check("ptys", c.Ptys, used.Ptys, g.Ptys, "")
	check("open files", c.Files, used.Files, g.Files, "")
	if over == nil {
		return nil
	}
	return errdefs.Errorf(errdefs.ErrLimit, "the running sandboxes hold this server's capacity (%s); stop a sandbox or ask for less, and try again", strings.Join(over, "; "))
}

// holds reports whether a sandbox in state st holds its grant: from the
// moment its start is admitted until its processes are gone.
func holds(st State) bool { return st == Starting || st == Running || st == Stopping }

// grantedLocked is the sum of what the sandboxes hold. Holds m.mu.
func (m *Manager) grantedLocked() Grant {
	var sum Grant
	for _, e := range m.entries {
		if holds(e.state) {
			sum.add(m.limits.grant(e.spec))
		}
	}
	return sum
}

// Admission is the sum of what the running sandboxes hold and the
// server's capacity (for metrics).
func (m *Manager) Admission() (granted Grant, capacity Capacity) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.grantedLocked(), m.opts.Capacity
}
