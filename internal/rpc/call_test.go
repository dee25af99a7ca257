package rpc

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/wire"
)

// TestParamsStrictness: the microsandbox methods ignore params they do not
// know, as clients of every microsandbox version expect; every other
// method refuses them, with invalid_params naming the field, before it
// does anything else (the server here has no manager to reach).
func TestParamsStrictness(t *testing.T) {
	s := &Server{}
	var lenient []string
	for name, m := range s.methodTable() {
		c := &call{s: s, claims: auth.Claims{Namespace: "*"}, params: json.RawMessage(`{"no_such_field":1}`), method: name}
		err := run(t, m, c)
		if m.lenient {
			lenient = append(lenient, name)
			if err != nil && strings.Contains(err.Error(), "no_such_field") {
				t.Errorf("%s (lenient) refused an unknown field: %v", name, err)
			}
			continue
		}
		want := name + ` params: unknown field "no_such_field"`
		if err == nil || kindOf(err) != "invalid_params" || err.Error() != want {
			t.Errorf("%s: %v (kind %s), want invalid_params %q", name, err, kindOf(err), want)
		}
	}
	slices.Sort(lenient)
	if want := []string{"sandbox.command.run", "sandbox.metrics.get", "sandbox.repl.run", "sandbox.start", "sandbox.stop"}; !slices.Equal(lenient, want) {
		t.Errorf("lenient methods %q, want %q", lenient, want)
	}
}

// TestParamsOfAnotherMethod: a field that another method takes is refused
// as unknown by a method that does not (one params struct per method).
func TestParamsOfAnotherMethod(t *testing.T) {
	s := &Server{}
	table := s.methodTable()
	for _, tc := range []struct{ method, params string }{
		{"sandbox.file.read", `{"sandbox":"a","path":"/x","recursive":true}`},
		{"sandbox.file.stat", `{"sandbox":"a","path":"/x","data":""}`},
		{"sandbox.file.move", `{"sandbox":"a","from":"/x","to":"/y","path":"/z"}`},
		{"sandbox.process.get", `{"sandbox":"a","id":"p","signal":"TERM"}`},
		{"sandbox.process.list", `{"sandbox":"a","id":"p"}`},
		{"sandbox.process.wait", `{"sandbox":"a","id":"p","offset":1}`},
		{"sandbox.get", `{"sandbox":"a","tail":1}`},
	} {
		c := &call{s: s, claims: auth.Claims{Namespace: "*"}, params: json.RawMessage(tc.params), method: tc.method}
		err := run(t, table[tc.method], c)
		if err == nil || kindOf(err) != "invalid_params" || !strings.Contains(err.Error(), "unknown field") {
			t.Errorf("%s %s: %v, want invalid_params for an unknown field", tc.method, tc.params, err)
		}
	}
}

// run runs m, turning the panic of a method that got past its params
// (and reached the missing manager) into an error.
func run(t *testing.T, m method, c *call) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	_, err = m.run(t.Context(), c)
	return err
}

// TestParamsExactNames: a strict method takes its fields by their exact
// names; encoding/json alone would take "Path" for "path".
func TestParamsExactNames(t *testing.T) {
	s := &Server{}
	table := s.methodTable()
	for _, tc := range []struct{ method, params, field string }{
		{"sandbox.file.read", `{"sandbox":"a","Path":"/x"}`, "Path"},
		{"sandbox.process.get", `{"sandbox":"a","ID":"p"}`, "ID"},
		{"sandbox.create", `{"NAME":"a"}`, "NAME"},
		{"sandbox.get", `{"Sandbox":"a","namespace":"n"}`, "Sandbox"},
	} {
		c := &call{s: s, claims: auth.Claims{Namespace: "*"}, params: json.RawMessage(tc.params), method: tc.method}
		err := run(t, table[tc.method], c)
		want := fmt.Sprintf("%s params: unknown field %q", tc.method, tc.field)
		if err == nil || kindOf(err) != "invalid_params" || err.Error() != want {
			t.Errorf("%s %s: %v, want invalid_params %q", tc.method, tc.params, err, want)
		}
	}
}

// TestLimitSeconds: a microsandbox method's timeout is any non-negative
// JSON number, held to the bound, as the Go SDK's nanoseconds need; what
// is not a non-negative number is refused with a message naming it.
func TestLimitSeconds(t *testing.T) {
	const bound = 24 * time.Hour
	ok := []struct {
		json string
		want time.Duration
	}{
		{`null`, 0},
		{`0`, 0},
		{`2.5`, 2500 * time.Millisecond},
		{`0.0004`, time.Millisecond},
		{`86400`, bound},
		{`86400.5`, bound},
		{`60000000000`, bound}, // the Go SDK's 60 s, in nanoseconds
		{`6e10`, bound},
		{`1e19`, bound},
		{`1e400`, bound}, // past a float64
		{`1e-400`, 0},
	}
	for _, c := range ok {
		var p struct {
			Timeout limitSeconds `json:"timeout"`
		}
		if err := json.Unmarshal([]byte(`{"timeout":`+c.json+`}`), &p); err != nil {
			t.Errorf("%s: %v", c.json, err)
			continue
		}
		d, err := p.Timeout.duration("timeout", bound)
		if err != nil || d != c.want {
			t.Errorf("%s: %v %v, want %v", c.json, d, err, c.want)
		}
	}
	bad := []string{`-1`, `-0.001`, `-1e400`, `"5"`, `true`, `[]`, `{}`}
	for _, b := range bad {
		var p struct {
			Timeout limitSeconds `json:"timeout"`
		}
		err := json.Unmarshal([]byte(`{"timeout":`+b+`}`), &p)
		if err == nil {
			_, err = p.Timeout.duration("timeout", bound)
		}
		if err == nil || !strings.Contains(err.Error(), "timeout") {
			t.Errorf("%s: %v, want an error naming the timeout", b, err)
		}
	}
}

// TestStdinParam: a stdin past wire.MaxStdin is too_large, from the
// methods that take one; one whose JSON is sure to be past it is refused
// as it is met (before the keys are checked: the unknown field here would
// be invalid_params), one with escapes when unquoted.
func TestStdinParam(t *testing.T) {
	s := &Server{}
	table := s.methodTable()
	over := strings.Repeat("s", wire.MaxStdin+1)
	for _, tc := range []struct{ method, params string }{
		{"sandbox.exec", `{"sandbox":"a","argv":["true"],"stdin":"` + over + `","Argv":1}`},
		{"sandbox.shell", `{"sandbox":"a","script":"true","stdin":"` + over + `","Script":1}`},
		{"sandbox.process.start", `{"sandbox":"a","id":"p","argv":["cat"],"stdin":"` + over + `","ID":1}`},
	} {
		c := &call{s: s, claims: auth.Claims{Namespace: "*"}, params: json.RawMessage(tc.params), method: tc.method}
		if err := run(t, table[tc.method], c); kindOf(err) != "too_large" {
			t.Errorf("%s: %v (kind %s), want too_large", tc.method, err, kindOf(err))
		}
	}
	for _, tc := range []struct {
		what    string
		json    string
		n       int  // its length, unquoted
		refused bool // by check, after unquoting
	}{
		{"at the limit", `"` + strings.Repeat("s", wire.MaxStdin) + `"`, wire.MaxStdin, false},
		{"escapes, twice the limit in JSON", `"` + strings.Repeat(`\n`, wire.MaxStdin) + `"`, wire.MaxStdin, false},
		{"escapes, over the limit unquoted", `"` + strings.Repeat(`\u00e9`, wire.MaxStdin/2+1) + `"`, wire.MaxStdin + 2, true},
		{"null", `null`, 0, false},
	} {
		var p stdinParam
		if err := json.Unmarshal([]byte(tc.json), &p); err != nil || len(p) != tc.n || (p.check() != nil) != tc.refused {
			t.Errorf("%s: %d bytes, %v, check %v; want %d bytes, refused %v", tc.what, len(p), err, p.check(), tc.n, tc.refused)
		}
	}
}
