//go:build linux

package service

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/warren-sandbox/warren/internal/wire"
)

type recorder struct {
	header map[string]string
	body   bytes.Buffer
}

func (r *recorder) Header() map[string]string   { return r.header }
func (r *recorder) WriteHeader(int)             {}
func (r *recorder) Write(p []byte) (int, error) { return r.body.Write(p) }
func (r *recorder) Flush()                      {}

// TestWriteReplResult: a REPL result written line by line decodes to what
// was written, special characters, no output and a huge output alike.
func TestWriteReplResult(t *testing.T) {
	s := "a \"q\" <b> é \x01 \\"
	many := make([]wire.OutputLine, 100000)
	for i := range many {
		many[i] = wire.OutputLine{Stream: wire.Stdout, Text: s}
	}
	for _, res := range []wire.ReplResult{
		{Status: wire.ReplSuccess, Output: []wire.OutputLine{}, DurationMs: 1},
		{Status: wire.ReplError, Output: []wire.OutputLine{{Stream: wire.Stdout, Text: s}, {Stream: wire.Stderr, Text: ""}},
			Result: &s, Error: "E: " + s, Truncated: true, DurationMs: 2.5},
		{Status: wire.ReplSuccess, Output: many},
	} {
		want := res
		want.Output = append([]wire.OutputLine{}, res.Output...)
		w := &recorder{header: map[string]string{}}
		writeReplResult(w, res)
		var got wire.ReplResult
		if err := json.Unmarshal(w.body.Bytes(), &got); err != nil {
			t.Fatalf("%.200s: %v", w.body.Bytes(), err)
		}
		if !reflect.DeepEqual(got, want) || w.header["Content-Type"] != "application/json" {
			t.Fatalf("wrote %.300s\ndecoded %+v\nwant %+v", w.body.Bytes(), got.Status, want.Status)
		}
	}
}
