package secrets

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"sync"

	"golang.org/x/sys/unix"
)

// Provider gives a secret's value by its key (the provider's name for
// it). Errors name the key and say what is wrong, never the value.
type Provider interface {
	Get(ctx context.Context, key string) (Value, error)
}

// keyRE is what a key may be in every provider here: a file name in a
// directory (no path, no dot file) and an environment variable's suffix.
// Compiled on first use, not at package initialisation, which every warren
// command pays (docs/performance.md).
var keyRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`) })

func checkKey(key string) error {
	if !keyRE().MatchString(key) {
		return fmt.Errorf("secret key %.40q: want 1-128 of [A-Za-z0-9_.-], not starting with '.' or '-'", key)
	}
	return nil
}

// Dir is a directory holding one file per secret, named by its key. A
// file is used only if it is a regular file (not a symlink), of mode 0600
// or stricter, owned by root or by the server's user, of at most MaxValue
// bytes; one trailing newline is not part of the value (an editor's).
type Dir struct {
	path string
	uid  int
}

// NewDir is the provider of the files in path (an absolute path to a
// directory). The directory is checked at every Get, not here, so a
// directory made after the server started works.
func NewDir(path string) (*Dir, error) {
	if path == "" || path[0] != '/' {
		return nil, fmt.Errorf("secrets directory %q: want an absolute path", path)
	}
	return &Dir{path: path, uid: os.Geteuid()}, nil
}

// Get reads the file key of the directory.
func (d *Dir) Get(_ context.Context, key string) (Value, error) {
	if err := checkKey(key); err != nil {
		return Value{}, err
	}
	dir, err := unix.Open(d.path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return Value{}, fmt.Errorf("secrets directory %s: %w", d.path, err)
	}
	defer func() { _ = unix.Close(dir) }()
	// O_NOFOLLOW: a symlink is refused (ELOOP), not followed to a file
	// someone else chose; O_NONBLOCK: a FIFO does not hang the open.
	fd, err := unix.Openat(dir, key, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) {
		return Value{}, fmt.Errorf("secret file %s/%s is a symbolic link: refused", d.path, key)
	}
	if err != nil {
		return Value{}, fmt.Errorf("secret file %s/%s: %w", d.path, key, err)
	}
	f := os.NewFile(uintptr(fd), key)
	defer func() { _ = f.Close() }()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Value{}, fmt.Errorf("secret file %s/%s: %w", d.path, key, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return Value{}, fmt.Errorf("secret file %s/%s is not a regular file: refused", d.path, key)
	case st.Mode&0o077 != 0:
		return Value{}, fmt.Errorf("secret file %s/%s has mode %#o: refused, want 0600 or stricter (chmod 600)", d.path, key, st.Mode&0o777)
	case st.Uid != 0 && int(st.Uid) != d.uid:
		return Value{}, fmt.Errorf("secret file %s/%s is owned by uid %d: refused, want root or the server's user (uid %d)", d.path, key, st.Uid, d.uid)
	case st.Size > MaxValue+1:
		return Value{}, fmt.Errorf("secret file %s/%s has %d bytes: refused, at most %d", d.path, key, st.Size, MaxValue)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxValue+2))
	if err != nil {
		return Value{}, fmt.Errorf("secret file %s/%s: %w", d.path, key, err)
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	if len(b) > MaxValue {
		return Value{}, fmt.Errorf("secret file %s/%s has over %d bytes: refused", d.path, key, MaxValue)
	}
	if len(b) == 0 {
		return Value{}, fmt.Errorf("secret file %s/%s is empty", d.path, key)
	}
	return NewValue(b), nil
}

// Env is the server's environment: key K is the variable Prefix+K.
type Env struct {
	Prefix string
	// Lookup is os.LookupEnv unless set (tests).
	Lookup func(string) (string, bool)
}

// Get reads the variable Prefix+key.
func (e *Env) Get(_ context.Context, key string) (Value, error) {
	if err := checkKey(key); err != nil {
		return Value{}, err
	}
	look := e.Lookup
	if look == nil {
		look = os.LookupEnv
	}
	name := e.Prefix + key
	v, ok := look(name)
	switch {
	case !ok:
		return Value{}, fmt.Errorf("secret variable %s is not in the server's environment", name)
	case v == "":
		return Value{}, fmt.Errorf("secret variable %s is empty", name)
	case len(v) > MaxValue:
		return Value{}, fmt.Errorf("secret variable %s has %d bytes: refused, at most %d", name, len(v), MaxValue)
	}
	return NewValue([]byte(v)), nil
}
