package diskquota

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Where Prepare found or made the limited file system.
const (
	// OnDataDir: the directory's own file system is btrfs; quotas are
	// enabled on it.
	OnDataDir = "btrfs-data-dir"
	// OnImage: a btrfs image Warren made, loop-mounted on the directory.
	OnImage = "btrfs-image"
)

// ErrNotEmpty is Prepare's refusal to mount an image over a directory
// that holds something: directories made before limits existed would be
// hidden under it.
var ErrNotEmpty = errors.New("the directory holds entries made before disk limits")

// MinImageBytes is the smallest image Prepare makes (btrfs needs ~115 MiB
// with its default profiles; below a few hundred MiB little is left).
const MinImageBytes = 512 << 20

// Prepare makes dir a place where CreateDir works: dir's own file system
// when it is btrfs, else the btrfs image at image (made sparse, of size
// bytes, if missing; mkfs.btrfs must be installed), loop-mounted on dir
// unless it is already (a restart). An image is mounted only on an empty
// dir (ignoring the entries named in ignore, which it hides); ErrNotEmpty
// otherwise. It returns OnDataDir or OnImage.
func Prepare(dir, image string, size int64, ignore ...string) (string, error) {
	// One process prepares at a time (a server and `warren run` starting
	// together on one data directory would mount the image twice).
	lock, err := os.OpenFile(image+".lock", os.O_CREATE|os.O_RDWR, 0o600) //nolint:gosec // beside the operator's image
	if err != nil {
		return "", err
	}
	defer func() { _ = lock.Close() }()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	if IsBtrfs(dir) {
		how := OnDataDir
		if MountedImage(dir) == absPath(image) {
			how = OnImage
		}
		if err := EnableQuota(dir); err != nil {
			return "", err
		}
		return how, nil
	}
	if err := checkEmpty(dir, ignore); err != nil {
		return "", err
	}
	if _, err := os.Stat(image); errors.Is(err, os.ErrNotExist) {
		if err := makeImage(image, size); err != nil {
			return "", err
		}
	}
	if err := mountImage(image, dir); err != nil {
		return "", err
	}
	if err := EnableQuota(dir); err != nil {
		_ = Unmount(dir)
		return "", err
	}
	return OnImage, nil
}

func absPath(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}

// mountSource is the device mounted on dir according to mountinfo.
func mountSource(dir string) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	want := absPath(dir)
	src := ""
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 10 || f[4] != want {
			continue
		}
		for i := 6; i < len(f)-2; i++ {
			if f[i] == "-" {
				src = f[i+2] // the last mount on dir wins
			}
		}
	}
	return src
}

// loopBacking is the file behind loop device dev ("/dev/loop3").
func loopBacking(dev string) string {
	b, err := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/loop/backing_file") //nolint:gosec // sysfs, named by the device
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// MountedImage is the backing file of the loop device mounted on dir, ""
// when dir is no loop mount.
func MountedImage(dir string) string {
	src := mountSource(dir)
	if !strings.HasPrefix(src, "/dev/loop") {
		return ""
	}
	return loopBacking(src)
}

func checkEmpty(dir string, ignore []string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	n := 0
	for _, e := range ents {
		skip := false
		for _, i := range ignore {
			skip = skip || e.Name() == i
		}
		if !skip {
			n++
		}
	}
	if n > 0 {
		return fmt.Errorf("%s: %w (%d)", dir, ErrNotEmpty, n)
	}
	return nil
}

// makeImage makes a sparse btrfs image, through a temporary name so a
// crash leaves no half-made image under the final one.
func makeImage(image string, size int64) error {
	if size < MinImageBytes {
		return fmt.Errorf("disk pool of %d MiB is below the %d MiB minimum", size>>20, MinImageBytes>>20)
	}
	mkfs, err := exec.LookPath("mkfs.btrfs")
	if err != nil {
		return errors.New("mkfs.btrfs not found: install btrfs-progs (apt-get install btrfs-progs), or turn disk limits off")
	}
	tmp := image + ".new"
	_ = os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600) //nolint:gosec // the image path the operator's data directory names
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// Metadata single, not dup: the image is one file on one disk,
		// where a second copy protects nothing and costs a write.
		out, rerr := exec.Command(mkfs, "-q", "-f", "-m", "single", "-d", "single", tmp).CombinedOutput() //nolint:gosec // mkfs.btrfs from PATH on an image Warren made
		if rerr != nil {
			err = fmt.Errorf("mkfs.btrfs: %w: %s", rerr, strings.TrimSpace(string(out)))
		}
	}
	if err == nil {
		err = os.Rename(tmp, image)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("make disk image %s: %w", image, err)
	}
	return nil
}

// mountImage attaches image to a free loop device (detached again by the
// kernel when the file system is unmounted) and mounts it on dir.
func mountImage(image, dir string) error {
	img, err := os.OpenFile(image, os.O_RDWR, 0) //nolint:gosec // the image Prepare made or found at the operator's path
	if err != nil {
		return err
	}
	defer func() { _ = img.Close() }()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("loop devices: %w", err)
	}
	defer func() { _ = ctl.Close() }()
	for attempt := 0; ; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return fmt.Errorf("find a free loop device: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		lf, err := os.OpenFile(dev, os.O_RDWR, 0) //nolint:gosec // a loop device the kernel named
		if err != nil {
			return fmt.Errorf("open %s: %w", dev, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd())} //nolint:gosec // G115: a descriptor
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		copy(cfg.Info.File_name[:], absPath(image))
		err = unix.IoctlLoopConfigure(int(lf.Fd()), &cfg)
		if errors.Is(err, unix.EBUSY) && attempt < 8 {
			_ = lf.Close() // taken by someone else meanwhile
			continue
		}
		if err != nil {
			_ = lf.Close()
			return fmt.Errorf("attach %s to %s: %w", image, dev, err)
		}
		// nodev, nosuid: nothing a sandbox leaves in its files works
		// as a device or setuid program on the host.
		err = unix.Mount(dev, dir, "btrfs", unix.MS_NODEV|unix.MS_NOSUID|unix.MS_NOATIME, "")
		_ = lf.Close() // the mount holds the device; autoclear frees it at unmount
		if err != nil {
			return fmt.Errorf("mount %s (%s) on %s: %w", image, dev, dir, err)
		}
		return nil
	}
}

// Unmount unmounts the image mounted on dir (tests; a server keeps it
// mounted across restarts). The loop device goes with it: autoclear
// detaches it once the file system lets go of it, which the kernel may do
// after the unmount returns, so Unmount waits (up to two seconds) until
// the device no longer names the image: a caller that removes or reuses
// the image next finds it free.
func Unmount(dir string) error {
	dev := mountSource(dir)
	img := ""
	if strings.HasPrefix(dev, "/dev/loop") {
		img = loopBacking(dev)
	}
	var err error
	for range 50 {
		if err = unix.Unmount(dir, 0); !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("unmount %s: %w", dir, err)
	}
	for i := 0; img != "" && i < 200 && loopBacking(dev) == img; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}
