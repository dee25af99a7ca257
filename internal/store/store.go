// Package store is the daemon's SQLite database: one file under the data
// directory, opened with modernc.org/sqlite (pure Go), in WAL mode with a busy
// timeout and foreign keys on, and brought to the current schema by numbered
// migrations.
//
// Migrations are append-only: a released migration is never edited, a schema
// change is a new entry at the end of the list. Each one runs in its own
// transaction together with the row recording it in schema_migrations, so a
// crash leaves the database at a whole version. A database whose version is
// newer than this binary knows is refused rather than used.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// busyTimeout is how long a statement waits for another connection's write
// lock before failing with SQLITE_BUSY.
const busyTimeout = 10 * time.Second

// maxOpenConns bounds the pool. WAL allows readers alongside one writer;
// writers queue on the busy timeout.
const maxOpenConns = 8

// ErrSchemaTooNew is returned by Open for a database written by a newer
// binary.
var ErrSchemaTooNew = errors.New("database schema is newer than this binary supports")

// Migration is one schema step. Version numbers start at 1 and are
// consecutive.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// migrations is the schema history. Append only.
var migrations = []Migration{
	{1, "images", `
CREATE TABLE layers (
	diff_id TEXT PRIMARY KEY,           -- "sha256:<hex>" of the uncompressed tar
	size    INTEGER NOT NULL,           -- bytes on disk once unpacked
	created INTEGER NOT NULL            -- unix nanoseconds
) STRICT;
CREATE TABLE images (
	id      TEXT PRIMARY KEY,           -- "sha256:<hex>" of the image config
	config  BLOB NOT NULL,              -- JSON runtime defaults (Env, Cmd, ...)
	created INTEGER NOT NULL
) STRICT;
CREATE TABLE image_layers (
	image_id TEXT NOT NULL REFERENCES images(id) ON DELETE CASCADE,
	position INTEGER NOT NULL,          -- 0 = base layer
	diff_id  TEXT NOT NULL REFERENCES layers(diff_id),
	PRIMARY KEY (image_id, position)
) STRICT;
CREATE INDEX image_layers_diff_id ON image_layers(diff_id);
CREATE TABLE image_names (
	name     TEXT PRIMARY KEY,
	image_id TEXT NOT NULL REFERENCES images(id) ON DELETE CASCADE,
	created  INTEGER NOT NULL
) STRICT;
CREATE INDEX image_names_image_id ON image_names(image_id);
`},
	{2, "sandboxes and api keys", `
CREATE TABLE sandboxes (
	id         TEXT PRIMARY KEY,        -- the backend's id ("sb-<hex>")
	namespace  TEXT NOT NULL,
	name       TEXT NOT NULL,
	state      TEXT NOT NULL,           -- starting, running, stopping, stopped, error
	error      TEXT NOT NULL DEFAULT '',
	spec       BLOB NOT NULL,           -- JSON: image, limits, env, labels, timeouts
	created    INTEGER NOT NULL,        -- unix nanoseconds
	started    INTEGER NOT NULL DEFAULT 0,
	stopped    INTEGER NOT NULL DEFAULT 0,
	UNIQUE (namespace, name)
) STRICT;
CREATE TABLE api_keys (
	id          TEXT PRIMARY KEY,       -- the key's jti claim
	namespace   TEXT NOT NULL,
	description TEXT NOT NULL DEFAULT '',
	created     INTEGER NOT NULL,
	expires     INTEGER NOT NULL,
	revoked     INTEGER NOT NULL DEFAULT 0   -- unix nanoseconds; 0 = valid
) STRICT;
`},
	// The image a sandbox was first started from, by id: it is started
	// from the same layers every time, even once its name points
	// elsewhere, and the image store keeps an image a sandbox uses.
	{3, "sandbox image ids", `
ALTER TABLE sandboxes ADD COLUMN image_id TEXT NOT NULL DEFAULT '';  -- "sha256:<hex>"; '' = host or not started yet
CREATE INDEX sandboxes_image_id ON sandboxes(image_id);
`},
}

// Store is an open database.
type Store struct {
	db *sql.DB
}

// Open opens (creating if needed) the database at path and migrates it to
// the current schema.
func Open(path string) (*Store, error) {
	return open(path, migrations)
}

func open(path string, migs []Migration) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeout.Milliseconds()))
	q.Add("_pragma", "foreign_keys(1)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	// IMMEDIATE: a write transaction takes the write lock at BEGIN, so two
	// writers queue on the busy timeout instead of one failing on lock
	// upgrade (SQLITE_BUSY that busy_timeout cannot retry).
	q.Set("_txlock", "immediate")
	dsn := "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + q.Encode()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(maxOpenConns)
	db.SetMaxIdleConns(maxOpenConns)
	db.SetConnMaxIdleTime(5 * time.Minute)
	s := &Store{db: db}
	if err := s.migrate(context.Background(), migs); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("store: %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("store: %w", err)
	}
	return s, nil
}

// DB is the underlying handle, for the packages that own tables.
func (s *Store) DB() *sql.DB { return s.db }

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// Version reports the schema version the database is at.
func (s *Store) Version(ctx context.Context) (int, error) {
	return version(ctx, s.db)
}

type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func version(ctx context.Context, q querier) (int, error) {
	var v sql.NullInt64
	if err := q.QueryRowContext(ctx, `SELECT MAX(version) FROM schema_migrations`).Scan(&v); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return int(v.Int64), nil
}

func (s *Store) migrate(ctx context.Context, migs []Migration) error {
	for i, m := range migs {
		if m.Version != i+1 {
			return fmt.Errorf("migration %q has version %d, want %d", m.Name, m.Version, i+1)
		}
	}
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
	version INTEGER PRIMARY KEY,
	name    TEXT NOT NULL,
	applied INTEGER NOT NULL
)`); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	for _, m := range migs {
		if err := s.apply(ctx, m, len(migs)); err != nil {
			return err
		}
	}
	// Refuse a database from the future even when nothing was applied.
	v, err := version(ctx, s.db)
	if err != nil {
		return err
	}
	if v > len(migs) {
		return fmt.Errorf("%w: database is at version %d, this binary knows up to %d", ErrSchemaTooNew, v, len(migs))
	}
	return nil
}

// apply runs m unless it is already recorded, in one transaction with its
// schema_migrations row. The version is read inside the transaction (which
// holds the write lock), so two processes opening the same file never apply
// a migration twice.
func (s *Store) apply(ctx context.Context, m Migration, latest int) (err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migration %d (%s): %w", m.Version, m.Name, err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	v, err := version(ctx, tx)
	if err != nil {
		return err
	}
	if v > latest {
		return fmt.Errorf("%w: database is at version %d, this binary knows up to %d", ErrSchemaTooNew, v, latest)
	}
	if v >= m.Version {
		return tx.Rollback()
	}
	if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
		return fmt.Errorf("migration %d (%s): %w", m.Version, m.Name, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied) VALUES (?, ?, ?)`,
		m.Version, m.Name, time.Now().UnixNano()); err != nil {
		return fmt.Errorf("migration %d (%s): record: %w", m.Version, m.Name, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migration %d (%s): commit: %w", m.Version, m.Name, err)
	}
	return nil
}
