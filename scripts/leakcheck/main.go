// Command leakcheck lists what Warren made on the host and nobody can use
// any more: nftables tables of Warren's whose services are gone, mounts
// of Warren's on deleted directories, the tests' build directories, and
// processes still running a program from the temporary directory (a test's
// own build of warren, say a server a test never stopped). `make test` takes a snapshot
// before the tests and checks after them: anything new is a leak (the
// project's rule: what is made for a sandbox is removed when it ends).
// Both are judged by what is there, not by who runs, so that another
// server on the host (a developer's own) is not mistaken for a leak; the
// suites check their own cgroups, links and processes as they end.
//
//	leakcheck snapshot FILE   record what is there now
//	leakcheck check FILE      fail listing what is there now and not in FILE
package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

func main() {
	if len(os.Args) != 3 || (os.Args[1] != "snapshot" && os.Args[1] != "check") {
		fmt.Fprintln(os.Stderr, "usage: leakcheck snapshot|check FILE")
		os.Exit(2)
	}
	now, err := inventory()
	if err != nil {
		fmt.Fprintln(os.Stderr, "leakcheck:", err)
		os.Exit(1)
	}
	if os.Args[1] == "snapshot" {
		if err := os.WriteFile(os.Args[2], []byte(strings.Join(now, "\n")+"\n"), 0o600); err != nil {
			fmt.Fprintln(os.Stderr, "leakcheck:", err)
			os.Exit(1)
		}
		return
	}
	before, err := os.ReadFile(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "leakcheck:", err)
		os.Exit(1)
	}
	old := strings.Split(string(before), "\n")
	var leaks []string
	for _, x := range now {
		if !slices.Contains(old, x) {
			leaks = append(leaks, x)
		}
	}
	if len(leaks) > 0 {
		fmt.Fprintf(os.Stderr, "leakcheck: %d left behind by the tests:\n  %s\n", len(leaks), strings.Join(leaks, "\n  "))
		os.Exit(1)
	}
	fmt.Println("leakcheck: nothing left behind")
}

func inventory() ([]string, error) {
	var out []string
	tables, err := staleTables()
	if err != nil {
		return nil, err
	}
	out = append(out, tables...)
	out = append(out, orphanMounts()...)
	out = append(out, buildDirs()...)
	out = append(out, tempPrograms()...)
	sort.Strings(out)
	return out, nil
}

// staleTables: Warren's tables none of whose ports has a listener.
func staleTables() ([]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	ts, err := c.ListTables()
	if err != nil {
		return nil, err
	}
	live := listening()
	var out []string
	for _, t := range ts {
		if !strings.HasPrefix(t.Name, "warren") {
			continue
		}
		rules, err := c.GetRules(t, &nftables.Chain{Name: "in", Table: t})
		if err != nil {
			out = append(out, "nft table "+t.Name+" (no chain in)")
			continue
		}
		used := false
		for _, r := range rules {
			for _, e := range r.Exprs {
				if cm, ok := e.(*expr.Cmp); ok && len(cm.Data) == 2 && live[binary.BigEndian.Uint16(cm.Data)] {
					used = true
				}
			}
		}
		if !used {
			out = append(out, "nft table "+t.Name)
		}
	}
	return out, nil
}

func listening() map[uint16]bool {
	m := map[uint16]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f) //nolint:gosec // one of two fixed /proc paths
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 4 || fs[3] != "0A" {
				continue
			}
			i := strings.LastIndex(fs[1], ":")
			if p, err := strconv.ParseUint(fs[1][i+1:], 16, 16); err == nil {
				m[uint16(p)] = true
			}
		}
		_ = fh.Close()
	}
	return m
}

// buildDirs: the binaries tests build (internal/testenv) go to the
// temporary directory, and each package's TestMain removes them.
func buildDirs() []string {
	var out []string
	for _, pat := range []string{"warren-build-*", "warren-agent-build-*", "warren-spawner-build-*"} {
		m, _ := filepath.Glob(filepath.Join(os.TempDir(), pat))
		for _, d := range m {
			out = append(out, "build directory "+d)
		}
	}
	return out
}

// tempPrograms: processes whose program is a file of the temporary
// directory, deleted or not: the tests build warren, its agent and
// spawner there (internal/testenv), and a process still running one after
// the tests is one a test left (a developer's own server runs from
// elsewhere). Named by pid, start time and program, so that a pid reused
// is a new entry.
func tempPrograms() []string {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	tmp := filepath.Clean(os.TempDir()) + "/"
	self := strconv.Itoa(os.Getpid()) // go run builds this program there too
	var out []string
	for _, e := range ents {
		pid := e.Name()
		if pid[0] < '0' || pid[0] > '9' || pid == self {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", pid, "exe"))
		if err != nil || !strings.HasPrefix(exe, tmp) {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", pid, "stat")) //nolint:gosec // /proc/<pid>/stat of a listed pid
		if err != nil {
			continue
		}
		// The start time is field 22, after the parenthesised command
		// name (which may hold spaces).
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		start := ""
		if len(f) > 19 {
			start = f[19]
		}
		out = append(out, fmt.Sprintf("process %s (started at tick %s) running %s", pid, start, exe))
	}
	return out
}

// orphanMounts: mounts of Warren's whose mount point was deleted under
// them (a test's temporary directory removed while something was still
// mounted in it): nobody can reach them to unmount them any more.
func orphanMounts() []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		fs := strings.Fields(l)
		if len(fs) > 4 && strings.Contains(fs[4], "warren") && strings.HasSuffix(fs[4], `\040(deleted)`) {
			out = append(out, "mount "+fs[4])
		}
	}
	return out
}
