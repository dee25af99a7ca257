package agentbin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:]) + "\n" // as sha256sum writes it
}

// installedBytes is what extract's path holds.
func installedBytes(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p) //nolint:gosec // the test's own file
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestExtractInstallsOnceAndStamps(t *testing.T) {
	bin := []byte("#!/bin/sh\necho agent one\n")
	dir := filepath.Join(t.TempDir(), "bin")
	p, err := extract("warren-agent", bin, digest(bin), dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(installedBytes(t, p), bin) {
		t.Fatal("installed copy differs from the embedded bytes")
	}
	if !stamped(p, int64(len(bin))) {
		t.Fatal("no valid stamp after the install")
	}
	fi, _ := os.Stat(p)
	p2, err := extract("warren-agent", bin, digest(bin), dir)
	if err != nil || p2 != p {
		t.Fatalf("second extract: %q, %v", p2, err)
	}
	fi2, _ := os.Stat(p)
	if !os.SameFile(fi, fi2) {
		t.Fatal("the second extract installed again: the stamp was not trusted")
	}
}

// A copy changed after its install (same size, so only the stamp can tell)
// is replaced by the embedded bytes before it is used.
func TestExtractReplacesTamperedCopy(t *testing.T) {
	bin := []byte("#!/bin/sh\necho agent one\n")
	dir := filepath.Join(t.TempDir(), "bin")
	p, err := extract("warren-agent", bin, digest(bin), dir)
	if err != nil {
		t.Fatal(err)
	}
	evil := bytes.Replace(bin, []byte("one"), []byte("bad"), 1)
	if err := os.WriteFile(p, evil, 0o755); err != nil { //nolint:gosec // executable like the real one
		t.Fatal(err)
	}
	p2, err := extract("warren-agent", bin, digest(bin), dir)
	if err != nil || p2 != p {
		t.Fatalf("extract: %q, %v", p2, err)
	}
	if !bytes.Equal(installedBytes(t, p), bin) {
		t.Fatal("the tampered copy was kept")
	}
}

// In a directory others may write, a stamp proves nothing (whoever swapped
// the binary could write the stamp too): the copy is hashed every time.
func TestExtractDistrustsStampInWritableDir(t *testing.T) {
	bin := []byte("#!/bin/sh\necho agent one\n")
	dir := filepath.Join(t.TempDir(), "bin")
	p, err := extract("warren-agent", bin, digest(bin), dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil { //nolint:gosec // the point of the test
		t.Fatal(err)
	}
	if safeDir(dir) {
		t.Fatal("a directory writable by all, without the sticky bit, counted as safe")
	}
	evil := bytes.Replace(bin, []byte("one"), []byte("bad"), 1)
	if err := os.WriteFile(p, evil, 0o755); err != nil { //nolint:gosec // as an attacker would
		t.Fatal(err)
	}
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	s, ok := stampOf(fi)
	if !ok {
		t.Fatal("no stamp for the tampered file")
	}
	if err := os.WriteFile(p+".stamp", []byte(s), 0o644); err != nil { //nolint:gosec // as an attacker would
		t.Fatal(err)
	}
	if _, err := extract("warren-agent", bin, digest(bin), dir); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(installedBytes(t, p), bin) {
		t.Fatal("a tampered copy with a matching stamp ran from a world-writable directory")
	}
	if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil { //nolint:gosec // sticky: as /tmp
		t.Fatal(err)
	}
	if !safeDir(dir) {
		t.Fatal("a sticky directory of ours counted as unsafe")
	}
}

func TestExtractRefusesStaleDigest(t *testing.T) {
	bin := []byte("#!/bin/sh\necho agent two\n")
	dir := filepath.Join(t.TempDir(), "bin")
	for _, sum := range []string{digest([]byte("an older agent")), "", "zz"} {
		_, err := extract("warren-agent", bin, sum, dir)
		if err == nil || !strings.Contains(err.Error(), "make build") {
			t.Errorf("digest %q: err %v, want one saying to rebuild", sum, err)
		}
	}
}
