// Package errdefs is the closed set of error kinds the server reports.
// Packages wrap one of these sentinels with %w; the RPC layer maps the kind
// to an HTTP status and a JSON-RPC code in one place.
package errdefs

import (
	"context"
	"errors"
	"fmt"

	"github.com/warren-sandbox/warren/internal/agent"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/wire"
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
)

// Internal is the kind of everything not wrapped with a sentinel.
const Internal = "internal"

var all = []error{ErrInvalid, ErrUnauthorized, ErrForbidden, ErrNotFound, ErrConflict,
	ErrTooLarge, ErrLimit, ErrTimeout, ErrExecFailed, ErrUnavailable}

// agentKinds maps the agent's error kinds onto the server's.
var agentKinds = map[string]error{
	wire.ErrInvalid:    ErrInvalid,
	wire.ErrNotFound:   ErrNotFound,
	wire.ErrExists:     ErrConflict,
	wire.ErrPermission: ErrForbidden,
	wire.ErrTooLarge:   ErrTooLarge,
	wire.ErrLimit:      ErrLimit,
}

// imageKinds maps the image store's (and the backend's) errors onto the
// server's kinds.
var imageKinds = []struct{ err, kind error }{
	{image.ErrNotFound, ErrNotFound},
	{image.ErrInvalidName, ErrInvalid},
	{image.ErrFormat, ErrInvalid},
	{image.ErrInUse, ErrConflict},
	{image.ErrLimit, ErrLimit},
	{backend.ErrVolumeNotAllowed, ErrInvalid},
}

// Kind names err's kind: the sentinel it wraps, the kind of an agent or
// image-store error it wraps, timeout for a deadline, or Internal.
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
	for _, m := range imageKinds {
		if errors.Is(err, m.err) {
			return m.kind.Error()
		}
	}
	var ae *agent.Error
	if errors.As(err, &ae) {
		if k, ok := agentKinds[ae.Kind]; ok {
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
// so the words stay the user's to read.
func Errorf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, err: fmt.Errorf(format, args...)}
}

type kindError struct{ kind, err error }

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }
