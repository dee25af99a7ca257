package errdefs

import (
	"errors"
	"fmt"
	"io/fs"
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
