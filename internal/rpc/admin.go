package rpc

import (
	"context"
	"time"

	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/image"
)

type imageInfo struct {
	Name      string    `json:"name"`
	ID        string    `json:"id"`
	Size      int64     `json:"size"`
	Layers    int       `json:"layers"`
	CreatedAt time.Time `json:"created_at"`
}

func toImageInfo(r *image.Record) imageInfo {
	return imageInfo{Name: r.Name, ID: r.ID, Size: r.Size, Layers: len(r.Layers), CreatedAt: r.Created.UTC()}
}

func (s *Server) images() (*image.Store, error) {
	if s.opts.Images == nil {
		return nil, errdefs.Errorf(errdefs.ErrUnavailable, "this server has no image store")
	}
	return s.opts.Images, nil
}

type imageList struct {
	Images []imageInfo `json:"images"`
}

func (s *Server) imageList(_ context.Context, _ *call, _ *noParams) (any, error) {
	st, err := s.images()
	if err != nil {
		return nil, err
	}
	recs, err := st.List()
	if err != nil {
		return nil, err
	}
	out := make([]imageInfo, len(recs))
	for i := range recs {
		out[i] = toImageInfo(&recs[i])
	}
	return imageList{Images: out}, nil
}

type imagePullParams struct {
	Ref      string `json:"ref"`
	Name     string `json:"name"`
	Platform string `json:"platform"`
	Insecure bool   `json:"insecure"`
}

func (s *Server) imagePull(ctx context.Context, c *call, p *imagePullParams) (any, error) {
	if err := c.requireAdmin(); err != nil {
		return nil, err
	}
	if p.Ref == "" {
		return nil, errdefs.Errorf(errInvalidParams, "\"ref\" is missing")
	}
	st, err := s.images()
	if err != nil {
		return nil, err
	}
	// A pull outlives a client that gave up: others may be waiting on it.
	rec, err := st.Pull(context.WithoutCancel(ctx), p.Ref, p.Name, image.PullOptions{Platform: p.Platform, Insecure: p.Insecure})
	if err != nil {
		return nil, image.PullFailed(p.Ref, err)
	}
	return toImageInfo(rec), nil
}

func (s *Server) keys() (*auth.Keys, error) {
	if s.opts.Keys == nil {
		return nil, errdefs.Errorf(errdefs.ErrUnavailable, "this server runs in dev mode without API keys")
	}
	return s.opts.Keys, nil
}

// adminKeys returns the key store, for an admin caller of a server that
// has one.
func (s *Server) adminKeys(c *call) (*auth.Keys, error) {
	if err := c.requireAdmin(); err != nil {
		return nil, err
	}
	return s.keys()
}

type keyCreateParams struct {
	Namespace   string  `json:"namespace"`
	Expire      float64 `json:"expire"`
	Description string  `json:"description"`
}

// keyCreated is key.create's answer, the only one that shows the key.
type keyCreated struct {
	ExpiresAt time.Time `json:"expires_at"`
	ID        string    `json:"id"`
	Key       string    `json:"key"`
	Namespace string    `json:"namespace"`
}

func (s *Server) keyCreate(ctx context.Context, c *call, p *keyCreateParams) (any, error) {
	ks, err := s.adminKeys(c)
	if err != nil {
		return nil, err
	}
	ttl, err := seconds("expire", p.Expire, 10*365*24*time.Hour)
	if err != nil {
		return nil, err
	}
	if ttl == 0 {
		ttl = auth.DefaultKeyTTL
	}
	k, rec, err := ks.Create(ctx, p.Namespace, ttl, p.Description)
	if err != nil {
		return nil, err
	}
	s.auditKeyChange(ctx, c, "create", rec.ID, rec.Namespace)
	return keyCreated{ID: rec.ID, Key: k, Namespace: rec.Namespace, ExpiresAt: rec.Expires.UTC()}, nil
}

// keyInfo is a key as listed (the key itself is shown only at creation).
type keyInfo struct {
	ID          string     `json:"id"`
	Namespace   string     `json:"namespace"`
	Description string     `json:"description"`
	CreatedAt   time.Time  `json:"created_at"`
	ExpiresAt   time.Time  `json:"expires_at"`
	RevokedAt   *time.Time `json:"revoked_at,omitempty"`
}

type keyList struct {
	Keys []keyInfo `json:"keys"`
}

func (s *Server) keyList(ctx context.Context, c *call, _ *noParams) (any, error) {
	ks, err := s.adminKeys(c)
	if err != nil {
		return nil, err
	}
	recs, err := ks.List(ctx)
	if err != nil {
		return nil, err
	}
	out := keyList{Keys: make([]keyInfo, len(recs))}
	for i, r := range recs {
		out.Keys[i] = keyInfo{ID: r.ID, Namespace: r.Namespace, Description: r.Description, CreatedAt: r.Created, ExpiresAt: r.Expires, RevokedAt: r.Revoked}
	}
	return out, nil
}

type keyRevokeParams struct {
	ID string `json:"id"`
}

type revokedResult struct {
	Revoked bool `json:"revoked"`
}

func (s *Server) keyRevoke(ctx context.Context, c *call, p *keyRevokeParams) (any, error) {
	ks, err := s.adminKeys(c)
	if err != nil {
		return nil, err
	}
	if err := ks.Revoke(ctx, p.ID); err != nil {
		return nil, err
	}
	s.auditKeyChange(ctx, c, "revoke", p.ID, "")
	return revokedResult{Revoked: true}, nil
}
