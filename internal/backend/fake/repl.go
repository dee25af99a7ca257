package fake

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/wire"
)

// maxCode bounds the code of one REPL run, as the real agent's REPL does.
const maxCode = 16 << 20

// repls is an agent's interpreters: per language, the variables its runs
// have set. They live as long as the agent, as real interpreters do.
type repls struct {
	mu   sync.Mutex
	vars map[string]map[string]string // language → name → value's repr
}

func newRepls() *repls { return &repls{vars: map[string]map[string]string{}} }

// language normalizes a language name as the real agent does.
func language(name string) (string, error) {
	switch strings.ToLower(name) {
	case "python":
		return "python", nil
	case "node", "nodejs", "javascript":
		return "node", nil
	}
	return "", errorf(wire.ErrInvalid, "unknown language %q (want python or node)", name)
}

var (
	assignRe = regexp.MustCompile(`^(?:(?:let|var|const)\s+)?([A-Za-z_]\w*)\s*=\s*(.+)$`)
	callRe   = regexp.MustCompile(`^(print|console\.log|console\.error|sleep|time\.sleep)\((.*?)(,\s*file=sys\.stderr)?\)$`)
	nameRe   = regexp.MustCompile(`^[A-Za-z_]\w*$`)
)

// run runs code, a line at a time, in the fake's tiny language (see
// agent.go), until its end, kill (its timeout: it is interrupted and the
// state kept) or gone (the agent or the client went: no answer).
func (rs *repls) run(lang, code string, kill, gone <-chan struct{}) (res wire.ReplResult, how outcome) {
	start := time.Now()
	res = wire.ReplResult{Status: wire.ReplSuccess, Output: []wire.OutputLine{}}
	defer func() { res.DurationMs = float64(time.Since(start).Microseconds()) / 1000 }()
	fail := func(msg string) (wire.ReplResult, outcome) {
		res.Status, res.Error = wire.ReplError, msg
		res.Output = append(res.Output, wire.OutputLine{Stream: wire.Stderr, Text: msg})
		return res, exited
	}
	lines := strings.Split(code, "\n")
	for i, line := range lines {
		line = strings.TrimSuffix(strings.TrimSpace(line), ";")
		last := i == len(lines)-1
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "//") || strings.HasPrefix(line, "import "):
		case strings.HasPrefix(line, "raise ") || strings.HasPrefix(line, "throw "):
			return fail(strings.TrimSpace(line[6:]))
		case callRe.MatchString(line):
			m := callRe.FindStringSubmatch(line)
			v, err := rs.eval(lang, m[2])
			if err != nil {
				return fail(err.Error())
			}
			switch {
			case m[1] == "console.error" || m[3] != "":
				res.Output = append(res.Output, wire.OutputLine{Stream: wire.Stderr, Text: str(v)})
				continue
			case m[1] == "print" || m[1] == "console.log":
				res.Output = append(res.Output, wire.OutputLine{Stream: wire.Stdout, Text: str(v)})
				continue
			}
			secs, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return fail("TypeError: sleep wants a number")
			}
			t := time.NewTimer(time.Duration(secs * float64(time.Second)))
			select {
			case <-t.C:
			case <-kill:
				t.Stop()
				return res, killed
			case <-gone:
				t.Stop()
				return res, lost
			}
		case assignRe.MatchString(line) && !strings.HasPrefix(assignRe.FindStringSubmatch(line)[2], "="):
			m := assignRe.FindStringSubmatch(line)
			v, err := rs.eval(lang, m[2])
			if err != nil {
				return fail(err.Error())
			}
			rs.mu.Lock()
			if rs.vars[lang] == nil {
				rs.vars[lang] = map[string]string{}
			}
			rs.vars[lang][m[1]] = v
			rs.mu.Unlock()
		default:
			v, err := rs.eval(lang, line)
			if err != nil {
				return fail(err.Error())
			}
			if last {
				res.Result = &v
			}
		}
	}
	return res, exited
}

// eval evaluates an expression: an integer, a quoted string (no escapes)
// or a variable. It returns the value's repr.
func (rs *repls) eval(lang, e string) (string, error) {
	e = strings.TrimSpace(e)
	if _, err := strconv.ParseInt(e, 10, 64); err == nil {
		return e, nil
	}
	if _, err := strconv.ParseFloat(e, 64); err == nil {
		return e, nil
	}
	if len(e) >= 2 && (e[0] == '\'' || e[0] == '"') && e[len(e)-1] == e[0] && !strings.ContainsRune(e[1:len(e)-1], rune(e[0])) {
		return "'" + e[1:len(e)-1] + "'", nil
	}
	if nameRe.MatchString(e) {
		rs.mu.Lock()
		v, ok := rs.vars[lang][e]
		rs.mu.Unlock()
		if !ok {
			if lang == "node" {
				return "", fmt.Errorf("ReferenceError: %s is not defined", e)
			}
			return "", fmt.Errorf("NameError: name '%s' is not defined", e)
		}
		return v, nil
	}
	return "", fmt.Errorf("SyntaxError: the fake REPL does not understand %.40q", e)
}

// str is what print shows of a value: a string without its quotes.
func str(repr string) string {
	if strings.HasPrefix(repr, "'") {
		return repr[1 : len(repr)-1]
	}
	return repr
}
