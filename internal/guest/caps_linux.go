package guest

import (
	"fmt"
	"syscall"
	"unsafe"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/oci"
)

// dropCapabilities narrows the bounding, effective, permitted and inheritable
// sets to what the spec lists and clears the ambient set. Capabilities are
// per thread and the Go runtime runs many, so every change is made on all
// threads at once (AllThreadsSyscall; the agent is built without cgo).
func dropCapabilities(c *specs.LinuxCapabilities) error {
	if c == nil {
		c = &specs.LinuxCapabilities{}
	}
	bounding, err := oci.CapMask(c.Bounding)
	if err != nil {
		return err
	}
	eff, err := oci.CapMask(c.Effective)
	if err != nil {
		return err
	}
	perm, err := oci.CapMask(c.Permitted)
	if err != nil {
		return err
	}
	inh, err := oci.CapMask(c.Inheritable)
	if err != nil {
		return err
	}
	// Each drop stops every thread, so drop only what is still there: the
	// host already narrowed the bounding set before the clone, leaving just
	// what setup needs (see oci.SetupCapabilities).
	for cap := 0; cap <= oci.LastCap(); cap++ {
		if bounding&(1<<cap) != 0 {
			continue
		}
		if have, _ := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(cap), 0, 0, 0); have != 1 {
			continue
		}
		if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(cap), 0); e != 0 && e != unix.EINVAL {
			return fmt.Errorf("drop capability %d from bounding set: %w", cap, e)
		}
	}
	if _, _, e := syscall.AllThreadsSyscall6(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0, 0); e != 0 {
		return fmt.Errorf("clear ambient capabilities: %w", e)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{
		{Effective: uint32(eff), Permitted: uint32(perm), Inheritable: uint32(inh)},
		{Effective: uint32(eff >> 32), Permitted: uint32(perm >> 32), Inheritable: uint32(inh >> 32)},
	}
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("set capabilities: %w", e)
	}
	return nil
}
