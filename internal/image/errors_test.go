package image

import (
	"errors"
	"fmt"
	"testing"

	"github.com/warren-sandbox/warren/internal/errdefs"
)

// TestErrorKinds pins the kind the server reports for each of the store's
// errors, as they are returned (wrapped) and as callers test for them.
func TestErrorKinds(t *testing.T) {
	s := newStore(t)
	_, getErr := s.Get("nope")
	for _, tc := range []struct {
		name string
		err  error
		is   error
		want string
	}{
		{"not found", getErr, ErrNotFound, "not_found"},
		{"invalid name", ValidateName("Bad Name"), ErrInvalidName, "invalid_params"},
		{"format", errNoPlatform, ErrFormat, "invalid_params"},
		{"in use", fmt.Errorf("%w: %q is used by sandbox x", ErrInUse, "img"), ErrInUse, "conflict"},
		{"limit", fmt.Errorf("%w: 2000 layers", ErrLimit), ErrLimit, "limit"},
		// A format error holding a limit inside it is a format error.
		{"format around limit", fmt.Errorf("%w: index: %w", ErrFormat, fmt.Errorf("%w: nested", ErrLimit)), ErrFormat, "invalid_params"},
		{"digest", fmt.Errorf("layer x: %w", ErrDigest), ErrDigest, errdefs.Internal},
		{"pull", fmt.Errorf("%w: refused", ErrPull), ErrPull, errdefs.Internal},
	} {
		if tc.err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		if !errors.Is(tc.err, tc.is) {
			t.Errorf("%s: %v is not %v", tc.name, tc.err, tc.is)
		}
		if got := errdefs.Kind(tc.err); got != tc.want {
			t.Errorf("%s: %v: kind %q, want %q", tc.name, tc.err, got, tc.want)
		}
	}
}
