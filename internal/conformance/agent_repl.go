// The Repl group: Python and Node sessions keep their state between calls,
// report output, results and errors, keep state across a timeout and run in
// the sandbox; language aliases, unknown languages and oversized code.

package conformance

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/agent"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/wire"
)

func (h *Harness) agentRepl(t *testing.T) {
	s := h.newAgentSuite(t, backend.Config{Hostname: "agentconf-" + randHex(3)})
	run := func(t testing.TB, lang, code string, timeout time.Duration) wire.ReplResult {
		t.Helper()
		res, err := s.c.Repl(ctxFor(t, 60*time.Second), wire.ReplRequest{Language: lang, Code: code, TimeoutMs: timeout.Milliseconds()})
		if err != nil {
			t.Fatalf("repl %s %q: %s", lang, code, errInfo(err))
		}
		return res
	}
	result := func(r wire.ReplResult) string {
		if r.Result == nil {
			return "<none>"
		}
		return *r.Result
	}
	wantOK := func(t testing.TB, r wire.ReplResult, want string) {
		t.Helper()
		if r.Status != wire.ReplSuccess || result(r) != want {
			t.Errorf("status %q result %q error %q output %q; want success with %q", r.Status, result(r), r.Error, r.Output, want)
		}
	}
	hostname := strings.TrimSpace(s.sh(t, "hostname"))
	marker := s.tmp + "/repl-marker"
	s.write(t, marker, []byte("from-agent"), 0o644)

	for _, lc := range []struct {
		lang, aliases                                string
		set, get, getWant, outCode, errCode, errWant string
		loop, host, file                             string
	}{
		{lang: "python", aliases: "python3,PYTHON, python ",
			set: "x = 40", get: "x + 2", getWant: "42",
			outCode: "import sys\nprint('out1')\nprint('err1', file=sys.stderr)\n'last'",
			errCode: "1/0", errWant: "ZeroDivisionError: division by zero",
			loop: "while True: pass",
			host: "import socket; socket.gethostname()", file: "open('" + marker + "').read()",
		},
		{lang: "node", aliases: "nodejs,javascript,js,NODE",
			set: "var x = 40", get: "x + 2", getWant: "42",
			outCode: "console.log('out1'); console.error('err1'); 'last'",
			errCode: "throw new Error('boom')", errWant: "Error: boom",
			loop: "while (true) {}",
			host: "require('os').hostname()", file: "require('fs').readFileSync('" + marker + "', 'utf8')",
		},
	} {
		t.Run(lc.lang, func(t *testing.T) {
			t.Run("state persists", func(t *testing.T) {
				wantOK(t, run(t, lc.lang, lc.set, 30*time.Second), "<none>")
				wantOK(t, run(t, lc.lang, lc.get, 30*time.Second), lc.getWant)
			})
			t.Run("output lines and result", func(t *testing.T) {
				r := run(t, lc.lang, lc.outCode, 30*time.Second)
				// The last value is printed, as the interactive
				// interpreter prints it, after the run's other output.
				want := []wire.OutputLine{{Stream: wire.Stdout, Text: "out1"}, {Stream: wire.Stderr, Text: "err1"}, {Stream: wire.Stdout, Text: "'last'"}}
				if !slices.Equal(r.Output, want) {
					t.Errorf("output %q; want %q", r.Output, want)
				}
				wantOK(t, r, "'last'")
			})
			t.Run("error", func(t *testing.T) {
				r := run(t, lc.lang, lc.errCode, 30*time.Second)
				if r.Status != wire.ReplError || r.Error != lc.errWant {
					t.Errorf("status %q error %q; want error %q", r.Status, r.Error, lc.errWant)
				}
				wantOK(t, run(t, lc.lang, "x", 30*time.Second), "40")
			})
			t.Run("timeout keeps state", func(t *testing.T) {
				start := time.Now()
				r := run(t, lc.lang, lc.loop, 500*time.Millisecond)
				took := time.Since(start)
				if r.Status != wire.ReplTimeout || !strings.Contains(r.Error, "TimeoutError") {
					t.Errorf("status %q error %q; want timeout", r.Status, r.Error)
				}
				if took < 450*time.Millisecond || took > 15*time.Second {
					t.Errorf("a 500 ms timeout took %v", took)
				}
				wantOK(t, run(t, lc.lang, "x", 30*time.Second), "40")
			})
			t.Run("runs in the sandbox", func(t *testing.T) {
				wantOK(t, run(t, lc.lang, lc.host, 30*time.Second), "'"+hostname+"'")
				wantOK(t, run(t, lc.lang, lc.file, 30*time.Second), "'from-agent'")
			})
			for _, alias := range strings.Split(lc.aliases, ",") {
				t.Run("alias "+strconv.Quote(alias), func(t *testing.T) {
					wantOK(t, run(t, alias, "x", 30*time.Second), "40")
				})
			}
		})
	}
	for _, lang := range []string{"cobol", "", "python2", "ruby", "node\x00"} {
		t.Run("unknown language "+strconv.Quote(lang), func(t *testing.T) {
			_, err := s.c.Repl(ctxFor(t, 10*time.Second), wire.ReplRequest{Language: lang, Code: "1"})
			wantKind(t, err, wire.ErrInvalid, "repl in "+strconv.Quote(lang))
		})
	}
	t.Run("oversized code", func(t *testing.T) {
		// The engines refuse more than 16 MiB of code; that is the
		// client's fault, not an internal error.
		code := "#" + strings.Repeat("x", 16<<20)
		_, err := s.c.Repl(ctxFor(t, 60*time.Second), wire.ReplRequest{Language: "python", Code: code})
		if !agent.IsKind(err, wire.ErrTooLarge) && !agent.IsKind(err, wire.ErrInvalid) {
			t.Errorf("repl with 16 MiB+ of code: %s; want kind too_large (or invalid)", errInfo(err))
		}
		wantOK(t, run(t, "python", "x", 30*time.Second), "40")
	})
	t.Run("StillHealthy", s.healthy)
}
