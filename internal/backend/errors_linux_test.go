package backend

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/errdefs"
)

// TestErrorKinds pins the kind the server reports for the backend's
// errors, as CheckVolumeSource and Exec return them.
func TestErrorKinds(t *testing.T) {
	dir := t.TempDir()
	allowed, other := filepath.Join(dir, "allowed"), filepath.Join(dir, "other")
	for _, d := range []string{allowed, other} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(other, filepath.Join(allowed, "link")); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(allowed, "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	roots := []string{allowed}
	vol := func(src string) Volume { return Volume{Source: src, Target: "/data"} }
	for _, tc := range []struct {
		name string
		err  error
		is   error
		want string
	}{
		{"outside the roots", CheckVolumeSource(roots, vol(other)), ErrVolumeNotAllowed, "invalid_params"},
		{"through a symlink", CheckVolumeSource(roots, vol(filepath.Join(allowed, "link"))), ErrVolumeNotAllowed, "invalid_params"},
		{"not a file or directory", CheckVolumeSource(roots, vol(fifo)), ErrVolumeNotAllowed, "invalid_params"},
		// The caller gives this one its kind: it knows what was cut short.
		{"agent unresponsive", fmt.Errorf("%w (stop: %w)", ErrAgentUnresponsive, errors.New("x")), ErrAgentUnresponsive, errdefs.Internal},
	} {
		if !errors.Is(tc.err, tc.is) {
			t.Errorf("%s: %v is not %v", tc.name, tc.err, tc.is)
		}
		if got := errdefs.Kind(tc.err); got != tc.want {
			t.Errorf("%s: %v: kind %q, want %q", tc.name, tc.err, got, tc.want)
		}
	}
	if err := CheckVolumeSource(roots, vol(allowed)); err != nil {
		t.Errorf("an allowed volume: %v", err)
	}
}
