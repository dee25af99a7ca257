package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadSecrets(t *testing.T) {
	if st, err := loadSecrets(""); st != nil || err != nil {
		t.Fatalf("no file: %v %v", st, err)
	}
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "s.json")
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ok := write(`{"providers": [{"name": "env", "type": "env", "prefix": "W_"}], "grants": {"team": [{"name": "db", "provider": "env", "mode": "env"}]}}`)
	if st, err := loadSecrets(ok); err != nil || st.Check("team", []string{"db"}) != nil {
		t.Fatalf("valid file: %v", err)
	}
	// Every problem at once; an unknown field is one.
	_, err := loadSecrets(write(`{"providers": [{"name": "env", "type": "nope"}], "grants": {"team": [{"name": "db", "provider": "x"}]}}`))
	for _, want := range []string{`type "nope"`, `provider "x" is not configured`, "proxy mode needs hosts"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: want %q", err, want)
		}
	}
	if _, err := loadSecrets(write(`{"providers": [], "grant": {}}`)); err == nil || !strings.Contains(err.Error(), `unknown field "grant"`) {
		t.Errorf("unknown field: %v", err)
	}
}
