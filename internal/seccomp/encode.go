package seccomp

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// maxInstructions is the kernel's limit on a classic BPF program.
const maxInstructions = 4096

// Encode serialises a compiled program (8 bytes per instruction, little
// endian), so the host can compile once and hand the result to agents.
func Encode(prog []unix.SockFilter) []byte {
	b := make([]byte, 0, 8*len(prog))
	for _, in := range prog {
		b = binary.LittleEndian.AppendUint16(b, in.Code)
		b = append(b, in.Jt, in.Jf)
		b = binary.LittleEndian.AppendUint32(b, in.K)
	}
	return b
}

// Decode reverses Encode. The kernel validates the program itself when it
// is installed; Decode checks only its framing and size.
func Decode(b []byte) ([]unix.SockFilter, error) {
	if len(b) == 0 || len(b)%8 != 0 || len(b)/8 > maxInstructions {
		return nil, fmt.Errorf("seccomp: encoded program of %d bytes: want 1..%d instructions of 8 bytes", len(b), maxInstructions)
	}
	prog := make([]unix.SockFilter, len(b)/8)
	for i := range prog {
		c := b[8*i:]
		prog[i] = unix.SockFilter{Code: binary.LittleEndian.Uint16(c), Jt: c[2], Jf: c[3], K: binary.LittleEndian.Uint32(c[4:])}
	}
	return prog, nil
}
