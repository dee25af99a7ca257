package auth

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/store"
)

// DefaultKeyTTL is how long a key lives when its creator says nothing.
const DefaultKeyTTL = 30 * 24 * time.Hour

// Keys issues API keys and checks them against the api_keys table, where
// revocation is recorded.
type Keys struct {
	signer *Signer
	db     *sql.DB
	stmts  *store.Stmts // Verify's check runs on every request
	now    func() time.Time
}

// NewKeys returns the key store over db, signing with signer.
func NewKeys(signer *Signer, db *sql.DB) *Keys {
	return &Keys{signer: signer, db: db, stmts: store.NewStmts(db), now: time.Now}
}

// KeyRecord is a key as listed (the key itself is shown only at creation).
type KeyRecord struct {
	ID          string     `json:"id"`
	Namespace   string     `json:"namespace"`
	Description string     `json:"description"`
	Created     time.Time  `json:"created_at"`
	Expires     time.Time  `json:"expires_at"`
	Revoked     *time.Time `json:"revoked_at,omitempty"`
}

// Create issues a key for namespace ("*" = all) valid for ttl.
func (k *Keys) Create(ctx context.Context, namespace string, ttl time.Duration, description string) (string, KeyRecord, error) {
	if !ValidNamespace(namespace) {
		return "", KeyRecord{}, errdefs.Errorf(errdefs.ErrInvalid, "namespace %.70q: want \"*\" or 1-63 of [A-Za-z0-9_-] starting with a letter or digit", namespace)
	}
	if len(description) > 256 {
		return "", KeyRecord{}, errdefs.Errorf(errdefs.ErrInvalid, "description is longer than 256 bytes")
	}
	key, claims, err := k.signer.Issue(namespace, ttl, k.now())
	if err != nil {
		return "", KeyRecord{}, errdefs.Errorf(errdefs.ErrInvalid, "%w", err)
	}
	rec := KeyRecord{ID: claims.ID, Namespace: namespace, Description: description, Created: claims.IssuedAt, Expires: claims.ExpiresAt}
	if _, err := k.db.ExecContext(ctx, `INSERT INTO api_keys (id, namespace, description, created, expires) VALUES (?, ?, ?, ?, ?)`,
		rec.ID, rec.Namespace, rec.Description, rec.Created.UnixNano(), rec.Expires.UnixNano()); err != nil {
		return "", KeyRecord{}, fmt.Errorf("record key: %w", err)
	}
	return key, rec, nil
}

// List returns every key, newest first.
func (k *Keys) List(ctx context.Context) ([]KeyRecord, error) {
	rows, err := k.db.QueryContext(ctx, `SELECT id, namespace, description, created, expires, revoked FROM api_keys ORDER BY created DESC`)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rows.Close() }()
	out := []KeyRecord{}
	for rows.Next() {
		var r KeyRecord
		var created, expires, revoked int64
		if err := rows.Scan(&r.ID, &r.Namespace, &r.Description, &created, &expires, &revoked); err != nil {
			return nil, err
		}
		r.Created, r.Expires = time.Unix(0, created).UTC(), time.Unix(0, expires).UTC()
		if revoked != 0 {
			t := time.Unix(0, revoked).UTC()
			r.Revoked = &t
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Revoke makes the key id unusable from now on. Revoking twice is fine.
func (k *Keys) Revoke(ctx context.Context, id string) error {
	if id == "" {
		return errdefs.Errorf(errdefs.ErrInvalid, "key id is missing")
	}
	res, err := k.db.ExecContext(ctx, `UPDATE api_keys SET revoked = ? WHERE id = ? AND revoked = 0`, k.now().UnixNano(), id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		var one int
		if err := k.db.QueryRowContext(ctx, `SELECT 1 FROM api_keys WHERE id = ?`, id).Scan(&one); errors.Is(err, sql.ErrNoRows) {
			return errdefs.Errorf(errdefs.ErrNotFound, "key %.40q does not exist", id)
		}
	}
	return nil
}

// Verify checks a presented key: signature, expiry, and that it was issued
// by this server and not revoked. Keys without an id (made by microsandbox
// tooling with the same secret) cannot be revoked and are accepted on
// their signature.
func (k *Keys) Verify(ctx context.Context, key string) (Claims, error) {
	c, err := k.signer.Verify(key, k.now())
	if err != nil {
		if errors.Is(err, ErrExpired) {
			return Claims{}, errdefs.Errorf(errdefs.ErrUnauthorized, "API key expired; create a new one with 'warren key create'")
		}
		return Claims{}, errdefs.Errorf(errdefs.ErrUnauthorized, "invalid API key (%w)", err)
	}
	if c.ID == "" {
		return c, nil
	}
	var revoked int64
	err = k.stmts.QueryRow(ctx, `SELECT revoked FROM api_keys WHERE id = ?`, c.ID).Scan(&revoked)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Claims{}, errdefs.Errorf(errdefs.ErrUnauthorized, "API key is not known to this server")
	case err != nil:
		return Claims{}, fmt.Errorf("check API key: %w", err)
	case revoked != 0:
		return Claims{}, errdefs.Errorf(errdefs.ErrUnauthorized, "API key was revoked")
	}
	return c, nil
}
