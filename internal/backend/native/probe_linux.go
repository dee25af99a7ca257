package native

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// ProbeUserNS checks that this kernel lets root create a user namespace with
// a mapped uid range, by starting /bin/true in one.
func ProbeUserNS() error {
	if err := userNSDisabled(); err != nil {
		return err
	}
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: DefaultUIDBase, Size: 65536}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: DefaultUIDBase, Size: 65536}},
	}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("start a process in a new user namespace: %w", err)
	}
	return nil
}

// userNSDisabled says when the administrator has turned user namespaces
// off, which fails a probe with a less helpful error.
func userNSDisabled() error {
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		return errors.New("user.max_user_namespaces is 0")
	}
	return nil
}

// checkTraversable makes sure a sandbox's mapped root, an unprivileged uid
// on the host, can reach dir: every ancestor needs the search bit for
// others, or for its group when that is the sandbox root's gid (a directory
// only sandboxes and root may pass, as the data directory is).
func checkTraversable(dir string, gid int, remedy string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for p := abs; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		group := fi.Mode().Perm()&0o010 != 0 && fi.Sys().(*syscall.Stat_t).Gid == uint32(gid) //nolint:gosec // gid is a sandbox root's, below 2^32
		if fi.Mode().Perm()&0o001 == 0 && !group {
			return fmt.Errorf("%s is not searchable by other users (mode %v); sandbox root maps to an unprivileged uid and cannot reach %s (%s)", p, fi.Mode().Perm(), abs, remedy)
		}
		if p == "/" {
			return nil
		}
	}
}

// checkUpperFS refuses a data directory on a filesystem an overlay upper
// layer cannot live on: overlayfs itself (the data directory inside a
// container's root) or a network filesystem. Failing here names the
// directory; the mount would only say "invalid argument".
func checkUpperFS(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return err
	}
	switch st.Type {
	case unix.OVERLAYFS_SUPER_MAGIC:
		return fmt.Errorf("data directory %s is on overlayfs (a container's root?): sandboxes' writable layers cannot live there; use a volume or bind mount (ext4, xfs, btrfs, tmpfs) for --data-dir", dir)
	case unix.NFS_SUPER_MAGIC, unix.CIFS_SUPER_MAGIC, unix.SMB2_SUPER_MAGIC, unix.FUSE_SUPER_MAGIC:
		return fmt.Errorf("data directory %s is on a network or FUSE filesystem, which overlayfs does not support as a writable layer; use a local filesystem for --data-dir", dir)
	}
	return nil
}

// procStartTime is a process's start time in clock ticks since boot (field
// 22 of /proc/PID/stat): with the pid it identifies a process across pid
// reuse. A zombie has exited, whether or not anyone reaped it (a sandbox
// orphaned by a killed warren is reparented to an init that may never reap
// it), and counts as gone: 0.
func procStartTime(pid int) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name may hold spaces and parentheses: fields start after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return 0
	}
	n, _ := strconv.ParseUint(f[19], 10, 64)
	return n
}

// alive reports whether the agent recorded in runDir/agent.pid still runs.
func alive(runDir string) bool {
	b, err := os.ReadFile(filepath.Join(runDir, "agent.pid")) //nolint:gosec // runDir is this backend's run directory for the sandbox; agent.pid is written by the backend
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return false
	}
	pid, err1 := strconv.Atoi(f[0])
	start, err2 := strconv.ParseUint(f[1], 10, 64)
	return err1 == nil && err2 == nil && pid > 0 && start > 0 && procStartTime(pid) == start
}
