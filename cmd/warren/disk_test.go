package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/diskquota"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// TestRunDiskLimit: `warren run --disk-pool SIZE --disk N` prepares the
// data directory's image on its first start and the sandbox stops at its
// cap, on either tier; `--read-only` leaves /tmp writable and the rest
// read-only; doctor reports the mechanism.
func TestRunDiskLimit(t *testing.T) {
	testenv.RequireRoot(t)
	_, err := exec.LookPath("mkfs.btrfs")
	testenv.Require(t, err == nil, "mkfs.btrfs (btrfs-progs; `make deps` installs it)")
	dir := stateDir(t)
	t.Cleanup(func() {
		if diskquota.IsBtrfs(filepath.Join(dir, "data", "sandboxes")) {
			if err := diskquota.Unmount(filepath.Join(dir, "data", "sandboxes")); err != nil {
				t.Error(err)
			}
		}
	})
	r := run(t, warren(t, dir, "run", "--disk-pool", "1G", "--disk", "32M", "--", "/bin/sh", "-c", "dd if=/dev/zero of=/tmp/big bs=1M count=64"), "")
	if r.code == 0 || !strings.Contains(r.stderr+r.stdout, "Disk quota exceeded") {
		t.Fatalf("dd past --disk 32M: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := diskquota.MountedImage(filepath.Join(dir, "data", "sandboxes")); got != filepath.Join(dir, "data", "disk.img") {
		t.Fatalf("image mounted on the sandboxes' directory: %q", got)
	}
	r = run(t, warren(t, dir, "run", "--disk-pool", "1G", "--read-only", "--write-path", "/home/user", "--", "/bin/sh", "-c",
		"echo a > /tmp/a && echo b > /home/user/b && ! echo c > /etc/c"), "")
	if r.code != 0 || !strings.Contains(r.stderr, "Read-only file system") {
		t.Fatalf("--read-only: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = run(t, warren(t, dir, "doctor", "--disk-pool", "1G"), "")
	if !strings.Contains(r.stdout, "ok    disk limits") || !strings.Contains(r.stdout, diskquota.OnImage) {
		t.Errorf("doctor:\n%s%s", r.stdout, r.stderr)
	}
	// The gvisor tier on the same pool.
	gv := warren(t, dir, "run", "--isolation", "gvisor", "--disk-pool", "1G", "--disk", "32M", "--", "/bin/sh", "-c", "dd if=/dev/zero of=/tmp/big bs=1M count=64")
	gv.Env = append(gv.Env, "WARREN_RUNSC="+testenv.RunscBinary(t))
	if r = run(t, gv, ""); r.code == 0 || !strings.Contains(r.stderr+r.stdout, "Disk quota exceeded") {
		t.Fatalf("gvisor: dd past --disk 32M: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if ents, err := os.ReadDir(filepath.Join(dir, "data", "sandboxes", ".gvisor")); err != nil || len(ents) != 0 {
		t.Errorf("gvisor sandboxes left on the pool: %v %v", ents, err)
	}
	r = run(t, warren(t, dir, "run", "--disk", "32M", "--", "/bin/true"), "")
	if r.code == 0 || !strings.Contains(r.stderr, "disk limits are off") {
		t.Errorf("--disk without --disk-pool: exit %d %s", r.code, r.stderr)
	}
}

// TestServeDiskLimit: a server with a disk pool caps a sandbox of either
// tier at its disk_mib (gvisor's on the same pool), and sandbox.get and
// sandbox.metrics.get show its usage against that cap.
func TestServeDiskLimit(t *testing.T) {
	testenv.RequireRoot(t)
	_, err := exec.LookPath("mkfs.btrfs")
	testenv.Require(t, err == nil, "mkfs.btrfs (btrfs-progs; `make deps` installs it)")
	dir := stateDir(t)
	sandboxes := filepath.Join(dir, "data", "sandboxes")
	url, srv, stderr := startServeEnv(t, dir, []string{"WARREN_RUNSC=" + testenv.RunscBinary(t)}, "--dev", "--disk-pool", "1G")
	t.Cleanup(func() {
		if diskquota.IsBtrfs(sandboxes) {
			if err := diskquota.Unmount(sandboxes); err != nil {
				t.Error(err)
			}
		}
	})
	defer stopServe(t, srv)
	call := rpcCaller(t, url, "")
	must := func(method string, params map[string]any) rpcReply {
		t.Helper()
		r := call(method, params)
		if r.status != 200 {
			t.Fatalf("%s %v: %d %+v\n%s", method, params, r.status, r.Error, stderr.String())
		}
		return r
	}
	for _, iso := range []string{"native", "gvisor"} {
		name := "d-" + iso
		must("sandbox.create", map[string]any{"name": name, "image": "host", "disk_mib": 32, "isolation": iso})
		defer call("sandbox.remove", map[string]any{"sandbox": name})
		r := must("sandbox.command.run", map[string]any{"sandbox": name, "command": "/bin/sh", "args": []string{"-c", "dd if=/dev/zero of=/root/big bs=1M count=64 2>&1; sync"}})
		if !strings.Contains(string(r.Result), "Disk quota exceeded") {
			t.Fatalf("%s: dd past disk_mib 32: %s", iso, r.Result)
		}
		var info struct {
			DiskMiB   int64  `json:"disk_mib"`
			DiskUsage *int64 `json:"disk_usage"`
			DiskLimit *int64 `json:"disk_limit"`
		}
		// The kernel accounts at its commits (at most 30 s apart).
		for deadline := time.Now().Add(40 * time.Second); ; time.Sleep(500 * time.Millisecond) {
			if err := json.Unmarshal(must("sandbox.get", map[string]any{"sandbox": name}).Result, &info); err != nil {
				t.Fatal(err)
			}
			if info.DiskUsage == nil || *info.DiskUsage >= 16<<20 || time.Now().After(deadline) {
				break
			}
		}
		if info.DiskMiB != 32 || info.DiskLimit == nil || *info.DiskLimit != 32<<20 || info.DiskUsage == nil || *info.DiskUsage < 16<<20 || *info.DiskUsage > 32<<20 {
			t.Fatalf("%s: sandbox.get: disk_mib %d, usage %v, limit %v", iso, info.DiskMiB, ptr(info.DiskUsage), ptr(info.DiskLimit))
		}
		var m struct {
			Sandboxes []struct {
				DiskUsage *int64 `json:"disk_usage"`
				DiskLimit *int64 `json:"disk_limit"`
			} `json:"sandboxes"`
		}
		if err := json.Unmarshal(must("sandbox.metrics.get", map[string]any{"sandbox": name}).Result, &m); err != nil {
			t.Fatal(err)
		}
		if len(m.Sandboxes) != 1 || m.Sandboxes[0].DiskLimit == nil || *m.Sandboxes[0].DiskLimit != 32<<20 || m.Sandboxes[0].DiskUsage == nil {
			t.Fatalf("%s: sandbox.metrics.get: %+v", iso, m.Sandboxes)
		}
	}
}

func ptr(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

// TestServeWorkspaceLimit: with disk limits on, a workspace's quota holds
// inside running sandboxes: one writing into it stops with EDQUOT at the
// quota, while another sandbox sharing it sees its writes, a third
// sandbox and the host write on; the limit holds across a server restart;
// removing the workspace frees its quota group; nothing stays mounted.
func TestServeWorkspaceLimit(t *testing.T) {
	testenv.RequireRoot(t)
	_, err := exec.LookPath("mkfs.btrfs")
	testenv.Require(t, err == nil, "mkfs.btrfs (btrfs-progs; `make deps` installs it)")
	dir := stateDir(t)
	sandboxes := filepath.Join(dir, "data", "sandboxes")
	t.Cleanup(func() {
		if diskquota.IsBtrfs(sandboxes) {
			if err := diskquota.Unmount(sandboxes); err != nil {
				t.Error(err)
			}
		}
		if img := filepath.Join(dir, "data", "disk.img"); strings.Contains(losetup(t), img) {
			t.Errorf("a loop device still backs %s:\n%s", img, losetup(t))
		}
	})
	url, srv, stderr := startServe(t, dir, "--dev", "--disk-pool", "1G")
	call := rpcCaller(t, url, "")
	must := func(method string, params map[string]any) string {
		t.Helper()
		r := call(method, params)
		if r.status != 200 {
			t.Fatalf("%s %v: %d %+v\n%s", method, params, r.status, r.Error, stderr.String())
		}
		return string(r.Result)
	}
	sh := func(sb, script string) string {
		t.Helper()
		return must("sandbox.command.run", map[string]any{"sandbox": sb, "command": "/bin/sh", "args": []string{"-c", "{ " + script + "; } 2>&1; echo exit=$?"}})
	}
	const quota = 16 << 20
	must("workspace.create", map[string]any{"name": "w", "quota": quota})
	if got := must("workspace.get", map[string]any{"workspace": "w"}); !strings.Contains(got, `"kernel_limit":true`) {
		t.Fatalf("workspace.get: %s", got)
	}
	for _, sb := range []map[string]any{{"name": "a", "workspace": "w"}, {"name": "b", "workspace": "w"}, {"name": "c"}} {
		sb["image"] = "host"
		must("sandbox.create", sb)
	}
	if got := sh("a", "echo from-a > /workspace/shared && cat /workspace/shared"); !strings.Contains(got, "from-a") {
		t.Fatalf("a writes into its workspace: %s", got)
	}
	if got := sh("b", "cat /workspace/shared"); !strings.Contains(got, "from-a") {
		t.Fatalf("b does not see a's write: %s", got)
	}
	if got := sh("a", "dd if=/dev/zero of=/workspace/big bs=1M count=32"); !strings.Contains(got, "Disk quota exceeded") {
		t.Fatalf("a fills the workspace past its quota: %s", got)
	}
	if got := sh("b", "/bin/echo more >> /workspace/shared"); !strings.Contains(got, "Disk quota exceeded") {
		t.Errorf("b writes into the full workspace: %s", got)
	}
	if got := sh("c", "dd if=/dev/zero of=/root/big bs=1M count=32 && rm /root/big"); !strings.Contains(got, "exit=0") {
		t.Errorf("another sandbox beside a full workspace: %s", got)
	}
	if got := sh("a", "dd if=/dev/zero of=/root/big bs=1M count=32 && rm /root/big"); !strings.Contains(got, "exit=0") {
		t.Errorf("the writer's own root beside its full workspace: %s", got)
	}
	if err := os.WriteFile(filepath.Join(t.TempDir(), "host"), make([]byte, 32<<20), 0o600); err != nil {
		t.Errorf("the host beside a full workspace: %v", err)
	}

	// A restart: the limit is the file system's, kept with the workspace.
	stopServe(t, srv)
	url, srv, stderr = startServe(t, dir, "--dev", "--disk-pool", "1G")
	call = rpcCaller(t, url, "")
	if got := sh("a", "rm /workspace/big; sync; dd if=/dev/zero of=/workspace/big bs=1M count=32"); !strings.Contains(got, "Disk quota exceeded") {
		t.Fatalf("after a restart: %s", got)
	}
	ws, _ := filepath.Glob(filepath.Join(sandboxes, ".workspaces", "local", "*", "w"))
	if len(ws) != 1 {
		t.Fatalf("the workspace's directory on the disk pool: %v", ws)
	}
	id, err := diskquota.SubvolumeID(ws[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range []string{"a", "b", "c"} {
		must("sandbox.remove", map[string]any{"sandbox": sb})
	}
	must("workspace.remove", map[string]any{"workspace": "w"})
	deadline := time.Now().Add(20 * time.Second)
	for {
		ids, err := diskquota.Qgroups(sandboxes)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(ids, id) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("quota group 0/%d still there 20 s after the workspace's removal", id)
		}
		_, _ = diskquota.Reap(sandboxes)
		time.Sleep(100 * time.Millisecond)
	}
	stopServe(t, srv)
}

// losetup lists the host's loop devices and their files.
func losetup(t *testing.T) string {
	out, err := exec.Command("losetup", "-a").CombinedOutput()
	if err != nil {
		t.Errorf("losetup -a: %v %s", err, out)
	}
	return string(out)
}

// TestServeDiskPoolDefault: warren serve turns disk limits on by itself
// (--disk-pool auto) where it can, and leaves the pool mounted for its
// next start; where it cannot (here: no mkfs.btrfs on its PATH), it
// starts without them, says so at start and in doctor, and refuses a
// disk_mib; an explicit size it cannot honour stops it from starting.
func TestServeDiskPoolDefault(t *testing.T) {
	testenv.RequireRoot(t)
	_, err := exec.LookPath("mkfs.btrfs")
	testenv.Require(t, err == nil, "mkfs.btrfs (btrfs-progs; `make deps` installs it)")
	dir := stateDir(t)
	sandboxes := filepath.Join(dir, "data", "sandboxes")
	image := filepath.Join(dir, "data", "disk.img")
	unmount := func() {
		if diskquota.IsBtrfs(sandboxes) {
			if err := diskquota.Unmount(sandboxes); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(func() {
		unmount()
		if strings.Contains(losetup(t), image) {
			t.Errorf("a loop device still backs %s:\n%s", image, losetup(t))
		}
	})
	_, srv, stderr := startServeEnv(t, dir, []string{"WARREN_DISK_POOL="}, "--dev", "--network", "off")
	stopServe(t, srv)
	if got := diskquota.MountedImage(sandboxes); got != image {
		t.Fatalf("the default disk pool: %q mounted on %s, want %s\n%s", got, sandboxes, image, stderr.String())
	}
	if !strings.Contains(stderr.String(), "disk limits on") {
		t.Errorf("the log does not say disk limits are on:\n%s", stderr.String())
	}
	unmount()
	// A new image would be needed: without mkfs.btrfs, auto cannot.
	if err := os.Remove(image); err != nil {
		t.Fatal(err)
	}
	noMkfs := []string{"WARREN_DISK_POOL=", "PATH=" + t.TempDir()}
	url, srv, stderr := startServeEnv(t, dir, noMkfs, "--dev", "--network", "off")
	r := rpcCaller(t, url, "")("sandbox.create", map[string]any{"name": "d", "image": "host", "disk_mib": 32})
	stopServe(t, srv)
	if r.status == 200 || !strings.Contains(fmt.Sprint(r.Error), "disk") {
		t.Errorf("disk_mib without disk limits: %d %+v", r.status, r.Error)
	}
	if !strings.Contains(stderr.String(), "DISK LIMITS OFF") || !strings.Contains(stderr.String(), "mkfs.btrfs not found") {
		t.Errorf("the log does not say loudly why disk limits are off:\n%s", stderr.String())
	}
	if diskquota.IsBtrfs(sandboxes) {
		t.Errorf("a pool is mounted though it could not be made")
	}
	doctor := warren(t, dir, "doctor")
	doctor.Env = append(slices.DeleteFunc(doctor.Env, func(e string) bool { return strings.HasPrefix(e, "WARREN_DISK_POOL=") }), "PATH="+t.TempDir())
	if d := run(t, doctor, ""); !strings.Contains(d.stdout, "disk limits") || !strings.Contains(d.stdout, "mkfs.btrfs not found") {
		t.Errorf("doctor does not say why disk limits are off:\n%s%s", d.stdout, d.stderr)
	}
	sized := warren(t, dir, "serve", "--dev", "--network", "off", "--listen", "127.0.0.1:0", "--keep-file-max", "--disk-pool", "1G")
	sized.Env = append(sized.Env, "PATH="+t.TempDir())
	if res := run(t, sized, ""); res.code == 0 || !strings.Contains(res.stderr, "disk limits are not possible here") {
		t.Errorf("--disk-pool 1G without mkfs.btrfs: exit %d\n%s", res.code, res.stderr)
	}
}
