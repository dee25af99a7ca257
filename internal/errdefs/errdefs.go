// Package errdefs is the closed set of error kinds the server reports.
// Packages wrap one of these sentinels with %w, or declare their own
// sentinels with Errorf; the RPC layer maps the kind to an HTTP status and
// a JSON-RPC code in one place. It imports only the standard library, so
// that any package can give its errors a kind.
package errdefs

import (
	"context"
	"errors"
	"fmt"
)

// The kinds. Their text is the wire name (error.data.kind).
var (
	ErrInvalid      = errors.New("invalid_params")
	ErrUnauthorized = errors.New("unauthorized")
	ErrForbidden    = errors.New("forbidden")
	ErrNotFound     = errors.New("not_found")
	ErrConflict     = errors.New("conflict")
	ErrTooLarge     = errors.New("too_large")
	ErrLimit        = errors.New("limit")
	ErrTimeout      = errors.New("timeout")
	ErrExecFailed   = errors.New("exec_failed")
	ErrUnavailable  = errors.New("unavailable")
	// ErrUnsupported: what was asked for is valid, but this server or
	// backend cannot do it (pausing on a backend without a freezer).
	ErrUnsupported = errors.New("unsupported")
)

// Internal is the kind of everything not wrapped with a sentinel.
const Internal = "internal"

var all = []error{ErrInvalid, ErrUnauthorized, ErrForbidden, ErrNotFound, ErrConflict,
	ErrTooLarge, ErrLimit, ErrTimeout, ErrExecFailed, ErrUnavailable, ErrUnsupported}

// Kind names err's kind: the outermost kind given with Errorf, else a kind
// err wraps (an error type may unwrap to one), timeout for a deadline, or
// Internal.
func Kind(err error) string {
	// The outermost kind given with Errorf wins over any inside it.
	var ke *kindError
	if errors.As(err, &ke) {
		return ke.kind.Error()
	}
	for _, k := range all {
		if errors.Is(err, k) {
			return k.Error()
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return ErrTimeout.Error()
	}
	return Internal
}

// Errorf returns an error of kind whose text is the formatted message
// alone (%w wraps as in fmt.Errorf): the kind travels in error.data.kind,
// so the words stay the user's to read. A package declares a sentinel of
// its own with it, e.g. Errorf(ErrNotFound, "image not found"): callers
// still test for that sentinel with errors.Is, and Kind finds its kind.
func Errorf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, err: fmt.Errorf(format, args...)}
}

type kindError struct{ kind, err error }

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }
