package seccomp

import (
	"reflect"
	"testing"
)

func TestEncodeRoundTrip(t *testing.T) {
	prog, err := Compile(DefaultProfile())
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(Encode(prog))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, prog) {
		t.Error("round trip changed the program")
	}
	for name, b := range map[string][]byte{
		"empty":     nil,
		"ragged":    make([]byte, 13),
		"too large": make([]byte, 8*(maxInstructions+1)),
	} {
		if _, err := Decode(b); err == nil {
			t.Errorf("%s: Decode accepted it", name)
		}
	}
}
