// Package workspace owns named workspaces: directories of a namespace that
// outlive sandboxes, are mounted at /workspace by the sandboxes that ask
// for them (several at once, each seeing the others' writes), hold at most
// a quota of bytes, and are uploaded and downloaded as tar.
//
// Every workspace has a directory on this host, which sandboxes mount (the
// manager binds it through the backend's volume mechanism). Where its
// content lives beyond that directory is its Store's business: a local
// store's directory is the content itself; an object store's is a cache
// that is pulled before the first sandbox mounts it and pushed when a
// sandbox stops and on Sync (s3.go, docs/policy.md "Workspaces").
//
// Invariants:
//   - Names (namespace and workspace) are sandbox.ValidName's; nothing else
//     reaches a path.
//   - What a workspace holds is written by hostile sandboxes, possibly while
//     the server reads it: the server walks it only with directory
//     descriptors, never a joined path that could follow a swapped-in
//     symlink (package confined's Root, and usage.go).
//   - Files the server writes into a workspace belong to the sandboxes'
//     root (Options.UID/GID), as if sandbox root had written them: they
//     are written by a thread whose file-system ids are those.
//   - A workspace is never removed while a sandbox holds it (Remove's
//     inUse, checked under the workspace's lock that Attach takes too).
package workspace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/confined"
	"github.com/warren-sandbox/warren/internal/diskquota"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

// Target is where a sandbox sees its workspace.
const Target = "/workspace"

// Defaults.
const (
	// DefaultQuota is a workspace's byte quota when neither its creation
	// nor the server names one.
	DefaultQuota = 10 << 30
	// MaxPerNamespace bounds the workspaces of one namespace.
	MaxPerNamespace = 256
	// LocalStore is the name of the store that always exists.
	LocalStore = "local"
)

// Store keeps workspaces' content.
type Store interface {
	// Kind is the store's type as the configuration names it ("dir",
	// "s3").
	Kind() string
	// Dir is the directory on this host that holds ns/name's files: what
	// sandboxes mount.
	Dir(ns, name string) string
	// Pull makes Dir the store's latest content; Push sends Dir's changes
	// to the store. Both are no-ops for a local directory. root is Dir,
	// and the calls run as the sandboxes' root (withWriter).
	Pull(ctx context.Context, ns, name string, root *confined.Root) (SyncStats, error)
	Push(ctx context.Context, ns, name string, root *confined.Root) (SyncStats, error)
	// Delete removes what the store holds of ns/name beyond Dir.
	Delete(ctx context.Context, ns, name string) error
}

// SyncStats says what a Pull or Push moved.
type SyncStats struct {
	Sent      int `json:"sent"`      // objects uploaded
	Received  int `json:"received"`  // objects downloaded
	Deleted   int `json:"deleted"`   // objects or files deleted because the other side deleted them
	Unchanged int `json:"unchanged"` // files already the same on both sides
	// Conflicts are files changed on both sides since the last sync:
	// neither side was overwritten (docs/policy.md).
	Conflicts []string `json:"conflicts,omitempty"`
}

func (s *SyncStats) add(o SyncStats) {
	s.Sent += o.Sent
	s.Received += o.Received
	s.Deleted += o.Deleted
	s.Unchanged += o.Unchanged
	s.Conflicts = append(s.Conflicts, o.Conflicts...)
}

// Info describes a workspace.
type Info struct {
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	Store     string    `json:"store"`
	Quota     int64     `json:"quota"`
	Created   time.Time `json:"created"`
	// Usage is the bytes its files take on disk (Get only; -1 when they
	// could not be counted, the error in UsageError).
	Usage      int64  `json:"usage"`
	UsageError string `json:"usage_error,omitempty"`
	// KernelLimit: its directory is a subvolume on the disk pool
	// (Options.Pool) that the kernel holds to Quota. Kept in the
	// metadata: a workspace made without it stays where it was.
	KernelLimit bool `json:"kernel_limit,omitempty"`
	// LimitNote says why a workspace has no kernel limit (Get only).
	LimitNote string `json:"limit_note,omitempty"`
}

// Options configure a Manager.
type Options struct {
	// Root holds the workspaces' metadata and the local store's
	// directories: <data dir>/workspaces.
	Root string
	// Stores by name, besides LocalStore (a "dir" store under Root, unless
	// Stores names another under that name).
	Stores map[string]Store
	// DefaultStore is the store of a workspace created without one
	// (default LocalStore). DefaultQuota is the quota of one created
	// without one (default DefaultQuota); MaxQuota, when set, bounds what
	// a creation may ask for.
	DefaultStore string
	DefaultQuota int64
	MaxQuota     int64
	// UID and GID are the host ids of a sandbox's root user, which owns a
	// workspace's directory and whatever the server writes into it (the
	// native backend's RootIDs).
	UID, GID int
	// Namespace, when set, gives a namespace's own store and quota
	// (the configuration's workspace_store and workspace_quota; "" and 0
	// = the server's). A namespace with a store uses that one alone; its
	// quota is the default and the maximum of its workspaces.
	Namespace func(ns string) (store string, quota int64)
	// Pool, when set, is a directory on the disk limits' btrfs file
	// system (quotas on, package diskquota) where new workspaces keep
	// their directories, <Pool>/<store>/<ns>/<name>, each a subvolume
	// whose quota group holds it to the workspace's quota: writes from
	// inside sandboxes stop there with EDQUOT. The local store's and the
	// object stores' workspaces go there; a "dir" store with a path of
	// its own keeps its workspaces there, not kernel-limited. Without
	// Pool, and for workspaces made before it was set, the quota holds at
	// uploads and mounts only (docs/policy.md).
	Pool   string
	Logger *slog.Logger
}

// Manager owns the server's workspaces.
type Manager struct {
	opts Options
	log  *slog.Logger

	mu    sync.Mutex
	locks map[string]*sync.Mutex // per workspace; never freed (bounded by the workspaces made)
}

// New opens the workspaces under opts.Root.
func New(opts Options) (*Manager, error) {
	if opts.Root == "" {
		return nil, errors.New("workspaces: no root directory")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.DefaultQuota == 0 {
		opts.DefaultQuota = DefaultQuota
	}
	if opts.DefaultStore == "" {
		opts.DefaultStore = LocalStore
	}
	stores := map[string]Store{LocalStore: &Dir{Root: opts.Root}}
	for n, s := range opts.Stores {
		if !sandbox.ValidName(n) {
			return nil, fmt.Errorf("workspaces: store name %q: want 1-63 of [A-Za-z0-9_-]", n)
		}
		stores[n] = s
	}
	opts.Stores = stores
	if opts.Stores[opts.DefaultStore] == nil {
		return nil, fmt.Errorf("workspaces: default store %q is not configured", opts.DefaultStore)
	}
	if opts.MaxQuota > 0 && opts.DefaultQuota > opts.MaxQuota {
		return nil, fmt.Errorf("workspaces: default quota %d is above the maximum %d", opts.DefaultQuota, opts.MaxQuota)
	}
	// Root's alone: the namespaces' names and metadata are nobody
	// else's business; the workspace directories below are reached by
	// sandboxes through mounts, not this path.
	if err := os.MkdirAll(filepath.Join(opts.Root, metaDir), 0o700); err != nil {
		return nil, fmt.Errorf("workspaces: %w", err)
	}
	if err := os.Chmod(opts.Root, 0o700); err != nil { //nolint:gosec // a directory: 0700 is root's alone
		return nil, fmt.Errorf("workspaces: %w", err)
	}
	if opts.Pool != "" {
		// Searchable, not listable, as the namespace levels below: the
		// sandboxes' root reaches its workspace through it where the
		// backend mounts volumes by path.
		if err := os.MkdirAll(opts.Pool, 0o711); err != nil { //nolint:gosec // searchable, not listable: see above
			return nil, fmt.Errorf("workspaces: %w", err)
		}
	}
	return &Manager{opts: opts, log: opts.Logger, locks: map[string]*sync.Mutex{}}, nil
}

// metaDir, under Root, holds one JSON file per workspace:
// .meta/<ns>/<name>.json. A name cannot start with ".", so it never
// collides with a namespace's directory. Files rather than database rows:
// written once at creation, read at mounts, they stay with the
// directories they describe (moving Root moves both), and they need no
// schema migration.
const metaDir = ".meta"

func (m *Manager) metaPath(ns, name string) string {
	return filepath.Join(m.opts.Root, metaDir, ns, name+".json")
}

func (m *Manager) lock(ns, name string) func() {
	m.mu.Lock()
	l := m.locks[ns+"/"+name]
	if l == nil {
		l = &sync.Mutex{}
		m.locks[ns+"/"+name] = l
	}
	m.mu.Unlock()
	l.Lock()
	return l.Unlock
}

func checkNames(ns, name string) error {
	if !sandbox.ValidName(ns) || !sandbox.ValidName(name) {
		return errdefs.Errorf(errdefs.ErrInvalid, "workspace and namespace names are 1-63 of [A-Za-z0-9_-] starting with a letter or digit")
	}
	return nil
}

func notFound(ns, name string) error {
	return errdefs.Errorf(errdefs.ErrNotFound, "workspace %q not found in namespace %q", name, ns)
}

// Stores lists the configured stores' names.
func (m *Manager) Stores() []string {
	names := make([]string, 0, len(m.opts.Stores))
	for n := range m.opts.Stores {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Create makes workspace ns/name on store (default Options.DefaultStore)
// with quota bytes (0: Options.DefaultQuota).
func (m *Manager) Create(ctx context.Context, ns, name, store string, quota int64) (Info, error) {
	if err := checkNames(ns, name); err != nil {
		return Info{}, err
	}
	var nsStore string
	var nsQuota int64
	if m.opts.Namespace != nil {
		nsStore, nsQuota = m.opts.Namespace(ns)
	}
	switch {
	case nsStore != "" && store != "" && store != nsStore:
		return Info{}, errdefs.Errorf(errdefs.ErrForbidden, "store %.64q: namespace %q keeps its workspaces in store %q", store, ns, nsStore)
	case store == "" && nsStore != "":
		store = nsStore
	case store == "":
		store = m.opts.DefaultStore
	}
	if nsQuota > 0 {
		if quota > nsQuota {
			return Info{}, errdefs.Errorf(errdefs.ErrLimit, "workspace quota %d bytes is above namespace %q's workspace_quota of %d bytes", quota, ns, nsQuota)
		}
		if quota == 0 {
			quota = nsQuota
		}
	}
	st := m.opts.Stores[store]
	if st == nil {
		return Info{}, errdefs.Errorf(errdefs.ErrInvalid, "store %.64q is not configured on this server (configured: %v)", store, m.Stores())
	}
	switch {
	case quota < 0:
		return Info{}, errdefs.Errorf(errdefs.ErrInvalid, "quota %d: want a positive number of bytes (0: the server's default)", quota)
	case quota == 0:
		quota = m.opts.DefaultQuota
	case m.opts.MaxQuota > 0 && quota > m.opts.MaxQuota:
		return Info{}, errdefs.Errorf(errdefs.ErrLimit, "workspace quota %d bytes is above this server's maximum of %d bytes", quota, m.opts.MaxQuota)
	}
	defer m.lock(ns, name)()
	if _, err := m.read(ns, name); err == nil {
		return Info{}, errdefs.Errorf(errdefs.ErrConflict, "workspace %q already exists in namespace %q", name, ns)
	}
	if n, _ := m.count(ns); n >= MaxPerNamespace {
		return Info{}, errdefs.Errorf(errdefs.ErrLimit, "namespace %q holds %d workspaces, the maximum; remove some", ns, n)
	}
	info := Info{Namespace: ns, Name: name, Store: store, Quota: quota, Created: time.Now().UTC().Truncate(time.Second),
		KernelLimit: m.opts.Pool != "" && m.pooled(store)}
	dir, err := m.dir(info, st)
	if err != nil {
		return Info{}, err
	}
	if err := m.makeDir(dir, info); err != nil {
		return Info{}, err
	}
	if err := m.write(info); err != nil {
		_ = m.removeDir(dir, info)
		return Info{}, err
	}
	if st.Kind() != "dir" {
		// Whatever the store already holds under this name (a workspace
		// of a server whose data directory was lost) becomes its content.
		if _, err := m.withWriter(dir, func(root *confined.Root) (SyncStats, error) { return st.Pull(ctx, ns, name, root) }); err != nil {
			m.log.Warn("first pull of a new workspace", "namespace", ns, "workspace", name, "store", store, "err", err)
		}
	}
	info.Usage = 0
	return info, nil
}

// pooled reports whether store's workspaces go to the disk pool when
// there is one: all but a "dir" store at a path of its own, which the
// operator chose for them.
func (m *Manager) pooled(store string) bool {
	d, ok := m.opts.Stores[store].(*Dir)
	return !ok || filepath.Clean(d.Root) == filepath.Clean(m.opts.Root)
}

// dir is the directory of info's workspace: on the disk pool when it is
// kernel-limited, else where its store keeps it.
func (m *Manager) dir(info Info, st Store) (string, error) {
	if !info.KernelLimit {
		return st.Dir(info.Namespace, info.Name), nil
	}
	if m.opts.Pool == "" {
		return "", errdefs.Errorf(errdefs.ErrUnavailable, "workspace %q is kept on the disk pool, and this server runs without disk limits: start it with them (--disk-pool auto) to reach it", info.Name)
	}
	return filepath.Join(m.opts.Pool, info.Store, info.Namespace, info.Name), nil
}

// place is info's store and directory.
func (m *Manager) place(info Info) (Store, string, error) {
	st, err := m.store(info)
	if err != nil {
		return nil, "", err
	}
	dir, err := m.dir(info, st)
	return st, dir, err
}

// limitNote says why info's workspace has no kernel limit ("" when it
// has one).
func (m *Manager) limitNote(info Info) string {
	switch {
	case info.KernelLimit:
		return ""
	case m.opts.Pool == "":
		return "disk limits are off on this server: sandboxes can write past the quota while they run (it holds at uploads and mounts)"
	case !m.pooled(info.Store):
		return fmt.Sprintf("store %q keeps workspaces at a path of its own, off the disk pool: sandboxes can write past the quota while they run (it holds at uploads and mounts)", info.Store)
	}
	return "made before disk limits were on: sandboxes can write past the quota while they run (it holds at uploads and mounts); copy it into a new workspace (download, create, upload) for a kernel limit"
}

// makeDir creates a workspace's directory (and its namespace's), owned by
// the sandboxes' root: the one thing of the workspace the server makes in
// its own name. A kernel-limited one is a subvolume held to the quota.
func (m *Manager) makeDir(dir string, info Info) error {
	// The namespace level: searchable by the sandboxes' root, which the
	// mounts do not need but a server running sandboxes without id-mapped
	// mounts does.
	if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil { //nolint:gosec // searchable, not listable: see above
		return err
	}
	if _, err := os.Lstat(dir); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if info.KernelLimit {
		if err := diskquota.CreateDir(dir, info.Quota); err != nil {
			return fmt.Errorf("workspace directory under a limit of %d bytes: %w", info.Quota, err)
		}
		if err := os.Chmod(dir, 0o755); err != nil { //nolint:gosec // the sandboxes' own directory, as a fresh root's
			_ = diskquota.Remove(dir)
			return err
		}
	} else if err := os.Mkdir(dir, 0o755); err != nil { //nolint:gosec // the sandboxes' own directory, as a fresh root's
		return err
	}
	return os.Lchown(dir, m.opts.UID, m.opts.GID)
}

// removeDir removes a workspace's directory (a kernel-limited one with
// its quota group).
func (m *Manager) removeDir(dir string, info Info) error {
	if info.KernelLimit {
		return diskquota.Remove(dir)
	}
	return os.RemoveAll(dir)
}

func (m *Manager) write(info Info) error {
	p := m.metaPath(info.Namespace, info.Name)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(info)
	if err != nil {
		return err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

func (m *Manager) read(ns, name string) (Info, error) {
	b, err := os.ReadFile(m.metaPath(ns, name))
	if errors.Is(err, fs.ErrNotExist) {
		return Info{}, notFound(ns, name)
	}
	if err != nil {
		return Info{}, err
	}
	var info Info
	if err := json.Unmarshal(b, &info); err != nil {
		return Info{}, fmt.Errorf("workspace %s/%s: metadata: %w", ns, name, err)
	}
	return info, nil
}

func (m *Manager) count(ns string) (int, error) {
	des, err := os.ReadDir(filepath.Join(m.opts.Root, metaDir, ns))
	return len(des), err
}

// store is info's store; one a configuration no longer names is an
// error the operator must fix (its workspaces stay on disk meanwhile).
func (m *Manager) store(info Info) (Store, error) {
	st := m.opts.Stores[info.Store]
	if st == nil {
		return nil, errdefs.Errorf(errdefs.ErrUnavailable, "workspace %q's store %q is no longer configured on this server", info.Name, info.Store)
	}
	return st, nil
}

// Namespaces lists the namespaces that have workspaces.
func (m *Manager) Namespaces() []string {
	des, _ := os.ReadDir(filepath.Join(m.opts.Root, metaDir))
	var out []string
	for _, de := range des {
		if de.IsDir() && sandbox.ValidName(de.Name()) {
			out = append(out, de.Name())
		}
	}
	return out
}

// List describes the workspaces of namespaces nss, without usage.
func (m *Manager) List(nss []string) ([]Info, error) {
	var out []Info
	for _, ns := range nss {
		if !sandbox.ValidName(ns) {
			continue
		}
		des, err := os.ReadDir(filepath.Join(m.opts.Root, metaDir, ns))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, de := range des {
			name, ok := cutSuffix(de.Name(), ".json")
			if !ok || !sandbox.ValidName(name) {
				continue
			}
			info, err := m.read(ns, name)
			if err != nil {
				continue // removed meanwhile
			}
			info.Usage = -1
			out = append(out, info)
		}
	}
	slices.SortFunc(out, func(a, b Info) int {
		if a.Namespace != b.Namespace {
			return compare(a.Namespace, b.Namespace)
		}
		return compare(a.Name, b.Name)
	})
	return out, nil
}

func cutSuffix(s, suffix string) (string, bool) {
	if len(s) > len(suffix) && s[len(s)-len(suffix):] == suffix {
		return s[:len(s)-len(suffix)], true
	}
	return "", false
}

func compare(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Get describes ns/name with its usage.
func (m *Manager) Get(ns, name string) (Info, error) {
	if err := checkNames(ns, name); err != nil {
		return Info{}, err
	}
	info, err := m.read(ns, name)
	if err != nil {
		return Info{}, err
	}
	info.LimitNote = m.limitNote(info)
	// A workspace whose directory cannot be reached is still described,
	// with why in its usage_error.
	_, dir, err := m.place(info)
	if err == nil {
		info.Usage, err = Usage(dir)
	}
	if err != nil {
		info.Usage, info.UsageError = -1, err.Error()
	}
	return info, nil
}

// Remove deletes ns/name: its directory, metadata and what its store
// holds. inUse, called under the lock Attach takes, reports whether a
// sandbox holds it; then it is refused (conflict).
func (m *Manager) Remove(ctx context.Context, ns, name string, inUse func() bool) error {
	if err := checkNames(ns, name); err != nil {
		return err
	}
	defer m.lock(ns, name)()
	info, err := m.read(ns, name)
	if err != nil {
		return err
	}
	if inUse != nil && inUse() {
		return errdefs.Errorf(errdefs.ErrConflict, "workspace %q is mounted by a sandbox of namespace %q; stop it first", name, ns)
	}
	st, dir, err := m.place(info)
	if err != nil {
		return err
	}
	if err := st.Delete(ctx, ns, name); err != nil {
		return fmt.Errorf("remove workspace %q from store %q: %w", name, info.Store, err)
	}
	// The metadata goes first: a removal cut short leaves files no
	// workspace names, never a workspace without its files.
	if err := os.Remove(m.metaPath(ns, name)); err != nil {
		return err
	}
	if err := m.removeDir(dir, info); err != nil {
		return fmt.Errorf("remove workspace %q's files: %w", name, err)
	}
	return nil
}

// Attach prepares ns/name for a sandbox that starts with it mounted and
// returns the directory to mount. first says no other sandbox holds it
// now: an object store's workspace is pulled then. A workspace over its
// quota is refused (limit). Every successful Attach is paired with a
// Detach when the sandbox stops.
func (m *Manager) Attach(ctx context.Context, ns, name string, first bool) (string, error) {
	if err := checkNames(ns, name); err != nil {
		return "", err
	}
	defer m.lock(ns, name)()
	info, err := m.read(ns, name)
	if err != nil {
		return "", err
	}
	st, dir, err := m.place(info)
	if err != nil {
		return "", err
	}
	if err := m.makeDir(dir, info); err != nil { // a cache directory removed by hand
		return "", err
	}
	if first && !info.KernelLimit && m.opts.Pool != "" {
		m.log.Warn("workspace without a kernel limit", "namespace", ns, "workspace", name, "why", m.limitNote(info))
	}
	if first && st.Kind() != "dir" {
		stats, err := m.withWriter(dir, func(root *confined.Root) (SyncStats, error) { return st.Pull(ctx, ns, name, root) })
		if err != nil {
			return "", fmt.Errorf("workspace %q: pull from store %q: %w", name, info.Store, err)
		}
		m.log.Info("workspace pulled", "namespace", ns, "workspace", name, "received", stats.Received, "deleted", stats.Deleted, "conflicts", len(stats.Conflicts))
	}
	used, err := Usage(dir)
	if err != nil {
		return "", fmt.Errorf("workspace %q: usage: %w", name, err)
	}
	if used > info.Quota {
		return "", errdefs.Errorf(errdefs.ErrLimit, "workspace %q uses %d bytes, above its quota of %d bytes; remove files (download, remove and upload) before mounting it", name, used, info.Quota)
	}
	return dir, nil
}

// Detach is told that a sandbox holding ns/name stopped: an object
// store's workspace is pushed.
func (m *Manager) Detach(ctx context.Context, ns, name string) error {
	_, err := m.Sync(ctx, ns, name, false)
	return err
}

// Sync pushes ns/name's changes to its store and, with pull, takes the
// store's changes in (docs/policy.md "Workspaces"). Conflicts are in the
// stats, not an error.
func (m *Manager) Sync(ctx context.Context, ns, name string, pull bool) (SyncStats, error) {
	if err := checkNames(ns, name); err != nil {
		return SyncStats{}, err
	}
	defer m.lock(ns, name)()
	info, err := m.read(ns, name)
	if err != nil {
		return SyncStats{}, err
	}
	st, dir, err := m.place(info)
	if err != nil {
		return SyncStats{}, err
	}
	if st.Kind() == "dir" {
		return SyncStats{}, nil
	}
	return m.withWriter(dir, func(root *confined.Root) (SyncStats, error) {
		stats, err := st.Push(ctx, ns, name, root)
		if err != nil || !pull {
			return stats, err
		}
		in, err := st.Pull(ctx, ns, name, root)
		stats.add(in)
		return stats, err
	})
}
