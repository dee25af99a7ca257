package auth

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// LoadOrCreateSecret returns the signing secret stored at path, creating it
// on first use.
//
// File format: the secret is the file's bytes verbatim, minus trailing
// whitespace (so a trailing newline is allowed), and must be MinSecretLen to
// MaxSecretLen bytes. Using the bytes verbatim, not hex-decoded, keeps the
// file compatible with microsandbox, which HMACs with its key string as is:
// paste microsandbox's server key into the file and its keys verify. A
// created file holds 32 bytes from crypto/rand, hex-encoded (64 characters,
// then a newline); those 64 ASCII characters are the HMAC key.
//
// An existing file must be a regular file (not a symlink), owned by the
// effective uid, with no group or other permission bits. Creation is atomic
// (temp file 0600, fsync, hard link to path, fsync dir), and concurrent first
// starts agree: the loser of the link race reads the winner's secret. The
// parent directory is created 0700 if missing.
func LoadOrCreateSecret(path string) ([]byte, error) {
	secret, err := readSecret(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return secret, err
	}
	return createSecret(path)
}

func readSecret(path string) ([]byte, error) {
	// O_NONBLOCK keeps a FIFO planted at path from hanging us; it is a no-op
	// for regular files.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0) //nolint:gosec // path is the daemon's configured secret file; O_NOFOLLOW and the checks below refuse anything but a regular file
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("auth: secret file %s is a symlink; refusing to follow it", path)
		}
		if errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("auth: opening secret file: %w", err)
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("auth: stat secret file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("auth: secret file %s is not a regular file", path)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("auth: secret file %s is owned by uid %d, not by the server's uid %d", path, st.Uid, os.Geteuid())
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("auth: secret file %s has mode %04o, readable or writable by others; run: chmod 600 %s", path, perm, path)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxSecretLen+64))
	if err != nil {
		return nil, fmt.Errorf("auth: reading secret file: %w", err)
	}
	secret := bytes.TrimRight(data, " \t\r\n")
	if len(secret) < MinSecretLen || len(secret) > MaxSecretLen {
		return nil, fmt.Errorf("auth: secret file %s must hold %d to %d bytes (has %d)", path, MinSecretLen, MaxSecretLen, len(secret))
	}
	return secret, nil
}

func createSecret(path string) ([]byte, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("auth: creating secret directory: %w", err)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, fmt.Errorf("auth: generating secret: %w", err)
	}
	secret := []byte(hex.EncodeToString(raw[:]))

	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*") // mode 0600
	if err != nil {
		return nil, fmt.Errorf("auth: creating secret file: %w", err)
	}
	tmpName := tmp.Name()
	defer func() { _ = os.Remove(tmpName) }()
	if _, err := tmp.Write(append(bytes.Clone(secret), '\n')); err != nil {
		_ = tmp.Close()
		return nil, fmt.Errorf("auth: writing secret file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return nil, fmt.Errorf("auth: syncing secret file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("auth: closing secret file: %w", err)
	}
	// link(2) fails with EEXIST instead of replacing, so exactly one
	// concurrent creator wins and the rest read its fully written file.
	if err := os.Link(tmpName, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return readSecret(path)
		}
		return nil, fmt.Errorf("auth: installing secret file: %w", err)
	}
	if d, err := os.Open(dir); err == nil { //nolint:gosec // dir is the secret file's own directory, opened only to fsync it
		_ = d.Sync() // best effort: the file itself was synced
		_ = d.Close()
	}
	return secret, nil
}
