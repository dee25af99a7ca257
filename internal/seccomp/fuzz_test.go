package seccomp

import (
	"encoding/binary"
	"maps"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// fuzzBytes hands out fuzz input; exhausted input reads as zeros.
type fuzzBytes []byte

func (b *fuzzBytes) u8() byte {
	if len(*b) == 0 {
		return 0
	}
	v := (*b)[0]
	*b = (*b)[1:]
	return v
}

func (b *fuzzBytes) u64() uint64 {
	var buf [8]byte
	for i := range buf {
		buf[i] = b.u8()
	}
	return binary.LittleEndian.Uint64(buf[:])
}

// value picks a 64-bit value, mostly ones whose words are interesting.
func (b *fuzzBytes) value() uint64 {
	switch b.u8() % 8 {
	case 0:
		return 0
	case 1:
		return uint64(b.u8())
	case 2:
		return uint64(b.u8()) << 32
	case 3:
		return 0xffffffff
	case 4:
		return 0xffffffff_00000000
	case 5:
		return uint64(b.u8())<<32 | uint64(b.u8())
	default:
		return b.u64()
	}
}

var (
	fuzzActions = []specs.LinuxSeccompAction{specs.ActAllow, specs.ActErrno, specs.ActErrno, specs.ActKillProcess, specs.ActKill, specs.ActKillThread}
	fuzzOps     = []specs.LinuxSeccompOperator{specs.OpEqualTo, specs.OpNotEqual, specs.OpMaskedEqual}
)

// fuzzProfile builds a profile from fuzz input. Most choices are valid; a few
// byte values select invalid ones so the error paths are fuzzed too.
func fuzzProfile(b *fuzzBytes, names []string) *specs.LinuxSeccomp {
	pickAction := func() specs.LinuxSeccompAction {
		v := b.u8()
		switch v {
		case 254:
			return specs.ActTrap
		case 255:
			return "SCMP_ACT_FUZZ"
		}
		return fuzzActions[int(v)%len(fuzzActions)]
	}
	errno := func(a specs.LinuxSeccompAction) *uint {
		v := b.u8()
		if v == 255 {
			e := uint(5000)
			return &e
		}
		if a != specs.ActErrno || v%2 == 0 {
			return nil
		}
		e := uint(v)
		return &e
	}
	p := &specs.LinuxSeccomp{DefaultAction: pickAction()}
	p.DefaultErrnoRet = errno(p.DefaultAction)
	for range int(b.u8() % 24) {
		var sc specs.LinuxSyscall
		for range 1 + int(b.u8()%3) {
			i := int(binary.LittleEndian.Uint16([]byte{b.u8(), b.u8()}))
			if i == 0xffff {
				sc.Names = append(sc.Names, "not_a_syscall")
			} else {
				sc.Names = append(sc.Names, names[i%len(names)])
			}
		}
		sc.Action = pickAction()
		sc.ErrnoRet = errno(sc.Action)
		for range int(b.u8() % 5) {
			a := specs.LinuxSeccompArg{Index: uint(b.u8() % 7), Value: b.value(), ValueTwo: b.value()}
			switch v := b.u8(); v {
			case 254:
				a.Op = specs.OpGreaterThan
			case 255:
				a.Op = "SCMP_CMP_FUZZ"
			default:
				a.Op = fuzzOps[int(v)%len(fuzzOps)]
			}
			sc.Args = append(sc.Args, a)
		}
		p.Syscalls = append(p.Syscalls, sc)
	}
	return p
}

// refRet is the reference mapping of an action, for valid profiles.
func refRet(a specs.LinuxSeccompAction, errno *uint) uint32 {
	switch a {
	case specs.ActAllow:
		return unix.SECCOMP_RET_ALLOW
	case specs.ActErrno:
		if errno == nil {
			return unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		}
		return unix.SECCOMP_RET_ERRNO | uint32(*errno)
	default:
		return unix.SECCOMP_RET_KILL_PROCESS
	}
}

// refInvalid says what is wrong with a fuzzed profile, or "" if it is valid.
func refInvalid(p *specs.LinuxSeccomp) string {
	badAction := func(a specs.LinuxSeccompAction, errno *uint) string {
		if !slices.Contains(fuzzActions, a) {
			return "action " + string(a)
		}
		if errno != nil && (a != specs.ActErrno || *errno > 4095) {
			return "errno"
		}
		return ""
	}
	if bad := badAction(p.DefaultAction, p.DefaultErrnoRet); bad != "" {
		return "default " + bad
	}
	for _, sc := range p.Syscalls {
		if bad := badAction(sc.Action, sc.ErrnoRet); bad != "" {
			return bad
		}
		if slices.Contains(sc.Names, "not_a_syscall") {
			return "unknown name"
		}
		seen := map[uint]bool{}
		for _, a := range sc.Args {
			if a.Index > 5 || seen[a.Index] {
				return "bad index"
			}
			seen[a.Index] = true
			if !slices.Contains(fuzzOps, a.Op) {
				return "op " + string(a.Op)
			}
		}
	}
	return ""
}

// refVerdict evaluates a valid profile directly: the specification the
// compiled program must agree with.
func refVerdict(p *specs.LinuxSeccomp, c call) uint32 {
	if c.arch != auditArch {
		return unix.SECCOMP_RET_KILL_PROCESS
	}
	if x32Syscalls && c.nr >= x32SyscallBit {
		return unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	}
	for _, sc := range p.Syscalls {
		for _, name := range sc.Names {
			if nr, ok := nativeSyscalls[name]; !ok || nr != c.nr {
				continue
			}
			match := true
			for _, a := range sc.Args {
				v := c.args[a.Index]
				switch a.Op {
				case specs.OpEqualTo:
					match = match && v == a.Value
				case specs.OpNotEqual:
					match = match && v != a.Value
				case specs.OpMaskedEqual:
					match = match && v&a.Value == a.ValueTwo
				}
			}
			if match {
				return refRet(sc.Action, sc.ErrnoRet)
			}
		}
	}
	return refRet(p.DefaultAction, p.DefaultErrnoRet)
}

// fuzzCalls derives calls that hit the profile's rules: for each entry, args
// that satisfy or just miss its conditions, as fuzz input decides.
func fuzzCalls(b *fuzzBytes, p *specs.LinuxSeccomp) []call {
	calls := []call{
		{arch: unix.AUDIT_ARCH_I386, nr: uint32(b.u8())},
		native(x32SyscallBit | uint32(b.u8())),
		native(uint32(b.u64())),
	}
	for _, sc := range p.Syscalls {
		for _, name := range sc.Names {
			nr, ok := nativeSyscalls[name]
			if !ok {
				continue
			}
			for range 3 {
				c := native(nr)
				for i := range c.args {
					c.args[i] = b.value()
				}
				for _, a := range sc.Args {
					v := a.Value
					if a.Op == specs.OpMaskedEqual {
						v = a.ValueTwo | c.args[a.Index]&^a.Value
					}
					switch b.u8() % 4 {
					case 0: // leave random
					case 1:
						c.args[a.Index] = v ^ 1 // low word differs
					case 2:
						c.args[a.Index] = v ^ 1<<32 // high word differs
					default:
						c.args[a.Index] = v
					}
				}
				calls = append(calls, c)
			}
		}
	}
	return calls
}

// FuzzCompile compiles profiles built from fuzz input. Compile must not
// panic; when it succeeds the program must be valid BPF within the kernel's
// limit and agree with refVerdict.
func FuzzCompile(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 5, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	f.Add([]byte("\x00\x10\x03\x01\x02\x01\x02\x01\x03\x02\x05\x07\x09\x02\x01\x00\x06\x00\x02\x02"))
	f.Add([]byte{255, 255, 255, 255, 255, 255, 255, 255})
	f.Add(make([]byte, 512))
	// Mostly a few syscalls, so that entries share them, plus every name
	// known here or elsewhere.
	names := []string{"read", "write", "clone", "personality", "mount", "getpid", "close", "dup"}
	names = slices.Repeat(names, 64)
	names = append(names, slices.Sorted(maps.Keys(nativeSyscalls))...)
	names = append(names, slices.Sorted(maps.Keys(otherArchOnly))...)
	f.Fuzz(func(t *testing.T, data []byte) {
		b := fuzzBytes(data)
		p := fuzzProfile(&b, names)
		prog, err := Compile(p)
		if invalid := refInvalid(p); invalid != "" || err != nil {
			if invalid == "" && !strings.Contains(err.Error(), "instructions") {
				t.Fatalf("Compile failed on a valid profile: %v\nprofile: %+v", err, p)
			}
			if err == nil {
				t.Fatalf("Compile accepted a profile with %s\nprofile: %+v", invalid, p)
			}
			return
		}
		if len(prog) == 0 || len(prog) > unix.BPF_MAXINSNS {
			t.Fatalf("program has %d instructions", len(prog))
		}
		vm := newVM(t, prog)
		for _, c := range fuzzCalls(&b, p) {
			if got, want := verdict(t, vm, c), refVerdict(p, c); got != want {
				t.Fatalf("call %+v: filter says %#x, reference %#x\nprofile: %+v", c, got, want, p)
			}
		}
	})
}
