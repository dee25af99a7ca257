package store

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
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
