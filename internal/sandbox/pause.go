package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/errdefs"
)

// Pausing. A paused sandbox is a running one (its state stays Running
// inside the manager: it holds its memory, its network, its ports and its
// place in every limit) whose processes the backend has stopped where they
// are (backend.Pauser). Info shows it as Paused. Operations that need its
// agent are refused with a conflict naming sandbox.resume, or resume it
// first when the request says so (LeaseResume). Whether it is paused is
// read from the backend at a restart, not from the database.

// Idle actions (Options.IdleAction).
const (
	IdleStop  = "stop"
	IdlePause = "pause"
)

// ValidIdleAction reports whether s names an idle action ("" = the server's).
func ValidIdleAction(s string) bool { return s == "" || s == IdleStop || s == IdlePause }

// shown is the state Info reports. Holding m.mu.
func (e *entry) shown() State {
	if e.state == Running && e.paused {
		return Paused
	}
	return e.state
}

// errPaused is the answer to an operation on a paused sandbox.
func errPaused(ns, name string) error {
	return errdefs.Errorf(errdefs.ErrConflict, "sandbox %q in namespace %q is paused: resume it first (sandbox.resume, or \"resume\": true in the request)", name, ns)
}

// Pause pauses the running sandbox ns/name: its processes stop where they
// are, with their memory kept. Requests in flight wait until it resumes
// (or their own timeouts). Pausing a paused sandbox does nothing; a
// backend that cannot pause answers unsupported.
func (m *Manager) Pause(ctx context.Context, ns, name string) error {
	return m.pause(ctx, ns, name, "a pause was requested", false)
}

// pause pauses ns/name for why; with idleOnly, only if no operation holds
// it (the janitor's idle pause, which a request may have overtaken).
func (m *Manager) pause(ctx context.Context, ns, name, why string, idleOnly bool) error {
	e, err := m.lockLife(ns, name)
	if err != nil {
		return err
	}
	defer e.life.Unlock()
	m.mu.Lock()
	switch {
	case e.state != Running:
		st := e.state
		m.mu.Unlock()
		return errdefs.Errorf(errdefs.ErrConflict, "sandbox %q in namespace %q is %s: only a running sandbox can be paused", name, ns, st)
	case e.paused:
		m.mu.Unlock()
		return nil
	case idleOnly && e.busy.Load() > 0:
		m.mu.Unlock()
		return nil
	}
	p, ok := e.sb.(backend.Pauser)
	if !ok {
		tier := e.spec.Isolation
		m.mu.Unlock()
		return errdefs.Errorf(errdefs.ErrUnsupported, "the %s backend cannot pause sandboxes", tier)
	}
	// Marked first: no lease is granted from here on.
	e.paused = true
	m.mu.Unlock()
	t0 := time.Now()
	if err := p.Pause(ctx); err != nil {
		m.mu.Lock()
		e.paused = false
		m.mu.Unlock()
		e.logf("pause failed: %v", err)
		return fmt.Errorf("pause sandbox %q: %w", name, err)
	}
	e.logf("paused (%s) in %.2f ms", why, float64(time.Since(t0).Microseconds())/1000)
	return nil
}

// Resume lets the paused sandbox ns/name run again. Resuming a running
// sandbox that is not paused does nothing; one that is not running is a
// conflict.
func (m *Manager) Resume(ctx context.Context, ns, name string) error {
	e, err := m.lockLife(ns, name)
	if err != nil {
		return err
	}
	defer e.life.Unlock()
	return m.resumeLocked(ctx, e)
}

// resumeLocked resumes e. Holds e.life.
func (m *Manager) resumeLocked(ctx context.Context, e *entry) error {
	m.mu.Lock()
	if e.state != Running {
		st := e.state
		m.mu.Unlock()
		return errdefs.Errorf(errdefs.ErrConflict, "sandbox %q in namespace %q is %s: only a paused sandbox can be resumed", e.name, e.ns, st)
	}
	if !e.paused {
		m.mu.Unlock()
		return nil
	}
	sb, tier := e.sb, e.spec.Isolation
	m.mu.Unlock()
	p, ok := sb.(backend.Pauser)
	if !ok {
		return errdefs.Errorf(errdefs.ErrUnsupported, "the %s backend cannot pause sandboxes", tier)
	}
	if err := p.Resume(ctx); err != nil {
		e.logf("resume failed: %v", err)
		return fmt.Errorf("resume sandbox %q: %w", e.name, err)
	}
	m.mu.Lock()
	e.paused = false
	m.mu.Unlock()
	e.touch() // its idle time starts again
	e.logf("resumed")
	return nil
}

// LeaseResume is Lease, resuming the sandbox first if it is paused.
func (m *Manager) LeaseResume(ctx context.Context, ns, name string) (*Lease, error) {
	m.mu.Lock()
	e := m.entries[key{ns, name}]
	paused := e != nil && e.state == Running && e.paused
	m.mu.Unlock()
	if paused {
		if err := m.Resume(ctx, ns, name); err != nil {
			return nil, err
		}
	}
	return m.Lease(ns, name)
}

// lockLife returns ns/name's entry with its lifecycle lock held.
func (m *Manager) lockLife(ns, name string) (*entry, error) {
	m.mu.Lock()
	e := m.entries[key{ns, name}]
	m.mu.Unlock()
	if e == nil {
		return nil, notFound(ns, name)
	}
	e.life.Lock()
	m.mu.Lock()
	removed := e.removed
	m.mu.Unlock()
	if removed {
		e.life.Unlock()
		return nil, notFound(ns, name)
	}
	return e, nil
}

// restorePaused sets e.paused from the backend after a restart: a paused
// sandbox stays paused. Holds e.life or runs before e is shared.
func (m *Manager) restorePaused(e *entry, sb backend.Sandbox) {
	p, ok := sb.(backend.Pauser)
	if !ok {
		return
	}
	paused, err := p.Paused()
	if err != nil {
		e.logf("reattached after a daemon restart without knowing whether it is paused: %v", err)
		return
	}
	e.paused = paused
}

// idleAction is what spec's idle timeout does.
func (m *Manager) idleAction(spec Spec) string {
	switch {
	case spec.IdleAction != "":
		return spec.IdleAction
	case m.opts.IdleAction != "":
		return m.opts.IdleAction
	}
	return IdleStop
}
