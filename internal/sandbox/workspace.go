package sandbox

import (
	"context"
	"slices"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/errdefs"
)

// Workspaces mounts a namespace's named workspaces (package workspace):
// what the manager needs of them.
type Workspaces interface {
	// Attach prepares workspace name of ns for a sandbox's start and
	// returns the host directory to mount at /workspace; first says no
	// other sandbox holds it. A missing workspace is not_found.
	Attach(ctx context.Context, ns, name string, first bool) (string, error)
	// Detach is told that a sandbox holding it stopped.
	Detach(ctx context.Context, ns, name string) error
}

// WorkspaceTarget is where a sandbox sees its workspace.
const WorkspaceTarget = "/workspace"

var errNoWorkspaces = errdefs.Errorf(errdefs.ErrInvalid, "workspace: workspaces are not configured on this server")

// workspaceError is a workspace's refusal of a start (missing, over its
// quota, its store unreachable): a new sandbox it refuses leaves nothing.
type workspaceError struct{ error }

func (e workspaceError) Unwrap() error { return e.error }

// workspaceUp attaches e's workspace, if it names one, and adds its mount
// to cfg. Holds e.life.
func (m *Manager) workspaceUp(ctx context.Context, e *entry, cfg *backend.Config) error {
	m.mu.Lock()
	ws := e.spec.Workspace
	first := !m.workspaceHeldLocked(e.ns, ws, e)
	m.mu.Unlock()
	if ws == "" {
		return nil
	}
	if m.opts.Workspaces == nil {
		return errNoWorkspaces
	}
	for _, v := range cfg.Volumes {
		if v.Target == WorkspaceTarget {
			return errdefs.Errorf(errdefs.ErrInvalid, "volume sandbox path %s: the workspace is mounted there", WorkspaceTarget)
		}
	}
	dir, err := m.opts.Workspaces.Attach(ctx, e.ns, ws, first)
	if err != nil {
		return workspaceError{err}
	}
	// A copy: cfg.Volumes is the spec's slice.
	cfg.Volumes = append(slices.Clone(cfg.Volumes), backend.Volume{Source: dir, Target: WorkspaceTarget})
	m.mu.Lock()
	e.wsHeld = true
	m.mu.Unlock()
	return nil
}

// workspaceDown detaches e's workspace if it holds one: after the sandbox
// stopped, so that what it wrote is complete. Holds e.life.
func (m *Manager) workspaceDown(ctx context.Context, e *entry) {
	m.mu.Lock()
	held, ws := e.wsHeld, e.spec.Workspace
	e.wsHeld = false
	m.mu.Unlock()
	if !held || m.opts.Workspaces == nil {
		return
	}
	if err := m.opts.Workspaces.Detach(context.WithoutCancel(ctx), e.ns, ws); err != nil {
		e.logf("workspace %s: sync after the stop failed: %v", ws, err)
		m.log.Error("workspace detach", "namespace", e.ns, "workspace", ws, "sandbox", e.name, "err", err)
	}
}

// workspaceHeldLocked reports whether a sandbox other than except holds
// workspace ws of ns. Holds m.mu.
func (m *Manager) workspaceHeldLocked(ns, ws string, except *entry) bool {
	for _, o := range m.entries {
		if o != except && o.ns == ns && o.spec.Workspace == ws && o.wsHeld {
			return true
		}
	}
	return false
}

// WorkspaceInUse reports whether a sandbox of ns is starting, running or
// stopping with workspace ws: a workspace's removal is refused then.
func (m *Manager) WorkspaceInUse(ns, ws string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, o := range m.entries {
		if o.ns == ns && o.spec.Workspace == ws && (o.wsHeld || holds(o.state)) {
			return true
		}
	}
	return false
}
