package auth

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/store"
)

func newKeys(t *testing.T) *Keys {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "warren.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	k := NewKeys(newSigner(t, testSecret), st.DB())
	k.now = func() time.Time { return testNow }
	return k
}

// TestKeysLifecycle: a key the store issued verifies until it is revoked
// or expires; a validly signed key it never issued does not.
func TestKeysLifecycle(t *testing.T) {
	ctx := t.Context()
	k := newKeys(t)
	key, rec, err := k.Create(ctx, "team-a", time.Hour, "ci")
	if err != nil {
		t.Fatal(err)
	}
	c, err := k.Verify(ctx, key)
	if err != nil || c.Namespace != "team-a" || c.ID != rec.ID {
		t.Fatalf("Verify of a fresh key: %+v, %v", c, err)
	}
	recs, err := k.List(ctx)
	if err != nil || len(recs) != 1 || recs[0].ID != rec.ID || recs[0].Description != "ci" || recs[0].Revoked != nil {
		t.Fatalf("List: %+v, %v", recs, err)
	}

	unauthorized := func(what, key, want string) {
		t.Helper()
		_, err := k.Verify(ctx, key)
		if errdefs.Kind(err) != errdefs.ErrUnauthorized.Error() || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: %v, want unauthorized saying %q", what, err, want)
		}
	}
	// Signed with the same secret, never recorded.
	stray, _, err := k.signer.Issue("team-a", time.Hour, testNow)
	if err != nil {
		t.Fatal(err)
	}
	unauthorized("a key the store did not issue", stray, "not known to this server")

	if err := k.Revoke(ctx, rec.ID); err != nil {
		t.Fatal(err)
	}
	if err := k.Revoke(ctx, rec.ID); err != nil {
		t.Fatalf("revoking twice: %v", err)
	}
	unauthorized("a revoked key", key, "revoked")
	if recs, _ := k.List(ctx); len(recs) != 1 || recs[0].Revoked == nil {
		t.Fatalf("List after the revocation: %+v", recs)
	}
	if err := k.Revoke(ctx, "no-such-key"); errdefs.Kind(err) != errdefs.ErrNotFound.Error() {
		t.Fatalf("revoking an unknown id: %v", err)
	}

	key2, _, err := k.Create(ctx, "*", time.Minute, "")
	if err != nil {
		t.Fatal(err)
	}
	k.now = func() time.Time { return testNow.Add(time.Minute + ClockSkew + time.Second) }
	unauthorized("an expired key", key2, "expired")

	if _, _, err := k.Create(ctx, "bad namespace", time.Hour, ""); errdefs.Kind(err) != errdefs.ErrInvalid.Error() {
		t.Fatalf("a key for an invalid namespace: %v", err)
	}
}
