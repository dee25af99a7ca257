// The Shell group: scripts run by the image's shell, given with -c, on
// stdin, and writing through redirects.

package conformance

import (
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/wire"
)

func (h *Harness) agentShell(t *testing.T) {
	s := h.newAgentSuite(t, backend.Config{})
	out := s.tmp + "/shell-out"
	script := `set -e
x=hello
echo "$x world" | tr a-z A-Z
printf 'a\nb\nc\n' | sort -r | head -n 2 > ` + out + `
cat ` + out + `
echo to-stderr >&2
cat <<EOF
heredoc $x
EOF
if [ -f ` + out + ` ]; then echo exists; fi
(cd /tmp && pwd)
echo $((6 * 7))
false || echo recovered
for w in one two; do printf '%s;' "$w"; done; echo
yes | head -n 2
exit 3
`
	want := "HELLO WORLD\nc\nb\nheredoc hello\nexists\n/tmp\n42\nrecovered\none;two;\ny\ny\n"
	t.Run("sh -c", func(t *testing.T) {
		r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", script}})
		if r.Code != 3 || string(r.Stdout) != want || string(r.Stderr) != "to-stderr\n" {
			t.Errorf("%v\nwant code 3, stdout %q, stderr %q", r, want, "to-stderr\n")
		}
	})
	t.Run("script on stdin", func(t *testing.T) {
		r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"/bin/sh"}, Stdin: []byte(script)})
		if r.Code != 3 || string(r.Stdout) != want || string(r.Stderr) != "to-stderr\n" {
			t.Errorf("%v\nwant code 3, stdout %q", r, want)
		}
	})
	t.Run("redirects", func(t *testing.T) {
		r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo a > f1 && echo b >> f1 && cat < f1 2>&1 | wc -l && ls nope 2>/dev/null || echo none"}, Cwd: s.tmp})
		if r.Code != 0 || strings.Fields(string(r.Stdout))[0] != "2" || !strings.HasSuffix(string(r.Stdout), "none\n") {
			t.Errorf("%v", r)
		}
	})
	t.Run("StillHealthy", s.healthy)
}
