package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// serveLock is the file in the data and run directories that a running
// `warren serve` holds an exclusive flock on.
const serveLock = "serve.lock"

// lockServe makes this process the only server of dirs (its data and run
// directories). A second server would reattach to the first one's
// sandboxes as its own, remove the ones it does not know and race it on
// every record. The kernel drops the locks when the process dies, so a
// crashed server never blocks the next one. The returned function releases
// them.
func lockServe(dirs ...string) (func(), error) {
	var held []*os.File
	release := func() {
		for _, f := range held {
			_ = f.Close()
		}
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o700); err != nil { // the backend sets the mode and group the sandboxes need (native.New)
			release()
			return nil, err
		}
		p := filepath.Join(d, serveLock)
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600) //nolint:gosec // p is in the directory the operator gave
		if err != nil {
			release()
			return nil, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			_ = f.Close()
			release()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("%s is in use by another warren serve%s: one server per data and run directory (stop it, or give this one --data-dir and --run-dir of its own)", d, holder(p))
			}
			return nil, fmt.Errorf("lock %s: %w", p, err)
		}
		// Who holds it, for the message a second server prints.
		_ = f.Truncate(0)
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		held = append(held, f)
	}
	return release, nil
}

// holder names the pid recorded in a lock file, if any.
func holder(p string) string {
	b, err := os.ReadFile(p) //nolint:gosec // p is in the directory the operator gave
	if err != nil {
		return ""
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
		return fmt.Sprintf(" (pid %d)", pid)
	}
	return ""
}
