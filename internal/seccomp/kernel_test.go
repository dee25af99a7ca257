package seccomp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// helperEnv selects what TestHelperProcess does in a re-executed test binary:
// "filter" installs DefaultProfile before probing, "none" probes unfiltered.
const helperEnv = "WARREN_SECCOMP_HELPER"

// seccompAvailable reports whether the kernel has seccomp at all.
func seccompAvailable() bool {
	b, err := os.ReadFile("/proc/self/status")
	return err == nil && bytes.Contains(b, []byte("\nSeccomp:"))
}

// TestKernelEnforcement installs DefaultProfile in a child process (this test
// binary re-executed) and checks what the kernel then does with real
// syscalls. The unfiltered run proves the probes would see something else.
func TestKernelEnforcement(t *testing.T) {
	testenv.Require(t, seccompAvailable(), "seccomp")
	testenv.RequireFile(t, "/bin/true")
	filtered := map[string]string{
		"install":         "ok",
		"nnp":             "1",
		"all_threads":     "yes",
		"getpid":          "ok",
		"mount":           "EPERM",
		"keyctl":          "EPERM",
		"unshare_newuser": "EPERM",
		"clone3":          "ENOSYS",
		"exec_true":       "ok",
		"exec_newuser":    "EPERM",
		"personality_get": "ok",
		"personality_rie": "EPERM",
		"socket_vsock":    "EAFNOSUPPORT",
		"socket_inet":     "ok",
		"socket_inet6":    "ok",
		"socket_unix":     "ok",
		"socket_netlink":  "ok",
		"socketpair_unix": "ok",
		// A family outside the list with its high bits set: the kernel
		// reads the domain as an int, so must the filter.
		"socket_vsock_hibits": "EAFNOSUPPORT",
	}
	if runtime.GOARCH == "amd64" {
		filtered["x32_getpid"] = "EPERM"
	}
	unfiltered := map[string]string{
		"install":         "skipped",
		"getpid":          "ok",
		"unshare_newuser": "EINVAL", // a multi-threaded process cannot unshare a user namespace
		"clone3":          "EINVAL", // a NULL clone_args of size 0
		"exec_true":       "ok",
		"personality_get": "ok",
		"socket_inet":     "ok",
		"socket_unix":     "ok",
		"socketpair_unix": "ok",
	}
	if os.Geteuid() == 0 {
		unfiltered["mount"] = "ENOENT" // the target does not exist
	}
	for _, tc := range []struct {
		mode string
		want map[string]string
		not  map[string]string
	}{
		{mode: "filter", want: filtered},
		{mode: "none", want: unfiltered, not: map[string]string{"x32_getpid": "EPERM", "keyctl": "EPERM", "socket_vsock": "EAFNOSUPPORT"}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			got := runHelper(t, tc.mode)
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
			for k, v := range tc.not {
				if got[k] == v {
					t.Errorf("%s = %q unfiltered: the probe cannot tell the filter's work apart", k, v)
				}
			}
		})
	}
}

// runHelper re-executes the test binary as TestHelperProcess and parses its
// key=value lines.
func runHelper(t *testing.T, mode string) map[string]string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.Bytes())
	}
	got := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			got[k] = v
		}
	}
	t.Logf("helper (%s): %v", mode, got)
	return got
}

// errnoName renders a syscall result for the parent to compare.
func errnoName(err error) string {
	if err == nil {
		return "ok"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if errno == 0 {
			return "ok"
		}
		if name := unix.ErrnoName(errno); name != "" {
			return name
		}
	}
	return fmt.Sprintf("error(%v)", err)
}

// TestHelperProcess is not a test: it runs only in a child started by
// TestKernelEnforcement.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		return
	}
	// Make sure there is at least one more thread than this one, parked, so
	// TSYNC has something to synchronise.
	parked := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		close(parked)
		select {}
	}()
	<-parked

	report := func(k, v string) { fmt.Printf("%s=%s\n", k, v) }
	if mode == "filter" {
		prog, err := Compile(DefaultProfile())
		if err == nil {
			err = Install(prog)
		}
		report("install", errnoName(err))
		if err != nil {
			return
		}
		report("nnp", statusField("/proc/self/status", "NoNewPrivs"))
		report("all_threads", allThreadsFiltered())
	} else {
		report("install", "skipped")
	}
	raw := func(nr uintptr, args ...uintptr) string {
		var a [3]uintptr
		copy(a[:], args)
		_, _, e := unix.Syscall(nr, a[0], a[1], a[2])
		return errnoName(e)
	}
	report("getpid", raw(unix.SYS_GETPID))
	report("mount", errnoName(unix.Mount("none", "/nonexistent-warren-seccomp-test", "tmpfs", 0, "")))
	keyring := int64(unix.KEY_SPEC_PROCESS_KEYRING)
	report("keyctl", raw(unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, uintptr(keyring)))
	report("unshare_newuser", errnoName(unix.Unshare(unix.CLONE_NEWUSER)))
	report("clone3", raw(unix.SYS_CLONE3, 0, 0)) // EINVAL unfiltered: no child is created
	if runtime.GOARCH == "amd64" {
		report("x32_getpid", raw(x32SyscallBit|unix.SYS_GETPID))
	}
	report("exec_true", errnoName(exec.Command("/bin/true").Run()))
	newuser := exec.Command("/bin/true")
	newuser.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER}
	report("exec_newuser", errnoName(newuser.Run()))
	report("personality_get", raw(unix.SYS_PERSONALITY, 0xffffffff))
	report("personality_rie", raw(unix.SYS_PERSONALITY, 0x0400000)) // READ_IMPLIES_EXEC
	sock := func(domain, typ int) string {
		fd, err := unix.Socket(domain, typ|unix.SOCK_CLOEXEC, 0)
		if err == nil {
			_ = unix.Close(fd)
		}
		return errnoName(err)
	}
	report("socket_vsock", sock(unix.AF_VSOCK, unix.SOCK_STREAM))
	report("socket_inet", sock(unix.AF_INET, unix.SOCK_STREAM))
	report("socket_inet6", sock(unix.AF_INET6, unix.SOCK_DGRAM))
	report("socket_unix", sock(unix.AF_UNIX, unix.SOCK_STREAM))
	report("socket_netlink", sock(unix.AF_NETLINK, unix.SOCK_RAW))
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err == nil {
		_ = unix.Close(fds[0])
		_ = unix.Close(fds[1])
	}
	report("socketpair_unix", errnoName(err))
	report("socket_vsock_hibits", raw(unix.SYS_SOCKET, uintptr(1)<<32|unix.AF_VSOCK, unix.SOCK_STREAM))
}

// statusField returns a field of a /proc status file.
func statusField(path, field string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "error(" + err.Error() + ")"
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "missing"
}

// allThreadsFiltered reports "yes" when every thread is in filter mode (2) with
// no_new_privs, and there is more than one thread.
func allThreadsFiltered() string {
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil || len(tasks) < 2 {
		return fmt.Sprintf("only %d threads (%v)", len(tasks), err)
	}
	for _, st := range tasks {
		if s, n := statusField(st, "Seccomp"), statusField(st, "NoNewPrivs"); s != "2" || n != "1" {
			return fmt.Sprintf("%s: Seccomp %s NoNewPrivs %s", st, s, n)
		}
	}
	return "yes"
}
