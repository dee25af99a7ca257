package sandbox_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/secrets"
)

func TestSecretsEnvMode(t *testing.T) {
	values := map[string]string{"S_db": "value-one"}
	st, err := secrets.NewStore(map[string]secrets.Provider{"env": &secrets.Env{Prefix: "S_", Lookup: func(k string) (string, bool) { v, ok := values[k]; return v, ok }}},
		map[string][]secrets.Grant{"team": {
			{Name: "db", Provider: "env", Mode: secrets.ModeEnv, Env: "DB_PASSWORD"},
			{Name: "api", Provider: "env", Key: "db", Hosts: []string{"api.test"}},
		}})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, sandbox.Options{Secrets: st})
	m := e.manager(t)
	ctx := t.Context()
	spec := sandbox.Spec{Image: "base"}

	for _, c := range []struct {
		ns, name string
		names    []string
		kind     error
		want     string
	}{
		{"team", "a", []string{"db", "stripe"}, errdefs.ErrForbidden, `secret "stripe" is not granted to namespace "team"`},
		{"other", "a", []string{"db"}, errdefs.ErrForbidden, `secret "db" is not granted to namespace "other"`},
		// Proxy mode needs the server's network, which this one lacks.
		{"team", "a", []string{"api"}, errdefs.ErrInvalid, "proxy mode needs the server's network"},
	} {
		sp := spec
		sp.Secrets = c.names
		_, err := m.Start(ctx, c.ns, c.name, sp, true)
		if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %q: %v, want %v %q", c.ns, c.names, err, c.kind, c.want)
		}
		if _, err := m.Get(c.ns, c.name); err == nil {
			t.Errorf("%s %q: a refused start left a sandbox", c.ns, c.names)
		}
	}

	sp := spec
	sp.Secrets = []string{"db"}
	info, err := m.Start(ctx, "team", "a", sp, true)
	if err != nil {
		t.Fatal(err)
	}
	envOf := func() []string { return e.be.Sandbox(info.ID).Config().Env }
	if !slices.Contains(envOf(), "DB_PASSWORD=value-one") {
		t.Fatalf("env mode: %q", envOf())
	}
	if !slices.Equal(info.Spec.Secrets, []string{"db"}) || slices.ContainsFunc(info.Spec.Env, func(s string) bool { return strings.Contains(s, "value-one") }) {
		t.Errorf("the spec shown: %+v", info.Spec)
	}
	var stored string
	if err := e.db.DB().QueryRowContext(ctx, `SELECT spec FROM sandboxes WHERE id = ?`, info.ID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stored, `"secrets":["db"]`) || strings.Contains(stored, "value-one") {
		t.Errorf("stored spec: %s", stored)
	}
	// A rotated value takes effect at the next start.
	values["S_db"] = "value-two"
	if err := m.Stop(ctx, "team", "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Start(ctx, "team", "a", sp, false); err != nil {
		t.Fatal(err)
	}
	if env := envOf(); !slices.Contains(env, "DB_PASSWORD=value-two") || slices.Contains(env, "DB_PASSWORD=value-one") {
		t.Errorf("after rotation: %q", env)
	}
	// A provider that fails: the start fails naming the secret.
	delete(values, "S_db")
	_ = m.Stop(ctx, "team", "a")
	if _, err := m.Start(ctx, "team", "a", sp, false); err == nil || !strings.Contains(err.Error(), `secret "db"`) {
		t.Errorf("a missing value: %v", err)
	}

	// A new sandbox refused so leaves nothing.
	if _, err := m.Start(ctx, "team", "c", sp, true); err == nil {
		t.Error("a missing value: started")
	}
	if _, err := m.Get("team", "c"); err == nil {
		t.Error("a start refused for its secret left a sandbox")
	}

	// A server without secrets refuses any name.
	bare := newEnv(t, sandbox.Options{}).manager(t)
	if _, err := bare.Start(ctx, "team", "b", sp, true); !errors.Is(err, errdefs.ErrForbidden) {
		t.Errorf("no secrets configured: %v", err)
	}
}
