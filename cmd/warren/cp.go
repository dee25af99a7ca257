package main

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/warren-sandbox/warren/internal/confined"
)

const cpAbout = `
Copies files and directories between the host and a sandbox of a running
server, as 'docker cp' does. One side is NAME:PATH (PATH absolute in the
sandbox), the other a host path, or - for a tar stream on standard input
(unpacked into the directory PATH) or output (of PATH).

Copying SRC to DST: when DST is an existing directory, SRC goes into it
under its own name; otherwise SRC is copied to DST itself (a file replaces
a file; DST's directory must exist). Symlinks are copied as symlinks;
ownership is not kept; setuid, setgid and sticky bits are dropped.

What comes from the sandbox is unpacked confined to the directory it is
copied into: no entry, symlink or hard link in it can write outside.

Examples:
  warren cp ./src demo:/work          # /work/src in the sandbox
  warren cp demo:/work/out.txt .
  warren cp demo:/work - | tar t`

// isSandboxName says whether s has the form of sandbox names (docs/api.md:
// 1-63 of [A-Za-z0-9_-], starting with a letter or digit), which tells
// NAME:PATH from a host path. Checked by hand: a regexp compiled at start
// would cost every command.
func isSandboxName(s string) bool {
	if s == "" || len(s) > 63 || s[0] == '_' || s[0] == '-' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// cpRef is one side of a copy: a host path (name "") or a sandbox's path.
type cpRef struct{ name, path string }

func parseCpRef(s string) cpRef {
	if name, p, ok := strings.Cut(s, ":"); ok && isSandboxName(name) {
		return cpRef{name, p}
	}
	return cpRef{path: s}
}

func cpCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren cp", "warren cp [--namespace NS] SRC DST", cpAbout)
	c, ns := clientFlags(fs)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return argsError(fs, "want SRC and DST, got %d arguments", len(pos))
	}
	src, dst := parseCpRef(pos[0]), parseCpRef(pos[1])
	switch {
	case (src.name == "") == (dst.name == ""):
		return argsError(fs, "one of SRC and DST must be NAME:PATH, the other a host path or -")
	case src.name != "" && !path.IsAbs(src.path), dst.name != "" && !path.IsAbs(dst.path):
		return argsError(fs, "the sandbox's PATH must be absolute")
	}
	if src.name != "" {
		return c.copyOut(ctx, *ns, src, dst.path)
	}
	return c.copyIn(ctx, *ns, src.path, dst)
}

// statSandbox returns the type of p in the sandbox ("file", "dir",
// "symlink", "other"), "" when it does not exist.
func (c *apiClient) statSandbox(ctx context.Context, ns, name, p string) (string, error) {
	var fi struct {
		Type string `json:"type"`
	}
	err := c.call(ctx, "sandbox.file.stat", map[string]any{"namespace": ns, "sandbox": name, "path": p}, &fi)
	var re *rpcError
	if errors.As(err, &re) && re.Data["kind"] == "not_found" && strings.Contains(re.Message, p) {
		return "", nil
	}
	return fi.Type, err
}

// copyIn copies the host's src (or a tar on stdin, "-") into the sandbox.
func (c *apiClient) copyIn(ctx context.Context, ns, src string, dst cpRef) error {
	if src == "-" {
		return c.putTar(ctx, ns, dst.name, dst.path, os.Stdin)
	}
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	typ, err := c.statSandbox(ctx, ns, dst.name, dst.path)
	if err != nil {
		return err
	}
	// Where SRC goes: into DST under its own name, or as DST.
	dir, base := dst.path, filepath.Base(src)
	switch {
	case typ == "dir":
	case typ != "" && fi.IsDir():
		return fmt.Errorf("%s:%s is not a directory: cannot copy the directory %s onto it", dst.name, dst.path, src)
	default:
		dir, base = path.Dir(dst.path), path.Base(dst.path)
		if t, err := c.statSandbox(ctx, ns, dst.name, dir); err != nil {
			return err
		} else if t != "dir" {
			return fmt.Errorf("%s:%s: no such directory", dst.name, dir)
		}
	}
	var root *confined.Root
	var tarName string
	if fi.IsDir() {
		// Its contents, unpacked into dir/base.
		tarName, dir = "/", path.Join(dir, base)
		if root, err = confined.Open(src); err != nil {
			return err
		}
	} else {
		if root, err = confined.Open(filepath.Dir(src)); err != nil {
			return err
		}
		tarName = filepath.Base(src)
	}
	defer func() { _ = root.Close() }()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(root.WriteTar(pw, tarName)) }()
	body := io.Reader(pr)
	if !fi.IsDir() {
		body = renameTar(pr, base)
	}
	err = c.putTar(ctx, ns, dst.name, dir, body)
	_ = pr.CloseWithError(errors.New("upload ended")) // the writer, if still going, stops
	return err
}

// copyOut copies the sandbox's src to the host's dst (or a tar on
// stdout, "-").
func (c *apiClient) copyOut(ctx context.Context, ns string, src cpRef, dst string) error {
	typ, err := c.statSandbox(ctx, ns, src.name, src.path)
	if err != nil {
		return err
	}
	if typ == "" {
		return fmt.Errorf("%s:%s: no such file or directory", src.name, src.path)
	}
	body, err := c.getTar(ctx, ns, src.name, src.path)
	if err != nil {
		return err
	}
	defer func() { _ = body.Close() }()
	if dst == "-" {
		_, err = io.Copy(os.Stdout, body)
		return err
	}
	fi, err := os.Stat(dst)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	// rootDir confines the extraction; name is the directory in it the
	// tar's entries are relative to.
	rootDir, name := dst, "/"
	tr := io.Reader(body)
	switch {
	case err == nil && fi.IsDir():
		if typ == "dir" {
			name = path.Base(src.path)
		}
	case err == nil && typ == "dir":
		return fmt.Errorf("%s is not a directory: cannot copy the directory %s:%s onto it", dst, src.name, src.path)
	default:
		rootDir = filepath.Dir(dst)
		if typ == "dir" {
			name = filepath.Base(dst)
		} else {
			tr = renameTar(body, filepath.Base(dst))
		}
	}
	root, err := confined.Open(rootDir)
	if err != nil {
		return err
	}
	defer func() { _ = root.Close() }()
	if _, err := root.ExtractTar(tr, name, confined.TarLimits{}); err != nil {
		return fmt.Errorf("copy %s:%s to %s: %w", src.name, src.path, dst, err)
	}
	return nil
}

// renameTar passes on a tar of one entry under name instead of its own. A
// second entry fails it: a file swapped for a directory in the sandbox
// since it was looked at.
func renameTar(r io.Reader, name string) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		tr, tw := tar.NewReader(r), tar.NewWriter(pw)
		err := func() error {
			hdr, err := tr.Next()
			if err != nil {
				return fmt.Errorf("read the tar: %w", err)
			}
			hdr.Name = name
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			// Not decompression: the entry's bytes as they come, bounded
			// by the server's tar limit and the extraction's.
			if _, err := io.Copy(tw, tr); err != nil { //nolint:gosec // G110: see above
				return err
			}
			if _, err := tr.Next(); !errors.Is(err, io.EOF) {
				return errors.New("the tar holds more than the one file expected (did it become a directory?)")
			}
			return tw.Close()
		}()
		pw.CloseWithError(err)
	}()
	return pr
}

// tarURL is the server's tar route of a sandbox's path (kind
// "sandboxes", query path) or of a workspace (kind "workspaces").
func (c *apiClient) tarURL(kind, ns, name string, query url.Values) string {
	u := fmt.Sprintf("%s/api/v1/%s/%s/%s/tar", strings.TrimRight(c.url, "/"), kind, url.PathEscape(pathNamespace(ns)), url.PathEscape(name))
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	return u
}

func (c *apiClient) putTar(ctx context.Context, ns, name, p string, body io.Reader) error {
	resp, err := c.tarRequest(ctx, "PUT", c.tarURL("sandboxes", ns, name, url.Values{"path": {p}}), body)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return resp.Body.Close()
}

func (c *apiClient) getTar(ctx context.Context, ns, name, p string) (io.ReadCloser, error) {
	resp, err := c.tarRequest(ctx, "GET", c.tarURL("sandboxes", ns, name, url.Values{"path": {p}}), nil)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// tarRequest sends a request to a tar route and returns the response of
// one that succeeded; a failed one's JSON error is the error.
func (c *apiClient) tarRequest(ctx context.Context, method, u string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the server at %s (is 'warren serve' running?): %w", c.url, err)
	}
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	defer func() { _ = resp.Body.Close() }()
	return nil, c.explainResponse(resp, fmt.Errorf("server answered %s", resp.Status))
}
