// Package uidrange hands out the host uid ranges sandboxes run as, so that
// no host uid is shared by two running sandboxes (issue #18, findings 2
// and 8): a sandbox that gets hold of another's uid could read and plant
// its files and signal its processes, and the kernel's per-user limits
// (inotify instances, message queues, queued signals) would be one pool.
//
// Invariants:
//   - Range k, for k in 1..Count, is the host ids [Base+k*Size,
//     Base+(k+1)*Size). Range 0, [Base, Base+Size), is the storage range:
//     what sandboxes and images keep on disk is owned by ids in it, and no
//     process runs as one. A sandbox sees its files through mounts
//     idmapped from the storage range to its own.
//   - A range is in use exactly while its lock file (Dir/<k>) is locked
//     (flock, exclusive). Take locks it; the holder hands the descriptor
//     to the sandbox's agent, which keeps it for its life. The kernel
//     drops the lock when the last descriptor goes: a range stays taken
//     while its sandbox runs, even when the server that took it has
//     crashed, and is free the moment the sandbox is gone.
//   - Every process that takes ranges with the same Base uses the same
//     Dir, so ranges are unique on the host, not just in one server.
package uidrange

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// Size is the number of ids in a range: a sandbox's uids and gids 0..65535.
const Size = 65536

// DefaultCount is how many ranges a host has by default: the most sandboxes
// that can run at once.
const DefaultCount = 1024

// ErrExhausted reports that every range is in use.
var ErrExhausted = errors.New("every sandbox uid range is in use")

// DefaultDir is the lock directory for ranges above base, shared by every
// process on the host.
func DefaultDir(base uint32) string {
	return fmt.Sprintf("/run/warren-uid-ranges/%#x", base)
}

// Allocator takes ranges above one base.
type Allocator struct {
	dir   string
	base  uint32
	count int
}

// New returns an allocator of count ranges above base (count 0:
// DefaultCount), locking in dir.
func New(dir string, base uint32, count int) (*Allocator, error) {
	if count == 0 {
		count = DefaultCount
	}
	if count < 1 || uint64(base)+uint64(count+1)*Size > math.MaxUint32 { //nolint:gosec // count >= 1 by then: the || stops at a negative one
		return nil, fmt.Errorf("uid ranges: %d ranges above %d do not fit in 32-bit ids", count, base)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("uid ranges: %w", err)
	}
	return &Allocator{dir: dir, base: base, count: count}, nil
}

// Base is the first id of the storage range.
func (a *Allocator) Base() uint32 { return a.base }

// Range is one taken range.
type Range struct {
	Index int
	Host  uint32 // the range's first host id: what sandbox root is
	lock  *os.File
}

// Take locks the first free range.
func (a *Allocator) Take() (*Range, error) {
	for k := 1; k <= a.count; k++ {
		f, err := os.OpenFile(filepath.Join(a.dir, strconv.Itoa(k)), os.O_RDONLY|os.O_CREATE, 0o600) //nolint:gosec // a number in the allocator's own directory
		if err != nil {
			return nil, fmt.Errorf("uid ranges: %w", err)
		}
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return &Range{Index: k, Host: a.base + uint32(k)*Size, lock: f}, nil //nolint:gosec // k <= count, which New checked fits
		}
		_ = f.Close()
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("uid ranges: lock range %d: %w", k, err)
		}
	}
	return nil, fmt.Errorf("%w (%d)", ErrExhausted, a.count)
}

// Lock is the descriptor that holds the range: whoever inherits it keeps
// the range taken for as long as it is open.
func (r *Range) Lock() *os.File { return r.lock }

// Close drops the caller's hold; the range stays taken while another
// process (the sandbox's agent) has the descriptor.
func (r *Range) Close() error { return r.lock.Close() }

// InUse reports whether range k is taken (by any process).
func (a *Allocator) InUse(k int) (bool, error) {
	f, err := os.Open(filepath.Join(a.dir, strconv.Itoa(k))) //nolint:gosec // a number in the allocator's own directory
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer func() { _ = f.Close() }()
	err = unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return true, nil
	}
	return false, err
}
