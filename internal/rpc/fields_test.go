package rpc

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"
)

// FuzzObjectKeys checks the key scanner against encoding/json on every
// valid JSON object: the same keys, in order, duplicates included.
func FuzzObjectKeys(f *testing.F) {
	for _, s := range []string{
		`{}`, `null`, `{"path":"/a","data":"xyz"}`, `{"a":{"b":1,"c":[{"d":2}]},"e":"}\"{,"}`,
		`{"p\u0061th":1, "x\\":[1,"a,b"]}`, `{"a":1,"a":2}`, ` { "k" : [ ] } `, `[{"a":1}]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !json.Valid(b) {
			return
		}
		want, ok := decodedKeys(b)
		if !ok {
			return // not an object
		}
		if got := objectKeys(b); !slices.Equal(got, want) {
			t.Fatalf("objectKeys(%q) = %q, want %q", b, got, want)
		}
	})
}

func decodedKeys(b []byte) ([]string, bool) {
	d := json.NewDecoder(bytes.NewReader(b))
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	var keys []string
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			return nil, false
		}
		keys = append(keys, tok.(string))
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			return nil, false
		}
	}
	return keys, true
}
