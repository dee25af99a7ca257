package rpc

import (
	"bytes"
	"encoding/json"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestOutTextPieces: the JSON an outText writes in pieces is byte for byte
// what json.Marshal makes of the whole string, and size says its length,
// whatever the bytes: control bytes, HTML characters, U+2028, multi-byte
// characters across the pieces' boundaries, invalid UTF-8 (replaced, as
// text does).
func TestOutTextPieces(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"\x00", "\x01", "\x1f", "\n", "\t", "\"", "\\", "<", ">", "&", "\u2028", "é", "€", "😀", "\xff", "\xe2\x82", "a", "z"}
	inputs := []string{"", "plain", strings.Repeat("\x01", 3*textChunk+7), strings.Repeat("é", textChunk), "\u2029\u2028x\xe2\x80", strings.Repeat("\u2028", textChunk)}
	all := make([]byte, 0, 4*256)
	for c := range 256 {
		all = append(all, byte(c), 'a', byte(c))
	}
	inputs = append(inputs, string(all))
	for range 40 {
		var b strings.Builder
		for range r.IntN(3 * textChunk) {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		inputs = append(inputs, b.String())
	}
	for _, in := range inputs {
		for _, binary := range []bool{false, true} {
			ot := newOutText([]byte(in), binary)
			want, err := json.Marshal(encode([]byte(in), binary))
			if err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			if err := ot.writeTo(&got, bulk{}); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Fatalf("%d bytes (binary %v): pieces differ from the whole", len(in), binary)
			}
			if ot.size() != int64(len(want)) {
				t.Fatalf("%d bytes: size %d, JSON %d", len(in), ot.size(), len(want))
			}
			if whole, _ := ot.MarshalJSON(); !bytes.Equal(whole, want) {
				t.Fatalf("%d bytes: MarshalJSON differs", len(in))
			}
		}
	}
}

// BenchmarkOutTextControlBytes: counting and writing an exec answer's
// 16 MiB of control bytes (96 MiB of JSON), the bulk work of
// output/control-bytes-x4 in the hostile suite; json.Marshal of the
// string whole for comparison. Per byte of output:
//
//	go test -run - -bench OutTextControlBytes ./internal/rpc/
func BenchmarkOutTextControlBytes(b *testing.B) {
	out := bytes.Repeat([]byte{1}, 16<<20)
	b.Run("pieces", func(b *testing.B) {
		b.SetBytes(int64(len(out)))
		for b.Loop() {
			ot := newOutText(out, false)
			_ = ot.size()
			if err := ot.writeTo(io.Discard, bulk{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		b.SetBytes(int64(len(out)))
		for b.Loop() {
			if _, err := json.Marshal(string(out)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestBlocks: blocks hold what is written and read into them, in order,
// whatever the sizes of the writes.
func TestBlocks(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	want := make([]byte, 3*blockSize+12345)
	for i := range want {
		want[i] = byte(r.IntN(256))
	}
	var w blocks
	for rest := want; len(rest) > 0; {
		n := min(len(rest), r.IntN(3*blockSize/2)+1)
		_, _ = w.Write(rest[:n])
		rest = rest[n:]
	}
	var rd blocks
	if n, err := rd.ReadFrom(bytes.NewReader(want)); err != nil || n != int64(len(want)) {
		t.Fatalf("ReadFrom: %d %v", n, err)
	}
	for _, b := range []*blocks{&w, &rd} {
		if b.Len() != len(want) || !bytes.Equal(b.Bytes(), want) {
			t.Fatalf("held %d bytes, not what was written (%d)", b.Len(), len(want))
		}
	}
	var empty blocks
	if empty.Bytes() != nil || empty.Len() != 0 {
		t.Fatal("empty blocks hold something")
	}
}
