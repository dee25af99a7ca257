package rpc

import (
	"context"
	"time"

	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

// Snapshots: sandbox.checkpoint, sandbox.restore, sandbox.fork and
// snapshot.list|get|remove (docs/api.md#snapshots), over the manager's
// (internal/sandbox/snapshot.go).

type checkpointParams struct {
	sandboxRef
	Snapshot string `json:"snapshot"`
}

type restoreParams struct {
	Snapshot  string `json:"snapshot"`
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
}

type forkParams struct {
	sandboxRef
	Count int      `json:"count"`
	Names []string `json:"names"`
}

type forkResult struct {
	Sandboxes []sandboxInfo `json:"sandboxes"`
}

type snapshotRef struct {
	Snapshot  string `json:"snapshot"`
	Namespace string `json:"namespace"`
}

type snapshotListParams struct {
	Namespace string `json:"namespace"`
}

type snapshotList struct {
	Snapshots []snapshotInfo `json:"snapshots"`
}

// snapshotInfo is a snapshot as the API shows it (docs/api.md#snapshots).
type snapshotInfo struct {
	Name      string    `json:"name"`
	Namespace string    `json:"namespace"`
	Source    string    `json:"source"`
	Isolation string    `json:"isolation"`
	Image     string    `json:"image"`
	Created   time.Time `json:"created"`
	Bytes     int64     `json:"bytes"`
}

func toSnapshotInfo(in sandbox.SnapshotInfo) snapshotInfo {
	return snapshotInfo{Name: in.Name, Namespace: in.Namespace, Source: in.Source, Isolation: in.Isolation,
		Image: in.Image, Created: in.Created, Bytes: in.Bytes}
}

func (s *Server) sandboxCheckpoint(ctx context.Context, c *call, p *checkpointParams) (any, error) {
	ns, name, err := c.resolveRef(p.sandboxRef)
	if err != nil {
		return nil, err
	}
	if err := snapshotName(p.Snapshot); err != nil {
		return nil, err
	}
	info, err := s.mgr.Checkpoint(ctx, ns, name, p.Snapshot)
	if err != nil {
		return nil, err
	}
	return toSnapshotInfo(info), nil
}

func (s *Server) sandboxRestore(ctx context.Context, c *call, p *restoreParams) (any, error) {
	if err := snapshotName(p.Snapshot); err != nil {
		return nil, err
	}
	ns, name, err := c.resolve(p.Namespace, p.Name)
	if err != nil {
		return nil, err
	}
	info, err := s.mgr.Restore(ctx, ns, p.Snapshot, name)
	if err != nil {
		return nil, err
	}
	return toInfo(info), nil
}

func (s *Server) sandboxFork(ctx context.Context, c *call, p *forkParams) (any, error) {
	ns, name, err := c.resolveRef(p.sandboxRef)
	if err != nil {
		return nil, err
	}
	if p.Count == 0 && len(p.Names) == 0 {
		p.Count = 1
	}
	if len(p.Names) > 0 && p.Count != 0 && p.Count != len(p.Names) {
		return nil, errdefs.Errorf(errInvalidParams, "count %d and %d names: give one or the other", p.Count, len(p.Names))
	}
	if p.Count < 0 || p.Count > sandbox.MaxFork || len(p.Names) > sandbox.MaxFork {
		return nil, errdefs.Errorf(errInvalidParams, "count: want 1 to %d copies", sandbox.MaxFork)
	}
	for _, n := range p.Names {
		if err := sandboxName(n); err != nil {
			return nil, err
		}
	}
	infos, err := s.mgr.Fork(ctx, ns, name, p.Count, p.Names)
	if err != nil {
		return nil, err
	}
	out := forkResult{Sandboxes: []sandboxInfo{}}
	for _, in := range infos {
		out.Sandboxes = append(out.Sandboxes, toInfo(in))
	}
	return out, nil
}

func (s *Server) snapshotList(_ context.Context, c *call, p *snapshotListParams) (any, error) {
	ns, err := c.namespace(p.Namespace)
	if err != nil {
		return nil, err
	}
	list, err := s.mgr.Snapshots(ns)
	if err != nil {
		return nil, err
	}
	out := snapshotList{Snapshots: []snapshotInfo{}}
	for _, in := range list {
		out.Snapshots = append(out.Snapshots, toSnapshotInfo(in))
	}
	return out, nil
}

func (s *Server) snapshotGet(_ context.Context, c *call, p *snapshotRef) (any, error) {
	if err := snapshotName(p.Snapshot); err != nil {
		return nil, err
	}
	ns, err := c.namespace(p.Namespace)
	if err != nil {
		return nil, err
	}
	info, err := s.mgr.Snapshot(ns, p.Snapshot)
	if err != nil {
		return nil, err
	}
	return toSnapshotInfo(info), nil
}

func (s *Server) snapshotRemove(_ context.Context, c *call, p *snapshotRef) (any, error) {
	if err := snapshotName(p.Snapshot); err != nil {
		return nil, err
	}
	ns, err := c.namespace(p.Namespace)
	if err != nil {
		return nil, err
	}
	removed, err := s.mgr.RemoveSnapshot(ns, p.Snapshot)
	if err != nil {
		return nil, err
	}
	return removedResult{Removed: removed}, nil
}

// snapshotName checks a snapshot name's form (a sandbox name's).
func snapshotName(n string) error {
	if !sandbox.ValidName(n) {
		return errdefs.Errorf(errInvalidParams, "snapshot %.70q: want 1-63 of [A-Za-z0-9_-] starting with a letter or digit", n)
	}
	return nil
}
