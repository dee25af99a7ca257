package store

import (
	"context"
	"database/sql"
	"errors"
	"sync"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/warren-sandbox/warren/internal/errdefs"
)

// Stmts prepares each statement once, on first use, and keeps it for the
// hot paths (a request's key check, a sandbox's state changes). SQLite's
// parse and plan are most of a small statement's cost: re-parsing the same
// few statements was 1.5% of all CPU in the 8-client server benchmark.
// The statements are the callers' constants, so the cache is bounded.
type Stmts struct {
	db *sql.DB
	mu sync.Mutex
	m  map[string]*sql.Stmt
}

// NewStmts returns an empty cache over db; db.Close closes its statements.
func NewStmts(db *sql.DB) *Stmts { return &Stmts{db: db, m: map[string]*sql.Stmt{}} }

func (s *Stmts) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.m[query]; st != nil {
		return st, nil
	}
	st, err := s.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	s.m[query] = st
	return st, nil
}

// Exec executes query, prepared once. A write the database cannot take
// now (see Classify) is an unavailable error.
func (s *Stmts) Exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	st, err := s.stmt(ctx, query)
	if err != nil {
		return nil, Classify(err)
	}
	r, err := st.ExecContext(ctx, args...)
	return r, Classify(err)
}

// Classify gives the database's transient failures a kind a client can act
// on: its lock held past the busy timeout (another process writing) and
// its file system full are unavailable, with words saying so instead of
// SQLite's; the cause stays wrapped. Other errors are returned as they
// are.
func Classify(err error) error {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return err
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return errdefs.Errorf(errdefs.ErrUnavailable, "%w", &dbError{"the server's database is locked by another process; try again", err})
	case sqlite3.SQLITE_FULL:
		return errdefs.Errorf(errdefs.ErrUnavailable, "%w", &dbError{"the server's data directory is full; try again once an operator has freed space", err})
	}
	return err
}

// dbError is a database failure told in the client's words.
type dbError struct {
	msg string
	err error
}

func (e *dbError) Error() string { return e.msg }
func (e *dbError) Unwrap() error { return e.err }

// QueryRow runs query, prepared once, for at most one row. A failure to
// prepare is the row's Scan error.
func (s *Stmts) QueryRow(ctx context.Context, query string, args ...any) *sql.Row {
	st, err := s.stmt(ctx, query)
	if err != nil {
		// A Row carries its error only from database/sql itself: run the
		// query unprepared, which reports the same error at Scan.
		return s.db.QueryRowContext(ctx, query, args...)
	}
	return st.QueryRowContext(ctx, args...)
}
