package boot

import (
	"errors"
	"os"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

func configPair(t *testing.T) (agent, host *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	agent, host = os.NewFile(uintptr(fds[0]), "agent"), os.NewFile(uintptr(fds[1]), "host")
	t.Cleanup(func() { _ = agent.Close(); _ = host.Close() })
	return agent, host
}

// TestConfigRoundTrip: the config arrives whole, with the root mount's
// descriptor when one is sent and without one otherwise.
func TestConfigRoundTrip(t *testing.T) {
	for _, withMount := range []bool{false, true} {
		agent, host := configPair(t)
		var mount *os.File
		if withMount {
			// Any descriptor travels alike; a mount is beside the point.
			f, err := os.Open("/")
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = f.Close() }()
			mount = f
		}
		sent := &Config{Rootfs: Rootfs{Lower: []string{"/l"}, Upper: "/u", Work: "/w"}, Python: strings.Repeat("p", 300<<10)}
		done := make(chan error, 1)
		go func() {
			err := SendConfig(host, sent, mount, nil)
			_ = host.Close()
			done <- err
		}()
		got, err := ReadConfig(agent)
		if err != nil {
			t.Fatalf("withMount=%v: %v", withMount, err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got.Python != sent.Python || got.Rootfs.Upper != "/u" {
			t.Errorf("withMount=%v: config changed in transit", withMount)
		}
		if withMount != (got.Rootfs.Mount > 0) {
			t.Errorf("withMount=%v: got mount descriptor %d", withMount, got.Rootfs.Mount)
		}
		if got.Rootfs.Mount > 0 {
			var a, b unix.Stat_t
			if err := unix.Fstat(got.Rootfs.Mount, &a); err != nil {
				t.Fatal(err)
			}
			_ = unix.Stat("/", &b)
			if a.Ino != b.Ino || a.Dev != b.Dev {
				t.Error("the descriptor received is not the one sent")
			}
			unix.Close(got.Rootfs.Mount)
		}
	}
}

// TestConfigWithWorkload: a workload cgroup's descriptor sent ahead of
// the config arrives as cfg.Workload, beside the root mount's.
func TestConfigWithWorkload(t *testing.T) {
	agent, host := configPair(t)
	work, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = work.Close() }()
	root, err := os.Open("/")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = root.Close() }()
	done := make(chan error, 1)
	go func() {
		err := SendWorkload(host, work)
		if err == nil {
			err = SendConfig(host, &Config{Python: "/p"}, root, nil)
		}
		_ = host.Close()
		done <- err
	}()
	got, err := ReadConfig(agent)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	defer unix.Close(got.Workload)
	defer unix.Close(got.Rootfs.Mount)
	for _, c := range []struct {
		fd   int
		path string
	}{{got.Workload, "/dev/null"}, {got.Rootfs.Mount, "/"}} {
		var a, b unix.Stat_t
		if c.fd <= 0 || unix.Fstat(c.fd, &a) != nil || unix.Stat(c.path, &b) != nil || a.Ino != b.Ino || a.Dev != b.Dev {
			t.Errorf("descriptor %d is not %s", c.fd, c.path)
		}
	}
	if got.Python != "/p" {
		t.Errorf("config changed in transit: %+v", got)
	}
}

// TestReadConfigRejects: a stream without the header, with more than one
// descriptor, or with a malformed config is an error, and no descriptor
// stays open.
func TestReadConfigRejects(t *testing.T) {
	devnull, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = devnull.Close() }()
	two := unix.UnixRights(int(devnull.Fd()), int(devnull.Fd()))
	for name, send := range map[string]func(*os.File) error{
		"no header":  func(h *os.File) error { _, err := h.Write(encodeConfig(&Config{})); return err },
		"two fds":    func(h *os.File) error { return unix.Sendmsg(int(h.Fd()), []byte{configHeader}, two, nil, 0) },
		"bad config": func(h *os.File) error { _, err := h.Write([]byte("C{not a config")); return err },
		"JSON":       func(h *os.File) error { _, err := h.Write([]byte(`C{"spec":null}`)); return err },
		"truncated": func(h *os.File) error {
			b := encodeConfig(&Config{Python: "/usr/bin/python3"})
			_, err := h.Write(append([]byte{configHeader}, b[:len(b)-1]...))
			return err
		},
		"too large": func(h *os.File) error {
			_, err := h.Write(append([]byte{configHeader}, make([]byte, maxConfig+1)...))
			return err
		},
		"root announced, none passed": func(h *os.File) error {
			_, err := h.Write(append([]byte{configHeaderRoot}, encodeConfig(&Config{Spec: &Spec{}})...))
			return err
		},
		"workload without fd": func(h *os.File) error { _, err := h.Write([]byte{workloadHeader}); return err },
		"workload, no config": func(h *os.File) error { return SendWorkload(h, devnull) },
		"workload, bad config": func(h *os.File) error {
			if err := SendWorkload(h, devnull); err != nil {
				return err
			}
			_, err := h.Write([]byte("C{not a config"))
			return err
		},
		"two workloads": func(h *os.File) error {
			if err := SendWorkload(h, devnull); err != nil {
				return err
			}
			return SendWorkload(h, devnull)
		},
		"nothing":     func(h *os.File) error { return nil },
		"header only": func(h *os.File) error { _, err := h.Write([]byte("C")); return err },
	} {
		agent, host := configPair(t)
		before := openFDs(t)
		done := make(chan error, 1)
		go func() {
			err := send(host)
			if errors.Is(err, unix.EPIPE) {
				err = nil // the reader gave up on an oversized config
			}
			_ = host.Close()
			done <- err
		}()
		if _, err := ReadConfig(agent); err == nil {
			t.Errorf("%s: accepted", name)
		}
		_ = agent.Close() // unblocks a sender still writing
		if err := <-done; err != nil {
			t.Fatalf("%s: send: %v", name, err)
		}
		if after := openFDs(t); after != before-2 {
			t.Errorf("%s: %d descriptors open after, %d before (less the pair's two)", name, after, before)
		}
	}
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestConfigBindMounts: bind mounts travel after the root's, one per bind
// of the spec without a source; a count that does not match is refused.
func TestConfigBindMounts(t *testing.T) {
	f, err := os.Open("/")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	spec := &Spec{Mounts: []specs.Mount{
		{Destination: "/a", Type: "bind"}, {Destination: "/t", Type: "tmpfs"}, {Destination: "/usr", Type: "bind", Source: "/usr"}, {Destination: "/b", Type: "bind"},
	}}
	for _, tc := range []struct {
		root  *os.File
		binds []*os.File
		ok    bool
	}{{f, []*os.File{f, f}, true}, {nil, []*os.File{f, f}, true}, {f, []*os.File{f}, false}, {nil, []*os.File{f, f, f}, false}} {
		agent, host := configPair(t)
		done := make(chan error, 1)
		go func() {
			err := SendConfig(host, &Config{Spec: spec}, tc.root, tc.binds)
			_ = host.Close()
			done <- err
		}()
		got, err := ReadConfig(agent)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if (err == nil) != tc.ok {
			t.Errorf("root %v, %d binds: %v", tc.root != nil, len(tc.binds), err)
			continue
		}
		if err != nil {
			continue
		}
		if len(got.BindMounts) != 2 || (tc.root != nil) != (got.Rootfs.Mount > 0) {
			t.Errorf("root %v: got root %d, binds %v", tc.root != nil, got.Rootfs.Mount, got.BindMounts)
		}
		for _, fd := range append(got.BindMounts, got.Rootfs.Mount) {
			if fd > 0 {
				unix.Close(fd)
			}
		}
	}
}
