package secrets

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/warren-sandbox/warren/internal/errdefs"
)

const sample = "sk-test-0123456789abcdef"

func TestValueNeverShown(t *testing.T) {
	v := NewValue([]byte(sample))
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("x", "v", v, "p", &v)
	j, err := json.Marshal(map[string]any{"v": v, "in": struct{ V Value }{v}})
	if err != nil {
		t.Fatal(err)
	}
	shown := []string{
		fmt.Sprint(v), fmt.Sprintf("%v %+v %#v %s %q %x %X %d", v, v, v, v, v, v, v, v),
		fmt.Sprintf("%v %+v", struct{ V Value }{v}, &struct{ V Value }{v}),
		fmt.Sprintf("%v", []Value{v}), logged.String(), string(j),
		fmt.Errorf("wrapped: %v", v).Error(),
	}
	for _, s := range shown {
		if strings.Contains(s, sample) || strings.Contains(s, fmt.Sprintf("%x", sample)) {
			t.Errorf("value shown: %s", s)
		}
		if !strings.Contains(s, redacted) {
			t.Errorf("no %s in %s", redacted, s)
		}
	}
	if string(v.Reveal()) != sample || v.Len() != len(sample) {
		t.Fatal("Reveal")
	}
}

func TestDirHostile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("good", sample+"\n", 0o600)
	write("readonly", sample, 0o400)
	write("open", sample, 0o644)
	write("group", sample, 0o640)
	write("huge", strings.Repeat("x", MaxValue+100), 0o600)
	write("max", strings.Repeat("y", MaxValue)+"\n", 0o600)
	write("empty", "", 0o600)
	write("newline", "\n", 0o600)
	if err := os.Symlink(filepath.Join(dir, "good"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "adir"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := write("other", sample, 0o600)
	if os.Geteuid() == 0 {
		if err := os.Chown(other, 12345, 12345); err != nil {
			t.Fatal(err)
		}
	}
	d, err := NewDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for key, want := range map[string]string{"good": sample, "readonly": sample, "max": strings.Repeat("y", MaxValue)} {
		v, err := d.Get(ctx, key)
		if err != nil || string(v.Reveal()) != want {
			t.Errorf("%s: %d bytes, %v", key, v.Len(), err)
		}
	}
	refusals := map[string]string{
		"open":       "mode 0644",
		"group":      "mode 0640",
		"huge":       "bytes: refused",
		"empty":      "empty",
		"newline":    "empty",
		"link":       "symbolic link",
		"adir":       "not a regular file",
		"fifo":       "not a regular file",
		"missing":    "no such file",
		"../good":    "secret key",
		"a/b":        "secret key",
		".hidden":    "secret key",
		"":           "secret key",
		"x\x00y":     "secret key",
		"-rf":        "secret key",
		"good\nmore": "secret key",
	}
	if os.Geteuid() == 0 {
		refusals["other"] = "owned by uid 12345"
	}
	for key, want := range refusals {
		v, err := d.Get(ctx, key)
		if err == nil {
			t.Errorf("%q: read %d bytes, want a refusal", key, v.Len())
			continue
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", key, err, want)
		}
		if strings.Contains(err.Error(), sample) || strings.Contains(err.Error(), "xxxxxxxx") {
			t.Errorf("%q: the error shows the value: %v", key, err)
		}
	}
	if _, err := NewDir("relative/path"); err == nil {
		t.Error("a relative directory was accepted")
	}
	gone, _ := NewDir(filepath.Join(dir, "nope"))
	if _, err := gone.Get(ctx, "good"); err == nil {
		t.Error("a missing directory gave a value")
	}
}

func TestEnvProvider(t *testing.T) {
	env := map[string]string{"WS_OPENAI": sample, "WS_EMPTY": "", "WS_BIG": strings.Repeat("z", MaxValue+1), "OTHER": "nope"}
	p := &Env{Prefix: "WS_", Lookup: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}
	ctx := context.Background()
	if v, err := p.Get(ctx, "OPENAI"); err != nil || string(v.Reveal()) != sample {
		t.Fatalf("OPENAI: %v", err)
	}
	for key, want := range map[string]string{"EMPTY": "empty", "BIG": "refused", "MISSING": "not in the server's environment", "../OTHER": "secret key"} {
		if _, err := p.Get(ctx, key); err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "zzzz") {
			t.Errorf("%s: %v, want %q", key, err, want)
		}
	}
}

func testStore(t *testing.T) *Store {
	t.Helper()
	env := map[string]string{"WS_openai": sample, "WS_db": "postgres-pass", "WS_bad": "a\r\nX-Evil: 1"}
	s, err := NewStore(map[string]Provider{"env": &Env{Prefix: "WS_", Lookup: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}},
		map[string][]Grant{
			"team-a": {
				{Name: "openai", Provider: "env", Hosts: []string{"api.openai.test", "*.wild.test"}},
				{Name: "db", Provider: "env", Mode: ModeEnv, Env: "DB_PASSWORD"},
				{Name: "bad", Provider: "env", Hosts: []string{"api.openai.test"}},
			},
		})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestGrants(t *testing.T) {
	s := testStore(t)
	if err := s.Check("team-a", []string{"openai", "db"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ns    string
		names []string
		kind  error
		want  string
	}{
		{"team-b", []string{"openai"}, errdefs.ErrForbidden, `secret "openai" is not granted to namespace "team-b"`},
		{"team-a", []string{"db", "stripe"}, errdefs.ErrForbidden, `secret "stripe" is not granted to namespace "team-a"`},
		{"team-a", []string{"db", "db"}, errdefs.ErrInvalid, "named twice"},
		{"team-a", []string{"BAD NAME"}, errdefs.ErrInvalid, "not a secret name"},
	} {
		err := s.Check(c.ns, c.names)
		if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %q: %v, want %v %q", c.ns, c.names, err, c.kind, c.want)
		}
	}
	var none *Store
	if err := none.Check("x", []string{"openai"}); !errors.Is(err, errdefs.ErrForbidden) {
		t.Errorf("nil store: %v", err)
	}
	// Every problem of a configuration at once.
	_, err := Open(Config{
		Providers: []ProviderConfig{{Name: "f", Type: "dir", Path: "rel"}, {Name: "e", Type: "env"}, {Name: "x", Type: "vault"}, {Name: "ok", Type: "env", Prefix: "P_"}},
		Grants: map[string][]Grant{"ns": {
			{Name: "a", Provider: "ok", Mode: "proxy"},
			{Name: "b", Provider: "ok", Mode: "env", Hosts: []string{"x.test"}},
			{Name: "c", Provider: "nope", Mode: "env"},
			{Name: "d", Provider: "ok", Mode: "weird"},
			{Name: "e", Provider: "ok", Hosts: []string{"bad host"}},
			{Name: "f", Provider: "ok", Mode: "env", Env: "1BAD"},
			{Name: "g", Provider: "ok", Mode: "env"}, {Name: "g", Provider: "ok", Mode: "env"},
		}},
	})
	for _, want := range []string{"absolute path", "needs a prefix", `type "vault"`, "proxy mode needs hosts", "hosts are for proxy mode",
		`provider "nope"`, `mode "weird"`, `host "bad host"`, `env "1BAD"`, `"g" is granted twice`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Open: %v\nwant %q", err, want)
		}
	}
}

func TestResolve(t *testing.T) {
	s := testStore(t)
	d, err := s.Resolve(context.Background(), "team-a", "sb1", []string{"openai", "db"})
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, kv := range d.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	if env["DB_PASSWORD"] != "postgres-pass" {
		t.Errorf("env mode: DB_PASSWORD=%q", env["DB_PASSWORD"])
	}
	ph := env["OPENAI"]
	if !strings.HasPrefix(ph, "warren-secret-openai-") || len(ph) != len("warren-secret-openai-")+32 || strings.Contains(ph, sample) {
		t.Errorf("proxy mode: OPENAI=%q, want a placeholder", ph)
	}
	for _, k := range []string{"SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE"} {
		if env[k] != BundlePath {
			t.Errorf("%s=%q", k, env[k])
		}
	}
	// A new start, a new placeholder and CA.
	d2, err := s.Resolve(context.Background(), "team-a", "sb1", []string{"openai"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(strings.Join(d2.Env, " "), ph) || bytes.Equal(d2.Proxy.CA().PEM(), d.Proxy.CA().PEM()) {
		t.Error("a second start reused the placeholder or the CA")
	}
	p := d.Proxy
	for host, want := range map[string]bool{"api.openai.test": true, "API.OPENAI.TEST": false, "a.wild.test": true, "x.a.wild.test": true,
		"wild.test": false, "evil.test": false, "api.openai.test.evil.test": false, "xapi.openai.test": false} {
		if p.Intercepts(host) != want {
			t.Errorf("Intercepts(%q) = %v", host, !want)
		}
	}
	in := []byte("Bearer " + ph + " and " + ph)
	out, names := p.Replace("api.openai.test", in)
	if string(out) != "Bearer "+sample+" and "+sample || len(names) != 1 || names[0] != "openai" {
		t.Errorf("Replace: %q %v", out, names)
	}
	if out, names := p.Replace("evil.test", in); !bytes.Equal(out, in) || names != nil {
		t.Errorf("Replace for another host: %q %v", out, names)
	}
	if got, _ := p.ReplaceInTarget("api.openai.test", "/v1?key="+ph); got != "/v1?key="+sample {
		t.Errorf("target: %q", got)
	}
	// A value that would break out of a header field is refused, by name.
	_, err = s.Resolve(context.Background(), "team-a", "sb1", []string{"bad"})
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), `secret "bad"`) || strings.Contains(err.Error(), "X-Evil") {
		t.Errorf("bad value: %v", err)
	}
	_, err = s.Resolve(context.Background(), "team-b", "sb1", []string{"openai"})
	if !errors.Is(err, errdefs.ErrForbidden) {
		t.Errorf("team-b: %v", err)
	}
}

func TestCA(t *testing.T) {
	ca, err := NewCA("t", []string{"api.openai.test", "*.wild.test"})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca.PEM()) {
		t.Fatal("PEM")
	}
	for name, ok := range map[string]bool{"api.openai.test": true, "a.wild.test": true, "evil.test": false} {
		leaf, err := ca.Leaf(name)
		if err != nil {
			t.Fatal(err)
		}
		cert, _ := x509.ParseCertificate(leaf.Certificate[0])
		_, err = cert.Verify(x509.VerifyOptions{DNSName: name, Roots: pool})
		if (err == nil) != ok {
			// The name constraint: the CA vouches for its grants' hosts alone.
			t.Errorf("%s: verify %v, want ok=%v", name, err, ok)
		}
	}
	if l1, _ := ca.Leaf("api.openai.test"); l1 != mustLeaf(t, ca, "api.openai.test") {
		t.Error("leaf not cached")
	}
}

func mustLeaf(t *testing.T, ca *CA, name string) *tls.Certificate {
	t.Helper()
	l, err := ca.Leaf(name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestRestore(t *testing.T) {
	s := testStore(t)
	d, err := s.Resolve(context.Background(), "team-a", "sb1", []string{"openai", "db"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := d.Proxy.State()
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(st, []byte(sample)) || bytes.Contains(st, []byte("postgres-pass")) {
		t.Fatal("the state holds a value")
	}
	p, err := s.Restore(context.Background(), "team-a", []string{"openai", "db"}, st)
	if err != nil {
		t.Fatal(err)
	}
	ph := d.Proxy.subs[0].Placeholder
	if out, _ := p.Replace("api.openai.test", ph); string(out) != sample {
		t.Errorf("restored: %q", out)
	}
	if !bytes.Equal(p.CA().Certificate().Raw, d.Proxy.CA().Certificate().Raw) {
		t.Error("another CA")
	}
	if _, err := p.CA().Leaf("api.openai.test"); err != nil {
		t.Error(err)
	}
	// A grant withdrawn meanwhile: not restored.
	if p, err := s.Restore(context.Background(), "team-b", []string{"openai"}, st); err != nil || p.Intercepts("api.openai.test") {
		t.Errorf("another namespace: %v", err)
	}
	for _, bad := range []string{"", "{}", `{"ca_cert":"AAAA"}`} {
		if _, err := s.Restore(context.Background(), "team-a", []string{"openai"}, []byte(bad)); err == nil {
			t.Errorf("%q restored", bad)
		}
	}
}
