package agent

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/wire"
)

// readAll decodes a REPL answer keeping its lines, as Client.Repl does.
func readAll(body string) (wire.ReplResult, error) {
	out := []wire.OutputLine{}
	res, err := readReplResult(strings.NewReader(body), wire.MaxOutputLimit, func(l wire.OutputLine) { out = append(out, l) })
	res.Output = out
	return res, err
}

// TestReadReplResult: a REPL answer decodes line by line to what a whole
// decode gives, in any member order; a hostile or broken one is an error.
func TestReadReplResult(t *testing.T) {
	s := "x \"q\" é"
	res := wire.ReplResult{Status: wire.ReplError, Output: []wire.OutputLine{{Stream: wire.Stdout, Text: s}, {Stream: wire.Stderr, Text: ""}},
		Result: &s, Error: "E", Truncated: true, DurationMs: 1.5}
	whole, _ := json.Marshal(res)
	for _, body := range []string{
		string(whole),
		`{"duration_ms":1.5,"truncated":true,"error":"E","result":"x \"q\" é","output":[{"stream":"stdout","text":"x \"q\" é"},
		 {"stream":"stderr","text":""}],"status":"error","future":{"a":[1]}}`,
	} {
		got, err := readAll(body)
		if err != nil || !reflect.DeepEqual(got, res) {
			t.Errorf("%s:\n got %+v, %v\nwant %+v", body, got, err, res)
		}
	}
	if got, err := readAll(`{"status":"success","output":[]}`); err != nil || got.Output == nil || len(got.Output) != 0 {
		t.Errorf("no output: %+v, %v", got, err)
	}
	var many bytes.Buffer
	many.WriteString(`{"status":"success","output":[`)
	for i := range maxReplLines + 1 {
		if i > 0 {
			many.WriteByte(',')
		}
		many.WriteString(`{"stream":"stdout","text":""}`)
	}
	many.WriteString(`]}`)
	for _, body := range []string{many.String(), ``, `[]`, `{"status":"success","output":{}}`, `{"status":"success","output":[1]}`,
		`{"status":"success","output":[`, `{"status":1}`, `{"status":"success"`} {
		if _, err := readAll(body); err == nil {
			t.Errorf("%.60q: no error", body)
		}
	}
}
