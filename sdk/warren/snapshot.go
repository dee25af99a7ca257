package warren

import (
	"context"
	"time"
)

// SnapshotInfo describes a snapshot: a running sandbox's memory, processes
// and files, checkpointed (isolation gvisor).
type SnapshotInfo struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	// Source is the sandbox it was taken of.
	Source    string    `json:"source"`
	Isolation string    `json:"isolation"`
	Image     string    `json:"image"`
	Created   time.Time `json:"created"`
	// Bytes is the space it takes on the server's disk.
	Bytes int64 `json:"bytes"`
}

type snapshotParams struct {
	Snapshot  string `json:"snapshot"`
	Namespace string `json:"namespace,omitempty"`
}

// Checkpoint writes the running sandbox to the snapshot called name
// (sandbox.checkpoint); the sandbox runs on. A sandbox whose isolation
// cannot checkpoint is an error of kind unsupported.
func (s *Sandbox) Checkpoint(ctx context.Context, name string) (SnapshotInfo, error) {
	p := struct {
		sandboxParams
		Snapshot string `json:"snapshot"`
	}{s.params(), name}
	var info SnapshotInfo
	err := s.c.Call(ctx, "sandbox.checkpoint", p, &info)
	return info, err
}

// Fork makes n running copies of the sandbox (sandbox.fork), each with its
// processes, REPL state and files as they were, and returns their handles.
func (s *Sandbox) Fork(ctx context.Context, n int) ([]*Sandbox, error) {
	p := struct {
		sandboxParams
		Count int `json:"count"`
	}{s.params(), n}
	var res struct {
		Sandboxes []SandboxInfo `json:"sandboxes"`
	}
	if err := s.c.Call(ctx, "sandbox.fork", p, &res); err != nil {
		return nil, err
	}
	out := make([]*Sandbox, 0, len(res.Sandboxes))
	for _, in := range res.Sandboxes {
		out = append(out, s.c.Sandbox(in.Name))
	}
	return out, nil
}

// Restore starts the new sandbox name from the snapshot (sandbox.restore).
func (c *Client) Restore(ctx context.Context, snapshot, name string) (*Sandbox, error) {
	p := struct {
		Snapshot  string `json:"snapshot"`
		Name      string `json:"name"`
		Namespace string `json:"namespace,omitempty"`
	}{snapshot, name, c.namespace}
	var info SandboxInfo
	if err := c.Call(ctx, "sandbox.restore", p, &info); err != nil {
		return nil, err
	}
	return c.Sandbox(name), nil
}

// Snapshots lists the namespace's snapshots (snapshot.list).
func (c *Client) Snapshots(ctx context.Context) ([]SnapshotInfo, error) {
	var res struct {
		Snapshots []SnapshotInfo `json:"snapshots"`
	}
	err := c.Call(ctx, "snapshot.list", struct {
		Namespace string `json:"namespace,omitempty"`
	}{c.namespace}, &res)
	return res.Snapshots, err
}

// Snapshot describes one snapshot (snapshot.get).
func (c *Client) Snapshot(ctx context.Context, name string) (SnapshotInfo, error) {
	var info SnapshotInfo
	err := c.Call(ctx, "snapshot.get", snapshotParams{name, c.namespace}, &info)
	return info, err
}

// RemoveSnapshot deletes a snapshot (snapshot.remove); removing one that
// does not exist is not an error.
func (c *Client) RemoveSnapshot(ctx context.Context, name string) error {
	return c.Call(ctx, "snapshot.remove", snapshotParams{name, c.namespace}, nil)
}
