package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/cgroup"
	"github.com/warren-sandbox/warren/internal/netplumb"
	"github.com/warren-sandbox/warren/internal/wire"
)

const doctorAbout = `
Checks, one by one, the kernel features the native backend uses, and ends
with a real sandbox start. For anything that does not work it says why and
what Warren does instead. Exits 1 when sandboxes cannot run here.`

type check struct {
	name string
	ok   bool
	note string
	// required checks make the exit status fail.
	required bool
}

func doctorCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren doctor", "warren doctor [flags]", doctorAbout)
	var hf hostFlags
	var tf tierFlags
	hf.diskPoolDefault = "auto" // warren serve's
	hf.register(fs)
	tf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var checks []check
	add := func(name string, required bool, err error, okNote string) {
		c := check{name: name, ok: err == nil, note: okNote, required: required}
		if err != nil {
			c.note = err.Error()
		}
		checks = append(checks, c)
	}
	root := os.Geteuid() == 0
	add("running as root", true, boolErr(root, "warren needs root for namespaces, cgroups and mounts"), "")

	for _, ns := range []struct {
		name string
		flag uintptr
	}{
		{"mount namespace", syscall.CLONE_NEWNS}, {"pid namespace", syscall.CLONE_NEWPID},
		{"ipc namespace", syscall.CLONE_NEWIPC}, {"uts namespace", syscall.CLONE_NEWUTS},
		{"net namespace", syscall.CLONE_NEWNET}, {"cgroup namespace", syscall.CLONE_NEWCGROUP},
	} {
		add(ns.name, true, probeClone(ns.flag), "")
	}
	if err := native.ProbeUserNS(); err != nil {
		add("user namespace", false, fmt.Errorf("%w; sandboxes run as host root with dropped capabilities, seccomp and no_new_privs instead", err), "")
	} else {
		add("user namespace", false, nil, fmt.Sprintf("files on disk are owned by host uids %d..%d", native.DefaultUIDBase, native.DefaultUIDBase+65535))
	}
	add("overlayfs", true, fsSupported("overlay"), "")
	add("seccomp", true, seccompSupported(), "")
	if m, err := cgroup.New("warren"); err != nil {
		add("cgroups", true, err, "")
	} else {
		add("cgroups", true, nil, "mode "+m.Mode())
		for _, f := range m.Probe() {
			c := check{name: "  cgroup " + f.Name, ok: f.Usable, note: f.Reason}
			if f.Usable {
				c.note = f.Note
			}
			checks = append(checks, c)
		}
	}
	// What a sandbox's network (egress) needs; without it sandboxes still
	// run, with loopback only.
	if root {
		for _, f := range netplumb.Probe() {
			add("network: "+f.Name, false, f.Err, "")
		}
	}
	// What the language names run on the host image (scripts/setup.sh
	// installs them).
	for _, p := range []string{"/usr/bin/python3", "/usr/bin/pip3", "/usr/bin/node", "/usr/bin/npm"} {
		_, err := os.Stat(p)
		add(p+" (host image)", false, err, "")
	}
	if root {
		d, ranges, disk, diskOff, err := smokeTest(ctx, &hf)
		add("sandbox start + exec true", true, err, fmt.Sprintf("%.1f ms cold start to exit", float64(d.Microseconds())/1000))
		// The isolation tiers (docs/isolation.md#tiers): each works here,
		// or why not.
		add("isolation tier native", true, err, "namespaces and cgroups")
		add("isolation tier gvisor", false, doctorGvisor(ctx, &hf, &tf), "a second kernel (gVisor's runsc)")
		if err == nil {
			note := "each running sandbox has a host uid range of its own (idmapped mounts)"
			var rerr error
			if !ranges {
				rerr = errors.New("unavailable here (they need Linux 6.18's detached mounts and a data directory that can be idmapped, or --uid-ranges off): every sandbox runs as the same host uids, sharing the kernel's per-user limits")
			}
			add("per-sandbox uid ranges", false, rerr, note)
			var derr error
			switch {
			case hf.diskPool == "" || hf.diskPool == "off":
				derr = errors.New("off (--disk-pool off): a sandbox can fill the data directory's disk; --disk-pool auto turns them on")
			case disk == "":
				derr = fmt.Errorf("unavailable: %s: a sandbox can fill the data directory's disk", diskOff)
			}
			add("disk limits", false, derr, "each sandbox's files are a btrfs subvolume under a quota ("+disk+")")
		}
		if err == nil {
			// The backend set their modes; a host user must reach nothing
			// below them (docs/isolation.md, "Host users").
			add(hf.dataDir+" closed to host users", true, closedDir(hf.dataDir), "")
			if ranges {
				add(hf.runDir+" closed to host users", true, closedRunDir(hf.runDir), "searchable, for agents to reach their binary; all else below closed")
			} else {
				add(hf.runDir+" closed to host users", true, closedDir(hf.runDir), "")
			}
		}
	}

	failed := false
	for _, c := range checks {
		mark := "ok  "
		if !c.ok {
			mark = "FAIL"
			if !c.required {
				mark = "warn"
			} else {
				failed = true
			}
		}
		line := fmt.Sprintf("%s  %s", mark, c.name)
		if c.note != "" {
			line += ": " + c.note
		}
		fmt.Println(line)
	}
	if failed {
		return exitError{1}
	}
	return nil
}

// closedDir fails when other host users may search or read dir.
func closedDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if m := fi.Mode().Perm(); m&0o007 != 0 {
		return fmt.Errorf("mode %v: other host users can reach what is below", m)
	}
	return nil
}

// closedRunDir checks the run directory with per-sandbox uid ranges:
// searchable but not listable, so that agents, as their sandbox's uids,
// reach their binary and the empty directories they mount on (.agent,
// .root, .pool); everything else below it closed.
func closedRunDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if m := fi.Mode().Perm(); m&0o006 != 0 {
		return fmt.Errorf("mode %v: other host users can list or write it", m)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		switch e.Name() {
		case ".agent", ".root", ".pool":
			continue
		}
		if err := closedDir(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("%s: %w", e.Name(), err)
		}
	}
	return nil
}

func boolErr(ok bool, msg string) error {
	if ok {
		return nil
	}
	return fmt.Errorf("%s", msg)
}

func probeClone(flag uintptr) error {
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flag}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("clone failed: %w", err)
	}
	return nil
}

func fsSupported(name string) error {
	f, err := os.Open("/proc/filesystems")
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 0 && fields[len(fields)-1] == name {
			return nil
		}
	}
	return fmt.Errorf("%s is not in /proc/filesystems (and modules cannot be assumed loadable)", name)
}

func seccompSupported() error {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return err
	}
	if !strings.Contains(string(b), "Seccomp:") {
		return fmt.Errorf("kernel built without CONFIG_SECCOMP")
	}
	return nil
}

func smokeTest(ctx context.Context, hf *hostFlags) (_ time.Duration, ranges bool, disk, diskOff string, err error) {
	be, err := hf.backend(native.Options{ExitWithHost: true})
	if err != nil {
		return 0, false, "", "", err
	}
	ranges, disk, diskOff = be.UIDRanges(), be.DiskLimits(), be.DiskLimitsOff()
	defer func() { _ = be.Close() }()
	img, err := be.HostImage()
	if err != nil {
		return 0, ranges, disk, diskOff, err
	}
	start := time.Now()
	sb, err := be.Create(ctx, backend.Config{ID: fmt.Sprintf("doctor-%d", os.Getpid()), Image: img, MemoryBytes: 256 << 20, CPUs: 1, PidsMax: 64})
	if err != nil {
		return 0, ranges, disk, diskOff, err
	}
	defer func() { _ = sb.Remove(context.WithoutCancel(ctx)) }()
	if err := sb.Start(ctx); err != nil {
		return 0, ranges, disk, diskOff, err
	}
	res, err := backend.Exec(ctx, sb, &wire.ExecRequest{Argv: []string{"/bin/true"}}, nil)
	if err != nil {
		return 0, ranges, disk, diskOff, err
	}
	if res.Code != 0 {
		return 0, ranges, disk, diskOff, fmt.Errorf("/bin/true exited %d %s", res.Code, res.Error)
	}
	return time.Since(start), ranges, disk, diskOff, nil
}
