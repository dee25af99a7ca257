package native

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ReapOrphans removes what sandboxes whose agent is gone left behind after a
// crash of the process that ran them: runtime directories, cgroups, and the
// whole state of ephemeral (`warren run`) sandboxes. Sandboxes for which
// keep returns true keep their persistent state. Anything younger than the
// start timeout is left alone: another process may be starting it.
func (b *Backend) ReapOrphans(keep func(id string) bool) (removed []string, err error) {
	if keep == nil {
		keep = func(string) bool { return false }
	}
	var errs []error
	young := func(p string) bool {
		fi, err := os.Stat(p)
		return err == nil && time.Since(fi.ModTime()) < b.opts.StartTimeout
	}
	seen := map[string]bool{}
	ents, err := os.ReadDir(b.opts.RunDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, e := range ents {
		id, run := e.Name(), filepath.Join(b.opts.RunDir, e.Name())
		if strings.HasPrefix(id, ".") {
			continue // the warm pool's, managed by the pool
		}
		seen[id] = true
		if alive(run) || (young(run) && !fileExists(filepath.Join(run, "agent.pid"))) {
			continue
		}
		if cg, err := b.cgroups.Open(id); err == nil {
			if err := cg.Destroy(); err != nil {
				errs = append(errs, err)
			}
		}
		if err := os.RemoveAll(run); err != nil {
			errs = append(errs, err)
		}
		removed = append(removed, id)
	}
	names, err := b.cgroups.List()
	if err != nil {
		errs = append(errs, err)
	}
	for _, id := range names {
		if seen[id] {
			continue
		}
		if cg, err := b.cgroups.Open(id); err == nil {
			if err := cg.Destroy(); err != nil {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, id)
		}
	}
	sbs, err := os.ReadDir(filepath.Join(b.opts.DataDir, "sandboxes"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range sbs {
		id := e.Name()
		dir := filepath.Join(b.opts.DataDir, "sandboxes", id)
		if keep(id) || !fileExists(filepath.Join(dir, "ephemeral")) || young(dir) {
			continue
		}
		if alive(filepath.Join(b.opts.RunDir, id)) {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, id)
	}
	return removed, errors.Join(errs...)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
