//go:build linux

package seccomp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Offsets into struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6]},
// which the kernel lays out in native byte order.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

// x32SyscallBit marks x32-ABI syscall numbers on x86_64.
const x32SyscallBit = 0x40000000

// maxErrno is the largest errno the kernel passes through (MAX_ERRNO).
const maxErrno = 4095

// maxJump is the longest forward skip a conditional jump can encode.
const maxJump = 255

// littleEndian reports the byte order the kernel uses for seccomp_data.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// argWords returns the offsets of the low and high 32-bit words of args[i].
func argWords(i uint) (lo, hi uint32) {
	base := offArgs + 8*uint32(i) //nolint:gosec // i is an argument index, checked to be 0..5 by checkArgs
	if littleEndian {
		return base, base + 4
	}
	return base + 4, base
}

// rule is one compiled profile entry for one syscall: when every condition
// holds, the filter returns ret.
type rule struct {
	conds []specs.LinuxSeccompArg
	ret   uint32
}

// Compile turns an OCI seccomp profile into a classic BPF program for the
// running architecture, ready for Install.
//
// The program first checks seccomp_data.arch: any other architecture (such as
// i386 through int 0x80 on x86_64) kills the process. On x86_64, syscall
// numbers at or above 0x40000000 (the x32 ABI) fail with EPERM. Then, for the
// syscall being made, the profile's entries that name it are tried in profile
// order and the first whose conditions all hold decides; if none does,
// DefaultAction applies.
//
// Supported actions are SCMP_ACT_ALLOW, SCMP_ACT_ERRNO (ErrnoRet or
// DefaultErrnoRet, EPERM when unset) and SCMP_ACT_KILL_PROCESS;
// SCMP_ACT_KILL and SCMP_ACT_KILL_THREAD are treated as SCMP_ACT_KILL_PROCESS,
// since killing one thread of a Go program leaves it wedged. Supported
// argument operators are SCMP_CMP_EQ, SCMP_CMP_NE and SCMP_CMP_MASKED_EQ
// (Value is the mask, ValueTwo the expected result), all on the full 64-bit
// argument; one entry may hold at most one condition per argument index.
//
// A syscall name unknown on every supported architecture is an error, so a
// typo cannot silently weaken a profile; a name known on another architecture
// but absent on this one (iopl on arm64) is skipped. Architectures is ignored
// (only the native architecture is ever admitted), as are the known Flags and
// the listener fields, which do not change what the filter decides.
func Compile(p *specs.LinuxSeccomp) ([]unix.SockFilter, error) {
	if p == nil {
		return nil, errors.New("seccomp: nil profile")
	}
	if auditArch == 0 {
		return nil, fmt.Errorf("seccomp: no syscall table for %s", runtime.GOARCH)
	}
	for _, f := range p.Flags {
		switch f {
		case specs.LinuxSeccompFlagLog, specs.LinuxSeccompFlagSpecAllow, specs.LinuxSeccompFlagWaitKillableRecv:
		default:
			return nil, fmt.Errorf("seccomp: unknown flag %q", f)
		}
	}
	def, err := action(p.DefaultAction, p.DefaultErrnoRet)
	if err != nil {
		return nil, fmt.Errorf("seccomp: default action: %w", err)
	}

	// Group the entries by syscall number, keeping profile order within each
	// syscall; different syscalls never match the same call, so the order of
	// the groups does not matter.
	groups := map[uint32][]rule{}
	var order []uint32
	for i, sc := range p.Syscalls {
		ret, err := action(sc.Action, sc.ErrnoRet)
		if err != nil {
			return nil, fmt.Errorf("seccomp: syscalls[%d]: %w", i, err)
		}
		if err := checkArgs(sc.Args); err != nil {
			return nil, fmt.Errorf("seccomp: syscalls[%d]: %w", i, err)
		}
		if len(sc.Names) == 0 {
			return nil, fmt.Errorf("seccomp: syscalls[%d]: no syscall names", i)
		}
		for _, name := range sc.Names {
			nr, ok := nativeSyscalls[name]
			if !ok {
				if otherArchOnly[name] {
					continue
				}
				return nil, fmt.Errorf("seccomp: syscalls[%d]: unknown syscall %q", i, name)
			}
			if _, seen := groups[nr]; !seen {
				order = append(order, nr)
			}
			groups[nr] = append(groups[nr], rule{conds: sc.Args, ret: ret})
		}
	}

	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: auditArch, SkipTrue: 1},
		bpf.RetConstant{Val: unix.SECCOMP_RET_KILL_PROCESS},
		bpf.LoadAbsolute{Off: offNr, Size: 4},
	}
	if x32Syscalls {
		prog = append(prog,
			bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: x32SyscallBit, SkipFalse: 1},
			bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
		)
	}
	// The groups, in syscall number order, as a binary search tree (see
	// tree), so the kernel runs a few comparisons per call instead of one
	// per group: it runs the whole program for every syscall number when it
	// installs the filter (to cache the calls it always allows), which took
	// 0.1 ms for the linear chain this replaces.
	slices.Sort(order)
	var entries []entry
	for _, nr := range order {
		if body := groupCode(groups[nr], def); len(body) > 0 {
			entries = append(entries, entry{nr: nr, body: body})
		}
	}
	prog = append(prog, tree(entries, def)...)
	if len(prog) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("seccomp: program needs more than the kernel's %d instructions", unix.BPF_MAXINSNS)
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, fmt.Errorf("seccomp: assemble: %w", err)
	}
	out := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		out[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return out, nil
}

// entry is one syscall's compiled group: code that decides the call and
// always returns.
type entry struct {
	nr   uint32
	body []bpf.Instruction
}

// leafEntries is how many entries a leaf of the tree compares in a row.
const leafEntries = 4

// tree returns code that, with the syscall number in A, runs the body of
// the entry for it, or returns def when none is. es is sorted by number. A
// leaf is a chain: each comparison skips its body when it fails, and the
// leaf ends with def. Above that, one comparison with the middle entry's
// number sends larger numbers past the lower half's code. Every path ends
// in a return, and A holds the number until a body runs.
func tree(es []entry, def uint32) []bpf.Instruction {
	if len(es) <= leafEntries {
		var code []bpf.Instruction
		for _, e := range es {
			code = append(code, jumpUnless(bpf.JumpEqual, e.nr, len(e.body))...)
			code = append(code, e.body...)
		}
		return append(code, bpf.RetConstant{Val: def})
	}
	mid := len(es) / 2
	lower, upper := tree(es[:mid], def), tree(es[mid:], def)
	code := jumpIf(bpf.JumpGreaterOrEqual, es[mid].nr, len(lower))
	return append(append(code, lower...), upper...)
}

// jumpUnless skips n instructions when A cond val does not hold.
func jumpUnless(cond bpf.JumpTest, val uint32, n int) []bpf.Instruction {
	if n <= maxJump {
		return []bpf.Instruction{bpf.JumpIf{Cond: cond, Val: val, SkipFalse: uint8(n)}} //nolint:gosec // n <= maxJump here
	}
	return []bpf.Instruction{bpf.JumpIf{Cond: cond, Val: val, SkipTrue: 1}, bpf.Jump{Skip: uint32(n)}} //nolint:gosec // n is an instruction count, at most BPF_MAXINSNS once installed
}

// jumpIf skips n instructions when A cond val holds.
func jumpIf(cond bpf.JumpTest, val uint32, n int) []bpf.Instruction {
	if n <= maxJump {
		return []bpf.Instruction{bpf.JumpIf{Cond: cond, Val: val, SkipTrue: uint8(n)}} //nolint:gosec // n <= maxJump here
	}
	return []bpf.Instruction{bpf.JumpIf{Cond: cond, Val: val, SkipFalse: 1}, bpf.Jump{Skip: uint32(n)}} //nolint:gosec // n is an instruction count, at most BPF_MAXINSNS once installed
}

// action returns the SECCOMP_RET_* value for an OCI action.
func action(a specs.LinuxSeccompAction, errnoRet *uint) (uint32, error) {
	if errnoRet != nil && a != specs.ActErrno {
		return 0, fmt.Errorf("errnoRet is only valid with %s, not %q", specs.ActErrno, a)
	}
	switch a {
	case specs.ActAllow:
		return unix.SECCOMP_RET_ALLOW, nil
	case specs.ActErrno:
		errno := uint(unix.EPERM)
		if errnoRet != nil {
			errno = *errnoRet
		}
		if errno > maxErrno {
			return 0, fmt.Errorf("errno %d out of range (0..%d)", errno, maxErrno)
		}
		return unix.SECCOMP_RET_ERRNO | uint32(errno), nil
	case specs.ActKill, specs.ActKillProcess, specs.ActKillThread:
		return unix.SECCOMP_RET_KILL_PROCESS, nil
	case specs.ActTrap, specs.ActTrace, specs.ActLog, specs.ActNotify:
		return 0, fmt.Errorf("unsupported action %q", a)
	default:
		return 0, fmt.Errorf("unknown action %q", a)
	}
}

// checkArgs validates the conditions of one entry.
func checkArgs(args []specs.LinuxSeccompArg) error {
	var seen [6]bool
	for j, a := range args {
		if a.Index >= uint(len(seen)) {
			return fmt.Errorf("args[%d]: index %d out of range (0..5)", j, a.Index)
		}
		if seen[a.Index] { //nolint:gosec // a.Index < len(seen) is checked just above
			return fmt.Errorf("args[%d]: more than one condition on argument %d", j, a.Index)
		}
		seen[a.Index] = true
		switch a.Op {
		case specs.OpEqualTo, specs.OpNotEqual, specs.OpMaskedEqual:
		case specs.OpLessThan, specs.OpLessEqual, specs.OpGreaterThan, specs.OpGreaterEqual:
			return fmt.Errorf("args[%d]: unsupported operator %q", j, a.Op)
		default:
			return fmt.Errorf("args[%d]: unknown operator %q", j, a.Op)
		}
	}
	return nil
}

// groupCode compiles the rules of one syscall, entered with the syscall
// matched. Every path through it ends in a return; its jumps stay inside it.
// It returns nil when every path would return def anyway.
func groupCode(rules []rule, def uint32) []bpf.Instruction {
	var codes [][]bpf.Instruction
	var rets []uint32
	terminated := false
	for _, r := range rules {
		code, conditional := ruleCode(r)
		codes, rets = append(codes, code), append(rets, r.ret)
		if !conditional {
			terminated = true
			break // later rules for this syscall cannot be reached
		}
	}
	// Trailing rules that return the default change nothing.
	for len(rets) > 0 && rets[len(rets)-1] == def {
		codes, rets = codes[:len(codes)-1], rets[:len(rets)-1]
		terminated = false
	}
	if len(codes) == 0 {
		return nil
	}
	var body []bpf.Instruction
	for _, c := range codes {
		body = append(body, c...)
	}
	if !terminated {
		body = append(body, bpf.RetConstant{Val: def})
	}
	return body
}

// ruleCode compiles one rule: its conditions, each jumping past the rule's
// final return when it does not hold, then the return. conditional is false
// when the rule always matches.
func ruleCode(r rule) (code []bpf.Instruction, conditional bool) {
	var failOnFalse []int // jumps whose false branch leaves the rule
	var failOnTrue []int  // jumps whose true branch leaves the rule
	for _, c := range r.conds {
		lo, hi := argWords(c.Index)
		vlo, vhi := uint32(c.Value), uint32(c.Value>>32) //nolint:gosec // splitting a 64-bit argument into BPF's two 32-bit words; truncation is the point
		switch c.Op {
		case specs.OpEqualTo:
			code = append(code, bpf.LoadAbsolute{Off: hi, Size: 4})
			failOnFalse = append(failOnFalse, len(code))
			code = append(code, bpf.JumpIf{Cond: bpf.JumpEqual, Val: vhi})
			code = append(code, bpf.LoadAbsolute{Off: lo, Size: 4})
			failOnFalse = append(failOnFalse, len(code))
			code = append(code, bpf.JumpIf{Cond: bpf.JumpEqual, Val: vlo})
		case specs.OpNotEqual:
			// Holds when either half differs.
			code = append(code,
				bpf.LoadAbsolute{Off: hi, Size: 4},
				bpf.JumpIf{Cond: bpf.JumpEqual, Val: vhi, SkipFalse: 2},
				bpf.LoadAbsolute{Off: lo, Size: 4},
			)
			failOnTrue = append(failOnTrue, len(code))
			code = append(code, bpf.JumpIf{Cond: bpf.JumpEqual, Val: vlo})
		case specs.OpMaskedEqual:
			dlo, dhi := uint32(c.ValueTwo), uint32(c.ValueTwo>>32) //nolint:gosec // splitting a 64-bit mask into BPF's two 32-bit words; truncation is the point
			for _, w := range []struct{ off, mask, want uint32 }{{hi, vhi, dhi}, {lo, vlo, dlo}} {
				if w.mask == 0 && w.want == 0 {
					continue // this half always matches
				}
				code = append(code, bpf.LoadAbsolute{Off: w.off, Size: 4})
				if w.mask != 0xffffffff {
					code = append(code, bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: w.mask})
				}
				failOnFalse = append(failOnFalse, len(code))
				code = append(code, bpf.JumpIf{Cond: bpf.JumpEqual, Val: w.want})
			}
		}
	}
	code = append(code, bpf.RetConstant{Val: r.ret})
	// A rule has at most 6 conditions of at most 6 instructions each, so
	// every skip fits in a conditional jump.
	end := len(code)
	for _, i := range failOnFalse {
		j := code[i].(bpf.JumpIf)
		j.SkipFalse = uint8(end - i - 1) //nolint:gosec // a rule's skips are at most 36 instructions (see above)
		code[i] = j
	}
	for _, i := range failOnTrue {
		j := code[i].(bpf.JumpIf)
		j.SkipTrue = uint8(end - i - 1) //nolint:gosec // a rule's skips are at most 36 instructions (see above)
		code[i] = j
	}
	return code, len(failOnFalse)+len(failOnTrue) > 0
}
