package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestKeyDataDir: 'warren key' takes --data-dir before or after the
// subcommand, and parses every flag before it creates anything: a bad
// flag leaves no database or secret behind, in either directory.
func TestKeyDataDir(t *testing.T) {
	dir := t.TempDir()
	envDir := filepath.Join(dir, "data") // WARREN_DATA_DIR of warren()
	other := filepath.Join(dir, "other")
	empty := func(d string) {
		t.Helper()
		if ents, err := os.ReadDir(d); err == nil && len(ents) > 0 {
			t.Fatalf("%s holds %d entries, want none", d, len(ents))
		}
	}
	if r := run(t, warren(t, dir, "key", "create", "--data-dir", other, "--namespace", "n", "--bogus"), ""); r.code == 0 || !strings.Contains(r.stderr, "bogus") {
		t.Fatalf("create with an unknown flag: %+v", r)
	}
	empty(envDir)
	empty(other)
	create := run(t, warren(t, dir, "key", "create", "--data-dir", other, "--namespace", "n", "--description", "after"), "")
	if create.code != 0 || !strings.HasPrefix(create.stdout, "msb_") {
		t.Fatalf("create with --data-dir after the subcommand: %+v", create)
	}
	empty(envDir)
	for _, f := range []string{"warren.db", "secret.key"} {
		if _, err := os.Stat(filepath.Join(other, f)); err != nil {
			t.Fatalf("--data-dir %s: %v", other, err)
		}
	}
	var id string
	for _, args := range [][]string{{"key", "list", "--data-dir", other}, {"key", "--data-dir", other, "list"}} {
		list := run(t, warren(t, dir, args...), "")
		if list.code != 0 || !strings.Contains(list.stdout, "after") {
			t.Fatalf("%q: %+v", args, list)
		}
		for _, line := range strings.Split(list.stdout, "\n") {
			if strings.Contains(line, "after") {
				id = strings.Fields(line)[0]
			}
		}
	}
	empty(envDir)
	if r := run(t, warren(t, dir, "key", "revoke", id, "--data-dir", other), ""); r.code != 0 {
		t.Fatalf("revoke ID --data-dir: %+v", r)
	}
	if list := run(t, warren(t, dir, "key", "list", "--data-dir", other), ""); !strings.Contains(list.stdout, "revoked") {
		t.Fatalf("list after revoke: %+v", list)
	}
	if r := run(t, warren(t, dir, "key", "revoke", "--data-dir", other), ""); r.code == 0 || !strings.Contains(r.stderr, "ID") {
		t.Fatalf("revoke without an id: %+v", r)
	}
	empty(envDir)
}
