package rpc_test

import (
	"fmt"
	"strings"
	"testing"
)

// TestReplPrintsExpressions: sandbox.repl.run's output holds what the
// interactive interpreter prints, bare expression values among it, in
// order with the run's prints; microsandbox's SDKs read only the output
// (their execution.output()), never result, which stays as it was.
func TestReplPrintsExpressions(t *testing.T) {
	e := newEnv(t, false, nil)
	e.must("sandbox.start", map[string]any{"sandbox": "repl"}, nil)
	type line struct{ Stream, Text string }
	for _, tc := range []struct {
		lang, code string
		status     string
		output     []line // a last stderr line: a traceback that holds this text
		result     string // "" = none
	}{
		{"python", "6*7", "success", []line{{"stdout", "42"}}, "42"},
		{"python", "print('before')\n6*7\nprint('after')", "success",
			[]line{{"stdout", "before"}, {"stdout", "42"}, {"stdout", "after"}}, ""},
		{"python", "x = 'kept'\nNone\nx", "success", []line{{"stdout", "'kept'"}}, "'kept'"},
		{"python", "for i in range(2):\n    i * 10\n    print('p', i)\n{\n  'k': [1,\n        2],\n}", "success",
			[]line{{"stdout", "0"}, {"stdout", "p 0"}, {"stdout", "10"}, {"stdout", "p 1"}, {"stdout", "{'k': [1, 2]}"}}, "{'k': [1, 2]}"},
		{"python", "print('before')\n6*7\n1/0\nprint('never')", "error",
			[]line{{"stdout", "before"}, {"stdout", "42"}, {"stderr", "Traceback (most recent call last):"}}, ""},
		{"nodejs", "6*7", "success", []line{{"stdout", "42"}}, "42"},
		{"javascript", "console.log('before');\nconst o = {\n  a: [1, 2],\n};\no", "success",
			[]line{{"stdout", "before"}, {"stdout", "{ a: [ 1, 2 ] }"}}, "{ a: [ 1, 2 ] }"},
		{"node", "console.log('before'); let u = undefined; u", "success", []line{{"stdout", "before"}}, ""},
		{"node", "console.log('before');\nnull.x", "error",
			[]line{{"stdout", "before"}, {"stderr", "TypeError: Cannot read properties of null (reading 'x')"}}, ""},
	} {
		t.Run(tc.lang+"/"+tc.code, func(t *testing.T) {
			var res struct {
				Status string  `json:"status"`
				Output []line  `json:"output"`
				Result *string `json:"result"`
			}
			e.must("sandbox.repl.run", map[string]any{"sandbox": "repl", "language": tc.lang, "code": tc.code}, &res)
			got, want := res.Output, tc.output
			if n := len(want); n > 0 && want[n-1].Stream == "stderr" {
				// A traceback: it follows the output before it and
				// holds this text.
				trace := want[n-1].Text
				want = want[:n-1]
				if len(got) < n || got[n-1].Stream != "stderr" || !strings.Contains(fmt.Sprint(got[n-1:]), trace) {
					t.Errorf("output %q: no traceback of %q after %q", got, trace, want)
				}
				got = got[:min(n-1, len(got))]
			}
			result := ""
			if res.Result != nil {
				result = *res.Result
			}
			if res.Status != tc.status || fmt.Sprint(got) != fmt.Sprint(want) || result != tc.result {
				t.Fatalf("status %q output %q result %q;\nwant status %q output %q result %q",
					res.Status, res.Output, result, tc.status, tc.output, tc.result)
			}
			if strings.Contains(fmt.Sprint(res.Output), "never") {
				t.Fatalf("output %q: the run went on after the exception", res.Output)
			}
		})
	}
}
