package auth

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"
)

// Prefix starts every API key.
const Prefix = "msb_"

const (
	// MinSecretLen and MaxSecretLen bound the signing secret, in bytes.
	MinSecretLen = 32
	MaxSecretLen = 1024

	// MaxKeyLen bounds the length of a key Verify will look at.
	MaxKeyLen = 4096

	// MaxTTL is the longest lifetime Issue grants.
	MaxTTL = 10 * 365 * 24 * time.Hour

	// ClockSkew is how far in the future iat (or nbf) may lie, and how
	// long after its exp a key is still taken: a key may come from another
	// host's clock (microsandbox's own keygen, with the server's secret),
	// and microsandbox allows the same minute. Revocation cuts a key off
	// at once.
	ClockSkew = time.Minute

	maxIDLen = 128
)

var (
	// ErrInvalid reports a malformed key or a bad signature. Returned errors
	// wrap it with a short fixed reason; they never quote the key.
	ErrInvalid = errors.New("auth: invalid api key")
	// ErrExpired reports a correctly signed key whose exp has passed.
	ErrExpired = errors.New("auth: api key expired")
)

func invalid(reason string) error { return fmt.Errorf("%w: %s", ErrInvalid, reason) }

// Claims are the verified contents of a key.
type Claims struct {
	// ID is the jti claim; "" for keys issued by microsandbox itself.
	ID string
	// Namespace is the namespace the key may act in; "*" means all.
	Namespace string
	// IssuedAt is the iat claim (zero when absent), ExpiresAt the exp claim.
	IssuedAt, ExpiresAt time.Time
}

// Allows reports whether the key may act in namespace.
func (c Claims) Allows(namespace string) bool {
	if c.Namespace == "" {
		return false
	}
	return c.Namespace == "*" || c.Namespace == namespace
}

// ValidNamespace reports whether s is "*" or 1–63 characters of
// [A-Za-z0-9_-] starting with a letter or digit.
func ValidNamespace(s string) bool {
	if s == "*" {
		return true
	}
	if len(s) == 0 || len(s) > 63 || !isAlnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func validID(s string) bool {
	if len(s) == 0 || len(s) > maxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// secretKey sits behind a pointer so that even reflection-based printing of
// a struct embedding a Signer shows an address, not the bytes.
type secretKey struct{ b []byte }

// Signer issues and verifies keys with one HMAC secret. It is safe for
// concurrent use. Every formatting path (fmt verbs, slog) prints
// "auth.Signer{REDACTED}".
type Signer struct {
	k *secretKey
}

// NewSigner returns a Signer for secret, which must be MinSecretLen to
// MaxSecretLen bytes. The secret is copied.
func NewSigner(secret []byte) (*Signer, error) {
	if len(secret) < MinSecretLen {
		return nil, fmt.Errorf("auth: secret too short (%d bytes, need at least %d)", len(secret), MinSecretLen)
	}
	if len(secret) > MaxSecretLen {
		return nil, fmt.Errorf("auth: secret too long (%d bytes, at most %d)", len(secret), MaxSecretLen)
	}
	return &Signer{k: &secretKey{b: bytes.Clone(secret)}}, nil
}

const redacted = "auth.Signer{REDACTED}"

// String implements fmt.Stringer without revealing the secret.
func (Signer) String() string { return redacted }

// GoString implements fmt.GoStringer without revealing the secret.
func (Signer) GoString() string { return redacted }

// Format implements fmt.Formatter so that no verb (%d, %x, %+v, …) reaches
// the secret through reflection.
func (Signer) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, redacted) }

// LogValue implements slog.LogValuer.
func (Signer) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalJSON keeps the secret out of JSON output.
func (Signer) MarshalJSON() ([]byte, error) { return json.Marshal(redacted) }

var (
	b64 = base64.RawURLEncoding.Strict()
	// The fixed header this package emits. Verify accepts any header with
	// alg HS256 (microsandbox emits {"typ":"JWT","alg":"HS256"}).
	encodedHeader = b64.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
)

type wireClaims struct {
	Exp       int64  `json:"exp"`
	Iat       int64  `json:"iat"`
	ID        string `json:"jti,omitempty"`
	Namespace string `json:"namespace"`
}

// Issue mints a key for namespace valid for ttl from now. The key id is 16
// random bytes in hex. Times are truncated to whole seconds; exp is rounded
// up so a key never expires earlier than now+ttl.
func (s *Signer) Issue(namespace string, ttl time.Duration, now time.Time) (string, Claims, error) {
	if s == nil || s.k == nil {
		return "", Claims{}, errors.New("auth: Signer not made by NewSigner")
	}
	if !ValidNamespace(namespace) {
		return "", Claims{}, fmt.Errorf("auth: invalid namespace %q", namespace)
	}
	if ttl <= 0 || ttl > MaxTTL {
		return "", Claims{}, fmt.Errorf("auth: ttl %v out of range (0, %v]", ttl, MaxTTL)
	}
	var idb [16]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return "", Claims{}, fmt.Errorf("auth: generating key id: %w", err)
	}
	iat := now.Unix()
	secs := int64(ttl / time.Second)
	if ttl%time.Second != 0 {
		secs++
	}
	wc := wireClaims{Exp: iat + secs, Iat: iat, ID: hex.EncodeToString(idb[:]), Namespace: namespace}
	payload, err := json.Marshal(wc)
	if err != nil {
		return "", Claims{}, fmt.Errorf("auth: encoding claims: %w", err)
	}
	signingInput := encodedHeader + "." + b64.EncodeToString(payload)
	key := Prefix + signingInput + "." + b64.EncodeToString(s.mac(signingInput))
	return key, Claims{
		ID:        wc.ID,
		Namespace: namespace,
		IssuedAt:  time.Unix(wc.Iat, 0).UTC(),
		ExpiresAt: time.Unix(wc.Exp, 0).UTC(),
	}, nil
}

func (s *Signer) mac(signingInput string) []byte {
	m := hmac.New(sha256.New, s.k.b)
	_, _ = io.WriteString(m, signingInput) // a hash never fails to write
	return m.Sum(nil)
}

// Verify checks key's signature and claims at time now. A correctly signed
// key past its exp yields ErrExpired; anything else wrong yields an error
// wrapping ErrInvalid. Neither the key nor the secret appears in errors.
func (s *Signer) Verify(key string, now time.Time) (Claims, error) {
	if s == nil || s.k == nil {
		return Claims{}, invalid("Signer not made by NewSigner")
	}
	if len(key) > MaxKeyLen {
		return Claims{}, invalid("key too long")
	}
	jwt, ok := strings.CutPrefix(key, Prefix)
	if !ok {
		return Claims{}, invalid("missing " + Prefix + " prefix")
	}
	// base64url alphabet and dots only: the base64 decoder would otherwise
	// silently skip CR/LF.
	for i := 0; i < len(jwt); i++ {
		if c := jwt[i]; !isAlnum(c) && c != '-' && c != '_' && c != '.' {
			return Claims{}, invalid("illegal character")
		}
	}
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		return Claims{}, invalid("want 3 segments")
	}
	for _, p := range parts {
		if p == "" {
			return Claims{}, invalid("empty segment")
		}
	}
	hdr, err := b64.DecodeString(parts[0])
	if err != nil {
		return Claims{}, invalid("header not base64url")
	}
	if err := checkHeader(hdr); err != nil {
		return Claims{}, err
	}
	sig, err := b64.DecodeString(parts[2])
	if err != nil {
		return Claims{}, invalid("signature not base64url")
	}
	if len(sig) != sha256.Size {
		return Claims{}, invalid("bad signature")
	}
	if !hmac.Equal(sig, s.mac(jwt[:len(parts[0])+1+len(parts[1])])) {
		return Claims{}, invalid("bad signature")
	}
	payload, err := b64.DecodeString(parts[1])
	if err != nil {
		return Claims{}, invalid("payload not base64url")
	}
	return checkClaims(payload, now)
}

func checkHeader(hdr []byte) error {
	var h map[string]json.RawMessage
	if err := json.Unmarshal(hdr, &h); err != nil || h == nil {
		return invalid("header not a JSON object")
	}
	var alg string
	if raw, ok := h["alg"]; !ok || !isJSONString(raw) || json.Unmarshal(raw, &alg) != nil {
		return invalid("header alg missing")
	}
	if alg != "HS256" {
		return invalid("unsupported alg")
	}
	for name, raw := range h {
		switch name {
		case "alg":
		case "typ":
			var typ string
			if !isJSONString(raw) || json.Unmarshal(raw, &typ) != nil || !strings.EqualFold(typ, "JWT") {
				return invalid("header typ not JWT")
			}
		case "kid":
			// Ignored; microsandbox does not set it, but it is harmless.
		default:
			// Includes "crit": extensions we do not understand must be rejected.
			return invalid("unexpected header field")
		}
	}
	return nil
}

func checkClaims(payload []byte, now time.Time) (Claims, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(payload, &m); err != nil || m == nil {
		return Claims{}, invalid("claims not a JSON object")
	}
	var c Claims

	raw, ok := m["exp"]
	if !ok {
		return Claims{}, invalid("exp missing")
	}
	exp, err := intClaim(raw)
	if err != nil || exp <= 0 {
		return Claims{}, invalid("exp not a positive integer")
	}
	c.ExpiresAt = time.Unix(exp, 0).UTC()

	raw, ok = m["namespace"]
	if !ok {
		return Claims{}, invalid("namespace missing")
	}
	if !isJSONString(raw) || json.Unmarshal(raw, &c.Namespace) != nil || !ValidNamespace(c.Namespace) {
		return Claims{}, invalid("namespace invalid")
	}

	limit := now.Add(ClockSkew)
	if raw, ok := m["iat"]; ok {
		iat, err := intClaim(raw)
		if err != nil || iat < 0 {
			return Claims{}, invalid("iat not a non-negative integer")
		}
		c.IssuedAt = time.Unix(iat, 0).UTC()
		if c.IssuedAt.After(limit) {
			return Claims{}, invalid("iat in the future")
		}
	}
	if raw, ok := m["nbf"]; ok {
		nbf, err := intClaim(raw)
		if err != nil || nbf < 0 {
			return Claims{}, invalid("nbf not a non-negative integer")
		}
		if time.Unix(nbf, 0).After(limit) {
			return Claims{}, invalid("not yet valid")
		}
	}
	if raw, ok := m["jti"]; ok {
		if !isJSONString(raw) || json.Unmarshal(raw, &c.ID) != nil || !validID(c.ID) {
			return Claims{}, invalid("jti invalid")
		}
	}

	if !now.Before(c.ExpiresAt.Add(ClockSkew)) {
		return Claims{}, ErrExpired
	}
	return c, nil
}

// intClaim parses a JSON integer. Strings, floats, exponents and null are
// rejected.
func intClaim(raw json.RawMessage) (int64, error) {
	s := string(raw)
	if s == "" || (s[0] != '-' && (s[0] < '0' || s[0] > '9')) {
		return 0, errors.New("not a number")
	}
	return strconv.ParseInt(s, 10, 64)
}

func isJSONString(raw json.RawMessage) bool { return len(raw) > 0 && raw[0] == '"' }
