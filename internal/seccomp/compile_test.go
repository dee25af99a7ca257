package seccomp

import (
	"encoding/binary"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unsafe"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Expected filter results.
const (
	retAllow = unix.SECCOMP_RET_ALLOW
	retKill  = unix.SECCOMP_RET_KILL_PROCESS
	retEPERM = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
)

func retErrno(e unix.Errno) uint32 { return unix.SECCOMP_RET_ERRNO | uint32(e) }

// call is one seccomp_data input.
type call struct {
	arch uint32
	nr   uint32
	args [6]uint64
}

// native returns a call of syscall nr on the running architecture.
func native(nr uint32, args ...uint64) call {
	c := call{arch: auditArch, nr: nr}
	copy(c.args[:], args)
	return c
}

// hostLittleEndian is worked out independently of compile.go's littleEndian.
func hostLittleEndian() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}

// data builds the 64-byte seccomp_data for c as the x/net/bpf VM must see it.
// The kernel loads each 32-bit word in native order; the VM loads big-endian.
// So each word is written big-endian at the native offset of that word.
func (c call) data() []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[0:], c.nr)
	binary.BigEndian.PutUint32(b[4:], c.arch)
	binary.BigEndian.PutUint32(b[8:], 0x11223344) // ip: never read
	binary.BigEndian.PutUint32(b[12:], 0x55667788)
	for i, a := range c.args {
		lo, hi := 16+8*i, 16+8*i+4
		if !hostLittleEndian() {
			lo, hi = hi, lo
		}
		binary.BigEndian.PutUint32(b[lo:], uint32(a))
		binary.BigEndian.PutUint32(b[hi:], uint32(a>>32))
	}
	return b
}

// newVM validates prog with the x/net/bpf VM.
func newVM(t testing.TB, prog []unix.SockFilter) *bpf.VM {
	t.Helper()
	insns := make([]bpf.Instruction, len(prog))
	for i, f := range prog {
		insns[i] = bpf.RawInstruction{Op: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K}.Disassemble()
	}
	vm, err := bpf.NewVM(insns)
	if err != nil {
		t.Fatalf("bpf.NewVM: %v", err)
	}
	return vm
}

func verdict(t testing.TB, vm *bpf.VM, c call) uint32 {
	t.Helper()
	n, err := vm.Run(c.data())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	return uint32(n)
}

func mustCompile(t testing.TB, p *specs.LinuxSeccomp) *bpf.VM {
	t.Helper()
	prog, err := Compile(p)
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	if len(prog) > unix.BPF_MAXINSNS {
		t.Fatalf("program has %d instructions", len(prog))
	}
	return newVM(t, prog)
}

// foreignArch is an architecture the filter must reject.
const foreignArch = unix.AUDIT_ARCH_I386

type verdictCase struct {
	name  string
	amd64 bool // only meaningful on amd64
	call  call
	want  uint32
}

func runCases(t *testing.T, vm *bpf.VM, cases []verdictCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.amd64 && runtime.GOARCH != "amd64" {
				t.Skip("amd64 only")
			}
			if got := verdict(t, vm, tc.call); got != tc.want {
				t.Errorf("verdict = %#x, want %#x", got, tc.want)
			}
		})
	}
}

func TestDefaultProfileVerdicts(t *testing.T) {
	vm := mustCompile(t, DefaultProfile())
	nr := func(name string) uint32 {
		n, ok := nativeSyscalls[name]
		if !ok {
			t.Fatalf("%s not in the native table", name)
		}
		return n
	}
	const sigchld = uint64(unix.SIGCHLD)
	goThreadFlags := uint64(unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_SYSVSEM | unix.CLONE_THREAD)
	cases := []verdictCase{
		{name: "getpid allowed", call: native(nr("getpid")), want: retAllow},
		{name: "read allowed", call: native(nr("read"), 0, 0xdeadbeef, 4096), want: retAllow},
		{name: "chroot allowed", call: native(nr("chroot")), want: retAllow},
		{name: "ptrace allowed", call: native(nr("ptrace")), want: retAllow},
		{name: "unassigned number falls to default", call: native(1000), want: retAllow},
		{name: "mount denied", call: native(nr("mount")), want: retEPERM},
		{name: "umount2 denied", call: native(nr("umount2")), want: retEPERM},
		{name: "keyctl denied", call: native(nr("keyctl")), want: retEPERM},
		{name: "bpf denied", call: native(nr("bpf")), want: retEPERM},
		{name: "unshare denied", call: native(nr("unshare"), unix.CLONE_NEWUSER), want: retEPERM},
		{name: "open_by_handle_at denied", call: native(nr("open_by_handle_at")), want: retEPERM},
		{name: "lsm_set_self_attr denied", call: native(nr("lsm_set_self_attr")), want: retEPERM},
		{name: "clone fork allowed", call: native(nr("clone"), sigchld), want: retAllow},
		{name: "clone vfork allowed", call: native(nr("clone"), unix.CLONE_VM|unix.CLONE_VFORK|unix.CLONE_PIDFD|sigchld), want: retAllow},
		{name: "clone thread allowed", call: native(nr("clone"), goThreadFlags), want: retAllow},
		{name: "clone high bits ignored", call: native(nr("clone"), 0xffffffff_00000000|sigchld), want: retAllow},
		{name: "clone3 ENOSYS", call: native(nr("clone3")), want: retErrno(unix.ENOSYS)},
		{name: "personality 0", call: native(nr("personality"), 0), want: retAllow},
		{name: "personality PER_LINUX32", call: native(nr("personality"), 8), want: retAllow},
		{name: "personality UNAME26", call: native(nr("personality"), 0x20000), want: retAllow},
		{name: "personality PER_LINUX32|UNAME26", call: native(nr("personality"), 0x20008), want: retAllow},
		{name: "personality query", call: native(nr("personality"), 0xffffffff), want: retAllow},
		{name: "personality high word ignored like the kernel", call: native(nr("personality"), 0x1_00000000), want: retAllow},
		{name: "personality READ_IMPLIES_EXEC", call: native(nr("personality"), 0x400000), want: retEPERM},
		{name: "personality ADDR_NO_RANDOMIZE", call: native(nr("personality"), 0x0040000), want: retEPERM},
		{name: "foreign arch getpid", call: call{arch: foreignArch, nr: nr("getpid")}, want: retKill},
		{name: "foreign arch nr 0", call: call{arch: foreignArch}, want: retKill},
		{name: "zero arch", call: call{nr: nr("getpid")}, want: retKill},
		{name: "x32 getpid", amd64: true, call: native(x32SyscallBit | nr("getpid")), want: retEPERM},
		{name: "x32 mount", amd64: true, call: native(x32SyscallBit | nr("mount")), want: retEPERM},
		{name: "nr -1", amd64: true, call: native(0xffffffff), want: retEPERM},
	}
	for _, flag := range []uint64{unix.CLONE_NEWNS, unix.CLONE_NEWUTS, unix.CLONE_NEWIPC, unix.CLONE_NEWUSER,
		unix.CLONE_NEWPID, unix.CLONE_NEWNET, unix.CLONE_NEWCGROUP, unix.CLONE_NEWTIME} {
		cases = append(cases, verdictCase{name: fmt.Sprintf("clone %#x denied", flag), call: native(nr("clone"), flag|sigchld), want: retEPERM})
	}
	runCases(t, vm, cases)
}

func TestDefaultProfileSkipsDeniedSyscallsAbsentHere(t *testing.T) {
	// Every denied name that exists here must be denied.
	vm := mustCompile(t, DefaultProfile())
	for _, name := range deniedSyscalls {
		if nr, ok := nativeSyscalls[name]; ok {
			if got := verdict(t, vm, native(nr)); got != retEPERM {
				t.Errorf("%s: verdict %#x, want EPERM", name, got)
			}
		}
	}
}

func uintp(v uint) *uint { return &v }

func TestCustomProfileVerdicts(t *testing.T) {
	nr := func(name string) uint32 { return nativeSyscalls[name] }
	p := &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Syscalls: []specs.LinuxSyscall{
			// MASKED_EQ on the high word only.
			{Names: []string{"read"}, Action: specs.ActErrno, ErrnoRet: uintp(uint(unix.EACCES)),
				Args: []specs.LinuxSeccompArg{{Index: 1, Value: 0x1_00000000, ValueTwo: 0x1_00000000, Op: specs.OpMaskedEqual}}},
			// MASKED_EQ across both words.
			{Names: []string{"pread64"}, Action: specs.ActErrno, ErrnoRet: uintp(uint(unix.EIO)),
				Args: []specs.LinuxSeccompArg{{Index: 3, Value: 0xff00_0000_0000_00ff, ValueTwo: 0x1200_0000_0000_0034, Op: specs.OpMaskedEqual}}},
			// NE: kill unless arg2 is exactly 0x1_00000005.
			{Names: []string{"write"}, Action: specs.ActKillProcess,
				Args: []specs.LinuxSeccompArg{{Index: 2, Value: 0x1_00000005, Op: specs.OpNotEqual}}},
			// MASKED_EQ that can never hold: bit 32 is expected but not masked.
			{Names: []string{"fchmod"}, Action: specs.ActErrno,
				Args: []specs.LinuxSeccompArg{{Index: 0, Value: 0xff, ValueTwo: 0x1_000000ff, Op: specs.OpMaskedEqual}}},
			// EQ with both words significant; errno defaults to EPERM.
			{Names: []string{"close"}, Action: specs.ActErrno,
				Args: []specs.LinuxSeccompArg{{Index: 0, Value: 0xdeadbeef_00000007, Op: specs.OpEqualTo}}},
			// Several entries for one syscall, one with two conditions (AND).
			{Names: []string{"dup"}, Action: specs.ActErrno, ErrnoRet: uintp(11),
				Args: []specs.LinuxSeccompArg{{Index: 0, Value: 11, Op: specs.OpEqualTo}}},
			{Names: []string{"dup"}, Action: specs.ActErrno, ErrnoRet: uintp(12),
				Args: []specs.LinuxSeccompArg{{Index: 0, Value: 12, Op: specs.OpEqualTo}, {Index: 5, Value: 5, Op: specs.OpEqualTo}}},
			{Names: []string{"getpid", "dup"}, Action: specs.ActKill,
				Args: []specs.LinuxSeccompArg{{Index: 0, Value: 13, Op: specs.OpEqualTo}}},
			// First match wins: the conditional allow shadows the denial.
			{Names: []string{"fsync"}, Action: specs.ActAllow,
				Args: []specs.LinuxSeccompArg{{Index: 0, Value: 3, Op: specs.OpEqualTo}}},
			{Names: []string{"fsync"}, Action: specs.ActErrno, ErrnoRet: uintp(0)},
			{Names: []string{"fsync"}, Action: specs.ActKillThread}, // unreachable
			// A known name absent on this architecture is skipped.
			{Names: []string{someOtherArchOnly(t), "fdatasync"}, Action: specs.ActKillThread},
		},
	}
	vm := mustCompile(t, p)
	runCases(t, vm, []verdictCase{
		{name: "masked_eq high word set", call: native(nr("read"), 0, 0x1_00000000), want: retErrno(unix.EACCES)},
		{name: "masked_eq high word set, other bits", call: native(nr("read"), 0, 0x3_ffffffff), want: retErrno(unix.EACCES)},
		{name: "masked_eq only low word", call: native(nr("read"), 0, 0x1), want: retAllow},
		{name: "masked_eq low ones", call: native(nr("read"), 0, 0xffffffff), want: retAllow},
		{name: "masked_eq other arg index", call: native(nr("read"), 0x1_00000000, 0), want: retAllow},
		{name: "masked_eq both words match", call: native(nr("pread64"), 0, 0, 0, 0x12ab_cdef_0123_4534), want: retErrno(unix.EIO)},
		{name: "masked_eq high word differs", call: native(nr("pread64"), 0, 0, 0, 0x13ab_cdef_0123_4534), want: retAllow},
		{name: "masked_eq low word differs", call: native(nr("pread64"), 0, 0, 0, 0x12ab_cdef_0123_4535), want: retAllow},
		{name: "ne equal", call: native(nr("write"), 0, 0, 0x1_00000005), want: retAllow},
		{name: "ne high word differs", call: native(nr("write"), 0, 0, 0x5), want: retKill},
		{name: "ne high word differs 2", call: native(nr("write"), 0, 0, 0x2_00000005), want: retKill},
		{name: "ne high word equals low value", call: native(nr("write"), 0, 0, 0x5_00000005), want: retKill},
		{name: "masked_eq impossible", call: native(nr("fchmod"), 0x1_000000ff), want: retAllow},
		{name: "masked_eq impossible low only", call: native(nr("fchmod"), 0xff), want: retAllow},
		{name: "ne low word differs", call: native(nr("write"), 0, 0, 0x1_00000006), want: retKill},
		{name: "eq match", call: native(nr("close"), 0xdeadbeef_00000007), want: retEPERM},
		{name: "eq low word only", call: native(nr("close"), 0x7), want: retAllow},
		{name: "eq high word only", call: native(nr("close"), 0xdeadbeef_00000000), want: retAllow},
		{name: "eq swapped words", call: native(nr("close"), 0x00000007_deadbeef), want: retAllow},
		{name: "dup first entry", call: native(nr("dup"), 11), want: retErrno(11)},
		{name: "dup second entry both conditions", call: native(nr("dup"), 12, 0, 0, 0, 0, 5), want: retErrno(12)},
		{name: "dup second entry one condition", call: native(nr("dup"), 12, 0, 0, 0, 0, 6), want: retAllow},
		{name: "dup third entry", call: native(nr("dup"), 13), want: retKill},
		{name: "dup no entry", call: native(nr("dup"), 14), want: retAllow},
		{name: "getpid shared entry", call: native(nr("getpid"), 13), want: retKill},
		{name: "getpid shared entry no match", call: native(nr("getpid"), 0), want: retAllow},
		{name: "first match wins", call: native(nr("fsync"), 3), want: retAllow},
		{name: "errno 0", call: native(nr("fsync"), 4), want: unix.SECCOMP_RET_ERRNO},
		{name: "kill thread is kill process", call: native(nr("fdatasync")), want: retKill},
	})
}

// someOtherArchOnly returns a syscall name known only on another
// architecture. amd64's table is a superset of arm64's, so on amd64 the test
// registers a made-up one for its duration.
func someOtherArchOnly(t testing.TB) string {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(otherArchOnly)) {
		return name
	}
	const fake = "warren_test_other_arch_only"
	otherArchOnly[fake] = true
	t.Cleanup(func() { delete(otherArchOnly, fake) })
	return fake
}

func TestDefaultActions(t *testing.T) {
	getpid := nativeSyscalls["getpid"]
	read := nativeSyscalls["read"]
	allowGetpid := []specs.LinuxSyscall{{Names: []string{"getpid"}, Action: specs.ActAllow}}
	for _, tc := range []struct {
		name   string
		action specs.LinuxSeccompAction
		errno  *uint
		want   uint32
	}{
		{"errno default EPERM", specs.ActErrno, nil, retEPERM},
		{"errno ENOSYS", specs.ActErrno, uintp(uint(unix.ENOSYS)), retErrno(unix.ENOSYS)},
		{"kill", specs.ActKill, nil, retKill},
		{"kill process", specs.ActKillProcess, nil, retKill},
		{"kill thread", specs.ActKillThread, nil, retKill},
		{"allow", specs.ActAllow, nil, retAllow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vm := mustCompile(t, &specs.LinuxSeccomp{DefaultAction: tc.action, DefaultErrnoRet: tc.errno, Syscalls: allowGetpid})
			if got := verdict(t, vm, native(read)); got != tc.want {
				t.Errorf("read: verdict %#x, want %#x", got, tc.want)
			}
			if got := verdict(t, vm, native(getpid)); got != retAllow {
				t.Errorf("getpid: verdict %#x, want ALLOW", got)
			}
			if got := verdict(t, vm, call{arch: foreignArch, nr: getpid}); got != retKill {
				t.Errorf("foreign getpid: verdict %#x, want KILL_PROCESS", got)
			}
		})
	}
}

// TestLongGroup exercises syscalls whose rules are about as long as, or
// longer than, a conditional jump can skip.
func TestLongGroup(t *testing.T) {
	read, write := nativeSyscalls["read"], nativeSyscalls["write"]
	for _, n := range []uint64{50, 51, 52, 60, 100} { // 5 instructions per rule
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			p := &specs.LinuxSeccomp{DefaultAction: specs.ActAllow}
			for i := uint64(1); i <= n; i++ {
				p.Syscalls = append(p.Syscalls, specs.LinuxSyscall{
					Names: []string{"read"}, Action: specs.ActErrno, ErrnoRet: uintp(uint(i)),
					Args: []specs.LinuxSeccompArg{{Index: 0, Value: i, Op: specs.OpEqualTo}},
				})
			}
			p.Syscalls = append(p.Syscalls, specs.LinuxSyscall{Names: []string{"write"}, Action: specs.ActErrno})
			prog, err := Compile(p)
			if err != nil {
				t.Fatal(err)
			}
			if len(prog) < int(5*n) {
				t.Fatalf("program has only %d instructions", len(prog))
			}
			runCases(t, newVM(t, prog), []verdictCase{
				{name: "first", call: native(read, 1), want: retErrno(1)},
				{name: "middle", call: native(read, n/2), want: retErrno(unix.Errno(n / 2))},
				{name: "last", call: native(read, n), want: retErrno(unix.Errno(n))},
				{name: "none", call: native(read, n+1), want: retAllow},
				{name: "next group", call: native(write), want: retEPERM},
				{name: "past all groups", call: native(nativeSyscalls["getpid"]), want: retAllow},
			})
		})
	}
}

func TestCompileErrors(t *testing.T) {
	deny := func(sc specs.LinuxSyscall) *specs.LinuxSeccomp {
		return &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{sc}}
	}
	eq := func(i uint, op specs.LinuxSeccompOperator) []specs.LinuxSeccompArg {
		return []specs.LinuxSeccompArg{{Index: i, Value: 1, Op: op}}
	}
	tooLong := &specs.LinuxSeccomp{DefaultAction: specs.ActAllow}
	for i := range 1000 {
		tooLong.Syscalls = append(tooLong.Syscalls, specs.LinuxSyscall{
			Names: []string{"read"}, Action: specs.ActErrno,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: uint64(i), Op: specs.OpEqualTo}},
		})
	}
	for _, tc := range []struct {
		name string
		p    *specs.LinuxSeccomp
		want string
	}{
		{"nil profile", nil, "nil profile"},
		{"unknown syscall", deny(specs.LinuxSyscall{Names: []string{"getpid", "mountt"}, Action: specs.ActErrno}), `unknown syscall "mountt"`},
		{"unknown syscall vm86", deny(specs.LinuxSyscall{Names: []string{"vm86"}, Action: specs.ActErrno}), `unknown syscall "vm86"`},
		{"empty names", deny(specs.LinuxSyscall{Action: specs.ActErrno}), "no syscall names"},
		{"unknown action", deny(specs.LinuxSyscall{Names: []string{"mount"}, Action: "SCMP_ACT_BOGUS"}), `unknown action "SCMP_ACT_BOGUS"`},
		{"empty action", deny(specs.LinuxSyscall{Names: []string{"mount"}}), `unknown action ""`},
		{"unsupported action", deny(specs.LinuxSyscall{Names: []string{"mount"}, Action: specs.ActTrap}), "unsupported action"},
		{"unknown default action", &specs.LinuxSeccomp{DefaultAction: "SCMP_ACT_NOPE"}, `default action: unknown action`},
		{"unsupported default action", &specs.LinuxSeccomp{DefaultAction: specs.ActNotify}, `default action: unsupported action`},
		{"errno out of range", deny(specs.LinuxSyscall{Names: []string{"mount"}, Action: specs.ActErrno, ErrnoRet: uintp(4096)}), "out of range"},
		{"errnoRet with allow", deny(specs.LinuxSyscall{Names: []string{"mount"}, Action: specs.ActAllow, ErrnoRet: uintp(1)}), "errnoRet is only valid"},
		{"default errnoRet with kill", &specs.LinuxSeccomp{DefaultAction: specs.ActKill, DefaultErrnoRet: uintp(1)}, "errnoRet is only valid"},
		{"unknown op", deny(specs.LinuxSyscall{Names: []string{"mount"}, Action: specs.ActErrno, Args: eq(0, "SCMP_CMP_FOO")}), `unknown operator "SCMP_CMP_FOO"`},
		{"unsupported op", deny(specs.LinuxSyscall{Names: []string{"mount"}, Action: specs.ActErrno, Args: eq(0, specs.OpLessThan)}), "unsupported operator"},
		{"arg index", deny(specs.LinuxSyscall{Names: []string{"mount"}, Action: specs.ActErrno, Args: eq(6, specs.OpEqualTo)}), "index 6 out of range"},
		{"repeated index", deny(specs.LinuxSyscall{Names: []string{"mount"}, Action: specs.ActErrno,
			Args: append(eq(2, specs.OpEqualTo), eq(2, specs.OpNotEqual)...)}), "more than one condition on argument 2"},
		{"bad args on a name absent here", deny(specs.LinuxSyscall{Names: []string{someOtherArchOnly(t)}, Action: specs.ActErrno, Args: eq(0, "x")}), "unknown operator"},
		{"unknown flag", &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Flags: []specs.LinuxSeccompFlag{"SECCOMP_FILTER_FLAG_BOGUS"}}, "unknown flag"},
		{"too long", tooLong, "more than the kernel's 4096 instructions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prog, err := Compile(tc.p)
			if err == nil {
				t.Fatalf("Compile succeeded with %d instructions, want error containing %q", len(prog), tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestDefaultProfileIsFresh(t *testing.T) {
	a := DefaultProfile()
	a.Syscalls[len(a.Syscalls)-1].Names[0] = "changed"
	if b := DefaultProfile(); b.Syscalls[len(b.Syscalls)-1].Names[0] == "changed" {
		t.Fatal("DefaultProfile shares state between calls")
	}
}

func BenchmarkCompile(b *testing.B) {
	p := DefaultProfile()
	for b.Loop() {
		if _, err := Compile(p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFilterWorstCase(b *testing.B) {
	prog, err := Compile(DefaultProfile())
	if err != nil {
		b.Fatal(err)
	}
	vm := newVM(b, prog)
	in := native(nativeSyscalls["getpid"]).data() // allowed: walks the whole chain
	for b.Loop() {
		if _, err := vm.Run(in); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(prog)), "insns")
}

// TestTreeMatchesReference: profiles of 1 to 150 syscalls, some with
// several argument rules (bodies long enough for the tree's long jumps),
// decide every syscall number as the profile says.
func TestTreeMatchesReference(t *testing.T) {
	names := slices.Sorted(maps.Keys(nativeSyscalls))
	errno := uint(unix.EACCES)
	for _, n := range []int{1, 4, 5, 9, 33, 150} {
		p := &specs.LinuxSeccomp{DefaultAction: specs.ActAllow}
		for i, name := range names[:min(n, len(names))] {
			sc := specs.LinuxSyscall{Names: []string{name}, Action: specs.ActErrno}
			if i%25 == 0 {
				// 40 rules of 5 instructions: a body over 255.
				for v := range uint64(40) {
					p.Syscalls = append(p.Syscalls, specs.LinuxSyscall{Names: []string{name}, Action: specs.ActErrno, ErrnoRet: &errno,
						Args: []specs.LinuxSeccompArg{{Index: 1, Value: v, Op: specs.OpEqualTo}}})
				}
			}
			p.Syscalls = append(p.Syscalls, sc)
		}
		vm := mustCompile(t, p)
		for nr := uint32(0); nr < 1100; nr++ {
			for _, arg := range []uint64{0, 7, 39, 40, 1 << 32} {
				c := native(nr, 0, arg)
				if got, want := verdict(t, vm, c), refVerdict(p, c); got != want {
					t.Fatalf("%d syscalls: nr %d arg %d: verdict %#x, profile says %#x", n, nr, arg, got, want)
				}
			}
		}
	}
}
