//go:build linux && !amd64 && !arm64

package seccomp

// auditArch is zero on architectures without a syscall table: Compile
// refuses to build a filter for them.
const auditArch = 0

// x32Syscalls reports whether the architecture has an x32-style syscall
// number range to deny; only amd64 does.
const x32Syscalls = false

// nativeSyscalls is empty: no table exists for this architecture.
var nativeSyscalls = map[string]uint32{}

// otherArchOnly is empty: Compile fails before names are looked up.
var otherArchOnly = map[string]bool{}
