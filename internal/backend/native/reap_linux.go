package native

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// ephemeralMarker marks an ephemeral sandbox's state directory; its owner
// holds an exclusive flock on it.
const ephemeralMarker = "ephemeral"

// lockFile opens (creating) p and takes an exclusive flock on it, waiting
// when wait is set; without wait it fails with EWOULDBLOCK if it is held.
func lockFile(p string, wait bool) (*os.File, error) {
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600) //nolint:gosec // p is a marker file in the backend's own data or run directory
	if err != nil {
		return nil, err
	}
	how := unix.LOCK_EX
	if !wait {
		how |= unix.LOCK_NB
	}
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// markerState reports whether an ephemeral marker exists and whether its
// owner still holds it. It never creates one.
func markerState(p string) (exists, held bool) {
	f, err := os.OpenFile(p, os.O_RDWR, 0) //nolint:gosec // p is a marker file in the backend's own data or run directory
	if err != nil {
		return false, false
	}
	defer func() { _ = f.Close() }()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return true, errors.Is(err, unix.EWOULDBLOCK)
	}
	return true, false
}

// removedDir, under the sandboxes' directory, holds removed sandboxes'
// state while it is deleted.
const removedDir = ".removed"

// newPrefix names an ephemeral sandbox's state directory while Create
// assembles it (see Create).
const newPrefix = ".new-"

var removeSeq atomic.Int64

// removeDir deletes a removed sandbox's state directory and unmounts its
// root (which syncs the data directory's file system, see rootMount). The
// directory is first renamed aside, so the name is free at once, and the
// rest runs in the background, after released is closed (when not nil): a
// crash in between leaves it to ReapOrphans.
func (b *Backend) removeDir(dir, id string, root *rootMount, released <-chan struct{}) error {
	aside := filepath.Join(b.opts.DataDir, "sandboxes", removedDir, fmt.Sprintf("%s.%d.%d", id, os.Getpid(), removeSeq.Add(1)))
	if err := os.Rename(dir, aside); err == nil {
		b.removing.Add(1)
		go func() {
			defer b.removing.Done()
			if released != nil {
				<-released
			}
			// Files first: the unmount's sync then has none of their
			// data left to write back.
			if err := b.removeTree(aside); err != nil {
				b.log.Warn("delete removed sandbox's files", "id", id, "err", err.Error())
			}
			root.close()
		}()
		return nil
	}
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		root.close()
		return nil // removed before
	}
	if released != nil {
		<-released
	}
	err := b.removeTree(dir)
	root.close()
	return err
}

// ReapOrphans removes what sandboxes left behind when the process that ran
// them died: runtime directories and cgroups of sandboxes whose agent is
// gone, and the whole state of ephemeral (`warren run`) sandboxes whose
// owner is gone. A sandbox is in use while its owner holds the lock on its
// marker (ephemeral) or its agent runs; keep names sandboxes the caller
// still owns, whose persistent state stays.
func (b *Backend) ReapOrphans(keep func(id string) bool) (removed []string, err error) {
	if keep == nil {
		keep = func(string) bool { return false }
	}
	ids := map[string]bool{}
	var errs []error
	for _, d := range []string{b.opts.RunDir, filepath.Join(b.opts.DataDir, "sandboxes")} {
		ents, err := os.ReadDir(d)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), ".") { // .pool belongs to the warm pool
				ids[e.Name()] = true
			}
		}
	}
	// Removed sandboxes whose deletion a crash interrupted (removeDir).
	// One another process is deleting right now is deleted by both.
	aside := filepath.Join(b.opts.DataDir, "sandboxes", removedDir)
	if ents, err := os.ReadDir(aside); err == nil {
		for _, e := range ents {
			if err := b.removeTree(filepath.Join(aside, e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	// Ephemeral sandboxes whose creator died while assembling them.
	sandboxes := filepath.Join(b.opts.DataDir, "sandboxes")
	if ents, err := os.ReadDir(sandboxes); err == nil {
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), newPrefix) {
				continue
			}
			p := filepath.Join(sandboxes, e.Name())
			if _, held := markerState(filepath.Join(p, ephemeralMarker)); held {
				continue
			}
			if err := b.removeTree(p); err != nil {
				errs = append(errs, err)
			}
		}
	}
	cgs, err := b.cgroups.List()
	if err != nil {
		errs = append(errs, err)
	}
	for _, id := range cgs {
		if !strings.HasPrefix(id, ".") { // the warm pool reaps its own
			ids[id] = true
		}
	}
	for id := range ids {
		dir := filepath.Join(b.opts.DataDir, "sandboxes", id)
		run := filepath.Join(b.opts.RunDir, id)
		ephemeral, held := markerState(filepath.Join(dir, ephemeralMarker))
		if held || alive(run) {
			continue
		}
		// Whole or in only some hierarchies (a crash mid-rename or
		// mid-destroy).
		if err := b.cgroups.Destroy(id); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.RemoveAll(run); err != nil {
			errs = append(errs, err)
			continue
		}
		if ephemeral && !keep(id) {
			if err := b.removeTree(dir); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		removed = append(removed, id)
	}
	if err := b.sweepNet(); err != nil {
		errs = append(errs, err)
	}
	if err := b.reapDisk(); err != nil {
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}
