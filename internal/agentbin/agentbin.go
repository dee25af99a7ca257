// Package agentbin finds the two helper binaries the native backend runs:
// warren-agent, PID 1 of every sandbox, and warren-spawner, the host-side
// process that starts the agents. Each comes from an explicit path, its
// environment variable, the copy embedded in a release build of warren
// (build tag embedagent), or the file next to the warren binary.
//
// An embedded copy is extracted once, under the data directory, named by
// its SHA-256, which `make build` computes and embeds beside it: a command
// that starts a sandbox must not pay for hashing megabytes on every run.
// What runs is still the embedded bytes, by these invariants:
//
//   - The installed file is written from the embedded bytes after they were
//     checked against the embedded digest (a build that embedded a stale
//     digest fails here, once, with what to do).
//   - A later run takes the installed file without reading it only when no
//     one but this user (or root) can have changed it: it, its directory
//     and every directory above are owned by root or this user and not
//     writable by group or others (a world-writable directory with the
//     sticky bit counts, as /tmp: no one else can rename in it what is
//     ours), and its inode, size, mtime and ctime are those recorded in its
//     stamp file when it was installed. A write to the file changes its
//     ctime, which no process can set back.
//   - Anywhere else the installed file is read whole and hashed before it is
//     used, as every run did before the stamp existed.
package agentbin

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Find returns the agent's path: explicit (a flag) wins, then $WARREN_AGENT,
// then the embedded copy (extracted once under cacheDir, named by its hash),
// then warren-agent beside the running executable.
func Find(explicit, cacheDir string) (string, error) {
	return find("warren-agent", "WARREN_AGENT", explicit, embeddedAgent, embeddedAgentSum, cacheDir)
}

// FindSpawner returns the spawner's path, looked for as Find looks for the
// agent ($WARREN_SPAWNER, then embedded, then beside warren).
func FindSpawner(explicit, cacheDir string) (string, error) {
	return find("warren-spawner", "WARREN_SPAWNER", explicit, embeddedSpawner, embeddedSpawnerSum, cacheDir)
}

func find(name, env, explicit string, embedded []byte, sum, cacheDir string) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	if p := os.Getenv(env); p != "" {
		return p, nil
	}
	if len(embedded) > 0 {
		return extract(name, embedded, sum, cacheDir)
	}
	exe, err := os.Executable()
	if err == nil {
		p := filepath.Join(filepath.Dir(exe), name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found: build with `make build` (which embeds it), put it next to warren, or set %s", name, env)
}

// extract returns the installed copy of embedded, whose SHA-256 in hex is
// sumHex (computed at build time), installing it under cacheDir first when
// no trustworthy copy is there.
func extract(name string, embedded []byte, sumHex, cacheDir string) (string, error) {
	sumHex = strings.TrimSpace(sumHex)
	want, err := hex.DecodeString(sumHex)
	if err != nil || len(want) != sha256.Size {
		return "", fmt.Errorf("embedded %s: its digest %q is not a SHA-256: rebuild with `make build`", name, sumHex)
	}
	p := filepath.Join(cacheDir, name+"-"+sumHex[:16])
	safe := safeDir(cacheDir)
	if safe && stamped(p, int64(len(embedded))) {
		return p, nil
	}
	// The slow path, once per install (or on every run in an unsafe place).
	sum := sha256.Sum256(embedded)
	if string(sum[:]) != string(want) {
		return "", fmt.Errorf("embedded %s: its bytes do not match the digest built with them: rebuild with `make build`", name)
	}
	if b, err := os.ReadFile(p); err == nil && sha256.Sum256(b) == sum { //nolint:gosec // p is cacheDir joined with a name made from the embedded binary's hash
		if safe {
			return p, writeStamp(p)
		}
		return p, nil
	}
	if err := os.MkdirAll(cacheDir, 0o711); err != nil { //nolint:gosec // 0711 like the data dir it sits in: it holds only binaries shipped inside warren itself, and listing stays refused
		return "", err
	}
	tmp, err := os.CreateTemp(cacheDir, "."+name+"-")
	if err != nil {
		return "", err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(embedded); err != nil {
		_ = tmp.Close()
		return "", err
	}
	if err := tmp.Chmod(0o755); err != nil {
		_ = tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return "", fmt.Errorf("install embedded %s: %w", name, err)
	}
	if safeDir(cacheDir) {
		return p, writeStamp(p)
	}
	return p, nil
}

// safeDir reports whether dir and every directory above it are owned by
// root or this user and writable by no one else (or sticky, as /tmp).
func safeDir(dir string) bool {
	d, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for {
		fi, err := os.Lstat(d)
		if err != nil || !fi.IsDir() || !ownedByUs(fi) {
			return false
		}
		if fi.Mode().Perm()&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0 {
			return false
		}
		if d == "/" {
			return true
		}
		d = filepath.Dir(d)
	}
}

func ownedByUs(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	return st.Uid == 0 || int(st.Uid) == os.Geteuid()
}

// stampOf is what a stamp records of the installed file: what changes when
// anything writes to it or replaces it.
func stampOf(fi fs.FileInfo) (string, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o022 != 0 || !ownedByUs(fi) {
		return "", false
	}
	return fmt.Sprintf("warren-agentbin 1 dev=%d ino=%d size=%d mtime=%d.%09d ctime=%d.%09d\n",
		st.Dev, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec), true
}

// stamped reports whether p is the file its stamp recorded, of size bytes.
func stamped(p string, size int64) bool {
	fi, err := os.Lstat(p)
	if err != nil || fi.Size() != size {
		return false
	}
	want, ok := stampOf(fi)
	if !ok {
		return false
	}
	got, err := os.ReadFile(p + ".stamp") //nolint:gosec // beside p, in a directory checked safe
	return err == nil && string(got) == want
}

// writeStamp records p's identity (after its rename, which may change its
// ctime) in p.stamp, written whole or not at all.
func writeStamp(p string) error {
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	s, ok := stampOf(fi)
	if !ok {
		return errors.New("install embedded binary: " + p + " is not a regular file of ours, writable only by us")
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".stamp-")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(f.Name()) }()
	_, err = f.WriteString(s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), p+".stamp")
	}
	return err
}
