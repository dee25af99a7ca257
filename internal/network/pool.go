package network

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/netplumb"
)

// Pools of instances. Every instance on a host (a warren serve, a test's
// server, a warren run with a network) addresses its sandboxes' links
// from a pool of its own: two pools that overlap would give two links the
// same addresses, and a packet to one could be routed to the other.
// Without --net-pool an instance takes a slot of AutoRange:
//   - a slot is an instance's while it holds the slot's lock (a file under
//     PoolLockDir, flock'd for the process's life), so two live instances
//     never share one;
//   - a slot whose addresses an interface of another instance holds (its
//     sandboxes outlived it) is skipped (netplumb.ErrPoolInUse);
//   - an instance tries the slot its prefix hashes to first, so a server
//     that restarts gets the pool its running sandboxes' links are in.

// AutoRange is cut into slots of SlotBits, one per instance.
var AutoRange = netip.MustParsePrefix("10.201.0.0/16")

// SlotBits is the size of a slot: a /20 holds 1024 /30 links, a sandbox each.
const SlotBits = 20

// PoolLockDir holds the slots' lock files.
const PoolLockDir = "/run/warren-net-pools"

// openAuto opens the plumbing on the first slot this instance can have.
func openAuto(cfg netplumb.Config) (*netplumb.Host, *os.File, error) {
	n := 1 << (SlotBits - AutoRange.Bits())
	sum := sha256.Sum256([]byte(cfg.Prefix))
	first := int(binary.BigEndian.Uint32(sum[:4]) % uint32(n)) //nolint:gosec // G115: n is 16
	if err := os.MkdirAll(PoolLockDir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("pool locks: %w", err)
	}
	var taken []string
	for i := range n {
		pool := slot((first + i) % n)
		lock, err := lockSlot(pool)
		if err != nil {
			if errors.Is(err, unix.EWOULDBLOCK) {
				taken = append(taken, pool.String()+" (another instance's)")
				continue
			}
			return nil, nil, err
		}
		cfg.Pool = pool
		h, err := netplumb.Open(cfg)
		if errors.Is(err, netplumb.ErrPoolInUse) {
			_ = lock.Close()
			taken = append(taken, pool.String()+" (in use)")
			continue
		}
		if err != nil {
			_ = lock.Close()
			return nil, nil, err
		}
		return h, lock, nil
	}
	return nil, nil, fmt.Errorf("no free pool in %v: %s: each warren serve and each warren run with a network holds one while it runs; give a server a pool of its own with --net-pool", AutoRange, strings.Join(taken, ", "))
}

// slot is AutoRange's i-th slot.
func slot(i int) netip.Prefix {
	base := AutoRange.Addr().As4()
	v := binary.BigEndian.Uint32(base[:]) + uint32(i)<<(32-SlotBits) //nolint:gosec // G115: i < 2^(SlotBits-16)
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.PrefixFrom(netip.AddrFrom4(b), SlotBits)
}

// lockSlot takes pool's lock without waiting (EWOULDBLOCK: another
// instance holds it).
func lockSlot(pool netip.Prefix) (*os.File, error) {
	name := strings.ReplaceAll(pool.String(), "/", "_")
	f, err := os.OpenFile(filepath.Join(PoolLockDir, name), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600) //nolint:gosec // a fixed directory of root's
	if err != nil {
		return nil, fmt.Errorf("pool lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil { //nolint:gosec // G115: a descriptor
		_ = f.Close()
		return nil, err
	}
	return f, nil
}
