package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/warren-sandbox/warren/internal/config"
)

func TestSecretsFromConfig(t *testing.T) {
	if st, err := (*livePolicy)(nil).secretStore(); st != nil || err != nil {
		t.Fatalf("no file: %v %v", st, err)
	}
	p := filepath.Join(t.TempDir(), "warren.toml")
	if err := os.WriteFile(p, []byte(`
[[secrets.providers]]
name = "env"
type = "env"
prefix = "W_"

[namespaces.team]
[[namespaces.team.secrets]]
name = "db"
provider = "env"
mode = "env"
[[namespaces.team.secrets]]
name = "api"
provider = "env"
hosts = ["api.example.com"]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := config.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	st, err := (&livePolicy{path: p, boot: f}).secretStore()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Check("team", []string{"db", "api"}); err != nil {
		t.Errorf("granted secrets refused: %v", err)
	}
	if err := st.Check("team", []string{"other"}); err == nil {
		t.Error("a secret not granted was let through")
	}
	if err := st.Check("elsewhere", []string{"db"}); err == nil {
		t.Error("another namespace's grant was let through")
	}
}
