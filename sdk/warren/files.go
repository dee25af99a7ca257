package warren

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// File types, as reported in [FileInfo].Type.
const (
	TypeFile    = "file"
	TypeDir     = "dir"
	TypeSymlink = "symlink"
	TypeOther   = "other"
)

// FileInfo describes a file inside a sandbox.
type FileInfo struct {
	Name    string      `json:"name"`
	Path    string      `json:"path"`
	Size    int64       `json:"size"`
	Mode    fs.FileMode `json:"mode"` // permission and type bits as in os.FileMode
	Type    string      `json:"type"` // one of the Type* constants
	ModTime time.Time   `json:"mod_time"`
	Target  string      `json:"target,omitempty"` // a symlink's target (not followed)
}

// IsDir reports whether the file is a directory.
func (f FileInfo) IsDir() bool { return f.Type == TypeDir }

// Paths are absolute inside the sandbox; ".." and symlinks never leave it.
type fileParams struct {
	Sandbox   string `json:"sandbox"`
	Namespace string `json:"namespace,omitempty"`
	Path      string `json:"path"`
}

func (s *Sandbox) fileParams(path string) fileParams {
	return fileParams{Sandbox: s.Name, Namespace: s.c.namespace, Path: path}
}

// ReadFile returns the contents of the file at path (sandbox.file.read, up
// to 64 MiB; use [Sandbox.DownloadTar] for more).
func (s *Sandbox) ReadFile(ctx context.Context, path string) ([]byte, error) {
	var res struct {
		Data string `json:"data"`
		Size int64  `json:"size"`
	}
	if err := s.c.Call(ctx, "sandbox.file.read", s.fileParams(path), &res); err != nil {
		return nil, err
	}
	b, err := base64.StdEncoding.DecodeString(res.Data)
	if err != nil {
		return nil, fmt.Errorf("warren: sandbox.file.read: decode data: %w", err)
	}
	return b, nil
}

// WriteFile writes data to the file at path, creating or truncating it
// (sandbox.file.write). perm 0 means the server's default, 0644.
func (s *Sandbox) WriteFile(ctx context.Context, path string, data []byte, perm fs.FileMode) error {
	p := struct {
		fileParams
		Data string `json:"data"`
		Mode uint32 `json:"mode,omitempty"`
	}{s.fileParams(path), base64.StdEncoding.EncodeToString(data), uint32(perm.Perm())}
	return s.c.Call(ctx, "sandbox.file.write", p, nil)
}

// ListFiles lists the directory at path (sandbox.file.list).
func (s *Sandbox) ListFiles(ctx context.Context, path string) ([]FileInfo, error) {
	var res struct {
		Entries []FileInfo `json:"entries"`
	}
	if err := s.c.Call(ctx, "sandbox.file.list", s.fileParams(path), &res); err != nil {
		return nil, err
	}
	return res.Entries, nil
}

// Stat describes the file at path without following a final symlink
// (sandbox.file.stat).
func (s *Sandbox) Stat(ctx context.Context, path string) (FileInfo, error) {
	var fi FileInfo
	err := s.c.Call(ctx, "sandbox.file.stat", s.fileParams(path), &fi)
	return fi, err
}

type mkdirParams struct {
	fileParams
	Parents bool   `json:"parents,omitempty"`
	Mode    uint32 `json:"mode,omitempty"`
}

// Mkdir creates the directory path; its parent must exist. perm 0 means the
// server's default (0755).
func (s *Sandbox) Mkdir(ctx context.Context, path string, perm fs.FileMode) error {
	return s.c.Call(ctx, "sandbox.file.mkdir", mkdirParams{s.fileParams(path), false, uint32(perm.Perm())}, nil)
}

// MkdirAll creates the directory path and any missing parents.
func (s *Sandbox) MkdirAll(ctx context.Context, path string, perm fs.FileMode) error {
	return s.c.Call(ctx, "sandbox.file.mkdir", mkdirParams{s.fileParams(path), true, uint32(perm.Perm())}, nil)
}

type removeParams struct {
	fileParams
	Recursive bool `json:"recursive,omitempty"`
}

// RemoveFile removes the file or empty directory at path
// (sandbox.file.remove).
func (s *Sandbox) RemoveFile(ctx context.Context, path string) error {
	return s.c.Call(ctx, "sandbox.file.remove", removeParams{s.fileParams(path), false}, nil)
}

// RemoveAll removes path and everything under it.
func (s *Sandbox) RemoveAll(ctx context.Context, path string) error {
	return s.c.Call(ctx, "sandbox.file.remove", removeParams{s.fileParams(path), true}, nil)
}

// Move renames from to to (sandbox.file.move).
func (s *Sandbox) Move(ctx context.Context, from, to string) error {
	p := struct {
		Sandbox   string `json:"sandbox"`
		Namespace string `json:"namespace,omitempty"`
		From      string `json:"from"`
		To        string `json:"to"`
	}{s.Name, s.c.namespace, from, to}
	return s.c.Call(ctx, "sandbox.file.move", p, nil)
}

func (s *Sandbox) tarPath(path string) string {
	return "/api/v1/sandboxes/" + url.PathEscape(s.c.ns()) + "/" + url.PathEscape(s.Name) +
		"/tar?path=" + url.QueryEscape(path)
}

// UploadTar unpacks the tar stream r under the directory dir inside the
// sandbox (PUT /api/v1/sandboxes/{namespace}/{name}/tar, at most 1 GiB).
func (s *Sandbox) UploadTar(ctx context.Context, dir string, r io.Reader) error {
	req, err := s.c.newRequest(ctx, http.MethodPut, s.tarPath(dir), r)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := s.c.do(req, "upload tar")
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	return nil
}

// DownloadTar returns a tar stream of path (a file or a directory) inside
// the sandbox (GET /api/v1/sandboxes/{namespace}/{name}/tar). The caller
// must close it.
//
// The server bounds the tar stream (warren serve --max-tar-download, 1 GiB
// by default): a file over the limit is a [KindTooLarge] error here, and a
// directory whose tar passes it is cut there, which makes reading the
// stream fail with an error wrapping [io.ErrUnexpectedEOF] that names the
// limit.
func (s *Sandbox) DownloadTar(ctx context.Context, path string) (io.ReadCloser, error) {
	req, err := s.c.newRequest(ctx, http.MethodGet, s.tarPath(path), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/x-tar, application/json")
	resp, err := s.c.do(req, "download tar") //nolint:bodyclose // the caller closes it, through tarBody
	if err != nil {
		return nil, err
	}
	limit, _ := strconv.ParseInt(resp.Header.Get(tarLimitHeader), 10, 64)
	return &tarBody{ReadCloser: resp.Body, limit: limit}, nil
}

// tarLimitHeader carries the server's tar download limit in bytes.
const tarLimitHeader = "X-Warren-Tar-Limit"

// tarBody explains a download the server cut at its limit.
type tarBody struct {
	io.ReadCloser
	limit int64 // 0: unknown
	n     int64
}

func (b *tarBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n += int64(n)
	if errors.Is(err, io.ErrUnexpectedEOF) && b.limit > 0 && b.n >= b.limit {
		err = fmt.Errorf("warren: download tar: the server cut the stream at its limit of %d bytes (warren serve --max-tar-download): %w", b.limit, err)
	}
	return n, err
}
