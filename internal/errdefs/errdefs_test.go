package errdefs

import (
	"context"
	"errors"
	"fmt"
	"go/build"
	"io/fs"
	"strings"
	"testing"
)

func TestErrorf(t *testing.T) {
	inner := fmt.Errorf("open x: %w", fs.ErrNotExist)
	err := fmt.Errorf("start: %w", Errorf(ErrInvalid, "volume %q: %w", "/data", inner))
	if got, want := err.Error(), `start: volume "/data": open x: file does not exist`; got != want {
		t.Errorf("text %q, want %q (no kind words)", got, want)
	}
	if Kind(err) != "invalid_params" {
		t.Errorf("kind %q", Kind(err))
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Error("the wrapped error is lost")
	}
	// The first kind in the chain wins over a kind wrapped inside it.
	if k := Kind(Errorf(ErrConflict, "busy: %w", Errorf(ErrNotFound, "gone"))); k != "conflict" {
		t.Errorf("nested kinds: %q", k)
	}
	if Kind(errors.New("plain")) != Internal {
		t.Error("an error without a kind is not internal")
	}
}

// unwrapsTo stands for an error type of another package that unwraps to a
// kind, as the agent client's errors do.
type unwrapsTo struct{ kind error }

func (e unwrapsTo) Error() string { return "typed" }
func (e unwrapsTo) Unwrap() error { return e.kind }

func TestKind(t *testing.T) {
	// A package's sentinel, declared as image and backend declare theirs.
	sentinel := Errorf(ErrNotFound, "thing not found")
	ctx, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	<-ctx.Done()
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"sentinel", sentinel, "not_found"},
		{"wrapped sentinel", fmt.Errorf("load: %w", sentinel), "not_found"},
		{"kind outside a sentinel", Errorf(ErrInvalid, "bad: %w", sentinel), "invalid_params"},
		{"bare kind", fmt.Errorf("x: %w", ErrUnavailable), "unavailable"},
		{"type unwrapping to a kind", fmt.Errorf("x: %w", unwrapsTo{ErrForbidden}), "forbidden"},
		{"type unwrapping to nothing", unwrapsTo{nil}, Internal},
		{"deadline", fmt.Errorf("call: %w", ctx.Err()), "timeout"},
		{"kind over a deadline", Errorf(ErrConflict, "stopped: %w", ctx.Err()), "conflict"},
		{"canceled", context.Canceled, Internal},
		{"an error with a kind's text", errors.New("not_found"), Internal},
	} {
		if got := Kind(tc.err); got != tc.want {
			t.Errorf("%s: kind %q, want %q", tc.name, got, tc.want)
		}
	}
	if got, want := sentinel.Error(), "thing not found"; got != want {
		t.Errorf("sentinel text %q, want %q", got, want)
	}
	if err := fmt.Errorf("a: %w", sentinel); !errors.Is(err, sentinel) || !errors.Is(err, ErrNotFound) {
		t.Error("a wrapped sentinel is neither itself nor its kind to errors.Is")
	}
	if errors.Is(Errorf(ErrNotFound, "thing not found"), sentinel) {
		t.Error("another error of the same kind and text is the sentinel")
	}
}

// TestLeaf keeps errdefs importable by every package: it imports the
// standard library alone, whose paths have no dot in their first element.
func TestLeaf(t *testing.T) {
	p, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range p.Imports {
		if first, _, _ := strings.Cut(imp, "/"); strings.Contains(first, ".") {
			t.Errorf("errdefs imports %s", imp)
		}
	}
}
