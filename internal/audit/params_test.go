package audit

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// parseParams is what Params did before it rewrote params in one pass,
// kept as the oracle of its tests: decode into maps, redact and clip,
// encode again.
func parseParams(raw []byte) (json.RawMessage, bool) {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, false
	}
	out, err := json.Marshal(scrubParsed(v, ""))
	return out, err == nil
}

func scrubParsed(v any, k string) any {
	if secretName(k) {
		return Redacted
	}
	switch x := v.(type) {
	case map[string]any:
		for kk, vv := range x {
			if k == "env" {
				x[kk] = Redacted
			} else {
				x[kk] = scrubParsed(vv, kk)
			}
		}
	case []any:
		for i, e := range x {
			switch s, ok := e.(string); {
			case k == "env" && ok:
				name, _, _ := strings.Cut(s, "=")
				x[i] = Clip(name, 256) + "=" + Redacted
			case k == "env":
				x[i] = Redacted
			default:
				x[i] = scrubParsed(e, "")
			}
		}
	case string:
		if k == "env" {
			return Redacted
		}
		return Clip(x, maxString)
	case bool, float64:
		if k == "env" {
			return Redacted
		}
	}
	return v
}

// checkParams compares Params(in) with the oracle: the same value once
// decoded (members may come in another order, and numbers keep their
// text), and a marker exactly where the input is no JSON.
func checkParams(t *testing.T, in []byte) {
	t.Helper()
	got := Params(in)
	if len(in) == 0 {
		if got != nil {
			t.Fatalf("Params of nothing: %s", got)
		}
		return
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, got); err != nil || compact.String() != string(got) {
		t.Fatalf("Params(%q) = %q: not compact JSON (%v)", in, got, err)
	}
	truncated := strings.HasPrefix(string(got), `{"[truncated]":`)
	want, ok := parseParams(in)
	switch {
	case len(in) > 1024: // the bounds can cut one and not the other
	case ok:
		var g, w any
		if truncated || json.Unmarshal(got, &g) != nil || json.Unmarshal(want, &w) != nil || !reflect.DeepEqual(g, w) {
			t.Fatalf("Params(%q)\n got %s\nwant %s", in, got, want)
		}
	case !json.Valid(in) && !truncated:
		t.Fatalf("Params(%q) = %s, want the marker", in, got)
	}
}

func TestParamsAsParsed(t *testing.T) {
	for _, in := range []string{
		`{"sandbox":"s","env":["A=1","B","=x",5,null,{"a":1},["c"]],"timeout":30}`,
		`{"env":{"A":"1","B":null,"C":{"D":"x"},"E":[1]},"env ":"kept","Env":"kept too"}`,
		`{"to\u006ben":"hidden by an escaped name","TOKEN":1,"PassWord":[1,2],"x":{"api_key":{"a":"b"}}}`,
		`{"a":"<b>&\u2028\u2029","b":"\ud83d\ude00 \u00e9","c":"\/\b\f\n\r\t\"\\"}`,
		"{\"bad utf8\":\"\xff\xfe\",\"ok\":\"\xc3\xa9\"}",
		`{"dup":"a","dup":"b","secret":"a","secret":{"b":1}}`,
		`{"n":[-0,0.5,1e10,-1.5E-7,123456789012345678901234567890]}`,
		` [ 1 , "x" , { "env" : [ "K=V" ] } , true , false , null ] `,
		`"a string"`, `12`, `null`, `{}`, `[]`, `{"a":{}}`,
		`{"env":null,"x":1}`, `{"env":true}`, `{"env":-1.5}`, `{"env":"K=V"}`, `{"env":[]}`, `{"env":{}}`, `{"token":null}`,
		`{"long":"` + strings.Repeat("é", 400) + `","env":["` + strings.Repeat("N", 300) + `=v"]}`,
		// Not JSON: the marker.
		`{`, `{"a":}`, `{"a":1,}`, `[1,]`, `{"a" 1}`, `{'a':1}`, `{"a":01}`, `{"a":1.}`, `{"a":.5}`, `{"a":-}`,
		`{"a":1e}`, `{"a":tru}`, `{"a":"\x"}`, "{\"a\":\"\x01\"}", `{"a":"unterminated}`, `{"a":1}{}`, `{"a":1} x`,
		`{"a":"\`, `{"a":[1 2]}`, `{1:2}`, `nul`, `{"a":"\ud800"}`,
	} {
		checkParams(t, []byte(in))
	}
	deep := strings.Repeat("[", maxParamsDepth+1) + strings.Repeat("]", maxParamsDepth+1)
	if got := string(Params([]byte(deep))); !strings.Contains(got, "[truncated]") {
		t.Errorf("params nested %d deep: %.100s", maxParamsDepth+1, got)
	}
}

func BenchmarkParams(b *testing.B) {
	params := []byte(`{"sandbox":"web-1","namespace":"team-a","argv":["python3","-c","print(1)"],"env":["TOKEN=abc"],"timeout":30}`)
	b.ReportAllocs()
	for b.Loop() {
		Params(params)
	}
}
