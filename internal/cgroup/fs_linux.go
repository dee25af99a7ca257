package cgroup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

var errBusy = syscall.EBUSY

// rmdirTimeout bounds the EBUSY retries of one rmdir.
var rmdirTimeout = 2 * time.Second

// writeFile writes s to an existing cgroup file in one write.
func writeFile(p, s string) error {
	f, err := os.OpenFile(p, os.O_WRONLY, 0) //nolint:gosec // p is a cgroupfs path built by this package from its own layout
	if err != nil {
		return err
	}
	_, err = f.Write([]byte(s))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", s, p, err)
	}
	return nil
}

// readWords returns the space-separated words of a file (nil on error).
func readWords(p string) []string {
	b, err := os.ReadFile(p) //nolint:gosec // p is a cgroupfs path built by this package from its own layout
	if err != nil {
		return nil
	}
	return strings.Fields(string(b))
}

// readInt reads a file holding one integer; a missing file reads as 0, ok=false.
func readInt(p string) (v int64, ok bool, err error) {
	b, err := os.ReadFile(p) //nolint:gosec // p is a cgroupfs path built by this package from its own layout
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, true, nil
	}
	v, err = strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("parse %s: %w", p, err)
	}
	return v, true, nil
}

// readKeyed reads a flat-keyed file ("key value" per line); missing → nil map.
func readKeyed(p string) (map[string]int64, error) {
	b, err := os.ReadFile(p) //nolint:gosec // p is a cgroupfs path built by this package from its own layout
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
			out[k] = n
		}
	}
	return out, nil
}

// readPids reads a cgroup.procs file; a missing file reads as empty, and
// so does a v2 threaded cgroup's, which the kernel refuses to list
// (EOPNOTSUPP): its thread root's lists the processes of its whole subtree.
func readPids(p string) ([]int, error) {
	b, err := os.ReadFile(p) //nolint:gosec // p is a cgroupfs path built by this package from its own layout
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENODEV) || errors.Is(err, syscall.EOPNOTSUPP) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", p, err)
		}
		out = append(out, n)
	}
	return out, nil
}

// rmdirRetry removes one cgroup directory, retrying EBUSY until timeout.
// A directory that is already gone is success.
func rmdirRetry(dir string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	wait := time.Millisecond
	for {
		err := unix.Rmdir(dir)
		if err == nil || err == unix.ENOENT {
			return nil
		}
		if err != unix.EBUSY || time.Now().After(deadline) {
			return &fs.PathError{Op: "rmdir", Path: dir, Err: err}
		}
		time.Sleep(wait)
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// removeTree removes a cgroup directory and its descendant cgroups,
// deepest first.
func removeTree(dir string, timeout time.Duration) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if e.IsDir() {
			errs = append(errs, removeTree(filepath.Join(dir, e.Name()), timeout))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return rmdirRetry(dir, timeout)
}

// walkDirs calls fn for dir and every descendant cgroup directory.
func walkDirs(dir string, fn func(string) error) error {
	if err := fn(dir); err != nil {
		return err
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := walkDirs(filepath.Join(dir, e.Name()), fn); err != nil {
				return err
			}
		}
	}
	return nil
}

// errno renders an error compactly (the errno text for PathErrors).
func errno(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}
