// Command init is PID 1 of the virtual machine that scripts/v2vm.sh boots to
// run Warren's tests on a pure cgroup v2 hierarchy. It lives in the
// initramfs next to the kernel modules the guest needs, and:
//
//  1. loads those modules (the file /modules lists them in dependency order);
//  2. mounts the host's / (9p tag "hostroot", read-only) as the new root, the
//     job directory (tag "v2vmjob", read-write) at /run/v2vm and the source
//     tree (tag "v2vmsrc", read-only) at the path it has on the host;
//  3. mounts proc, sysfs, devtmpfs, devpts, tmpfs on /tmp, /run, /var/tmp and
//     /dev/shm, and cgroup2 alone at /sys/fs/cgroup (no v1 hierarchy, so every
//     controller belongs to v2), then moves the new root onto / and chroots;
//  4. runs each lane of /run/v2vm/plan ("NAME TIMEOUT_SECONDS DIR COMMAND",
//     COMMAND run by /bin/sh -c in DIR, environment from /run/v2vm/env) with
//     its output on the console, kills whatever a lane left behind, and
//     prints "=== V2VM LANE NAME EXIT CODE SECONDS" after each;
//  5. prints "=== V2VM DONE" and powers the machine off.
//
// A lane that outlives its timeout is killed and reported with EXIT 124.
// It is built static (CGO_ENABLED=0) by scripts/v2vm.sh.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	jobDir   = "/run/v2vm"
	newRoot  = "/newroot"
	ninepOpt = "trans=virtio,version=9p2000.L,msize=512000"
)

func main() {
	start := time.Now()
	reopenConsole()
	if err := boot(); err != nil {
		say("=== V2VM BOOT FAILED: %v", err)
		poweroff()
	}
	say("=== V2VM INIT up=%s (init took %.2fs)", uptime(), time.Since(start).Seconds())
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	say("=== V2VM kernel %s; cgroup2 alone at /sys/fs/cgroup, controllers: %s", unix.ByteSliceToString(uts.Release[:]),
		strings.TrimSpace(readFile("/sys/fs/cgroup/cgroup.controllers")))
	if err := runPlan(); err != nil {
		say("=== V2VM PLAN FAILED: %v", err)
	}
	say("=== V2VM DONE up=%s", uptime())
	poweroff()
}

func say(format string, args ...any) {
	fmt.Fprintf(os.Stdout, format+"\n", args...)
}

// reopenConsole makes fds 0-2 the console, in case the kernel found no
// /dev/console in the initramfs.
func reopenConsole() {
	if _, err := os.Stat("/dev/console"); err != nil {
		_ = os.MkdirAll("/dev", 0o755) //nolint:gosec // 0755: /dev in the test VM's root, as any system has it
		_ = unix.Mount("devtmpfs", "/dev", "devtmpfs", 0, "")
	}
	fd, err := unix.Open("/dev/console", unix.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return
	}
	for i := 0; i <= 2; i++ {
		_ = unix.Dup2(fd, i)
	}
	if fd > 2 {
		_ = unix.Close(fd)
	}
}

func boot() error {
	if err := loadModules("/modules"); err != nil {
		return err
	}
	if err := os.MkdirAll(newRoot, 0o755); err != nil { //nolint:gosec // 0755: the test VM's new root, with the mode any system gives /
		return err
	}
	type mnt struct {
		src, dst, fstype string
		flags            uintptr
		data             string
		optional         bool
	}
	const nosuid = unix.MS_NOSUID | unix.MS_NODEV
	mounts := []mnt{
		{"hostroot", newRoot, "9p", unix.MS_RDONLY, ninepOpt + ",cache=loose", false},
		{"proc", newRoot + "/proc", "proc", nosuid | unix.MS_NOEXEC, "", false},
		{"sysfs", newRoot + "/sys", "sysfs", nosuid | unix.MS_NOEXEC, "", false},
		{"cgroup2", newRoot + "/sys/fs/cgroup", "cgroup2", nosuid | unix.MS_NOEXEC, "nsdelegate,memory_recursiveprot", false},
		{"devtmpfs", newRoot + "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755", false},
		{"devpts", newRoot + "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "gid=5,mode=0620,ptmxmode=0666", false},
		{"tmpfs", newRoot + "/dev/shm", "tmpfs", nosuid, "mode=1777", false},
		{"tmpfs", newRoot + "/tmp", "tmpfs", nosuid, "mode=1777", false},
		{"tmpfs", newRoot + "/var/tmp", "tmpfs", nosuid, "mode=1777", true},
		{"tmpfs", newRoot + "/run", "tmpfs", nosuid, "mode=0755", false},
		{"v2vmjob", newRoot + jobDir, "9p", 0, ninepOpt + ",cache=none", false},
	}
	for _, m := range mounts {
		if m.fstype == "devpts" || m.fstype == "tmpfs" || m.fstype == "9p" {
			_ = os.MkdirAll(m.dst, 0o755) //nolint:gosec // 0755: mount points in the test VM, as any system has them; only possible on a tmpfs; elsewhere it exists
		}
		if err := unix.Mount(m.src, m.dst, m.fstype, m.flags, m.data); err != nil {
			if m.optional {
				continue
			}
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.dst, err)
		}
	}
	// The source tree, at the path it has on the host (test binaries and
	// testenv.ModuleRoot use absolute paths into it).
	src := strings.TrimSpace(readFile(newRoot + jobDir + "/src"))
	if src != "" {
		dst := newRoot + src
		_ = os.MkdirAll(dst, 0o755) //nolint:gosec // 0755: a mount point in the test VM
		if err := unix.Mount("v2vmsrc", dst, "9p", unix.MS_RDONLY, ninepOpt+",cache=loose"); err != nil {
			return fmt.Errorf("mount the source tree on %s: %w", src, err)
		}
	}
	if err := os.Chdir(newRoot); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move the new root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return os.Chdir("/")
}

// loadModules loads the modules listed in file, in order; a module the
// kernel already has is fine.
func loadModules(file string) error {
	b, err := os.ReadFile(file) //nolint:gosec // file is the fixed /modules list in the test VM's initramfs
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	for _, p := range strings.Fields(string(b)) {
		f, err := os.Open(p) //nolint:gosec // p is a module path from that list
		if err != nil {
			return err
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		_ = f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load module %s: %w", filepath.Base(p), err)
		}
	}
	return nil
}

func readFile(p string) string {
	b, err := os.ReadFile(p) //nolint:gosec // p is a fixed /proc or /sys path or a file of the job dir the harness wrote
	if err != nil {
		return ""
	}
	return string(b)
}

func uptime() string {
	f := strings.Fields(readFile("/proc/uptime"))
	if len(f) == 0 {
		return "?"
	}
	return f[0] + "s"
}

type lane struct {
	name    string
	timeout time.Duration
	dir     string
	command string
}

func readPlan(p string) ([]lane, error) {
	f, err := os.Open(p) //nolint:gosec // p is the plan file the harness put in the job dir
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var lanes []lane
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.SplitN(line, " ", 4)
		if len(fields) != 4 {
			return nil, fmt.Errorf("plan line %q: want NAME TIMEOUT DIR COMMAND", line)
		}
		secs, err := strconv.Atoi(fields[1])
		if err != nil || secs <= 0 {
			return nil, fmt.Errorf("plan line %q: bad timeout", line)
		}
		lanes = append(lanes, lane{fields[0], time.Duration(secs) * time.Second, fields[2], fields[3]})
	}
	return lanes, sc.Err()
}

func readEnv(p string) []string {
	env := []string{"PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/tmp/home", "TERM=dumb"}
	for _, l := range strings.Split(readFile(p), "\n") {
		if k, _, ok := strings.Cut(l, "="); ok && k != "" && !strings.HasPrefix(l, "#") {
			env = append(env, l)
		}
	}
	return env
}

func runPlan() error {
	lanes, err := readPlan(jobDir + "/plan")
	if err != nil {
		return err
	}
	env := readEnv(jobDir + "/env")
	_ = os.MkdirAll("/tmp/home", 0o755) //nolint:gosec // 0755: the tests' HOME in the test VM
	for _, l := range lanes {
		say("=== V2VM LANE %s START up=%s", l.name, uptime())
		t0 := time.Now()
		code := runLane(l, env)
		say("=== V2VM LANE %s EXIT %d %.1f", l.name, code, time.Since(t0).Seconds())
	}
	return nil
}

// runLane runs one lane to its end or its timeout, reaping every orphan
// reparented to PID 1 meanwhile, and then kills whatever it left running.
func runLane(l lane, env []string) int {
	attr := &os.ProcAttr{
		Dir:   l.dir,
		Env:   env,
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	}
	p, err := os.StartProcess("/bin/sh", []string{"/bin/sh", "-c", l.command}, attr)
	if err != nil {
		say("v2vm-init: start lane %s: %v", l.name, err)
		return 127
	}
	deadline := time.Now().Add(l.timeout)
	code := -1
	for code < 0 {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		switch {
		case err != nil && !errors.Is(err, unix.EINTR):
			say("v2vm-init: wait: %v", err)
			code = 125
		case pid == p.Pid:
			code = ws.ExitStatus()
			if ws.Signaled() {
				code = 128 + int(ws.Signal())
			}
		case pid > 0:
			// an orphan: reaped, keep going
		case time.Now().After(deadline):
			say("=== V2VM LANE %s TIMEOUT after %v: killing it", l.name, l.timeout)
			_ = unix.Kill(-p.Pid, unix.SIGQUIT) // Go test binaries print their goroutines
			time.Sleep(2 * time.Second)
			killAll()
			code = 124
		default:
			time.Sleep(20 * time.Millisecond)
		}
	}
	killAll()
	return code
}

// killAll SIGKILLs every process but PID 1 and reaps them (bounded).
func killAll() {
	_ = unix.Kill(-1, unix.SIGKILL)
	end := time.Now().Add(5 * time.Second)
	for time.Now().Before(end) {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.ECHILD) {
			return
		}
		if pid <= 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

func poweroff() {
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	// Reboot only fails without CAP_SYS_BOOT; the kernel panics (and QEMU,
	// started with -no-reboot, exits) when PID 1 returns.
	os.Exit(1)
}
