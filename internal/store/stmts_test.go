package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"modernc.org/sqlite"

	"github.com/warren-sandbox/warren/internal/errdefs"
)

// TestStmts: a statement is prepared once and reused, concurrently, with
// the same results as unprepared; a bad statement is an error, not cached.
func TestStmts(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "warren.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	ctx := context.Background()
	st := NewStmts(s.DB())
	const insert = `INSERT INTO layers (diff_id, size, created) VALUES (?, ?, 0)`
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := st.Exec(ctx, insert, fmt.Sprintf("sha256:%02x", i), i)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(st.m) != 1 {
		t.Errorf("%d statements cached, want 1", len(st.m))
	}
	var n int64
	// sha256:27 was inserted by i = 0x27.
	if err := st.QueryRow(ctx, `SELECT size FROM layers WHERE diff_id = ?`, "sha256:27").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0x27 {
		t.Errorf("size = %d, want 39", n)
	}
	if _, err := st.Exec(ctx, `INSERT INTO no_such_table VALUES (1)`); err == nil {
		t.Error("a statement on a missing table executed")
	}
	if err := st.QueryRow(ctx, `SELECT nothing FROM no_such_table`).Scan(&n); err == nil {
		t.Error("a query on a missing table returned a row")
	}
	if len(st.m) != 2 {
		t.Errorf("%d statements cached after two bad ones, want 2 (the good ones only)", len(st.m))
	}
}

// TestClassify: the database's lock held by another process and its file
// full are unavailable (retryable) errors in the client's words, made from
// real SQLite failures; other errors keep their kind.
func TestClassify(t *testing.T) {
	path := filepath.Join(t.TempDir(), "warren.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	ctx := context.Background()
	// Another process's write lock, met by a connection that does not wait.
	other, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(0)")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Close() }()
	conn, err := s.DB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	_, busy := NewStmts(other).Exec(ctx, `INSERT INTO layers (diff_id, size, created) VALUES ('sha256:aa', 1, 0)`)
	_, _ = conn.ExecContext(ctx, "ROLLBACK")
	_ = conn.Close()
	// A full database: more pages than it may have.
	if _, err := s.DB().ExecContext(ctx, "PRAGMA max_page_count = 8"); err != nil {
		t.Fatal(err)
	}
	st := NewStmts(s.DB())
	var full error
	for i := 0; i < 1000 && full == nil; i++ {
		_, full = st.Exec(ctx, `INSERT INTO layers (diff_id, size, created) VALUES (?, ?, 0)`, fmt.Sprintf("sha256:%0600d", i), i)
	}
	_, syntax := st.Exec(ctx, `INSERT INTO nowhere VALUES (1)`)
	for _, tc := range []struct {
		name string
		err  error
		kind string
		msg  string
	}{
		{"busy", busy, "unavailable", "the server's database is locked by another process; try again"},
		{"full", full, "unavailable", "the server's data directory is full; try again once an operator has freed space"},
		{"other", syntax, errdefs.Internal, "no such table"},
	} {
		if tc.err == nil || errdefs.Kind(tc.err) != tc.kind || !strings.Contains(tc.err.Error(), tc.msg) {
			t.Errorf("%s: %v (kind %s), want kind %s and %q", tc.name, tc.err, errdefs.Kind(tc.err), tc.kind, tc.msg)
		}
		var se *sqlite.Error
		if tc.err != nil && !errors.As(tc.err, &se) {
			t.Errorf("%s: the SQLite error is no longer wrapped: %v", tc.name, tc.err)
		}
	}
}
