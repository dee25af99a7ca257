package rpc_test

// The wire scripts: every shipped example of microsandbox's SDKs, as the
// sequence of calls it makes, and the SDKs' basic operations, with what a
// user of the SDK gets back (the checks). The examples' sandbox names,
// commands and arguments are theirs; the code they run is written here to
// do what theirs does (print, keep state, raise, write files, burn CPU),
// shorter where theirs only waits. msbcompat_client_test.go turns each
// call into each SDK's exact request and reads the answer as that SDK.
//
// Examples (same commit as the SDK's generation, see the client file):
//   - sdk/python/examples/{command,metrics,node,repl}.py,
//     sdk/javascript/examples/{command,metrics,node,python}.ts and
//     sdk/rust/examples/{command,metrics,node,repl}.rs: the same sequences
//     in three languages (pyExamples).
//   - sdk/go/cmd/{command,concurrent,metrics,node,repl}-example/main.go
//     (goExamples).

import "time"

const (
	opStart   = "start"
	opStop    = "stop"
	opRepl    = "repl"
	opCommand = "command"
	opMetrics = "metrics"
	opSleep   = "sleep"
)

// call is one SDK call (or a pause between calls).
type call struct {
	Op      string
	Sandbox string
	Lang    string // start: the sandbox class (python, node); repl: the language
	Memory  int    // start; 0: the SDK's default 512
	CPUs    int    // start; 0: the SDK's default 1
	Ports   []string
	Code    string
	Command string
	Args    []string // nil: the call passes none
	Timeout *int     // seconds, when the example passes one
	Pause   time.Duration
	// Cancel is a client-side deadline (the Go SDK's context example): the
	// client gives up after it; the server must stay usable.
	Cancel time.Duration
	// Parallel calls run at once (the Go SDK's concurrent examples).
	Parallel []call
	Want     want
	// Finding names the issue-17 finding a failure of this call waits for.
	Finding string
}

// want is what the example's user must get.
type want struct {
	Fail           bool // the SDK raises
	Stdout         *string
	StdoutHas      []string
	StdoutLines    int // exact number of stdout lines, when > 0
	StderrHas      []string
	HasError       *bool
	Status         string
	ExitCode       *int
	Success        *bool
	Running        bool // metrics: running, CPU in [0, 100*CPUs], memory > 0
	CPUs           int  // metrics: the sandbox's CPUs (bounds cpu_usage)
	StdoutNotEmpty bool
}

func ptr[T any](v T) *T { return &v }

// Constructors keep the tables short.

func start(name, lang string, mem, cpus int) call {
	return call{Op: opStart, Sandbox: name, Lang: lang, Memory: mem, CPUs: cpus}
}
func stop(name string) call { return call{Op: opStop, Sandbox: name} }
func repl(name, lang, code string, w want) call {
	return call{Op: opRepl, Sandbox: name, Lang: lang, Code: code, Want: w}
}
func command(name, cmd string, args []string, w want) call {
	return call{Op: opCommand, Sandbox: name, Command: cmd, Args: args, Want: w}
}
func metricsCall(name string, cpus int) call {
	return call{Op: opMetrics, Sandbox: name, Want: want{Running: true, CPUs: cpus}}
}
func pause(d time.Duration) call { return call{Op: opSleep, Pause: d} }

// with is the context-manager / defer pattern: start, the calls, stop.
func with(name, lang string, mem, cpus int, calls ...call) []call {
	out := []call{start(name, lang, mem, cpus)}
	for _, c := range calls {
		if c.Sandbox == "" && c.Op != opSleep {
			c.Sandbox = name
		}
		for i := range c.Parallel {
			if c.Parallel[i].Sandbox == "" {
				c.Parallel[i].Sandbox = name
			}
		}
		out = append(out, c)
	}
	return append(out, stop(name))
}

func finding(f string, c call) call { c.Finding = f; return c }

func ok() want             { return want{} }
func out(s string) want    { return want{Stdout: &s, HasError: ptr(false)} }
func has(s ...string) want { return want{StdoutHas: s} }
func exit(code int) want   { return want{ExitCode: &code, Success: ptr(code == 0)} }
func exitOut(code int, s string) want {
	w := exit(code)
	w.StdoutHas = []string{s}
	return w
}

// script is one example (or the basic operations) of one SDK family.
type script struct {
	Name  string
	Calls []call
}

// A small program for the CPU-load examples: theirs runs ten seconds.
const cpuScript = "import time\nend = time.time() + 1\nn = 0\nwhile time.time() < end:\n    n += sum(i * i for i in range(1000))\nprint('done', n > 0)\n"

// pyExamples: the Python SDK's examples; the JavaScript and Rust SDKs ship
// the same sequences (command, metrics, node, and repl / python).
var pyExamples = []script{
	{"command", concat(
		with("command-example", "python", 0, 0,
			command("", "ls", []string{"-la", "/"}, exitOut(0, "tmp")),
			command("", "echo", []string{"Hello from", "sandbox command!"}, want{Stdout: ptr("Hello from sandbox command!"), ExitCode: ptr(0), Success: ptr(true)}),
			command("", "uname", []string{"-a"}, exitOut(0, "Linux"))),
		with("error-example", "python", 0, 0,
			command("", "ls", []string{"/nonexistent"}, want{ExitCode: ptr(2), Success: ptr(false), StderrHas: []string{"nonexistent"}}),
			command("", "nonexistentcommand", []string{}, want{Fail: true})),
		with("timeout-example", "python", 0, 0,
			call{Op: opCommand, Command: "sleep", Args: []string{"10"}, Timeout: ptr(2), Want: want{Fail: true}},
			command("", "echo", []string{"Still working!"}, want{Stdout: ptr("Still working!"), ExitCode: ptr(0)})),
		with("advanced-example", "python", 0, 0,
			command("", "bash", []string{"-c", "echo 'Hello, file content!' > /tmp/test.txt"}, exit(0)),
			command("", "cat", []string{"/tmp/test.txt"}, want{Stdout: ptr("Hello, file content!"), ExitCode: ptr(0)}),
			command("", "bash", []string{"-c", "mkdir -p /tmp/test_dir && echo 'Line 1' > /tmp/test_dir/data.txt && echo 'Line 2' >> /tmp/test_dir/data.txt && cat /tmp/test_dir/data.txt | grep 'Line' | wc -l"}, want{Stdout: ptr("2"), ExitCode: ptr(0)}),
			command("", "bash", []string{"-c", "cat > /tmp/test.py << 'EOF'\nimport sys\nprint('args:', sys.argv[1:])\nEOF"}, exit(0)),
			finding("2", command("", "python", []string{"/tmp/test.py", "arg1", "arg2", "arg3"}, exitOut(0, "args: ['arg1', 'arg2', 'arg3']")))),
		with("explicit-lifecycle", "python", 0, 0,
			command("", "hostname", nil, want{ExitCode: ptr(0), StdoutNotEmpty: true}),
			command("", "date", nil, want{ExitCode: ptr(0), StdoutNotEmpty: true})),
	)},
	{"metrics", concat(
		with("metrics-example", "python", 0, 0,
			command("", "ls", []string{"-la", "/"}, exit(0)),
			command("", "dd", []string{"if=/dev/zero", "of=/tmp/testfile", "bs=1M", "count=10"}, exit(0)),
			pause(300*time.Millisecond),
			metricsCall("", 1), metricsCall("", 1), metricsCall("", 1), metricsCall("", 1)),
		with("all-metrics-example", "python", 0, 0,
			command("", "cat", []string{"/etc/os-release"}, exit(0)),
			command("", "ls", []string{"-la", "/usr"}, exit(0)),
			pause(300*time.Millisecond),
			metricsCall("", 1)),
		with("monitoring-example", "python", 0, 0,
			command("", "sh", []string{"-c", "for i in $(seq 1 5); do ls -la / > /dev/null; sleep 0.2; done &"}, exit(0)),
			metricsCall("", 1), metricsCall("", 1), pause(200*time.Millisecond), metricsCall("", 1), metricsCall("", 1)),
		with("cpu-load-test", "python", 0, 0,
			command("", "bash", []string{"-c", "cat > /tmp/cpu_test.py << 'EOF'\n" + cpuScript + "\nEOF"}, exit(0)),
			finding("2", command("", "python", []string{"/tmp/cpu_test.py", "&"}, exitOut(0, "done True"))),
			metricsCall("", 1), metricsCall("", 1)),
		// The error example's first metrics call is refused by the SDK
		// before any request (not started).
		with("error-example", "python", 0, 0, metricsCall("", 1)),
	)},
	{"node", concat(
		with("node-basic", "node", 0, 0,
			repl("", "node", "console.log('Hello from Node.js!');", has("Hello from Node.js!")),
			repl("", "node", "const version = process.version;\nconst platform = process.platform;\nconsole.log(`Node.js ${version} running on ${platform}`);", has("running on linux"))),
		with("node-error", "node", 0, 0,
			repl("", "node", "try {\n    console.log(undefinedVariable);\n} catch (error) {\n    console.error('Caught error:', error.message);\n}", want{HasError: ptr(true), StderrHas: []string{"Caught error: undefinedVariable is not defined"}})),
		with("node-module", "node", 0, 0,
			repl("", "node", "const fs = require('fs');\nconst os = require('os');\nfs.writeFileSync('/tmp/hello.txt', 'Hello from Node.js!');\nconsole.log('File written successfully');\nconsole.log('File content:', fs.readFileSync('/tmp/hello.txt', 'utf8'));\nconsole.log('Platform:', os.platform());", has("File written successfully", "File content: Hello from Node.js!", "Platform: linux"))),
		with("node-chain", "node", 0, 0,
			repl("", "node", "const name = 'Node.js';", ok()),
			repl("", "node", "const version = process.version;", ok()),
			repl("", "node", "const numbers = [1, 2, 3, 4, 5];", ok()),
			repl("", "node", "console.log(`Hello from ${name} ${version}!`);\nconst sum = numbers.reduce((a, b) => a + b, 0);\nconsole.log(`Sum of numbers: ${sum}`);", has("Hello from Node.js v", "Sum of numbers: 15"))),
	)},
	{"repl", concat(
		with("sandbox-cm", "python", 0, 0,
			repl("", "python", "name = 'Python'\nmessage = f'Hello from {name}!'\nprint(message)", out("Hello from Python!"))),
		with("sandbox-explicit", "python", 1024, 2,
			repl("", "python", "x = 42", out("")),
			repl("", "python", "y = [i**2 for i in range(10)]", out("")),
			repl("", "python", "print(f'x = {x}')\nprint(f'y = {y}')", out("x = 42\ny = [0, 1, 4, 9, 16, 25, 36, 49, 64, 81]")),
			repl("", "python", "1/0", want{HasError: ptr(true), StderrHas: []string{"ZeroDivisionError"}})),
		with("sandbox-chain", "python", 0, 0,
			repl("", "python", "name = 'Python'", ok()),
			repl("", "python", "import sys", ok()),
			repl("", "python", "version = sys.version", ok()),
			repl("", "python", "print(f'Hello from {name} {version}!')", has("Hello from Python 3."))),
	)},
}

// goExamples: the Go SDK's sdk/go/cmd/*-example programs.
var goExamples = []script{
	{"command-example", concat(
		with("command-example", "python", 512, 1,
			command("", "ls", []string{"-la", "/"}, exitOut(0, "tmp")),
			command("", "echo", []string{"Hello from", "sandbox command!"}, want{Stdout: ptr("Hello from sandbox command!"), ExitCode: ptr(0), Success: ptr(true)}),
			command("", "uname", []string{"-a"}, exitOut(0, "Linux"))),
		with("error-example", "python", 512, 1,
			command("", "ls", []string{"/nonexistent"}, want{ExitCode: ptr(2), Success: ptr(false), StderrHas: []string{"nonexistent"}}),
			command("", "nonexistentcommand", []string{}, want{Fail: true})),
		with("advanced-example", "python", 1024, 2,
			command("", "bash", []string{"-c", "echo 'Hello, file content!' > /tmp/test.txt"}, exit(0)),
			command("", "cat", []string{"/tmp/test.txt"}, want{Stdout: ptr("Hello, file content!"), ExitCode: ptr(0)}),
			command("", "bash", []string{"-c", "mkdir -p /tmp/test_dir && echo 'Line 1' > /tmp/test_dir/data.txt && echo 'Line 2' >> /tmp/test_dir/data.txt && cat /tmp/test_dir/data.txt | grep 'Line' | wc -l"}, want{Stdout: ptr("2"), ExitCode: ptr(0)}),
			command("", "bash", []string{"-c", "cat > /tmp/test.py << 'EOF'\nimport sys\nprint('args:', sys.argv[1:])\nEOF"}, exit(0)),
			finding("2", command("", "python", []string{"/tmp/test.py", "arg1", "arg2", "arg3"}, exitOut(0, "args: ['arg1', 'arg2', 'arg3']")))),
		with("explicit-lifecycle", "python", 512, 1,
			command("", "hostname", []string{}, want{ExitCode: ptr(0), StdoutNotEmpty: true}),
			command("", "date", []string{}, want{ExitCode: ptr(0), StdoutNotEmpty: true})),
	)},
	{"concurrent-example", concat(
		with("sequential-example", "python", 512, 1,
			repl("", "python", "import time\nprint('task 1 done')", out("task 1 done")),
			repl("", "python", "print('task 2 done')", out("task 2 done")),
			repl("", "python", "print('task 3 done')", out("task 3 done"))),
		with("concurrent-example", "python", 1024, 2,
			call{Parallel: []call{
				repl("", "python", "print('task 1 finished')", out("task 1 finished")),
				repl("", "python", "print('task 2 finished')", out("task 2 finished")),
				repl("", "python", "print('task 3 finished')", out("task 3 finished")),
			}}),
		with("worker-pool-example", "python", 1024, 2,
			call{Parallel: []call{
				repl("", "python", "print(sum(range(1 * 100)))", out("4950")),
				repl("", "python", "print(sum(range(2 * 100)))", out("19900")),
				repl("", "python", "print(sum(range(3 * 100)))", out("44850")),
				repl("", "python", "print(sum(range(4 * 100)))", out("79800")),
				repl("", "python", "print(sum(range(5 * 100)))", out("124750")),
			}}),
		// The context example gives up on a long run after its deadline;
		// the sandbox must still stop.
		with("context-example", "python", 512, 1,
			call{Op: opRepl, Lang: "python", Code: "import time\ntime.sleep(5)\nprint('finished')", Cancel: 500 * time.Millisecond, Want: want{Fail: true}}),
		with("channel-coordination", "python", 1024, 2,
			repl("", "python", "print('processed item-1')", out("processed item-1")),
			repl("", "python", "print('processed item-2')", out("processed item-2")),
			repl("", "python", "print('processed item-3')", out("processed item-3"))),
		with("metrics-monitoring", "python", 1024, 2,
			call{Parallel: []call{
				repl("", "python", "total = sum(i * i for i in range(200000))\nprint(total > 0)", out("True")),
				metricsCall("", 2), metricsCall("", 2), metricsCall("", 2),
			}},
			repl("", "python", "print('load 2')", out("load 2")),
			metricsCall("", 2)),
	)},
	{"metrics-example", concat(
		with("metrics-example", "python", 512, 1,
			command("", "ls", []string{"-la", "/"}, exit(0)),
			command("", "dd", []string{"if=/dev/zero", "of=/tmp/testfile", "bs=1M", "count=10"}, exit(0)),
			pause(300*time.Millisecond),
			metricsCall("", 1), metricsCall("", 1), metricsCall("", 1), metricsCall("", 1)),
		with("all-metrics-example", "python", 512, 1,
			command("", "cat", []string{"/etc/os-release"}, exit(0)),
			command("", "ls", []string{"-la", "/usr"}, exit(0)),
			pause(300*time.Millisecond),
			metricsCall("", 1)),
		with("monitoring-example", "python", 512, 1,
			command("", "sh", []string{"-c", "for i in $(seq 1 5); do ls -la / > /dev/null; sleep 0.2; done &"}, exit(0)),
			metricsCall("", 1), metricsCall("", 1), pause(200*time.Millisecond), metricsCall("", 1), metricsCall("", 1)),
		with("cpu-load-test", "python", 1024, 2,
			command("", "bash", []string{"-c", "cat > /tmp/cpu_test.py << 'EOF'\n" + cpuScript + "\nEOF"}, exit(0)),
			finding("2", command("", "python", []string{"/tmp/cpu_test.py", "&"}, exitOut(0, "done True"))),
			metricsCall("", 2), metricsCall("", 2)),
		with("error-example", "python", 512, 1, metricsCall("", 1)),
	)},
	{"node-example", concat(
		with("node-basic", "node", 512, 1,
			repl("", "node", "console.log('Hello from Node.js!');", has("Hello from Node.js!")),
			repl("", "node", "const version = process.version;\nconst platform = process.platform;\nconsole.log(`Node.js ${version} running on ${platform}`);", has("running on linux"))),
		with("node-error", "node", 512, 1,
			repl("", "node", "try {\n    console.log(undefinedVariable);\n} catch (error) {\n    console.error('Caught error:', error.message);\n}", want{HasError: ptr(true), StderrHas: []string{"Caught error: undefinedVariable is not defined"}})),
		with("node-module", "node", 512, 1,
			repl("", "node", "const fs = require('fs');\nfs.writeFileSync('/tmp/hello.txt', 'Hello from Node.js!');\nconsole.log('File content:', fs.readFileSync('/tmp/hello.txt', 'utf8'));", has("File content: Hello from Node.js!"))),
		with("node-chain", "node", 512, 1,
			repl("", "node", "const name = 'Node.js';", ok()),
			repl("", "node", "const version = process.version;", ok()),
			repl("", "node", "const numbers = [1, 2, 3, 4, 5];", ok()),
			repl("", "node", "console.log(`Hello from ${name} ${version}!`);\nconsole.log(`Sum of numbers: ${numbers.reduce((a, b) => a + b, 0)}`);", has("Hello from Node.js v", "Sum of numbers: 15"))),
		with("node-json", "node", 512, 1,
			repl("", "node", "const data = { users: [{ name: 'Alice', age: 30 }, { name: 'Bob', age: 25 }] };\nconsole.log(JSON.stringify(data.users.map(u => u.name)));\nconsole.log('Average age:', data.users.reduce((s, u) => s + u.age, 0) / data.users.length);", has(`["Alice","Bob"]`, "Average age: 27.5"))),
	)},
	{"repl-example", concat(
		with("sandbox-cm", "python", 512, 1,
			repl("", "python", "name = 'Python'\nmessage = f'Hello from {name}!'\nprint(message)", out("Hello from Python!"))),
		with("sandbox-explicit", "python", 1024, 2,
			repl("", "python", "x = 42", out("")),
			repl("", "python", "y = [i**2 for i in range(10)]", out("")),
			repl("", "python", "print(f'x = {x}')\nprint(f'y = {y}')", out("x = 42\ny = [0, 1, 4, 9, 16, 25, 36, 49, 64, 81]")),
			repl("", "python", "1/0", want{HasError: ptr(true), StderrHas: []string{"ZeroDivisionError"}})),
		with("sandbox-chain", "python", 512, 1,
			repl("", "python", "name = 'Python'", ok()),
			repl("", "python", "import sys", ok()),
			repl("", "python", "version = sys.version", ok()),
			repl("", "python", "print(f'Hello from {name} {version}!')", has("Hello from Python 3."))),
		with("sandbox-data", "python", 1024, 2,
			repl("", "python", "import json\ndata = [{'name': 'A', 'age': 30, 'dept': 'x'}, {'name': 'B', 'age': 40, 'dept': 'y'}, {'name': 'C', 'age': 50, 'dept': 'x'}]", ok()),
			repl("", "python", "ages = [p['age'] for p in data]\nprint(f'Average age: {sum(ages) / len(ages)}')\ncounts = {}\nfor p in data:\n    counts[p['dept']] = counts.get(p['dept'], 0) + 1\nfor dept, count in counts.items():\n    print(f'{dept}: {count}')", out("Average age: 40.0\nx: 2\ny: 1"))),
		with("sandbox-error-recovery", "python", 512, 1,
			repl("", "python", "counter = 0", ok()),
			repl("", "python", "def safe_divide(a, b):\n    try:\n        return a / b\n    except ZeroDivisionError:\n        return None\n", ok()),
			repl("", "python", "counter += 1\nprint(f'valid: {safe_divide(10, 2)}, counter={counter}')", out("valid: 5.0, counter=1")),
			repl("", "python", "counter += 1\nundefined_function()", want{HasError: ptr(true), StderrHas: []string{"NameError"}}),
			repl("", "python", "counter += 1\nprint(f'final counter={counter}')", out("final counter=3"))),
	)},
}

// bigLines is a command and a REPL run whose output is 30,000 lines of 100
// bytes (about 3 MB): microsandbox returns every line (finding 3).
const bigLines = 30000

var bigCommand = []string{"-c", "i=0; while [ $i -lt 30000 ]; do printf '%05d %094d\\n' $i 0; i=$((i+1)); done"}

// basicOps: every SDK's basic operations, at every generation: start, REPL runs of
// both languages including a bare expression, commands with and without
// arguments and a timeout, metrics, stop.
func basicOps(s wireSDK) []call {
	calls := []call{
		start("basic-ops", "python", 0, 0),
		metricsCall("basic-ops", 1),
		repl("basic-ops", "python", "x = 40\nprint('hi')", out("hi")),
		finding("1", repl("basic-ops", "python", "x + 2", out("42"))),
		finding("1", repl("basic-ops", "python", "6*7", out("42"))),
		repl("basic-ops", "python", "import sys\nprint('out')\nprint('err', file=sys.stderr)", want{Stdout: ptr("out"), StderrHas: []string{"err"}, HasError: ptr(true)}),
		finding("1", repl("basic-ops", "node", "6*7", out("42"))),
		repl("basic-ops", "node", "console.log(6*7)", has("42")),
		command("basic-ops", "echo", []string{"hi"}, want{Stdout: ptr("hi"), ExitCode: ptr(0), Success: ptr(true)}),
		command("basic-ops", "true", nil, exit(0)),
		command("basic-ops", "sh", []string{"-c", "echo one; echo two >&2; exit 5"}, want{Stdout: ptr("one"), StderrHas: []string{"two"}, ExitCode: ptr(5), Success: ptr(false)}),
		command("basic-ops", "no-such-command", nil, want{Fail: true}),
		metricsCall("basic-ops", 1),
	}
	if s.SDK != "go" { // the Go SDK has no per-call command timeout
		calls = append(calls, call{Op: opCommand, Sandbox: "basic-ops", Command: "echo", Args: []string{"timely"}, Timeout: ptr(30), Want: want{Stdout: ptr("timely")}})
	}
	if s.SDK == "python" || s.SDK == "go" {
		calls = append(calls,
			finding("3", command("basic-ops", "sh", bigCommand, want{StdoutLines: bigLines, ExitCode: ptr(0)})),
			finding("3", repl("basic-ops", "python", "for i in range(30000):\n    print('%05d %094d' % (i, 0))", want{StdoutLines: bigLines})))
	}
	return append(calls, stop("basic-ops"))
}

func concat(parts ...[]call) []call {
	var out []call
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
