package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
)

func TestMigrateTwiceIdempotent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub dir", "warren.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.DB().Exec(`INSERT INTO layers (diff_id, size, created) VALUES ('sha256:aa', 1, 0)`); err != nil {
		t.Fatal(err)
	}
	v, err := s.Version(context.Background())
	if err != nil || v != len(migrations) {
		t.Fatalf("version = %d, %v; want %d", v, err, len(migrations))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(path)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer func() { _ = s.Close() }()
	var n int
	if err := s.DB().QueryRow(`SELECT COUNT(*) FROM schema_migrations`).Scan(&n); err != nil || n != len(migrations) {
		t.Fatalf("schema_migrations rows = %d, %v; want %d", n, err, len(migrations))
	}
	if err := s.DB().QueryRow(`SELECT COUNT(*) FROM layers`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("data lost on reopen: %d rows, %v", n, err)
	}
	var mode string
	if err := s.DB().QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		t.Errorf("journal_mode = %q, %v", mode, err)
	}
	var fk int
	if err := s.DB().QueryRow(`PRAGMA foreign_keys`).Scan(&fk); err != nil || fk != 1 {
		t.Errorf("foreign_keys = %d, %v", fk, err)
	}
}

func TestLaterMigrationApplied(t *testing.T) {
	path := filepath.Join(t.TempDir(), "warren.db")
	s, err := open(path, migrations)
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	next := append(append([]Migration(nil), migrations...),
		Migration{len(migrations) + 1, "test", `CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (7);`})
	s, err = open(path, next)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	var x int
	if err := s.DB().QueryRow(`SELECT x FROM t`).Scan(&x); err != nil || x != 7 {
		t.Fatalf("new migration not applied: %d, %v", x, err)
	}
}

func TestFailedMigrationRolledBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "warren.db")
	bad := append(append([]Migration(nil), migrations...),
		Migration{len(migrations) + 1, "bad", `CREATE TABLE half (x INTEGER); THIS IS NOT SQL;`})
	if _, err := open(path, bad); err == nil {
		t.Fatal("bad migration succeeded")
	}
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	var n int
	if err := s.DB().QueryRow(`SELECT COUNT(*) FROM sqlite_master WHERE name = 'half'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("failed migration left table behind: %d, %v", n, err)
	}
	if v, _ := s.Version(context.Background()); v != len(migrations) {
		t.Fatalf("version %d", v)
	}
}

func TestNewerSchemaRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "warren.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.DB().Exec(`INSERT INTO schema_migrations (version, name, applied) VALUES (?, 'future', 0)`, len(migrations)+5); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	_, err = Open(path)
	if !errors.Is(err, ErrSchemaTooNew) {
		t.Fatalf("Open of a newer database: %v, want ErrSchemaTooNew", err)
	}
	t.Log(err)
}

func TestConcurrentWriters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "warren.db")
	// Two Stores on one file: two pools, as two processes would have.
	a, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Close() }()
	b, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Close() }()
	const writers, each = 8, 50
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		s := a
		if w%2 == 1 {
			s = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				// Read-then-write transactions are what would hit
				// SQLITE_BUSY on lock upgrade with deferred BEGIN.
				tx, err := s.DB().Begin()
				if err != nil {
					errs <- err
					return
				}
				var n int
				if err := tx.QueryRow(`SELECT COUNT(*) FROM layers`).Scan(&n); err != nil {
					_ = tx.Rollback()
					errs <- err
					return
				}
				if _, err := tx.Exec(`INSERT INTO layers (diff_id, size, created) VALUES (?, ?, 0)`,
					fmt.Sprintf("sha256:%d-%d", w, i), n); err != nil {
					_ = tx.Rollback()
					errs <- err
					return
				}
				if err := tx.Commit(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("writer: %v", err)
	}
	var n int
	if err := a.DB().QueryRow(`SELECT COUNT(*) FROM layers`).Scan(&n); err != nil || n != writers*each {
		t.Fatalf("rows = %d, %v; want %d", n, err, writers*each)
	}
}
