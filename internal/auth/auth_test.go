package auth

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/testenv"
)

var (
	testSecret  = []byte("0123456789abcdef0123456789abcdef-test-secret")
	otherSecret = []byte("fedcba9876543210fedcba9876543210-other-secret")
	testNow     = time.Unix(1_750_000_000, 0)
)

func newSigner(t testing.TB, secret []byte) *Signer {
	t.Helper()
	s, err := NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// mint builds a key by hand, independently of Signer: manual base64url and
// HMAC-SHA256 over "header.payload", the way any JWT library (microsandbox's
// jsonwebtoken crate included) does it.
func mint(secret []byte, header, payload string) string {
	enc := base64.RawURLEncoding
	in := enc.EncodeToString([]byte(header)) + "." + enc.EncodeToString([]byte(payload))
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(in))
	return "msb_" + in + "." + enc.EncodeToString(m.Sum(nil))
}

const msbHeader = `{"typ":"JWT","alg":"HS256"}` // jsonwebtoken's field order

// independentCheck reports whether key is "msb_" + three segments whose
// signature is a valid HMAC-SHA256 of the first two under secret, with an
// HS256 header. It shares no code with Verify.
func independentCheck(secret []byte, key string) bool {
	rest, ok := strings.CutPrefix(key, "msb_")
	if !ok {
		return false
	}
	p := strings.Split(rest, ".")
	if len(p) != 3 {
		return false
	}
	sig, err := base64.RawURLEncoding.DecodeString(p[2])
	if err != nil {
		return false
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(p[0] + "." + p[1]))
	if !bytes.Equal(sig, m.Sum(nil)) {
		return false
	}
	hb, err := base64.RawURLEncoding.DecodeString(p[0])
	if err != nil {
		return false
	}
	var h struct{ Alg string }
	if json.Unmarshal(hb, &h) != nil || h.Alg != "HS256" {
		return false
	}
	return true
}

func TestNewSigner(t *testing.T) {
	if _, err := NewSigner(make([]byte, 31)); err == nil {
		t.Error("31-byte secret accepted")
	}
	if _, err := NewSigner(make([]byte, 1025)); err == nil {
		t.Error("1025-byte secret accepted")
	}
	var zero Signer
	if _, _, err := zero.Issue("ns", time.Hour, testNow); err == nil {
		t.Error("zero Signer issued a key")
	}
	if _, err := zero.Verify("msb_a.b.c", testNow); !errors.Is(err, ErrInvalid) {
		t.Errorf("zero Signer Verify: %v", err)
	}
	buf := bytes.Clone(testSecret)
	s := newSigner(t, buf)
	key, _, err := s.Issue("ns", time.Hour, testNow)
	if err != nil {
		t.Fatal(err)
	}
	buf[0] ^= 0xff // the Signer must hold its own copy
	if _, err := s.Verify(key, testNow); err != nil {
		t.Fatalf("caller mutating its secret broke the signer: %v", err)
	}
}

func TestRoundTrip(t *testing.T) {
	s := newSigner(t, testSecret)
	for _, ns := range []string{"*", "default", "a", "Team_1-x", strings.Repeat("z", 63)} {
		key, issued, err := s.Issue(ns, 90*time.Minute, testNow)
		if err != nil {
			t.Fatalf("Issue(%q): %v", ns, err)
		}
		if !strings.HasPrefix(key, "msb_") {
			t.Fatalf("key lacks prefix: %s", key)
		}
		if len(issued.ID) != 32 {
			t.Errorf("ID %q: want 32 hex chars", issued.ID)
		}
		if !issued.IssuedAt.Equal(testNow) || !issued.ExpiresAt.Equal(testNow.Add(90*time.Minute)) {
			t.Errorf("issued times %v..%v", issued.IssuedAt, issued.ExpiresAt)
		}
		if !independentCheck(testSecret, key) {
			t.Errorf("independent check rejects issued key")
		}
		got, err := s.Verify(key, testNow.Add(89*time.Minute))
		if err != nil {
			t.Fatalf("Verify: %v", err)
		}
		if got != issued {
			t.Errorf("claims changed: issued %+v, verified %+v", issued, got)
		}
	}
	k1, c1, _ := s.Issue("ns", time.Hour, testNow)
	k2, c2, _ := s.Issue("ns", time.Hour, testNow)
	if k1 == k2 || c1.ID == c2.ID {
		t.Error("two issues produced the same key id")
	}
}

func TestIssueRejects(t *testing.T) {
	s := newSigner(t, testSecret)
	cases := []struct {
		ns  string
		ttl time.Duration
	}{
		{"", time.Hour},
		{"-lead", time.Hour},
		{"_lead", time.Hour},
		{"has space", time.Hour},
		{"dot.ted", time.Hour},
		{"**", time.Hour},
		{strings.Repeat("a", 64), time.Hour},
		{"ok", 0},
		{"ok", -time.Second},
		{"ok", MaxTTL + time.Second},
	}
	for _, c := range cases {
		if _, _, err := s.Issue(c.ns, c.ttl, testNow); err == nil {
			t.Errorf("Issue(%q, %v) succeeded", c.ns, c.ttl)
		}
	}
	if _, _, err := s.Issue("ok", MaxTTL, testNow); err != nil {
		t.Errorf("Issue with MaxTTL: %v", err)
	}
	// Sub-second ttl rounds up: the key is valid right after issue.
	key, c, err := s.Issue("ok", time.Millisecond, testNow)
	if err != nil {
		t.Fatal(err)
	}
	if !c.ExpiresAt.After(c.IssuedAt) {
		t.Errorf("exp %v not after iat %v", c.ExpiresAt, c.IssuedAt)
	}
	if _, err := s.Verify(key, testNow); err != nil {
		t.Errorf("1ms key rejected at issue time: %v", err)
	}
}

func TestValidNamespace(t *testing.T) {
	for s, want := range map[string]bool{
		"*": true, "a": true, "9": true, "a-b_c": true, strings.Repeat("x", 63): true,
		"": false, "-a": false, "_a": false, "a b": false, "a/b": false, "ä": false,
		strings.Repeat("x", 64): false, "a*": false, "*a": false,
	} {
		if got := ValidNamespace(s); got != want {
			t.Errorf("ValidNamespace(%q) = %v, want %v", s, got, want)
		}
	}
}

func TestAllows(t *testing.T) {
	all := Claims{Namespace: "*"}
	one := Claims{Namespace: "team"}
	if !all.Allows("team") || !all.Allows("other") {
		t.Error("* should allow every namespace")
	}
	if !one.Allows("team") || one.Allows("other") || one.Allows("*") || one.Allows("Team") {
		t.Error("single-namespace claims allow the wrong set")
	}
	if (Claims{}).Allows("") {
		t.Error("zero Claims allowed the empty namespace")
	}
}

// TestMicrosandboxKey verifies a key shaped exactly like microsandbox's
// server mints them: header {"typ":"JWT","alg":"HS256"}, claims only
// exp/iat/namespace, built without this package's code.
func TestMicrosandboxKey(t *testing.T) {
	s := newSigner(t, testSecret)
	iat := testNow.Unix() - 3600
	exp := testNow.Unix() + 86400
	key := mint(testSecret, msbHeader, fmt.Sprintf(`{"exp":%d,"iat":%d,"namespace":"*"}`, exp, iat))
	c, err := s.Verify(key, testNow)
	if err != nil {
		t.Fatalf("microsandbox-style key rejected: %v", err)
	}
	want := Claims{ID: "", Namespace: "*", IssuedAt: time.Unix(iat, 0).UTC(), ExpiresAt: time.Unix(exp, 0).UTC()}
	if c != want {
		t.Errorf("got %+v, want %+v", c, want)
	}
	// Header without typ, and without iat, also verify.
	key = mint(testSecret, `{"alg":"HS256"}`, fmt.Sprintf(`{"namespace":"dev","exp":%d}`, exp))
	if c, err := s.Verify(key, testNow); err != nil || c.Namespace != "dev" || !c.IssuedAt.IsZero() {
		t.Errorf("minimal key: %+v, %v", c, err)
	}
}

func TestVerifyMatrix(t *testing.T) {
	s := newSigner(t, testSecret)
	good, _, err := s.Issue("team", time.Hour, testNow)
	if err != nil {
		t.Fatal(err)
	}
	jwt := strings.TrimPrefix(good, "msb_")
	parts := strings.Split(jwt, ".")
	exp := testNow.Unix() + 3600
	iat := testNow.Unix()
	claims := func(extra string) string {
		return fmt.Sprintf(`{"exp":%d,"iat":%d,"namespace":"team"%s}`, exp, iat, extra)
	}
	enc := base64.RawURLEncoding.EncodeToString

	// Tampered payload: namespace changed, original signature kept.
	tamperedPayload := enc([]byte(fmt.Sprintf(`{"exp":%d,"iat":%d,"jti":"x","namespace":"*"}`, exp, iat)))
	tampered := "msb_" + parts[0] + "." + tamperedPayload + "." + parts[2]

	// alg none: unsigned token, with and without a trailing empty signature.
	noneIn := enc([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + parts[1]
	// HS512 header, correctly signed with HS256 over it (alg confusion).
	hs512 := mint(testSecret, `{"alg":"HS512","typ":"JWT"}`, claims(""))

	cases := []struct {
		name string
		key  string
		want error
	}{
		{"no prefix", jwt, ErrInvalid},
		{"wrong prefix", "msk_" + jwt, ErrInvalid},
		{"upper prefix", "MSB_" + jwt, ErrInvalid},
		{"empty", "", ErrInvalid},
		{"prefix only", "msb_", ErrInvalid},
		{"2 segments", "msb_" + parts[0] + "." + parts[1], ErrInvalid},
		{"4 segments", good + "." + parts[2], ErrInvalid},
		{"trailing dot", good + ".", ErrInvalid},
		{"bad base64 header", "msb_" + "!!!" + parts[0][3:] + "." + parts[1] + "." + parts[2], ErrInvalid},
		{"bad base64 sig", good[:len(good)-2] + "+/", ErrInvalid},
		{"padded sig", good + "=", ErrInvalid},
		{"newline in key", "msb_" + parts[0] + "\n." + parts[1] + "." + parts[2], ErrInvalid},
		{"newline in sig", "msb_" + parts[0] + "." + parts[1] + "." + parts[2][:10] + "\r\n" + parts[2][10:], ErrInvalid},
		{"truncated sig", good[:len(good)-4], ErrInvalid},
		{"alg none", "msb_" + noneIn + ".", ErrInvalid},
		{"alg none sig", "msb_" + noneIn + "." + parts[2], ErrInvalid},
		{"alg HS512", hs512, ErrInvalid},
		{"alg lower", mint(testSecret, `{"alg":"hs256"}`, claims("")), ErrInvalid},
		{"alg missing", mint(testSecret, `{"typ":"JWT"}`, claims("")), ErrInvalid},
		{"typ wrong", mint(testSecret, `{"alg":"HS256","typ":"JWS"}`, claims("")), ErrInvalid},
		{"crit header", mint(testSecret, `{"alg":"HS256","crit":["exp"]}`, claims("")), ErrInvalid},
		{"header array", mint(testSecret, `["HS256"]`, claims("")), ErrInvalid},
		{"tampered payload", tampered, ErrInvalid},
		{"other secret", mint(otherSecret, msbHeader, claims("")), ErrInvalid},
		{"expired", mint(testSecret, msbHeader, fmt.Sprintf(`{"exp":%d,"iat":%d,"namespace":"team"}`, testNow.Unix()-61, iat-100)), ErrExpired},
		{"expired a clock skew ago", mint(testSecret, msbHeader, fmt.Sprintf(`{"exp":%d,"namespace":"team"}`, testNow.Unix()-60)), ErrExpired},
		{"iat far future", mint(testSecret, msbHeader, fmt.Sprintf(`{"exp":%d,"iat":%d,"namespace":"team"}`, exp+7200, iat+3600)), ErrInvalid},
		{"nbf future", mint(testSecret, msbHeader, claims(fmt.Sprintf(`,"nbf":%d`, iat+3600))), ErrInvalid},
		{"exp string", mint(testSecret, msbHeader, fmt.Sprintf(`{"exp":"%d","namespace":"team"}`, exp)), ErrInvalid},
		{"exp float", mint(testSecret, msbHeader, fmt.Sprintf(`{"exp":%d.5,"namespace":"team"}`, exp)), ErrInvalid},
		{"exp null", mint(testSecret, msbHeader, `{"exp":null,"namespace":"team"}`), ErrInvalid},
		{"exp bool", mint(testSecret, msbHeader, `{"exp":true,"namespace":"team"}`), ErrInvalid},
		{"exp missing", mint(testSecret, msbHeader, `{"namespace":"team"}`), ErrInvalid},
		{"exp huge", mint(testSecret, msbHeader, `{"exp":99999999999999999999,"namespace":"team"}`), ErrInvalid},
		{"iat string", mint(testSecret, msbHeader, fmt.Sprintf(`{"exp":%d,"iat":"x","namespace":"team"}`, exp)), ErrInvalid},
		{"namespace missing", mint(testSecret, msbHeader, fmt.Sprintf(`{"exp":%d,"iat":%d}`, exp, iat)), ErrInvalid},
		{"namespace invalid", mint(testSecret, msbHeader, fmt.Sprintf(`{"exp":%d,"namespace":"../etc"}`, exp)), ErrInvalid},
		{"namespace empty", mint(testSecret, msbHeader, fmt.Sprintf(`{"exp":%d,"namespace":""}`, exp)), ErrInvalid},
		{"namespace number", mint(testSecret, msbHeader, fmt.Sprintf(`{"exp":%d,"namespace":7}`, exp)), ErrInvalid},
		{"jti empty", mint(testSecret, msbHeader, claims(`,"jti":""`)), ErrInvalid},
		{"jti number", mint(testSecret, msbHeader, claims(`,"jti":5`)), ErrInvalid},
		{"claims not object", mint(testSecret, msbHeader, `"hi"`), ErrInvalid},
		{"claims null", mint(testSecret, msbHeader, `null`), ErrInvalid},
		{"claims trailing", mint(testSecret, msbHeader, claims("")+"x"), ErrInvalid},
		{"oversized", mint(testSecret, msbHeader, claims(`,"pad":"`+strings.Repeat("a", 4096)+`"`)), ErrInvalid},
		{"bad base64 length", "msb_" + parts[0] + "A." + parts[1] + "." + parts[2], ErrInvalid},
		{"non-canonical sig", noncanonical(good), ErrInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := s.Verify(c.key, testNow)
			if err == nil {
				t.Fatalf("accepted: %+v", got)
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			if errors.Is(c.want, ErrInvalid) && errors.Is(err, ErrExpired) {
				t.Fatalf("err %v is both invalid and expired", err)
			}
			if got != (Claims{}) {
				t.Errorf("non-zero claims on error: %+v", got)
			}
			checkErrText(t, err, c.key)
		})
	}

	// Within the clock skew, a slightly-future iat is fine, and so is an
	// exp that has just passed (microsandbox allows the same minute).
	skewed := mint(testSecret, msbHeader, fmt.Sprintf(`{"exp":%d,"iat":%d,"namespace":"team"}`, exp, iat+30))
	if _, err := s.Verify(skewed, testNow); err != nil {
		t.Errorf("iat 30s ahead rejected: %v", err)
	}
	for _, ago := range []int64{0, 1, 59} {
		just := mint(testSecret, msbHeader, fmt.Sprintf(`{"exp":%d,"iat":%d,"namespace":"team"}`, testNow.Unix()-ago, iat-100))
		if _, err := s.Verify(just, testNow); err != nil {
			t.Errorf("a key that expired %d s ago, within the clock skew, rejected: %v", ago, err)
		}
	}
	// The untouched key still verifies (the matrix did not pass by accident).
	if _, err := s.Verify(good, testNow); err != nil {
		t.Fatalf("good key rejected: %v", err)
	}
}

// noncanonical re-encodes the signature's last character with non-zero
// padding bits: same decoded bytes under a lax decoder, different string.
func noncanonical(key string) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	last := strings.IndexByte(alphabet, key[len(key)-1])
	return key[:len(key)-1] + string(alphabet[last|1])
}

func checkErrText(t *testing.T, err error, key string) {
	t.Helper()
	msg := err.Error()
	for _, secret := range [][]byte{testSecret, otherSecret} {
		if strings.Contains(msg, string(secret)) || strings.Contains(msg, fmt.Sprintf("%x", secret)) {
			t.Errorf("error text contains the secret: %q", msg)
		}
	}
	rest := strings.TrimPrefix(key, "msb_")
	if len(rest) >= 8 {
		if strings.Contains(msg, rest) {
			t.Errorf("error text contains the key: %q", msg)
		}
		for _, seg := range strings.Split(rest, ".") {
			if len(seg) >= 8 && strings.Contains(msg, seg) {
				t.Errorf("error text contains a key segment: %q", msg)
			}
		}
	}
}

func TestFromHeader(t *testing.T) {
	cases := []struct {
		auth, proxy string
		key         string
		ok          bool
	}{
		{"Bearer msb_abc", "", "msb_abc", true},
		{"bearer msb_abc", "", "msb_abc", true},
		{"BEARER   msb_abc  ", "", "msb_abc", true},
		{"Bearer\tmsb_abc", "", "msb_abc", true},
		{"  msb_abc  ", "", "msb_abc", true},
		{"msb_abc", "Bearer other", "msb_abc", true},
		{"", "Bearer msb_proxy", "msb_proxy", true},
		{"   ", "msb_proxy", "msb_proxy", true},
		{"", "", "", false},
		{"Bearer", "", "", false},
		{"Bearer   ", "", "", false},
		{"Basic dXNlcjpwYXNz", "", "", false},
		{"Bearer a b", "", "", false},
	}
	for _, c := range cases {
		h := http.Header{}
		if c.auth != "" {
			h.Set("Authorization", c.auth)
		}
		if c.proxy != "" {
			h.Set("Proxy-Authorization", c.proxy)
		}
		key, ok := FromHeader(h)
		if key != c.key || ok != c.ok {
			t.Errorf("Authorization=%q Proxy-Authorization=%q: got (%q, %v), want (%q, %v)", c.auth, c.proxy, key, ok, c.key, c.ok)
		}
	}
	if _, ok := FromHeader(nil); ok {
		t.Error("nil header gave ok")
	}
}

func TestSignerRedaction(t *testing.T) {
	s := newSigner(t, testSecret)
	type holder struct {
		Name   string
		S      *Signer
		V      Signer
		hidden Signer
	}
	h := holder{Name: "x", S: s, V: *s, hidden: *s}
	var outs []string
	for _, f := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%T"} {
		outs = append(outs, fmt.Sprintf(f, s), fmt.Sprintf(f, *s), fmt.Sprintf(f, h), fmt.Sprintf(f, &h))
	}
	outs = append(outs, fmt.Sprint(s), fmt.Sprintln(*s))
	for _, v := range []string{"%v", "%+v", "%#v", "%s", "%d", "%x", "%10.3v"} {
		if got := fmt.Sprintf(v, s); got != "auth.Signer{REDACTED}" {
			t.Errorf("%s of *Signer = %q", v, got)
		}
		if got := fmt.Sprintf(v, *s); got != "auth.Signer{REDACTED}" {
			t.Errorf("%s of Signer = %q", v, got)
		}
	}
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	log.Info("m", "signer", s, "value", *s, "holder", h)
	log.Info("m", slog.Any("signer", s), slog.Group("g", "s", s))
	text := slog.New(slog.NewTextHandler(&buf, nil))
	text.Info("m", "signer", s)
	outs = append(outs, buf.String())
	if !strings.Contains(buf.String(), "auth.Signer{REDACTED}") {
		t.Errorf("slog output lacks redaction marker: %s", buf.String())
	}
	j, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	outs = append(outs, string(j))

	needles := []string{string(testSecret), fmt.Sprintf("%x", testSecret), fmt.Sprintf("%X", testSecret),
		base64.StdEncoding.EncodeToString(testSecret), fmt.Sprint(testSecret[:8]), "0123456789abcdef"}
	for _, out := range outs {
		for _, n := range needles {
			if strings.Contains(out, n) {
				t.Errorf("output leaks the secret (%q): %s", n, out)
			}
		}
	}
}

func TestLoadOrCreateSecret(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "dir", "secret")
	s1, err := LoadOrCreateSecret(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(s1) < MinSecretLen {
		t.Fatalf("secret of %d bytes", len(s1))
	}
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Errorf("secret file mode %v, want regular 0600", fi.Mode())
	}
	di, err := os.Stat(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	if di.Mode().Perm() != 0o700 {
		t.Errorf("parent dir mode %v, want 0700", di.Mode().Perm())
	}
	s2, err := LoadOrCreateSecret(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(s1, s2) {
		t.Error("second call returned a different secret")
	}
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Errorf("temp files left behind: %v", ents)
	}
	if _, err := NewSigner(s1); err != nil {
		t.Errorf("created secret unusable: %v", err)
	}
	// Two fresh files differ.
	s3, err := LoadOrCreateSecret(filepath.Join(dir, "other"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(s1, s3) {
		t.Error("two created secrets are equal")
	}
}

func TestLoadSecretVerbatim(t *testing.T) {
	// A microsandbox server key pasted into the file is used as is, so its
	// keys verify.
	path := filepath.Join(t.TempDir(), "secret")
	msbKey := "my-microsandbox-server-key-that-is-long-enough"
	if err := os.WriteFile(path, []byte(msbKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := LoadOrCreateSecret(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != msbKey {
		t.Fatalf("got %q", got)
	}
	key := mint([]byte(msbKey), msbHeader, fmt.Sprintf(`{"exp":%d,"iat":%d,"namespace":"*"}`, testNow.Unix()+60, testNow.Unix()))
	if _, err := newSigner(t, got).Verify(key, testNow); err != nil {
		t.Errorf("key signed with file secret rejected: %v", err)
	}
}

func TestLoadSecretRejects(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	if _, err := LoadOrCreateSecret(good); err != nil {
		t.Fatal(err)
	}

	t.Run("mode 0644", func(t *testing.T) {
		p := filepath.Join(dir, "wide")
		if err := os.WriteFile(p, bytes.Repeat([]byte("a"), 40), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := LoadOrCreateSecret(p)
		if err == nil || !strings.Contains(err.Error(), "chmod 600 "+p) {
			t.Fatalf("err = %v, want a chmod 600 hint", err)
		}
		if strings.Contains(err.Error(), strings.Repeat("a", 32)) {
			t.Error("error leaks file contents")
		}
		for _, m := range []os.FileMode{0o640, 0o604, 0o660} {
			if err := os.Chmod(p, m); err != nil {
				t.Fatal(err)
			}
			if _, err := LoadOrCreateSecret(p); err == nil {
				t.Errorf("mode %v accepted", m)
			}
		}
		if err := os.Chmod(p, 0o400); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadOrCreateSecret(p); err != nil {
			t.Errorf("mode 0400 rejected: %v", err)
		}
	})
	t.Run("symlink", func(t *testing.T) {
		p := filepath.Join(dir, "link")
		if err := os.Symlink(good, p); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadOrCreateSecret(p); err == nil || !strings.Contains(err.Error(), "symlink") {
			t.Fatalf("err = %v, want symlink refusal", err)
		}
		dangling := filepath.Join(dir, "dangling")
		if err := os.Symlink(filepath.Join(dir, "nowhere"), dangling); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadOrCreateSecret(dangling); err == nil {
			t.Fatal("dangling symlink accepted")
		}
		if _, err := os.Lstat(filepath.Join(dir, "nowhere")); err == nil {
			t.Error("secret created through a dangling symlink")
		}
	})
	t.Run("too short", func(t *testing.T) {
		p := filepath.Join(dir, "short")
		if err := os.WriteFile(p, []byte(strings.Repeat("s", 31)+"\n\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadOrCreateSecret(p); err == nil {
			t.Fatal("31-byte secret accepted")
		}
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadOrCreateSecret(p); err == nil {
			t.Fatal("empty secret accepted")
		}
	})
	t.Run("too long", func(t *testing.T) {
		p := filepath.Join(dir, "long")
		if err := os.WriteFile(p, bytes.Repeat([]byte("l"), 1025), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadOrCreateSecret(p); err == nil {
			t.Fatal("1025-byte secret accepted")
		}
	})
	t.Run("foreign owner", func(t *testing.T) {
		p := filepath.Join(dir, "foreign")
		if err := os.WriteFile(p, bytes.Repeat([]byte("f"), 40), 0o600); err != nil {
			t.Fatal(err)
		}
		testenv.RequireRoot(t) // to give the file to another owner
		if err := os.Chown(p, os.Geteuid()+1, -1); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadOrCreateSecret(p); err == nil || !strings.Contains(err.Error(), "owned by") {
			t.Fatalf("err = %v, want an ownership refusal", err)
		}
	})
	t.Run("directory", func(t *testing.T) {
		p := filepath.Join(dir, "adir")
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadOrCreateSecret(p); err == nil {
			t.Fatal("directory accepted")
		}
	})
}

func TestLoadOrCreateSecretConcurrent(t *testing.T) {
	for round := 0; round < 5; round++ {
		path := filepath.Join(t.TempDir(), "state", "secret")
		const n = 20
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			secrets = make([][]byte, n)
			errs    = make([]error, n)
		)
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				secrets[i], errs[i] = LoadOrCreateSecret(path)
			}()
		}
		close(start)
		wg.Wait()
		for i := 0; i < n; i++ {
			if errs[i] != nil {
				t.Fatalf("caller %d: %v", i, errs[i])
			}
			if !bytes.Equal(secrets[i], secrets[0]) {
				t.Fatalf("caller %d got a different secret", i)
			}
		}
		onDisk, err := LoadOrCreateSecret(path)
		if err != nil || !bytes.Equal(onDisk, secrets[0]) {
			t.Fatalf("on-disk secret differs from the one handed out (%v)", err)
		}
		ents, _ := os.ReadDir(filepath.Dir(path))
		if len(ents) != 1 {
			t.Fatalf("leftover files: %v", ents)
		}
	}
}

func FuzzVerify(f *testing.F) {
	s := newSigner(f, testSecret)
	good, _, err := s.Issue("team", time.Hour, testNow)
	if err != nil {
		f.Fatal(err)
	}
	exp := testNow.Unix() + 3600
	f.Add(good)
	f.Add(strings.TrimPrefix(good, "msb_"))
	f.Add(good + ".")
	f.Add(good[:len(good)-1])
	f.Add(mint(testSecret, msbHeader, fmt.Sprintf(`{"exp":%d,"iat":%d,"namespace":"*"}`, exp, testNow.Unix())))
	f.Add(mint(testSecret, msbHeader, fmt.Sprintf(`{"exp":%d,"namespace":"*"}`, testNow.Unix()-5)))
	f.Add(mint(testSecret, msbHeader, fmt.Sprintf(`{"exp":%d,"namespace":"*"}`, testNow.Unix()-61)))
	f.Add(mint(testSecret, `{"alg":"none"}`, fmt.Sprintf(`{"exp":%d,"namespace":"*"}`, exp)))
	f.Add(mint(otherSecret, msbHeader, fmt.Sprintf(`{"exp":%d,"namespace":"*"}`, exp)))
	f.Add(mint(testSecret, msbHeader, fmt.Sprintf(`{"exp":"%d","namespace":"*"}`, exp)))
	f.Add("msb_..")
	f.Add("msb_a.b.c")
	f.Add("")
	f.Fuzz(func(t *testing.T, key string) {
		c, err := s.Verify(key, testNow)
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrExpired) {
				t.Fatalf("error wraps neither sentinel: %v", err)
			}
			if c != (Claims{}) {
				t.Fatalf("claims returned with error: %+v", c)
			}
			if strings.Contains(err.Error(), string(testSecret)) {
				t.Fatal("error text contains the secret")
			}
			if len(key) >= 24 && strings.Contains(err.Error(), key) {
				t.Fatal("error text contains the key")
			}
			return
		}
		if !independentCheck(testSecret, key) {
			t.Fatalf("Verify accepted a key failing the independent signature check: %q", key)
		}
		if !ValidNamespace(c.Namespace) || !testNow.Before(c.ExpiresAt.Add(ClockSkew)) {
			t.Fatalf("accepted bad claims %+v", c)
		}
		if len(key) > MaxKeyLen {
			t.Fatal("accepted an oversized key")
		}
	})
}

func TestOversizedValidKeyRejectedByLengthOnly(t *testing.T) {
	s := newSigner(t, testSecret)
	exp := testNow.Unix() + 60
	// Just under the limit verifies; just over does not.
	base := fmt.Sprintf(`{"exp":%d,"namespace":"team","pad":"`, exp)
	for n := 2900; n < 3100; n++ {
		key := mint(testSecret, msbHeader, base+strings.Repeat("a", n)+`"}`)
		_, err := s.Verify(key, testNow)
		if len(key) <= MaxKeyLen && err != nil {
			t.Fatalf("key of %d bytes rejected: %v", len(key), err)
		}
		if len(key) > MaxKeyLen && !errors.Is(err, ErrInvalid) {
			t.Fatalf("key of %d bytes: err = %v", len(key), err)
		}
	}
}
