//go:build linux

package repl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/testenv"
	"github.com/warren-sandbox/warren/internal/wire"
)

var langs = []string{Python, Node}

func requireLang(t testing.TB, lang string) {
	t.Helper()
	switch lang {
	case Python:
		testenv.RequireFile(t, DefaultPython)
	case Node:
		testenv.RequireFile(t, DefaultNode)
	}
}

func newTestManager(t testing.TB, opts Options) *Manager {
	t.Helper()
	m := NewManager(opts)
	t.Cleanup(func() { _ = m.Close() })
	return m
}

func mustRun(t testing.TB, m *Manager, lang, code string, timeout time.Duration) wire.ReplResult {
	t.Helper()
	res, err := m.Run(context.Background(), lang, code, timeout)
	if err != nil {
		t.Fatalf("Run(%s, %q): %v", lang, code, err)
	}
	return res
}

func lines(res wire.ReplResult, stream string) []string {
	out := []string{}
	for _, l := range res.Output {
		if l.Stream == stream {
			out = append(out, l.Text)
		}
	}
	return out
}

func joined(res wire.ReplResult, stream string) string {
	return strings.Join(lines(res, stream), "\n")
}

// hasInOrder reports whether got holds exactly the lines of the given
// sequences, each sequence in order. Frames and raw fd output arrive on
// different pipes, so only the order within each is exact.
func hasInOrder(got []string, seqs ...[]string) bool {
	total := 0
	for _, seq := range seqs {
		total += len(seq)
		i := 0
		for _, g := range got {
			if i < len(seq) && g == seq[i] {
				i++
			}
		}
		if i != len(seq) {
			return false
		}
	}
	return total == len(got)
}

func resultOf(res wire.ReplResult) string {
	if res.Result == nil {
		return "<none>"
	}
	return *res.Result
}

func wantSuccess(t testing.TB, res wire.ReplResult, want string) {
	t.Helper()
	if res.Status != wire.ReplSuccess || resultOf(res) != want {
		t.Fatalf("got status %q result %q error %q output %q; want success with result %q",
			res.Status, resultOf(res), res.Error, res.Output, want)
	}
}

func interpreterPid(t testing.TB, m *Manager, lang string) int {
	t.Helper()
	code := "import os; os.getpid()"
	if lang == Node {
		code = "process.pid"
	}
	res := mustRun(t, m, lang, code, 0)
	pid, err := strconv.Atoi(resultOf(res))
	if err != nil {
		t.Fatalf("pid result %q: %v", resultOf(res), err)
	}
	return pid
}

// gone reports whether pid no longer runs (a zombie awaiting its reaper
// counts as gone).
func gone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && len(b) > i+2 && b[i+2] == 'Z'
}

func waitGone(t testing.TB, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !gone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still running", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestNormalizeLanguage(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"python", Python, true},
		{"python3", Python, true},
		{" Python ", Python, true},
		{"node", Node, true},
		{"nodejs", Node, true},
		{"javascript", Node, true},
		{"js", Node, true},
		{"JS", Node, true},
		{"", "", false},
		{"ruby", "", false},
		{"python2", "", false},
		{"py", "", false},
	} {
		got, err := NormalizeLanguage(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("NormalizeLanguage(%q) = %q, %v; want %q, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
	m := NewManager(Options{})
	defer func() { _ = m.Close() }()
	if _, err := m.Run(context.Background(), "cobol", "1", 0); err == nil {
		t.Error("Run with an unknown language succeeded")
	}
}

func TestStatePersists(t *testing.T) {
	cases := map[string][]struct{ code, want string }{
		Python: {
			{"x = 40", "<none>"},
			{"import math\ndef f(a):\n    return a + 1", "<none>"},
			{"class C:\n    k = 1", "<none>"},
			{"f(x) + C.k", "42"},
			{"math.floor(2.5)", "2"},
			{"import __main__; __main__.x", "40"},
		},
		Node: {
			{"var a = 40", "<none>"},
			{"function g(v) { return v + 1 }", "<none>"},
			{"let b = 1; const k = 0", "<none>"},
			{"globalThis.c = 0", "0"},
			{"g(a) + b + c + k", "42"},
			{"const fs = require('fs'); typeof fs.readFileSync", "'function'"},
			{"typeof fs", "'object'"},
			{"globalThis.w = await Promise.resolve(7)", "7"},
			{"w * 6", "42"},
		},
	}
	for _, lang := range langs {
		t.Run(lang, func(t *testing.T) {
			requireLang(t, lang)
			m := newTestManager(t, Options{})
			for _, step := range cases[lang] {
				wantSuccess(t, mustRun(t, m, lang, step.code, 0), step.want)
			}
		})
	}
}

func TestLastExpressionResult(t *testing.T) {
	for _, tc := range []struct{ lang, code, want string }{
		{Python, "1+1", "2"},
		{Python, "x = 5", "<none>"},
		{Python, "print('a')", "<none>"},
		{Python, "None", "<none>"},
		{Python, "'s'", "'s'"},
		{Python, "[1, 'a']", "[1, 'a']"},
		{Python, "y = 2\ny * 3", "6"},
		{Python, "", "<none>"},
		{Python, "# only a comment", "<none>"},
		{Python, "for i in range(3):\n    i", "<none>"},
		{Node, "1+1", "2"},
		{Node, "'s'", "'s'"},
		{Node, "console.log('a')", "<none>"},
		{Node, "undefined", "<none>"},
		{Node, "({a: 1})", "{ a: 1 }"},
		{Node, "let z = 9", "<none>"},
		{Node, "Promise.resolve(7)", "7"},
		{Node, "await Promise.resolve(3)", "3"},
		{Node, "const v = await Promise.resolve(4);\nv * 2;", "8"},
		{Node, "await null", "null"},
		{Node, "", "<none>"},
	} {
		t.Run(tc.lang+"/"+tc.code, func(t *testing.T) {
			requireLang(t, tc.lang)
			m := newTestManager(t, Options{})
			wantSuccess(t, mustRun(t, m, tc.lang, tc.code, 5*time.Second), tc.want)
		})
	}
}

// TestExpressionsPrint: a run prints what the interactive interpreter
// prints for what is typed at its prompt. Python: the value of every
// expression statement outside a function that is not None, as
// sys.displayhook writes it (repr; also into _). Node: the run's
// completion value unless undefined, as the REPL inspects it. Both in
// order with the run's other output; the last value is also the result.
func TestExpressionsPrint(t *testing.T) {
	out := func(s ...string) []wire.OutputLine {
		ls := []wire.OutputLine{}
		for _, x := range s {
			ls = append(ls, wire.OutputLine{Stream: wire.Stdout, Text: x})
		}
		return ls
	}
	for _, tc := range []struct {
		lang, code string
		want       []wire.OutputLine
		result     string
	}{
		{Python, "6*7", out("42"), "42"},
		{Python, "print('a')\n6*7\nprint('b')", out("a", "42", "b"), "<none>"},
		{Python, "x = 5\nx\nx + 1", out("5", "6"), "6"},
		{Python, "None", out(), "<none>"},
		{Python, "print('a')", out("a"), "<none>"},
		{Python, "'s'", out("'s'"), "'s'"},
		{Python, "'two\\nlines'", out("'two\\nlines'"), "'two\\nlines'"},
		{Python, "[\n  1,\n  'a',\n]", out("[1, 'a']"), "[1, 'a']"},
		{Python, "for i in range(3):\n    i", out("0", "1", "2"), "<none>"},
		{Python, "if True:\n    'x'\n    print('y')", out("'x'", "y"), "<none>"},
		{Python, "def f():\n    5\n    return 6\nf()\nf() and None", out("6"), "<none>"},
		{Python, "7\n_ * 2", out("7", "14"), "14"},
		{Python, "import sys\nsys.displayhook = lambda v: print('hook', v)\n3\nNone", out("hook 3", "hook None"), "<none>"},
		{Node, "6*7", out("42"), "42"},
		{Node, "console.log('a'); 6*7", out("a", "42"), "42"},
		{Node, "console.log('a')", out("a"), "<none>"},
		{Node, "undefined", out(), "<none>"},
		{Node, "let z = 9", out(), "<none>"},
		{Node, "'s'", out("'s'"), "'s'"},
		{Node, "const o = {\n  a: [1, 2],\n};\no", out("{ a: [ 1, 2 ] }"), "{ a: [ 1, 2 ] }"},
		{Node, "console.log('before');\nawait new Promise((r) => setTimeout(r, 10));\nconsole.log('after');\n40 + 2",
			out("before", "after", "42"), "42"},
	} {
		t.Run(tc.lang+"/"+tc.code, func(t *testing.T) {
			requireLang(t, tc.lang)
			m := newTestManager(t, Options{})
			res := mustRun(t, m, tc.lang, tc.code, 5*time.Second)
			wantSuccess(t, res, tc.result)
			if fmt.Sprint(res.Output) != fmt.Sprint(tc.want) {
				t.Fatalf("output\n%q\nwant\n%q", res.Output, tc.want)
			}
		})
	}
}

// TestExpressionsPrintUntilError: the values printed before an exception
// stay in the output, before its traceback; nothing after it runs.
func TestExpressionsPrintUntilError(t *testing.T) {
	for _, tc := range []struct{ lang, code, wantErr string }{
		{Python, "print('a')\n40 + 2\n1/0\n'never'", "ZeroDivisionError: division by zero"},
		{Python, "print('a')\n40 + 2\n[][1]", "IndexError: list index out of range"},
		{Node, "console.log('a');\nnull.x;\n'never'", "TypeError: Cannot read properties of null (reading 'x')"},
	} {
		t.Run(tc.lang+"/"+tc.code, func(t *testing.T) {
			requireLang(t, tc.lang)
			m := newTestManager(t, Options{})
			res := mustRun(t, m, tc.lang, tc.code, 5*time.Second)
			if res.Status != wire.ReplError || res.Error != tc.wantErr || res.Result != nil {
				t.Fatalf("status %q error %q result %q; want error %q", res.Status, res.Error, resultOf(res), tc.wantErr)
			}
			want := []string{"a"}
			if tc.lang == Python {
				want = append(want, "42")
			}
			if got := lines(res, wire.Stdout); !slices.Equal(got, want) {
				t.Fatalf("stdout %q, want %q", got, want)
			}
			if stderr := joined(res, wire.Stderr); !strings.Contains(stderr, tc.wantErr) || strings.Contains(stderr, "never") {
				t.Fatalf("stderr %q, want the traceback of %q", stderr, tc.wantErr)
			}
			// The traceback comes after the printed values.
			if i := slices.IndexFunc(res.Output, func(l wire.OutputLine) bool { return l.Stream == wire.Stderr }); i != len(want) {
				t.Fatalf("output %q: the traceback does not follow the values", res.Output)
			}
		})
	}
}

func TestOutputOrder(t *testing.T) {
	want := []wire.OutputLine{}
	for i := range 5 {
		want = append(want,
			wire.OutputLine{Stream: wire.Stdout, Text: fmt.Sprintf("out %d", i)},
			wire.OutputLine{Stream: wire.Stderr, Text: fmt.Sprintf("err %d", i)})
	}
	want = append(want,
		wire.OutputLine{Stream: wire.Stdout, Text: "ab"},
		wire.OutputLine{Stream: wire.Stderr, Text: "tail"})
	for _, tc := range []struct{ lang, code string }{
		{Python, "import sys\nfor i in range(5):\n    print('out', i)\n    print('err', i, file=sys.stderr)\n" +
			"print('a', end='')\nn = sys.stdout.write('b\\n')\nn = sys.stderr.write('tail')"},
		{Node, "for (let i = 0; i < 5; i++) { console.log('out', i); console.error('err', i) }\n" +
			"process.stdout.write('a'); process.stdout.write('b\\n'); void process.stderr.write('tail')"},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			requireLang(t, tc.lang)
			m := newTestManager(t, Options{})
			res := mustRun(t, m, tc.lang, tc.code, 0)
			if res.Status != wire.ReplSuccess || fmt.Sprint(res.Output) != fmt.Sprint(want) {
				t.Fatalf("status %q output\n%q\nwant\n%q", res.Status, res.Output, want)
			}
			// The next run sees only its own output.
			res = mustRun(t, m, tc.lang, "1", 0)
			if fmt.Sprint(res.Output) != fmt.Sprint([]wire.OutputLine{{Stream: wire.Stdout, Text: "1"}}) {
				t.Fatalf("next run output %q, want its value only", res.Output)
			}
		})
	}
}

func TestException(t *testing.T) {
	for _, tc := range []struct{ lang, setup, code, wantErr, wantTrace, after string }{
		{Python, "x = 1", "def f():\n    raise ValueError('bad')\nprint('before')\nf()",
			"ValueError: bad", `line 2, in f`, "x"},
		{Python, "x = 1", "1/0", "ZeroDivisionError: division by zero", "Traceback (most recent call last):", "x"},
		{Python, "x = 1", "import sys; sys.exit(4)", "SystemExit: 4", "SystemExit: 4", "x"},
		{Node, "var x = 1", "function f() { throw new TypeError('bad') }\nconsole.log('before')\nf()",
			"TypeError: bad", "at f (cell-", "x"},
		{Node, "var x = 1", "throw 42", "Uncaught 42", "Uncaught 42", "x"},
		{Node, "var x = 1", "await Promise.reject(new RangeError('late'))", "RangeError: late", "RangeError: late", "x"},
	} {
		t.Run(tc.lang+"/"+tc.wantErr, func(t *testing.T) {
			requireLang(t, tc.lang)
			m := newTestManager(t, Options{})
			mustRun(t, m, tc.lang, tc.setup, 0)
			res := mustRun(t, m, tc.lang, tc.code, 5*time.Second)
			if res.Status != wire.ReplError || res.Error != tc.wantErr {
				t.Fatalf("status %q error %q; want error %q", res.Status, res.Error, tc.wantErr)
			}
			if stderr := joined(res, wire.Stderr); !strings.Contains(stderr, tc.wantTrace) {
				t.Fatalf("stderr %q lacks %q", stderr, tc.wantTrace)
			}
			if strings.Contains(tc.code, "before") && joined(res, wire.Stdout) != "before" {
				t.Fatalf("stdout %q, want before", joined(res, wire.Stdout))
			}
			if strings.Contains(joined(res, wire.Stderr), "driver") {
				t.Fatalf("traceback shows driver frames: %q", joined(res, wire.Stderr))
			}
			wantSuccess(t, mustRun(t, m, tc.lang, tc.after, 0), "1")
		})
	}
}

func TestSyntaxError(t *testing.T) {
	for _, tc := range []struct{ lang, code, wantErr string }{
		{Python, "print('never')\n1 +", "SyntaxError: invalid syntax"},
		{Python, "def f(:\n  pass", "SyntaxError:"},
		{Node, "console.log('never')\n1 +", "SyntaxError: Unexpected end of input"},
		{Node, "let = = 1", "SyntaxError:"},
	} {
		t.Run(tc.lang+"/"+tc.code, func(t *testing.T) {
			requireLang(t, tc.lang)
			m := newTestManager(t, Options{})
			res := mustRun(t, m, tc.lang, tc.code, 0)
			if res.Status != wire.ReplError || !strings.HasPrefix(res.Error, tc.wantErr) {
				t.Fatalf("status %q error %q; want error %q", res.Status, res.Error, tc.wantErr)
			}
			if !strings.Contains(joined(res, wire.Stderr), "SyntaxError") || len(lines(res, wire.Stdout)) != 0 {
				t.Fatalf("output %q: want a SyntaxError on stderr and nothing on stdout", res.Output)
			}
			wantSuccess(t, mustRun(t, m, tc.lang, "1+1", 0), "2")
		})
	}
}

func TestTimeoutKeepsState(t *testing.T) {
	for _, tc := range []struct{ lang, setup, code string }{
		{Python, "x = 41", "print('spinning')\nwhile True: pass"},
		{Python, "x = 41", "import time\ntime.sleep(100)"},
		{Node, "var x = 41", "console.log('spinning')\nwhile (true) {}"},
		{Node, "var x = 41", "await new Promise(() => {})"},
	} {
		t.Run(tc.lang+"/"+tc.code, func(t *testing.T) {
			requireLang(t, tc.lang)
			m := newTestManager(t, Options{InterruptGrace: 5 * time.Second})
			pid := interpreterPid(t, m, tc.lang)
			mustRun(t, m, tc.lang, tc.setup, 0)
			const timeout = 300 * time.Millisecond
			start := time.Now()
			res := mustRun(t, m, tc.lang, tc.code, timeout)
			took := time.Since(start)
			want := "TimeoutError: execution exceeded 300ms"
			if res.Status != wire.ReplTimeout || res.Error != want {
				t.Fatalf("status %q error %q output %q; want timeout %q", res.Status, res.Error, res.Output, want)
			}
			if !strings.Contains(joined(res, wire.Stderr), want) {
				t.Fatalf("stderr %q lacks %q", joined(res, wire.Stderr), want)
			}
			if strings.Contains(tc.code, "spinning") && joined(res, wire.Stdout) != "spinning" {
				t.Fatalf("stdout %q, want spinning", joined(res, wire.Stdout))
			}
			if took < timeout || took > timeout+3*time.Second {
				t.Fatalf("run took %v for a timeout of %v", took, timeout)
			}
			wantSuccess(t, mustRun(t, m, tc.lang, "x + 1", 0), "42")
			if got := interpreterPid(t, m, tc.lang); got != pid {
				t.Fatalf("interpreter changed from %d to %d", pid, got)
			}
		})
	}
}

func TestIgnoredInterruptRestarts(t *testing.T) {
	for _, tc := range []struct{ lang, setup, code, after string }{
		// (A KeyboardInterrupt raised in a tight `while True: pass` may escape
		// an enclosing try in CPython 3.11, so the loop sleeps.)
		{Python, "x = 1", "import time\nwhile True:\n    try:\n        time.sleep(0.01)\n    except KeyboardInterrupt:\n        print('ignored')", "x"},
		{Node, "var x = 1", "await new Promise(r => setTimeout(r, 10));\nwhile (true) {}", "x"},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			requireLang(t, tc.lang)
			m := newTestManager(t, Options{InterruptGrace: 300 * time.Millisecond})
			mustRun(t, m, tc.lang, tc.setup, 0)
			pid := interpreterPid(t, m, tc.lang)
			res := mustRun(t, m, tc.lang, tc.code, 200*time.Millisecond)
			if res.Status != wire.ReplRestarted || !strings.HasPrefix(res.Error, "TimeoutError: execution exceeded 200ms") {
				t.Fatalf("status %q error %q; want restarted after a timeout", res.Status, res.Error)
			}
			if !strings.Contains(joined(res, wire.Stderr), "state was lost") {
				t.Fatalf("stderr %q does not say state was lost", joined(res, wire.Stderr))
			}
			if tc.lang == Python && !strings.Contains(joined(res, wire.Stdout), "ignored") {
				t.Fatalf("stdout %q lacks the output before the kill", joined(res, wire.Stdout))
			}
			waitGone(t, pid)
			res = mustRun(t, m, tc.lang, tc.after, 0)
			if res.Status != wire.ReplError {
				t.Fatalf("after restart %q gave %q %q; want an error (state lost)", tc.after, res.Status, resultOf(res))
			}
			if got := interpreterPid(t, m, tc.lang); got == pid {
				t.Fatal("interpreter was not replaced")
			}
		})
	}
}

func TestInterpreterExit(t *testing.T) {
	for _, tc := range []struct{ lang, code, wantErr, wantOut string }{
		{Python, "import os\nprint('bye')\nos._exit(3)", "exit code 3", "bye"},
		{Python, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "killed by signal SIGKILL", ""},
		{Node, "console.log('bye'); process.exit(3)", "exit code 3", "bye"},
		{Node, "process.kill(process.pid, 'SIGKILL')", "killed by signal SIGKILL", ""},
	} {
		t.Run(tc.lang+"/"+tc.wantErr, func(t *testing.T) {
			requireLang(t, tc.lang)
			m := newTestManager(t, Options{})
			pid := interpreterPid(t, m, tc.lang)
			res := mustRun(t, m, tc.lang, tc.code, 0)
			if res.Status != wire.ReplRestarted || !strings.Contains(res.Error, tc.wantErr) || !strings.Contains(res.Error, "state was lost") {
				t.Fatalf("status %q error %q; want restarted with %q", res.Status, res.Error, tc.wantErr)
			}
			if got := joined(res, wire.Stdout); got != tc.wantOut {
				t.Fatalf("stdout %q, want %q", got, tc.wantOut)
			}
			waitGone(t, pid)
			wantSuccess(t, mustRun(t, m, tc.lang, "1+1", 0), "2")
			if got := interpreterPid(t, m, tc.lang); got == pid {
				t.Fatal("interpreter was not replaced")
			}
		})
	}
}

func TestSubprocessOutput(t *testing.T) {
	for _, tc := range []struct {
		lang, code          string
		frames, raw, stderr []string
	}{
		{Python, "import os, subprocess\nprint('a')\nr = os.system('echo b; echo c >&2')\nr = subprocess.run(['sh', '-c', 'echo d'])\nr = os.system('printf tail')",
			[]string{"a"}, []string{"b", "d", "tail"}, []string{"c"}},
		{Python, "import os\nn = os.write(1, b'raw1\\n'); n = os.write(2, b'raw2\\n')", nil, []string{"raw1"}, []string{"raw2"}},
		{Node, "console.log('a')\nrequire('child_process').execSync('echo b; echo c >&2', {stdio: 'inherit'})\nvoid require('fs').writeSync(1, 'raw\\n')",
			[]string{"a"}, []string{"b", "raw"}, []string{"c"}},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			requireLang(t, tc.lang)
			m := newTestManager(t, Options{})
			res := mustRun(t, m, tc.lang, tc.code, 10*time.Second)
			if res.Status != wire.ReplSuccess {
				t.Fatalf("status %q error %q", res.Status, res.Error)
			}
			if !hasInOrder(lines(res, wire.Stdout), tc.frames, tc.raw) || fmt.Sprint(lines(res, wire.Stderr)) != fmt.Sprint(tc.stderr) {
				t.Fatalf("output %q; want stdout %q and %q, stderr %q", res.Output, tc.frames, tc.raw, tc.stderr)
			}
		})
	}
}

// TestSubprocessOutputStaysInRun floods fd 1 from a subprocess right up to
// the end of a run: all of it belongs to that run, none to the next.
func TestSubprocessOutputStaysInRun(t *testing.T) {
	for _, tc := range []struct{ lang, code, next string }{
		{Python, "import os\nr = os.system('seq 1 20000')", "print('next')"},
		{Node, "void require('child_process').execSync('seq 1 20000', {stdio: 'inherit'})", "console.log('next')"},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			requireLang(t, tc.lang)
			m := newTestManager(t, Options{})
			for range 3 {
				res := mustRun(t, m, tc.lang, tc.code, 10*time.Second)
				out := lines(res, wire.Stdout)
				if len(out) != 20000 || out[0] != "1" || out[19999] != "20000" {
					t.Fatalf("got %d lines (status %q)", len(out), res.Status)
				}
				res = mustRun(t, m, tc.lang, tc.next, 0)
				if fmt.Sprint(res.Output) != fmt.Sprint([]wire.OutputLine{{Stream: wire.Stdout, Text: "next"}}) {
					t.Fatalf("next run output %q", res.Output)
				}
			}
		})
	}
}

// TestNodeSubprocessBigWrite checks fd 1 stays blocking for children: a
// child writing 1 MB at once must not fail with EAGAIN.
func TestNodeSubprocessBigWrite(t *testing.T) {
	requireLang(t, Node)
	m := newTestManager(t, Options{OutputLimit: 2 << 20})
	res := mustRun(t, m, Node, `void require('child_process').execSync("head -c 1000000 /dev/zero | tr '\\0' a", {stdio: 'inherit'})`, 10*time.Second)
	out := lines(res, wire.Stdout)
	if res.Status != wire.ReplSuccess || len(out) != 1 || len(out[0]) != 1000000 {
		t.Fatalf("status %q error %q, %d lines", res.Status, res.Error, len(out))
	}
}

func TestInvalidUTF8(t *testing.T) {
	const bad = "\uFFFD\uFFFD"
	for _, tc := range []struct {
		lang, code  string
		frames, raw []string
	}{
		{Python, "import sys, os\nn = sys.stdout.buffer.write(b'\\xff\\xfe\\n')\nprint('ok')\n" +
			"n = sys.stdout.buffer.write(b'\\xe2\\x82'); n = sys.stdout.buffer.write(b'\\xac\\n')\nn = os.write(1, b'\\xff\\xfe\\n')\nprint('\\udcff\\udcfe')",
			[]string{bad, "ok", "€", bad}, []string{bad}},
		{Node, "process.stdout.write(Buffer.from([0xff, 0xfe, 0x0a])); console.log('ok')\n" +
			"process.stdout.write(Buffer.from([0xe2, 0x82])); process.stdout.write(Buffer.from([0xac, 0x0a]))\n" +
			"void require('fs').writeSync(1, Buffer.from([0xff, 0xfe, 0x0a]))",
			[]string{bad, "ok", "€"}, []string{bad}},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			requireLang(t, tc.lang)
			m := newTestManager(t, Options{})
			res := mustRun(t, m, tc.lang, tc.code, 0)
			if got := lines(res, wire.Stdout); res.Status != wire.ReplSuccess || !hasInOrder(got, tc.frames, tc.raw) {
				t.Fatalf("status %q error %q stdout %q; want %q and %q", res.Status, res.Error, got, tc.frames, tc.raw)
			}
			wantSuccess(t, mustRun(t, m, tc.lang, "1+1", 0), "2")
		})
	}
}

func keptBytes(res wire.ReplResult) int {
	n := 0
	for _, l := range res.Output {
		n += len(l.Text) + 1
	}
	return n
}

func TestOutputLimit(t *testing.T) {
	const limit = 64 << 10
	for _, tc := range []struct{ lang, name, code string }{
		{Python, "lines", "for i in range(200000):\n    print('x' * 99)"},
		{Python, "100MB", "import sys\nchunk = 'y' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.write(chunk)"},
		{Python, "raw100MB", "import os\nos.system(\"head -c 100000000 /dev/zero | tr '\\\\0' z\")"},
		{Python, "newlines", "import sys\nsys.stdout.write('\\n' * 10000000)"},
		{Python, "both", "import sys\nfor i in range(100000):\n    print('o' * 50)\n    print('e' * 50, file=sys.stderr)"},
		{Node, "lines", "for (let i = 0; i < 200000; i++) console.log('x'.repeat(99))"},
		{Node, "100MB", "const chunk = 'y'.repeat(1 << 20)\nfor (let i = 0; i < 100; i++) process.stdout.write(chunk)"},
		{Node, "raw100MB", "require('child_process').execSync(\"head -c 100000000 /dev/zero | tr '\\\\0' z\", {stdio: 'inherit'})"},
	} {
		t.Run(tc.lang+"/"+tc.name, func(t *testing.T) {
			requireLang(t, tc.lang)
			m := newTestManager(t, Options{OutputLimit: limit})
			mustRun(t, m, tc.lang, "1", 0)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			res := mustRun(t, m, tc.lang, tc.code, 60*time.Second)
			runtime.ReadMemStats(&after)
			if res.Status != wire.ReplSuccess || !res.Truncated {
				t.Fatalf("status %q error %q truncated %v", res.Status, res.Error, res.Truncated)
			}
			if n := keptBytes(res); n > limit+1 || n < limit/2 {
				t.Fatalf("kept %d bytes with a limit of %d", n, limit)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 32<<20 {
				t.Fatalf("the engine allocated %d MiB for one run", alloc>>20)
			}
			res = mustRun(t, m, tc.lang, "1+1", 0)
			if res.Truncated || fmt.Sprint(res.Output) != fmt.Sprint([]wire.OutputLine{{Stream: wire.Stdout, Text: "2"}}) {
				t.Fatalf("next run: truncated %v output %q", res.Truncated, res.Output)
			}
		})
	}
}

func TestResultTruncated(t *testing.T) {
	requireLang(t, Python)
	m := newTestManager(t, Options{})
	res := mustRun(t, m, Python, "'a' * (3 << 20)", 0)
	if res.Status != wire.ReplSuccess || !res.Truncated || res.Result == nil || len(*res.Result) > 1<<20 {
		t.Fatalf("status %q truncated %v result len %d", res.Status, res.Truncated, len(resultOf(res)))
	}
}

func TestLargeCode(t *testing.T) {
	for _, tc := range []struct{ lang, code string }{
		{Python, "s = '" + strings.Repeat("a", 5<<20) + "'\nlen(s)"},
		{Node, "var s = '" + strings.Repeat("a", 5<<20) + "'\ns.length"},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			requireLang(t, tc.lang)
			m := newTestManager(t, Options{})
			wantSuccess(t, mustRun(t, m, tc.lang, tc.code, 0), strconv.Itoa(5<<20))
			wantSuccess(t, mustRun(t, m, tc.lang, "1+1", 0), "2")
		})
	}
	m := newTestManager(t, Options{})
	if _, err := m.Run(context.Background(), Python, strings.Repeat(" ", MaxCode+1), 0); err == nil {
		t.Fatal("Run accepted code larger than MaxCode")
	}
}

func TestConcurrentRuns(t *testing.T) {
	requireLang(t, Python)
	requireLang(t, Node)
	m := newTestManager(t, Options{})
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 6 {
				lang := langs[(g+j)%2]
				tag := fmt.Sprintf("g%d-r%d", g, j)
				code := fmt.Sprintf("print(%q)\nimport sys; print(%q, file=sys.stderr)\n%d", tag, tag+"e", g*100+j)
				if lang == Node {
					code = fmt.Sprintf("console.log(%q); console.error(%q); %d", tag, tag+"e", g*100+j)
				}
				res, err := m.Run(context.Background(), lang, code, 10*time.Second)
				want := []wire.OutputLine{{Stream: wire.Stdout, Text: tag}, {Stream: wire.Stderr, Text: tag + "e"},
					{Stream: wire.Stdout, Text: strconv.Itoa(g*100 + j)}}
				switch {
				case err != nil:
					errs <- err
				case res.Status != wire.ReplSuccess || resultOf(res) != strconv.Itoa(g*100+j):
					errs <- fmt.Errorf("%s %s: status %q result %q", lang, tag, res.Status, resultOf(res))
				case fmt.Sprint(res.Output) != fmt.Sprint(want):
					errs <- fmt.Errorf("%s %s: output %q", lang, tag, res.Output)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestContextCancel(t *testing.T) {
	for _, tc := range []struct{ lang, setup, code string }{
		{Python, "x = 1", "while True: pass"},
		{Node, "var x = 1", "while (true) {}"},
		{Node, "var x = 1", "await new Promise(() => {})"},
	} {
		t.Run(tc.lang+"/"+tc.code, func(t *testing.T) {
			requireLang(t, tc.lang)
			m := newTestManager(t, Options{})
			mustRun(t, m, tc.lang, tc.setup, 0)
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(200*time.Millisecond, cancel)
			start := time.Now()
			res, err := m.Run(ctx, tc.lang, tc.code, 0)
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != wire.ReplTimeout || !strings.Contains(res.Error, "context canceled") || time.Since(start) > 3*time.Second {
				t.Fatalf("status %q error %q after %v; want an interrupt", res.Status, res.Error, time.Since(start))
			}
			wantSuccess(t, mustRun(t, m, tc.lang, "x", 0), "1")
			if _, err := m.Run(ctx, tc.lang, "x", 0); !errors.Is(err, context.Canceled) {
				t.Fatalf("Run with a cancelled ctx: %v", err)
			}
		})
	}
}

func TestCloseKillsInterpreters(t *testing.T) {
	requireLang(t, Python)
	requireLang(t, Node)
	m := NewManager(Options{})
	res := mustRun(t, m, Python, "import os, subprocess\np = subprocess.Popen(['sleep', '1000'])\nprint(os.getpid(), p.pid)", 0)
	var pyPid, childPid int
	if _, err := fmt.Sscan(joined(res, wire.Stdout), &pyPid, &childPid); err != nil {
		t.Fatalf("output %q: %v", res.Output, err)
	}
	nodePid := interpreterPid(t, m, Node)
	for _, pid := range []int{pyPid, childPid, nodePid} {
		if gone(pid) {
			t.Fatalf("process %d is not running before Close", pid)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{pyPid, childPid, nodePid} {
		waitGone(t, pid)
	}
	if _, err := m.Run(context.Background(), Python, "1", 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("Run after Close: %v, want ErrClosed", err)
	}
}

func TestCloseDuringRun(t *testing.T) {
	requireLang(t, Python)
	m := NewManager(Options{})
	mustRun(t, m, Python, "1", 0)
	time.AfterFunc(200*time.Millisecond, func() { _ = m.Close() })
	if _, err := m.Run(context.Background(), Python, "import time; time.sleep(100)", 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("Run interrupted by Close: %v, want ErrClosed", err)
	}
}

// TestHostileControlFrames has user code write to the driver's control
// channel: unknown frames are ignored, forged results for other runs are
// ignored, and an oversized frame costs only the interpreter.
func TestHostileControlFrames(t *testing.T) {
	requireLang(t, Python)
	m := newTestManager(t, Options{})
	find := "import os, fcntl\nw = [int(f) for f in os.listdir('/proc/self/fd') if int(f) >= 100 and fcntl.fcntl(int(f), fcntl.F_GETFL) & os.O_WRONLY][0]\n"
	mustRun(t, m, Python, "x = 1", 0)
	res := mustRun(t, m, Python, find+"os.write(w, b'z\\x00\\x00\\x00\\x03abc')\nos.write(w, b'r\\x00\\x00\\x00\\x0b{\"id\": 999}')\nx + 1", 0)
	wantSuccess(t, res, "2")
	res = mustRun(t, m, Python, find+"os.write(w, b'r\\x7f\\xff\\xff\\xff')\nimport time; time.sleep(5)", 0)
	if res.Status != wire.ReplRestarted || !strings.Contains(res.Error, "protocol error") {
		t.Fatalf("status %q error %q; want restarted after a protocol error", res.Status, res.Error)
	}
	wantSuccess(t, mustRun(t, m, Python, "1+1", 0), "2")
}

func TestStartFailure(t *testing.T) {
	m := newTestManager(t, Options{Python: "/nonexistent/python3"})
	if _, err := m.Run(context.Background(), Python, "1", 0); err == nil {
		t.Fatal("Run with a missing interpreter succeeded")
	}
	testenv.RequireFile(t, "/bin/false")
	m = newTestManager(t, Options{Node: "/bin/false"})
	if _, err := m.Run(context.Background(), Node, "1", 0); err == nil || !strings.Contains(err.Error(), "exit code 1") {
		t.Fatalf("Run with an interpreter that exits: %v", err)
	}
}

func TestMarkerScanner(t *testing.T) {
	prefix := []byte("\x00M:")
	for _, tc := range []struct {
		name   string
		chunks []string
		out    string
		marks  []uint64
	}{
		{"plain", []string{"hello\n"}, "hello\n", nil},
		{"marker", []string{"ab\x00M:7\ncd"}, "abcd", []uint64{7}},
		{"split", []string{"ab\x00", "M", ":1", "2\nc"}, "abc", []uint64{12}},
		{"two", []string{"\x00M:1\n\x00M:2\n"}, "", []uint64{1, 2}},
		{"not digits", []string{"\x00M:x\n"}, "\x00M:x\n", nil},
		{"too long", []string{"\x00M:" + strings.Repeat("1", 30) + "\n"}, "\x00M:" + strings.Repeat("1", 30) + "\n", nil},
		{"partial at EOF", []string{"a\x00M"}, "a\x00M", nil},
		{"nul alone", []string{"a\x00", "b"}, "a\x00b", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := markerScanner{prefix: prefix}
			var out []byte
			var marks []uint64
			emit := func(b []byte) { out = append(out, b...) }
			for _, c := range tc.chunks {
				sc.scan([]byte(c), emit, func(s uint64) { marks = append(marks, s) })
			}
			sc.flush(emit)
			if string(out) != tc.out || fmt.Sprint(marks) != fmt.Sprint(tc.marks) {
				t.Fatalf("out %q marks %v; want %q %v", out, marks, tc.out, tc.marks)
			}
		})
	}
}

func TestCollector(t *testing.T) {
	c := newCollector(1, 20)
	c.write(srcFrame, 0, []byte("ab\xffc\n"))
	c.write(srcFrame, 1, []byte("err"))
	c.write(srcFrame, 0, []byte("d"))
	c.write(srcRaw, 0, []byte("raw"))
	c.write(srcFrame, 1, []byte("\n"))
	c.write(srcFrame, 0, []byte("0123456789012345"))
	got, trunc := c.finish()
	want := []wire.OutputLine{
		{Stream: wire.Stdout, Text: "ab\uFFFDc"},
		{Stream: wire.Stderr, Text: "err"},
		{Stream: wire.Stdout, Text: "d01234567"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) || !trunc {
		t.Fatalf("got %q truncated %v; want %q truncated", got, trunc, want)
	}
	if n := keptBytes(wire.ReplResult{Output: got}); n > 20+1 {
		t.Fatalf("kept %d bytes", n)
	}
}

func benchmarkOnePlusOne(b *testing.B, lang string) {
	requireLang(b, lang)
	m := newTestManager(b, Options{})
	ctx := context.Background()
	mustRun(b, m, lang, "1+1", 0)
	for b.Loop() {
		res, err := m.Run(ctx, lang, "1+1", 0)
		if err != nil || resultOf(res) != "2" {
			b.Fatalf("%v %q %q", err, res.Status, resultOf(res))
		}
	}
}

func BenchmarkPythonOnePlusOne(b *testing.B) { benchmarkOnePlusOne(b, Python) }

func BenchmarkNodeOnePlusOne(b *testing.B) { benchmarkOnePlusOne(b, Node) }

// TestRunLimit: a run may keep more (or less) output than the Manager's
// default.
func TestRunLimit(t *testing.T) {
	for _, lang := range langs {
		t.Run(lang, func(t *testing.T) {
			requireLang(t, lang)
			m := newTestManager(t, Options{OutputLimit: 64 << 10})
			code := "import sys\nn = sys.stdout.write('x' * 300000)"
			if lang == Node {
				code = "void process.stdout.write('x'.repeat(300000))"
			}
			for _, limit := range []int{0, 16 << 10, 256 << 10, 1 << 20} {
				res, err := m.RunLimit(context.Background(), lang, code, 0, limit)
				if err != nil {
					t.Fatal(err)
				}
				want := limit
				if limit == 0 {
					want = 64 << 10
				}
				if limit == 1<<20 {
					want = 300000
				}
				if got := keptBytes(res); got < want-1 || got > want+1 || res.Truncated != (want < 300000) {
					t.Errorf("limit %d: kept %d bytes, truncated %v; want %d", limit, got, res.Truncated, want)
				}
			}
		})
	}
}

// TestCollectorLineCap: a run keeps at most wire.MaxReplLines lines,
// whatever their bytes.
func TestCollectorLineCap(t *testing.T) {
	c := newCollector(1, wire.MaxOutputLimit)
	c.write(srcFrame, 0, bytes.Repeat([]byte("\n"), wire.MaxReplLines+10))
	lines, truncated := c.finish()
	if len(lines) != wire.MaxReplLines || !truncated {
		t.Fatalf("kept %d lines, truncated %v; want %d and truncated", len(lines), truncated, wire.MaxReplLines)
	}
}
