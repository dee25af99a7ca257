package rpc

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/wire"
	"github.com/warren-sandbox/warren/internal/workspace"
)

// Workspaces: named, per-namespace directories sandboxes mount at
// /workspace (package workspace, docs/api.md). Their tar transfers are
// the routes /api/v1/workspaces/{namespace}/{name}/tar.

type workspaceRef struct {
	Workspace string `json:"workspace"`
	Namespace string `json:"namespace"`
}

type workspaceCreateParams struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Store     string `json:"store"`
	Quota     int64  `json:"quota"`
}

type workspaceInfo struct {
	Namespace  string    `json:"namespace"`
	Name       string    `json:"name"`
	Store      string    `json:"store"`
	Quota      int64     `json:"quota"`
	Usage      *int64    `json:"usage,omitempty"`
	UsageError string    `json:"usage_error,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	InUse      bool      `json:"in_use"`
	// KernelLimit: writes from inside sandboxes stop at the quota
	// (EDQUOT); LimitNote (get only) says why not when they do not.
	KernelLimit bool   `json:"kernel_limit"`
	LimitNote   string `json:"limit_note,omitempty"`
}

func (s *Server) toWorkspaceInfo(in workspace.Info, usage bool) workspaceInfo {
	out := workspaceInfo{Namespace: in.Namespace, Name: in.Name, Store: in.Store, Quota: in.Quota, CreatedAt: in.Created,
		UsageError: in.UsageError, InUse: s.mgr.WorkspaceInUse(in.Namespace, in.Name), KernelLimit: in.KernelLimit, LimitNote: in.LimitNote}
	if usage && in.Usage >= 0 {
		out.Usage = &in.Usage
	}
	return out
}

var errNoWorkspaceManager = errdefs.Errorf(errdefs.ErrUnavailable, "workspaces are not configured on this server")

func (s *Server) workspaces() (*workspace.Manager, error) {
	if s.opts.Workspaces == nil {
		return nil, errNoWorkspaceManager
	}
	return s.opts.Workspaces, nil
}

// resolveWorkspace checks a workspace's name and the caller's right to
// its namespace.
func (c *call) resolveWorkspace(ns, name string) (string, string, error) {
	if name == "" {
		return "", "", errdefs.Errorf(errInvalidParams, "the workspace's name is missing")
	}
	if !sandbox.ValidName(name) {
		return "", "", errdefs.Errorf(errInvalidParams, "workspace name %.70q: want 1-63 of [A-Za-z0-9_-] starting with a letter or digit", name)
	}
	ns, err := c.namespace(ns)
	return ns, name, err
}

func (s *Server) workspaceCreate(ctx context.Context, c *call, p *workspaceCreateParams) (any, error) {
	w, err := s.workspaces()
	if err != nil {
		return nil, err
	}
	ns, name, err := c.resolveWorkspace(p.Namespace, p.Name)
	if err != nil {
		return nil, err
	}
	info, err := w.Create(ctx, ns, name, p.Store, p.Quota)
	if err != nil {
		return nil, err
	}
	return s.toWorkspaceInfo(info, true), nil
}

type workspaceListParams struct {
	Namespace string `json:"namespace"`
}

type workspaceList struct {
	Workspaces []workspaceInfo `json:"workspaces"`
}

func (s *Server) workspaceList(_ context.Context, c *call, p *workspaceListParams) (any, error) {
	w, err := s.workspaces()
	if err != nil {
		return nil, err
	}
	nss, err := c.namespaces(p.Namespace)
	if err != nil {
		return nil, err
	}
	if nss == nil {
		nss = w.Namespaces()
	}
	infos, err := w.List(nss)
	if err != nil {
		return nil, err
	}
	out := workspaceList{Workspaces: []workspaceInfo{}}
	for _, in := range infos {
		out.Workspaces = append(out.Workspaces, s.toWorkspaceInfo(in, false))
	}
	return out, nil
}

func (s *Server) workspaceGet(_ context.Context, c *call, p *workspaceRef) (any, error) {
	w, err := s.workspaces()
	if err != nil {
		return nil, err
	}
	ns, name, err := c.resolveWorkspace(p.Namespace, p.Workspace)
	if err != nil {
		return nil, err
	}
	info, err := w.Get(ns, name)
	if err != nil {
		return nil, err
	}
	return s.toWorkspaceInfo(info, true), nil
}

func (s *Server) workspaceRemove(ctx context.Context, c *call, p *workspaceRef) (any, error) {
	w, err := s.workspaces()
	if err != nil {
		return nil, err
	}
	ns, name, err := c.resolveWorkspace(p.Namespace, p.Workspace)
	if err != nil {
		return nil, err
	}
	if err := w.Remove(ctx, ns, name, func() bool { return s.mgr.WorkspaceInUse(ns, name) }); err != nil {
		return nil, err
	}
	return done{}, nil
}

type workspaceSyncParams struct {
	workspaceRef
	// Push only: the store's changes are not taken in.
	PushOnly bool `json:"push_only"`
}

func (s *Server) workspaceSync(ctx context.Context, c *call, p *workspaceSyncParams) (any, error) {
	w, err := s.workspaces()
	if err != nil {
		return nil, err
	}
	ns, name, err := c.resolveWorkspace(p.Namespace, p.Workspace)
	if err != nil {
		return nil, err
	}
	st, err := w.Sync(ctx, ns, name, !p.PushOnly)
	if err != nil {
		return nil, err
	}
	out := syncResult{Sent: st.Sent, Received: st.Received, Deleted: st.Deleted, Unchanged: st.Unchanged, Conflicts: st.Conflicts}
	if out.Conflicts == nil {
		out.Conflicts = []string{}
	}
	return out, nil
}

// syncResult is what a workspace.sync moved (workspace.SyncStats).
type syncResult struct {
	Sent      int      `json:"sent"`
	Received  int      `json:"received"`
	Deleted   int      `json:"deleted"`
	Unchanged int      `json:"unchanged"`
	Conflicts []string `json:"conflicts"`
}

// workspaceTransfer authenticates a workspace tar route and resolves its
// workspace.
func (s *Server) workspaceTransfer(w http.ResponseWriter, r *http.Request) (*workspace.Manager, string, string, bool) {
	ctx := r.Context()
	claims, err := s.authenticate(r)
	if err != nil {
		s.writeError(w, ctx, nil, err, 0)
		return nil, "", "", false
	}
	c := &call{s: s, claims: claims, method: "tar"}
	ns := r.PathValue("namespace")
	if ns == defaultNamespaceSegment {
		ns = ""
	}
	ns, name, err := c.resolveWorkspace(ns, r.PathValue("name"))
	if err == nil {
		var wm *workspace.Manager
		if wm, err = s.workspaces(); err == nil {
			return wm, ns, name, true
		}
	}
	s.writeError(w, ctx, nil, err, 0)
	return nil, "", "", false
}

// serveWorkspaceUpload is workspace.upload: the body is a tar stream
// extracted into the workspace, within its quota.
func (s *Server) serveWorkspaceUpload(w http.ResponseWriter, r *http.Request) {
	wm, ns, name, ok := s.workspaceTransfer(w, r)
	if !ok {
		return
	}
	body := http.MaxBytesReader(w, r.Body, wire.MaxTarUpload)
	st, err := wm.Upload(ns, name, body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			err = errdefs.Errorf(errdefs.ErrTooLarge, "tar body is larger than %d MiB", wire.MaxTarUpload>>20)
		}
		s.writeError(w, r.Context(), nil, err, 0)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// serveWorkspaceDownload is workspace.download: the workspace's files as
// a tar stream, cut (the connection aborted) past the server's tar
// download limit, as a sandbox's.
func (s *Server) serveWorkspaceDownload(w http.ResponseWriter, r *http.Request) {
	wm, ns, name, ok := s.workspaceTransfer(w, r)
	if !ok {
		return
	}
	if _, err := wm.Get(ns, name); err != nil {
		s.writeError(w, r.Context(), nil, err, 0)
		return
	}
	w.Header().Set("Content-Type", "application/x-tar")
	w.Header().Set(TarLimitHeader, strconv.FormatInt(s.opts.MaxTarDownload, 10))
	w.WriteHeader(http.StatusOK)
	lw := &limitWriter{w: w, left: s.opts.MaxTarDownload}
	if err := wm.Download(ns, name, lw); err != nil {
		s.log.Info("workspace download cut short", "request_id", requestID(r.Context()), "namespace", ns, "workspace", name, "err", err)
		_ = http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler) // a truncated tar must not end cleanly
	}
}

// limitWriter fails writes past left bytes.
type limitWriter struct {
	w    http.ResponseWriter
	left int64
}

var errDownloadLimit = errors.New("past the server's tar download limit")

func (l *limitWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.left {
		n, _ := l.w.Write(p[:l.left])
		l.left -= int64(n)
		return n, errDownloadLimit
	}
	n, err := l.w.Write(p)
	l.left -= int64(n)
	return n, err
}
