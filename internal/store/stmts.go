package store

import (
	"context"
	"database/sql"
	"sync"
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

// Exec executes query, prepared once.
func (s *Stmts) Exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	st, err := s.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

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
