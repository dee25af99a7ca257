package cgroup

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// ParseProcSelf parses the /proc/<pid>/cgroup format ("hierarchy-ID:controller-list:path"
// per line) into a map from controller to cgroup path. A v1 line listing
// several controllers ("2:cpu,cpuacct:/x") yields one entry per controller;
// named v1 hierarchies keep their "name=..." key; the cgroup v2 line
// ("0::/x") has the key "". Paths are as the kernel prints them: relative to
// the hierarchy root as seen from this process's cgroup namespace.
func ParseProcSelf(r io.Reader) (map[string]string, error) {
	out := make(map[string]string)
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		if line == "" {
			continue
		}
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			return nil, fmt.Errorf("cgroup: malformed /proc/self/cgroup line %d: %q", n, line)
		}
		if _, err := strconv.Atoi(parts[0]); err != nil {
			return nil, fmt.Errorf("cgroup: malformed hierarchy ID on line %d: %q", n, line)
		}
		path := parts[2]
		if !strings.HasPrefix(path, "/") {
			return nil, fmt.Errorf("cgroup: malformed path on line %d: %q", n, line)
		}
		if parts[1] == "" {
			if parts[0] != "0" {
				return nil, fmt.Errorf("cgroup: v1 hierarchy without controllers on line %d: %q", n, line)
			}
			out[""] = path
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c != "" {
				out[c] = path
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("cgroup: read /proc/self/cgroup: %w", err)
	}
	return out, nil
}

// mountEntry is one cgroup or cgroup2 line of /proc/self/mountinfo.
type mountEntry struct {
	root   string   // root of the mount within its hierarchy
	point  string   // mount point
	fstype string   // "cgroup" or "cgroup2"
	ctrls  []string // v1 controllers (from the super options); nil for cgroup2
}

// v1Controllers are the v1 controller names recognised in mount options.
var v1Controllers = map[string]bool{
	"cpu": true, "cpuacct": true, "cpuset": true, "memory": true, "devices": true,
	"freezer": true, "net_cls": true, "net_prio": true, "blkio": true,
	"perf_event": true, "hugetlb": true, "pids": true, "rdma": true, "misc": true,
}

// parseMountinfo returns the cgroup and cgroup2 mounts of a mountinfo file.
func parseMountinfo(r io.Reader) ([]mountEntry, error) {
	var out []mountEntry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" && i >= 6 {
				sep = i
				break
			}
		}
		if sep < 0 || len(fields) < sep+3 {
			continue
		}
		fstype := fields[sep+1]
		if fstype != "cgroup" && fstype != "cgroup2" {
			continue
		}
		e := mountEntry{root: unescapeMount(fields[3]), point: unescapeMount(fields[4]), fstype: fstype}
		if fstype == "cgroup" {
			for _, o := range strings.Split(fields[sep+3], ",") {
				if v1Controllers[o] {
					e.ctrls = append(e.ctrls, o)
				}
			}
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("cgroup: read mountinfo: %w", err)
	}
	return out, nil
}

// unescapeMount undoes the octal escapes (\040 etc.) of mountinfo paths.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
