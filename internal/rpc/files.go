package rpc

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/warren-sandbox/warren/internal/agent"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/wire"
)

// filePath names a path in a sandbox.
type filePath struct {
	agentRef
	Path string `json:"path"`
}

// onFile runs f against the agent of the sandbox ref names, for its path.
func (s *Server) onFile(ctx context.Context, c *call, ref filePath, f func(a *agent.Client) (any, error)) (any, error) {
	ns, name, err := c.resolveRef(ref.sandboxRef)
	if err != nil {
		return nil, err
	}
	if ref.Path == "" {
		return nil, errdefs.Errorf(errInvalidParams, "\"path\" is missing")
	}
	if !strings.HasPrefix(ref.Path, "/") {
		return nil, errdefs.Errorf(errInvalidParams, "path %q is not absolute (paths in a sandbox begin with /)", ref.Path)
	}
	return s.agentCall(ctx, ns, name, func(l *sandbox.Lease) (any, error) { return f(l.Agent()) })
}

// fileData is sandbox.file.read's answer: the file, base64.
type fileData struct {
	Data string `json:"data"`
	Size int    `json:"size"`
}

func (s *Server) fileRead(ctx context.Context, c *call, p *filePath) (any, error) {
	return s.onFile(ctx, c, *p, func(a *agent.Client) (any, error) {
		b, err := a.ReadFile(ctx, p.Path)
		if err != nil {
			return nil, err
		}
		return fileData{Data: base64.StdEncoding.EncodeToString(b), Size: len(b)}, nil
	})
}

// MaxFileWrite bounds the decoded data of one sandbox.file.write: its
// base64 text (4/3 of it, 62.7 MiB) and the rest of the request must fit
// the MaxBody of a JSON-RPC request. The agent would take more
// (wire.MaxFileWrite); bigger files go through the tar upload route.
const MaxFileWrite = 47 << 20

type fileWritten struct {
	Size int `json:"size"`
}

type fileWriteParams struct {
	filePath
	Data string `json:"data"`
	Mode uint32 `json:"mode"`
}

func (s *Server) fileWrite(ctx context.Context, c *call, p *fileWriteParams) (any, error) {
	return s.onFile(ctx, c, p.filePath, func(a *agent.Client) (any, error) {
		tooLarge := func(n int) error {
			return errdefs.Errorf(errdefs.ErrTooLarge, "data is %d bytes, more than the %d MiB sandbox.file.write takes; send bigger files with the tar upload route (PUT /api/v1/sandboxes/{namespace}/{name}/tar)", n, MaxFileWrite>>20)
		}
		// DecodedLen overstates by at most the 2 bytes of padding: no
		// decoding of what is surely too large (MCP calls are not bounded
		// by MaxBody).
		if n := base64.StdEncoding.DecodedLen(len(p.Data)); n > MaxFileWrite+2 {
			return nil, tooLarge(n)
		}
		b, err := base64.StdEncoding.DecodeString(p.Data)
		if err != nil {
			return nil, errdefs.Errorf(errInvalidParams, "\"data\" must be base64: %w", err)
		}
		if len(b) > MaxFileWrite {
			return nil, tooLarge(len(b))
		}
		mode := p.Mode
		if mode == 0 {
			mode = 0o644
		}
		if mode > 0o7777 {
			return nil, errdefs.Errorf(errInvalidParams, "mode %o: want permission bits (at most 07777)", mode)
		}
		if err := a.WriteFile(ctx, p.Path, bytes.NewReader(b), mode); err != nil {
			return nil, err
		}
		return fileWritten{Size: len(b)}, nil
	})
}

type fileList struct {
	Entries []fileInfo `json:"entries"`
}

func (s *Server) fileList(ctx context.Context, c *call, p *filePath) (any, error) {
	return s.onFile(ctx, c, *p, func(a *agent.Client) (any, error) {
		ents, err := a.List(ctx, p.Path)
		if err != nil {
			return nil, err
		}
		out := fileList{Entries: make([]fileInfo, len(ents))}
		for i, f := range ents {
			out.Entries[i] = toFileInfo(f)
		}
		return out, nil
	})
}

func (s *Server) fileStat(ctx context.Context, c *call, p *filePath) (any, error) {
	return s.onFile(ctx, c, *p, func(a *agent.Client) (any, error) {
		fi, err := a.Stat(ctx, p.Path)
		if err != nil {
			return nil, err
		}
		return toFileInfo(fi), nil
	})
}

type fileMkdirParams struct {
	filePath
	Parents bool   `json:"parents"`
	Mode    uint32 `json:"mode"`
}

func (s *Server) fileMkdir(ctx context.Context, c *call, p *fileMkdirParams) (any, error) {
	return s.onFile(ctx, c, p.filePath, func(a *agent.Client) (any, error) {
		return done{}, a.Mkdir(ctx, wire.MkdirRequest{Path: p.Path, Parents: p.Parents, Mode: p.Mode})
	})
}

type fileRemoveParams struct {
	filePath
	Recursive bool `json:"recursive"`
}

func (s *Server) fileRemove(ctx context.Context, c *call, p *fileRemoveParams) (any, error) {
	return s.onFile(ctx, c, p.filePath, func(a *agent.Client) (any, error) {
		return done{}, a.Remove(ctx, wire.RemoveRequest{Path: p.Path, Recursive: p.Recursive})
	})
}

type fileMoveParams struct {
	agentRef
	From string `json:"from"`
	To   string `json:"to"`
}

func (s *Server) fileMove(ctx context.Context, c *call, p *fileMoveParams) (any, error) {
	return s.onSandbox(ctx, c, p.sandboxRef, func(l *sandbox.Lease) (any, error) {
		if p.From == "" || p.To == "" {
			return nil, errdefs.Errorf(errInvalidParams, "\"from\" and \"to\" are both needed")
		}
		return done{}, l.Agent().Move(ctx, p.From, p.To)
	})
}

// defaultNamespaceSegment in a tar route's {namespace} stands for the
// namespace a JSON-RPC request without one gets (the key's own, or
// "default"); it is not a valid namespace name.
const defaultNamespaceSegment = "-"

// transfer resolves a tar route's sandbox and the caller's right to it,
// and leases the sandbox.
func (s *Server) transfer(w http.ResponseWriter, r *http.Request) (*sandbox.Lease, string, bool) {
	ctx := r.Context()
	claims, err := s.authenticate(r)
	if err != nil {
		s.writeError(w, ctx, nil, err, 0)
		return nil, "", false
	}
	c := &call{s: s, claims: claims, method: "tar"}
	_ = auditHTTP(ctx, c)
	ns := r.PathValue("namespace")
	if ns == defaultNamespaceSegment {
		ns = "" // as for a request that names none
	}
	ns, name, err := c.resolve(ns, r.PathValue("name"))
	if err != nil {
		s.writeError(w, ctx, nil, err, 0)
		return nil, "", false
	}
	p := r.URL.Query().Get("path")
	if p == "" {
		s.writeError(w, ctx, nil, errdefs.Errorf(errInvalidParams, "query parameter \"path\" is missing"), 0)
		return nil, "", false
	}
	l, err := s.lease(withResumeQuery(ctx, r), ns, name)
	if err != nil {
		s.writeError(w, ctx, nil, err, 0)
		return nil, "", false
	}
	return l, p, true
}

// TarLimitHeader carries a tar download's size limit in bytes, so that a
// client whose download ends early can tell the limit cut it.
const TarLimitHeader = "X-Warren-Tar-Limit"

func (s *Server) serveTarDownload(w http.ResponseWriter, r *http.Request) {
	l, p, ok := s.transfer(w, r)
	if !ok {
		return
	}
	defer l.Release()
	a := l.Agent()
	ctx := r.Context()
	limit := s.opts.MaxTarDownload
	// A file's size is known before anything is sent: one over the limit
	// gets a proper error. A directory's is not (the agent streams the tar
	// as it walks), so its download is cut when it passes the limit.
	if fi, err := a.Stat(ctx, p); err == nil && fi.Type == "file" && fi.Size > limit {
		s.writeError(w, ctx, nil, errdefs.Errorf(errdefs.ErrTooLarge,
			"%.200s is %d bytes, more than this server's tar download limit of %d bytes (warren serve --max-tar-download); download a directory's parts separately or split the file in the sandbox",
			p, fi.Size, limit), 0)
		return
	}
	rc, err := a.DownloadTar(ctx, p)
	if err != nil {
		s.writeError(w, ctx, nil, l.Explain(ctx, "the tar was downloaded", err), 0)
		return
	}
	defer rc.Close() //nolint:errcheck // the download's read side: closing it loses no data, and the copy below is judged on its own
	w.Header().Set("Content-Type", "application/x-tar")
	w.Header().Set(TarLimitHeader, strconv.FormatInt(limit, 10))
	w.WriteHeader(http.StatusOK)
	n, err := io.CopyN(w, rc, limit)
	if errors.Is(err, io.EOF) {
		return // the whole tar, within the limit
	}
	if err != nil {
		if !errors.Is(err, os.ErrClosed) {
			s.log.Info("tar download cut short", "request_id", requestID(ctx), "err", err)
		}
		return
	}
	if more, _ := io.CopyN(io.Discard, rc, 1); more == 0 {
		return // exactly the limit
	}
	// Over the limit. The status is sent already, so the connection is
	// cut: the client's read fails (unexpected EOF) instead of ending
	// cleanly on a truncated tar that might look complete.
	s.log.Info("tar download over the limit: cut", "request_id", requestID(ctx), "path", p, "bytes", n, "limit", limit)
	_ = http.NewResponseController(w).Flush() // the client gets every byte up to the limit
	panic(http.ErrAbortHandler)
}

func (s *Server) serveTarUpload(w http.ResponseWriter, r *http.Request) {
	l, p, ok := s.transfer(w, r)
	if !ok {
		return
	}
	defer l.Release()
	a := l.Agent()
	body := http.MaxBytesReader(w, r.Body, wire.MaxTarUpload)
	if err := a.UploadTar(r.Context(), p, body); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			err = errdefs.Errorf(errdefs.ErrTooLarge, "tar body is larger than %d MiB", wire.MaxTarUpload>>20)
		}
		s.writeError(w, r.Context(), nil, l.Explain(r.Context(), "the tar was uploaded", err), 0)
		return
	}
	writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
}
