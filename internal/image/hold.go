package image

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Holds pin an image for a process that runs a sandbox the database does
// not know (`warren run`): a file per holder under <store>/holds, named
// after the image id and locked exclusively for as long as the holder
// lives, listing the image's layers. A holder that dies releases its lock
// with it, so a crash leaves at most a stale file that the next Prune
// deletes. Remove refuses an image's last name while it is held; Prune
// keeps the layers of held images, even once a re-import has moved the
// name and the image record is gone.

func (s *Store) holdsDir() string { return filepath.Join(s.dir, "holds") }

// Hold pins img (from Get) until release is called or the process ends.
// The host image (no id) needs no hold.
func (s *Store) Hold(img *Image) (release func(), err error) {
	if img.ID == "" {
		return func() {}, nil
	}
	rec, err := getRecordByID(context.Background(), s.db, img.ID)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(s.holdsDir(), 0o700); err != nil {
		return nil, err
	}
	// Written and locked under a temporary name, then renamed into
	// place: Prune sees a hold complete or not at all.
	f, err := os.CreateTemp(s.holdsDir(), ".tmp-")
	if err != nil {
		return nil, fmt.Errorf("hold image %s: %w", img.ID, err)
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	p := filepath.Join(s.holdsDir(), strings.TrimPrefix(img.ID, "sha256:")+"-"+hex.EncodeToString(rnd[:]))
	release = func() {
		_ = os.Remove(p)
		_ = os.Remove(f.Name())
		_ = f.Close()
	}
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
	if err == nil {
		_, err = f.WriteString(strings.Join(rec.Layers, "\n") + "\n")
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err == nil {
		// A Prune between the lookup above and the rename may have taken
		// the layers; from here on it cannot, so check they are there.
		_, err = s.Get(img.ID)
	}
	if err != nil {
		release()
		return nil, fmt.Errorf("hold image %s: %w", img.ID, err)
	}
	return release, nil
}

// holds returns the layers of every live hold by image id, deleting the
// files of dead holders.
func (s *Store) holds() (map[string][]string, error) {
	ents, err := os.ReadDir(s.holdsDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, e := range ents {
		// Temporary files of a Hold in progress (live) or of one that
		// died before its rename (deleted here) pin nothing.
		layers, live, err := readHold(filepath.Join(s.holdsDir(), e.Name()))
		if err != nil {
			return nil, err
		}
		hexID, _, _ := strings.Cut(e.Name(), "-")
		if live && hexRE().MatchString(hexID) {
			id := "sha256:" + hexID
			out[id] = append(out[id], layers...)
		}
	}
	return out, nil
}

// readHold reads a hold file's layers if its holder is alive, and deletes
// it if not.
func readHold(p string) (layers []string, live bool, err error) {
	f, err := os.Open(p) //nolint:gosec // p is a hold file in the store's own directory
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	defer func() { _ = f.Close() }()
	if unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB) == nil {
		return nil, false, os.Remove(p) // nobody holds it
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if d := sc.Text(); validDigest(d) {
			layers = append(layers, d)
		}
	}
	return layers, true, sc.Err()
}
