package network

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/warren-sandbox/warren/internal/netplumb"
)

// Instances owned by a process. A `warren run` with a network is an
// instance of its own for its life (its table, its links, its pool slot):
// concurrent runs, and a warren serve on the same run directory, must not
// share plumbing. Its prefix names its process:
//
//	<base>-run-<pid>-<start>
//
// where base is the backend's InstancePrefix and start is the process's
// start time (clock ticks after boot, /proc/<pid>/stat). Invariants:
//   - (pid, start) names one process of this boot: a pid is reused only
//     after the kernel cycles through every other (pid_max), which takes
//     far longer than a tick; nftables tables and links do not outlive a
//     boot;
//   - so an owned instance whose process is gone is garbage: its sandboxes
//     ended with it (they run with ExitWithHost), and the kernel deleted
//     their links with their namespaces. SweepOwned removes its table (and
//     any link left) at the next `warren run` or `warren serve` of base;
//   - "gone" is only concluded from /proc saying so (no such pid, or
//     another start time): when /proc cannot be read, the instance is
//     kept. This assumes the sweeper shares the owner's pid and time
//     namespaces (a start time is read relative to the reader's boot
//     time), as processes of one host's run directory do.
const ownedInfix = "-run-"

// OwnedPrefix returns the prefix of an instance owned by this process.
func OwnedPrefix(base string) (string, error) {
	pid := os.Getpid()
	start, err := startTime(pid)
	if err != nil {
		return "", fmt.Errorf("network: own start time: %w", err)
	}
	return fmt.Sprintf("%s%s%d-%d", base, ownedInfix, pid, start), nil
}

// SweepOwned removes the plumbing of base's owned instances whose process
// is gone, returning their prefixes.
func SweepOwned(base string) ([]string, error) {
	names, err := netplumb.Tables(base + ownedInfix)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, name := range names {
		pid, start, ok := parseOwned(strings.TrimPrefix(name, base+ownedInfix))
		if !ok || ownerAlive(pid, start) {
			continue // another shape of name is not ours to judge
		}
		if err := netplumb.RemoveInstance(name); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}

// parseOwned reads "<pid>-<start>".
func parseOwned(s string) (pid int, start uint64, ok bool) {
	p, st, found := strings.Cut(s, "-")
	if !found {
		return 0, 0, false
	}
	pid, err := strconv.Atoi(p)
	if err != nil || pid <= 0 || strconv.Itoa(pid) != p {
		return 0, 0, false
	}
	start, err = strconv.ParseUint(st, 10, 64)
	if err != nil || strconv.FormatUint(start, 10) != st {
		return 0, 0, false
	}
	return pid, start, true
}

// ownerAlive reports whether process pid with start time start may still
// run: false only when /proc says it does not.
func ownerAlive(pid int, start uint64) bool {
	got, dead, err := procStat(pid)
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	if err != nil {
		return true
	}
	return got == start && !dead
}

func startTime(pid int) (uint64, error) {
	st, _, err := procStat(pid)
	return st, err
}

// procStat reads /proc/<pid>/stat's start time (field 22) and whether
// the process has exited (a zombie: its descriptors and its sandboxes
// are gone, only its parent has not collected it yet). Fields are read
// after the command's closing parenthesis (a command may hold spaces and
// parentheses).
func procStat(pid int) (start uint64, dead bool, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false, fmt.Errorf("/proc/%d/stat: no command", pid)
	}
	f := strings.Fields(string(b[i+1:])) // from field 3, the state
	if len(f) < 20 {
		return 0, false, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return start, f[0] == "Z" || f[0] == "X", err
}
