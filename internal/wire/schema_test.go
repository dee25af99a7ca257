package wire

import (
	"flag"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/protocol.golden")

// wireTypes are every type that crosses the host-agent connection.
var wireTypes = []any{
	Health{}, ExecRequest{}, ExecEvent{}, ExitStatus{}, ProcessInfo{}, OutputChunk{},
	SignalRequest{}, ResizeRequest{}, FileInfo{}, MkdirRequest{}, RemoveRequest{},
	MoveRequest{}, ReplRequest{}, OutputLine{}, ReplResult{}, ErrorBody{},
}

func schema() string {
	var b strings.Builder
	fmt.Fprintf(&b, "version %s\n", Version)
	for _, v := range wireTypes {
		t := reflect.TypeOf(v)
		fmt.Fprintf(&b, "\n%s\n", t.Name())
		for i := range t.NumField() {
			f := t.Field(i)
			// The Go package's name is not part of the protocol.
			typ := strings.ReplaceAll(f.Type.String(), t.PkgPath()[strings.LastIndex(t.PkgPath(), "/")+1:]+".", "")
			fmt.Fprintf(&b, "  %-12s %-18s %s\n", f.Name, typ, f.Tag.Get("json"))
		}
	}
	return b.String()
}

// TestProtocolGolden pins the wire schema: changing a type without bumping
// Version and regenerating (go test ./internal/wire -update) fails here.
func TestProtocolGolden(t *testing.T) {
	got := schema()
	if *update {
		if err := os.WriteFile("testdata/protocol.golden", []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("testdata/protocol.golden")
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("agent protocol changed; bump Version if incompatible and run with -update.\ngot:\n%s", got)
	}
}
