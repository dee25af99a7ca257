package rpc

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/warren-sandbox/warren/internal/errdefs"
)

// FuzzDecodeRequest feeds arbitrary bodies to the JSON-RPC envelope
// decoder. A request it accepts is one a method may run: "jsonrpc" is
// "2.0", a method is named, the id is absent or a string, number or null,
// and params are absent, null or an object. Whatever it returns, the
// answer built from it (the id echoed) is valid JSON with a mapped kind.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","method":"sandbox.start","params":{"sandbox":"a","config":{"image":"python"}},"id":1}`,
		`{"jsonrpc":"2.0","method":"sandbox.get","params":{"sandbox":"a"},"id":"x"}`,
		`{"jsonrpc":"2.0","method":"sandbox.list"}`,
		`{"jsonrpc":"2.0","method":"sandbox.list","params":null,"id":null}`,
		`[{"jsonrpc":"2.0","method":"sandbox.list","id":1}]`,
		`{"jsonrpc":"1.0","method":"x","id":{}}`,
		`{"jsonrpc":"2.0","method":"x","params":[1],"id":[1]}`,
		`{"jsonrpc":"2.0","method":"","id":1e400}`,
		`{"jsonrpc":2,"id":"keep"}`,
		`  {"jsonrpc":"2.0","method":"a","id":1} trailing`,
		"",
		"null",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := decodeRequest(body)
		if err == nil {
			switch {
			case req.JSONRPC != "2.0":
				t.Fatalf("accepted jsonrpc %q", req.JSONRPC)
			case req.Method == "":
				t.Fatal("accepted a request without a method")
			case len(req.ID) > 0 && (req.ID[0] == '{' || req.ID[0] == '['):
				t.Fatalf("accepted id %s", req.ID)
			case len(req.Params) > 0 && !bytes.Equal(req.Params, []byte("null")) && req.Params[0] != '{':
				t.Fatalf("accepted params %s", req.Params)
			}
		} else if k := kindOf(err); k != "parse_error" && k != "invalid_request" && k != errdefs.ErrInvalid.Error() {
			t.Fatalf("envelope error of kind %q: %v", k, err)
		}
		// The answer echoes the id: it must stay valid JSON whatever was sent.
		w := httptest.NewRecorder()
		if err != nil {
			eo, status := toErrorObject(err)
			writeJSON(w, status, response{JSONRPC: "2.0", Error: eo, ID: req.ID})
		} else {
			writeJSON(w, 200, response{JSONRPC: "2.0", Result: "ok", ID: req.ID})
		}
		if w.Code == 500 || !json.Valid(w.Body.Bytes()) {
			t.Fatalf("answer %d %q", w.Code, w.Body.Bytes())
		}
	})
}
