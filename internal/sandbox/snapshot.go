package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/errdefs"
)

// Snapshots. Checkpoint writes a running sandbox's memory, processes and
// files (backend.Checkpointer) to a named snapshot of its namespace;
// Restore starts a new sandbox from one (backend.Restorer), through
// Start's own admission, limits and records; Fork does both for n copies.
//
// On disk: <SnapshotDir>/<namespace>/<name>/{snapshot.json,data/}. A
// snapshot is written under a ".tmp-" name and renamed once whole, so an
// interrupted one is never listed (New removes the leftovers). A restore
// holds the snapshot (snapshotUse) so a removal waits for it.
//
// What a copy gets of its own: its name, its hostname (its name), a new
// agent connection, its secrets and egress state as a new sandbox (a
// sandbox with secrets is not checkpointed at all: their values would be
// in the snapshot). What it shares with its source is in
// docs/isolation.md (the processes' memory, random generators' state
// among it).

// MaxFork bounds the copies one sandbox.fork makes.
const MaxFork = 16

// SnapshotInfo is a snapshot as the API shows it.
type SnapshotInfo struct {
	Name      string    `json:"name"`
	Namespace string    `json:"namespace"`
	Source    string    `json:"source"` // the sandbox it was taken of
	Isolation string    `json:"isolation"`
	Image     string    `json:"image"`
	Created   time.Time `json:"created"`
	Bytes     int64     `json:"bytes"`
}

// snapshotMeta is snapshot.json: the info and what a restore needs.
type snapshotMeta struct {
	SnapshotInfo
	Spec    Spec   `json:"spec"`
	ImageID string `json:"image_id,omitempty"`
}

// snapshotRef is a snapshot a new sandbox is restored from.
type snapshotRef struct {
	dir  string
	meta snapshotMeta
}

const snapshotFile = "snapshot.json"

var (
	// snapshotCommit serialises the quota check and the rename that
	// records a snapshot: two checkpoints cannot both take the last share.
	snapshotCommit sync.Mutex
	// snapshotUse: restores hold it shared, removals exclusively.
	snapshotUse sync.RWMutex
)

func errNoSnapshots() error {
	return errdefs.Errorf(errdefs.ErrUnavailable, "this server keeps no snapshots (no snapshot directory)")
}

func (m *Manager) snapshotDir(ns, name string) string {
	return filepath.Join(m.opts.SnapshotDir, ns, name)
}

// Checkpoint writes the running sandbox ns/name to the snapshot snap of
// its namespace. The sandbox runs on; requests in flight on its agent
// connection during the checkpoint fail.
func (m *Manager) Checkpoint(ctx context.Context, ns, name, snap string) (SnapshotInfo, error) {
	if m.opts.SnapshotDir == "" {
		return SnapshotInfo{}, errNoSnapshots()
	}
	if !ValidName(snap) {
		return SnapshotInfo{}, errdefs.Errorf(errdefs.ErrInvalid, "snapshot name %q: want 1-63 of [A-Za-z0-9_-] starting with a letter or digit", snap)
	}
	e, err := m.lockLife(ns, name)
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer e.life.Unlock()
	m.mu.Lock()
	state, paused, sb, spec, imageID := e.state, e.paused, e.sb, e.spec, e.imageID
	m.mu.Unlock()
	switch {
	case state != Running:
		return SnapshotInfo{}, errdefs.Errorf(errdefs.ErrConflict, "sandbox %q in namespace %q is %s: only a running sandbox can be checkpointed", name, ns, state)
	case paused:
		return SnapshotInfo{}, errPaused(ns, name)
	case len(spec.Secrets) > 0:
		return SnapshotInfo{}, errdefs.Errorf(errdefs.ErrUnsupported, "sandbox %q has secrets: a checkpoint would write their values into the snapshot", name)
	}
	cp, ok := sb.(backend.Checkpointer)
	if !ok {
		return SnapshotInfo{}, errdefs.Errorf(errdefs.ErrUnsupported, "isolation %s cannot checkpoint sandboxes: create the sandbox with isolation gvisor", spec.Isolation)
	}
	pol := m.policy(ns)
	if err := m.checkSnapshotQuota(ns, pol, 0); err != nil {
		return SnapshotInfo{}, err
	}
	if _, err := os.Stat(m.snapshotDir(ns, snap)); err == nil {
		return SnapshotInfo{}, errdefs.Errorf(errdefs.ErrConflict, "snapshot %q in namespace %q already exists", snap, ns)
	}
	if err := os.MkdirAll(filepath.Join(m.opts.SnapshotDir, ns), 0o700); err != nil {
		return SnapshotInfo{}, err
	}
	tmp, err := os.MkdirTemp(filepath.Join(m.opts.SnapshotDir, ns), ".tmp-"+snap+"-")
	if err != nil {
		return SnapshotInfo{}, err
	}
	done := false
	defer func() {
		if !done {
			_ = os.RemoveAll(tmp)
		}
	}()
	t0 := time.Now()
	e.busy.Add(1)
	err = cp.Checkpoint(context.WithoutCancel(ctx), filepath.Join(tmp, "data"))
	e.busy.Add(-1)
	if err != nil {
		e.logf("checkpoint failed: %v", err)
		if !isRunning(sb) {
			// The backend could not keep it running: it says why.
			m.mu.Lock()
			e.state, e.err = Error, err.Error()
			m.mu.Unlock()
			m.persist(e)
		}
		return SnapshotInfo{}, fmt.Errorf("checkpoint sandbox %q: %w", name, err)
	}
	took := time.Since(t0)
	spec.Exposed = nil
	meta := snapshotMeta{
		SnapshotInfo: SnapshotInfo{Name: snap, Namespace: ns, Source: name, Isolation: spec.Isolation,
			Image: spec.Image, Created: time.Now().UTC(), Bytes: dirBytes(tmp)},
		Spec: spec, ImageID: imageID,
	}
	js, err := json.Marshal(meta)
	if err != nil {
		return SnapshotInfo{}, err
	}
	if err := os.WriteFile(filepath.Join(tmp, snapshotFile), js, 0o600); err != nil {
		return SnapshotInfo{}, err
	}
	snapshotCommit.Lock()
	defer snapshotCommit.Unlock()
	if err := m.checkSnapshotQuota(ns, pol, meta.Bytes); err != nil {
		return SnapshotInfo{}, err
	}
	if err := os.Rename(tmp, m.snapshotDir(ns, snap)); err != nil {
		if errors.Is(err, fs.ErrExist) || errors.Is(err, os.ErrExist) || strings.Contains(err.Error(), "not empty") {
			return SnapshotInfo{}, errdefs.Errorf(errdefs.ErrConflict, "snapshot %q in namespace %q already exists", snap, ns)
		}
		return SnapshotInfo{}, err
	}
	done = true
	e.logf("checkpointed to snapshot %s (%d bytes) in %.1f ms", snap, meta.Bytes, float64(took.Microseconds())/1000)
	return meta.SnapshotInfo, nil
}

// checkSnapshotQuota refuses one more snapshot of adding bytes past ns's
// snapshot quotas.
func (m *Manager) checkSnapshotQuota(ns string, p NamespacePolicy, adding int64) error {
	if p.MaxSnapshots == 0 && p.SnapshotBytes == 0 {
		return nil
	}
	list, err := m.Snapshots(ns)
	if err != nil {
		return err
	}
	var total int64
	for _, s := range list {
		total += s.Bytes
	}
	if p.MaxSnapshots > 0 && len(list) >= p.MaxSnapshots {
		return limitErr("namespace %q has %d snapshots, its max_snapshots: remove some", ns, len(list))
	}
	if p.SnapshotBytes > 0 && total+adding > p.SnapshotBytes {
		return limitErr("namespace %q's snapshots would take %d bytes, over its snapshot_bytes of %d", ns, total+adding, p.SnapshotBytes)
	}
	return nil
}

// dirBytes is the size of dir's files.
func dirBytes(dir string) int64 {
	var n int64
	// An entry that cannot be read is not counted; the walk goes on.
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, ierr := d.Info(); ierr == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// readSnapshot reads ns's snapshot snap.
func (m *Manager) readSnapshot(ns, snap string) (snapshotMeta, error) {
	var meta snapshotMeta
	if m.opts.SnapshotDir == "" {
		return meta, errNoSnapshots()
	}
	if !ValidName(snap) {
		return meta, errdefs.Errorf(errdefs.ErrNotFound, "no snapshot %q in namespace %q", snap, ns)
	}
	b, err := os.ReadFile(filepath.Join(m.snapshotDir(ns, snap), snapshotFile))
	if errors.Is(err, fs.ErrNotExist) {
		return meta, errdefs.Errorf(errdefs.ErrNotFound, "no snapshot %q in namespace %q", snap, ns)
	}
	if err != nil {
		return meta, err
	}
	if err := json.Unmarshal(b, &meta); err != nil {
		return meta, fmt.Errorf("snapshot %q: %w", snap, err)
	}
	return meta, nil
}

// Snapshot describes ns's snapshot snap.
func (m *Manager) Snapshot(ns, snap string) (SnapshotInfo, error) {
	meta, err := m.readSnapshot(ns, snap)
	return meta.SnapshotInfo, err
}

// Snapshots lists ns's snapshots by name.
func (m *Manager) Snapshots(ns string) ([]SnapshotInfo, error) {
	if m.opts.SnapshotDir == "" {
		return nil, nil
	}
	ents, err := os.ReadDir(filepath.Join(m.opts.SnapshotDir, ns))
	if errors.Is(err, fs.ErrNotExist) {
		return []SnapshotInfo{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := []SnapshotInfo{}
	for _, d := range ents {
		if !d.IsDir() || strings.HasPrefix(d.Name(), ".") {
			continue
		}
		if meta, err := m.readSnapshot(ns, d.Name()); err == nil {
			out = append(out, meta.SnapshotInfo)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// RemoveSnapshot deletes ns's snapshot snap (after the restores from it
// in progress); it reports whether there was one.
func (m *Manager) RemoveSnapshot(ns, snap string) (bool, error) {
	if _, err := m.readSnapshot(ns, snap); err != nil {
		if errdefs.Kind(err) == errdefs.ErrNotFound.Error() {
			return false, nil
		}
		return false, err
	}
	snapshotUse.Lock()
	defer snapshotUse.Unlock()
	// Renamed away first: the removal is whole or not seen.
	dir := m.snapshotDir(ns, snap)
	gone := filepath.Join(m.opts.SnapshotDir, ns, ".tmp-removed-"+snap+"-"+newID())
	if err := os.Rename(dir, gone); err != nil {
		return false, err
	}
	return true, os.RemoveAll(gone)
}

// Restore starts the new sandbox ns/name from ns's snapshot snap: its
// processes, REPL state and files as they were, under its own name and
// hostname. It is admitted and counted as a new sandbox of the
// snapshot's spec.
func (m *Manager) Restore(ctx context.Context, ns, snap, name string) (Info, error) {
	snapshotUse.RLock()
	defer snapshotUse.RUnlock()
	meta, err := m.readSnapshot(ns, snap)
	if err != nil {
		return Info{}, err
	}
	return m.start(ctx, ns, name, meta.Spec, true, &snapshotRef{dir: m.snapshotDir(ns, snap), meta: meta})
}

// restoreOnHost is startLocked's creation of a restored sandbox.
func (m *Manager) restoreOnHost(ctx context.Context, be backend.Backend, e *entry, cfg backend.Config) (backend.Sandbox, error) {
	r, ok := be.(backend.Restorer)
	if !ok || !be.Capabilities().Checkpoint {
		return nil, errdefs.Errorf(errdefs.ErrUnsupported, "isolation %s cannot restore snapshots: use isolation gvisor", be.Name())
	}
	cfg.Hostname = hostnameOf(e.name)
	dir := filepath.Join(e.from.dir, "data")
	sb, err := r.Restore(context.WithoutCancel(ctx), cfg, dir)
	if err != nil {
		return nil, err
	}
	e.logf("restored from snapshot %s of %s", e.from.meta.Name, e.from.meta.Source)
	e.from = nil
	return sb, nil
}

// hostnameOf is a restored sandbox's hostname: its name, lower case, "_"
// as "-" (a hostname's characters).
func hostnameOf(name string) string {
	return strings.ReplaceAll(strings.ToLower(name), "_", "-")
}

// Fork makes n running copies of the running sandbox ns/name (named
// names, or "<name>-fork-<random>-<i>"): a checkpoint to a snapshot of its
// own that is removed after (it takes a snapshot's room in the namespace's
// quota meanwhile), and n restores from it, concurrently. All or nothing:
// when one copy fails the others are removed.
func (m *Manager) Fork(ctx context.Context, ns, name string, n int, names []string) ([]Info, error) {
	if len(names) > 0 {
		n = len(names)
	}
	if n < 1 || n > MaxFork {
		return nil, errdefs.Errorf(errdefs.ErrInvalid, "count %d: want 1 to %d copies", n, MaxFork)
	}
	if len(names) == 0 {
		suffix := newID()[:6]
		for i := range n {
			names = append(names, fmt.Sprintf("%s-fork-%s-%d", name, suffix, i+1))
		}
	}
	for _, c := range names {
		if !ValidName(c) {
			return nil, errdefs.Errorf(errdefs.ErrInvalid, "name %q: want 1-63 of [A-Za-z0-9_-] starting with a letter or digit", c)
		}
	}
	snap := "fork-" + newID()[:12]
	if _, err := m.Checkpoint(ctx, ns, name, snap); err != nil {
		return nil, err
	}
	defer func() { _, _ = m.RemoveSnapshot(ns, snap) }()
	infos := make([]Info, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, c := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			infos[i], errs[i] = m.Restore(ctx, ns, snap, c)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		// All or nothing: the copies made go again.
		for i, c := range names {
			if errs[i] == nil {
				_, _ = m.Remove(context.WithoutCancel(ctx), ns, c)
			}
		}
		return nil, err
	}
	return infos, nil
}

// sweepSnapshots removes what interrupted checkpoints and removals left.
func (m *Manager) sweepSnapshots() {
	if m.opts.SnapshotDir == "" {
		return
	}
	nss, _ := os.ReadDir(m.opts.SnapshotDir)
	for _, ns := range nss {
		ents, _ := os.ReadDir(filepath.Join(m.opts.SnapshotDir, ns.Name()))
		for _, d := range ents {
			if strings.HasPrefix(d.Name(), ".tmp-") {
				_ = os.RemoveAll(filepath.Join(m.opts.SnapshotDir, ns.Name(), d.Name()))
			}
		}
	}
}
