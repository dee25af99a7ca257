package rpc_test

// A fresh client for microsandbox's SDKs' wire forms: for each SDK and
// protocol generation, the exact bytes it posts (route, headers, key order,
// which fields are omitted, number forms, string escaping) and the way it
// reads the answer (what it requires, what it raises on). Written from
// reading the SDKs' sources (superradcompany/microsandbox, formerly
// microsandbox/microsandbox):
//
//   - generation A, namespace in every call: commit ef8a9e554fb6 (the parent
//     of "chore(namespace): deprecate namespaces"); the Go SDK also at
//     0f2c5b3bdd6b (before "add default Request ID generation in SDK": no id,
//     and a start config of image, memory and cpus only).
//   - generation B, no namespace: commit 2837007cb662; the Python and
//     JavaScript SDKs post start and stop (JavaScript: command run too) to
//     REST-style routes.
//
// Files: sdk/python/microsandbox/{base_sandbox,python_sandbox,node_sandbox,
// command,metrics,execution,command_execution}.py;
// sdk/javascript/src/{base-sandbox,python-sandbox,node-sandbox,command,
// metrics,execution,command-execution}.ts; sdk/go/{rpc_client,base,msb,
// code_execution,command_execution,option}.go; sdk/rust/src/{base,command,
// metrics,execution}.rs.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
)

// wireSDK is one SDK at one generation.
type wireSDK struct {
	SDK    string // python, javascript, go, rust
	Gen    string // A (namespace sent) or B (none)
	Commit string // where its wire form was read
	// goNoID: the Go SDK before it made request ids by default sends none
	// and only image, memory and cpus in a start's config.
	goNoID bool
	// goTimeout is the Go SDK's http.Client timeout (WithHTTPClient); the
	// SDK sends it, in nanoseconds, as every command's timeout.
	goTimeout int64
	// Namespace is what generation A sends: the SDKs' default "default",
	// or the one a user passes (the test gives each SDK its own, so they
	// can play at once).
	Namespace string
}

func (s wireSDK) String() string {
	if s.goNoID {
		return s.SDK + "-" + s.Gen + "-0f2c5b3"
	}
	return s.SDK + "-" + s.Gen
}

// field is one member of a JSON object in the order an SDK writes it.
type field struct {
	k string
	v any // string, int, int64, float64, bool, nil, []string, fields
}

type fields []field

// encode writes v as the SDK's serializer does: Python's json.dumps
// (", " and ": " separators, non-ASCII escaped), Go's encoding/json (HTML
// characters escaped), serde_json without preserve_order (keys sorted),
// JSON.stringify (compact, as written).
func (s wireSDK) encode(v any) []byte {
	var b bytes.Buffer
	s.write(&b, v)
	return b.Bytes()
}

func (s wireSDK) write(b *bytes.Buffer, v any) {
	comma, colon := ",", ":"
	if s.SDK == "python" {
		comma, colon = ", ", ": "
	}
	switch v := v.(type) {
	case fields:
		if s.SDK == "rust" {
			v = append(fields(nil), v...)
			sort.Slice(v, func(i, j int) bool { return v[i].k < v[j].k })
		}
		b.WriteByte('{')
		for i, f := range v {
			if i > 0 {
				b.WriteString(comma)
			}
			s.write(b, f.k)
			b.WriteString(colon)
			s.write(b, f.v)
		}
		b.WriteByte('}')
	case []string:
		if v == nil {
			b.WriteString("null")
			return
		}
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteString(comma)
			}
			s.write(b, e)
		}
		b.WriteByte(']')
	case string:
		s.writeString(b, v)
	default:
		raw, err := json.Marshal(v)
		if err != nil {
			panic(err)
		}
		b.Write(raw)
	}
}

func (s wireSDK) writeString(b *bytes.Buffer, v string) {
	var enc bytes.Buffer
	e := json.NewEncoder(&enc)
	e.SetEscapeHTML(s.SDK == "go")
	if err := e.Encode(v); err != nil {
		panic(err)
	}
	out := strings.TrimSuffix(enc.String(), "\n")
	if s.SDK == "python" { // ensure_ascii
		var a strings.Builder
		for _, r := range out {
			if r < 0x80 {
				a.WriteRune(r)
				continue
			}
			if u := r; u > 0xffff {
				u -= 0x10000
				fmt.Fprintf(&a, `\u%04x\u%04x`, 0xd800+(u>>10), 0xdc00+(u&0x3ff))
			} else {
				fmt.Fprintf(&a, `\u%04x`, u)
			}
		}
		out = a.String()
	}
	b.WriteString(out)
}

// request is what an SDK sends for one call.
type request struct {
	Path   string
	Header http.Header
	Body   []byte
	ID     string // "" when the request carries none
}

// request builds the exact request s sends for c; key is the API key ("" in
// dev mode: no Authorization header, as every SDK leaves it out when it has
// no key). id is the request id the SDK would have drawn.
func (s wireSDK) request(c call, key, id string) request {
	ns := func(f fields, at int) fields { // the namespace member, generation A only
		if s.Gen != "A" {
			return f
		}
		out := append(fields(nil), f[:at]...)
		n := s.Namespace
		if n == "" {
			n = "default"
		}
		out = append(out, field{"namespace", n})
		return append(out, f[at:]...)
	}
	rpc := "/api/v1/rpc"
	var method string
	var params fields
	path := rpc
	withID := true
	switch c.Op {
	case opStart:
		method = "sandbox.start"
		params = ns(fields{{"sandbox", c.Sandbox}, {"config", s.startConfig(c)}}, 0)
		if s.Gen == "B" && (s.SDK == "python" || s.SDK == "javascript") {
			path, withID = "/api/v1/sandbox/start", false
		}
	case opStop:
		method = "sandbox.stop"
		params = ns(fields{{"sandbox", c.Sandbox}}, 0)
		if s.Gen == "B" && (s.SDK == "python" || s.SDK == "javascript") {
			path = "/api/v1/sandbox/stop"
		}
	case opRepl:
		method = "sandbox.repl.run"
		lang := "python"
		if c.Lang == "node" {
			lang = "nodejs"
		}
		params = fields{{"sandbox", c.Sandbox}, {"language", lang}, {"code", c.Code}}
		if s.SDK == "go" {
			params = ns(params, 0)
		} else {
			params = ns(params, 1)
		}
		if c.Timeout != nil && s.SDK == "javascript" {
			params = append(params, field{"timeout", *c.Timeout})
		}
	case opCommand:
		method = "sandbox.command.run"
		args := c.Args
		if args == nil && s.SDK != "go" { // Python, JS and Rust send []; Go a nil slice as null
			args = []string{}
		}
		params = fields{{"sandbox", c.Sandbox}, {"command", c.Command}, {"args", args}}
		if s.SDK == "go" {
			params = ns(params, 0)
			if s.goTimeout != 0 {
				params = append(params, field{"timeout", s.goTimeout})
			}
		} else {
			params = ns(params, 1)
			if c.Timeout != nil {
				params = append(params, field{"timeout", *c.Timeout})
			}
		}
		if s.Gen == "B" && s.SDK == "javascript" {
			path = "/api/v1/sandbox/command/run"
		}
	case opMetrics:
		method = "sandbox.metrics.get"
		params = ns(fields{{"sandbox", c.Sandbox}}, 0)
	default:
		panic("no request for " + c.Op)
	}
	if s.goNoID {
		withID = false
	}
	env := fields{{"jsonrpc", "2.0"}, {"method", method}, {"params", params}}
	if withID {
		env = append(env, field{"id", id})
	} else {
		id = ""
	}
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	if s.SDK != "go" { // aiohttp, node-fetch and reqwest accept anything
		h.Set("Accept", "*/*")
	}
	if key != "" {
		h.Set("Authorization", "Bearer "+key)
	}
	return request{Path: path, Header: h, Body: s.encode(env), ID: id}
}

// startConfig is the config of a start: image, memory, cpus, then the
// optional lists when given (the Go SDK before 0f2c5b3's successor sends
// only the first three).
func (s wireSDK) startConfig(c call) fields {
	image := "microsandbox/python"
	if c.Lang == "node" {
		image = "microsandbox/node"
	}
	mem, cpus := c.Memory, c.CPUs
	if mem == 0 {
		mem = 512
	}
	if cpus == 0 {
		cpus = 1
	}
	cfg := fields{{"image", image}, {"memory", mem}, {"cpus", cpus}}
	if len(c.Ports) > 0 && !s.goNoID {
		cfg = append(cfg, field{"ports", c.Ports})
	}
	return cfg
}

// view is what an SDK makes of an answer: the values its accessors return.
type view struct {
	Stdout, Stderr   string // output() / error() (each SDK trims differently)
	StdoutLines      int    // stdout lines it read
	HasError         bool
	Status, Language string
	ExitCode         int
	Success          bool
	Running          bool
	CPU              *float64 // metrics as the SDK reads them (nil: not available)
	Memory, Disk     *float64
	StartResult      string
}

// read interprets an answer as s does for c, or returns the error the
// SDK raises (or, for the Go SDK's executions, the error its accessors
// return when the result could not be parsed).
func (s wireSDK) read(c call, status int, hdr http.Header, body []byte) (view, error) {
	var v view
	switch s.SDK {
	case "python":
		if status != 200 {
			return v, fmt.Errorf("status %d: %s", status, body)
		}
		if s.Gen == "B" && c.Op == opStop { // reads nothing but the status
			return v, nil
		}
		// aiohttp's response.json() refuses another content type.
		if ct := hdr.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			return v, fmt.Errorf("content type %q: aiohttp refuses to decode", ct)
		}
		obj, err := decodeObject(body)
		if err != nil {
			return v, err
		}
		if s.Gen == "B" && c.Op == opStart { // reads only message
			return v, nil
		}
		if e, ok := obj["error"]; ok {
			return v, fmt.Errorf("error member: %s", errMessage(e, true))
		}
		res, ok := obj["result"]
		if !ok {
			res = map[string]any{}
		}
		return readLoose(c, res, "python")
	case "javascript":
		if status < 200 || status > 299 {
			return v, fmt.Errorf("status %d: %s", status, body)
		}
		obj, err := decodeObject(body) // `"error" in responseData` throws on a primitive
		if err != nil {
			return v, err
		}
		if e, ok := obj["error"]; ok {
			return v, fmt.Errorf("error member: %s", errMessage(e, true))
		}
		res := obj["result"]
		if res == nil || res == false || res == "" || res == float64(0) { // result || {}
			res = map[string]any{}
		}
		return readLoose(c, res, "javascript")
	case "rust":
		if status < 200 || status > 299 {
			return v, fmt.Errorf("status %d: %s", status, body)
		}
		var obj map[string]any
		if err := json.Unmarshal(body, &obj); err != nil {
			return v, fmt.Errorf("answer: %w", err)
		}
		if e, ok := obj["error"]; ok { // Some(Null) too
			return v, fmt.Errorf("error member: %s", errMessage(e, false))
		}
		res, hasResult := obj["result"]
		switch c.Op {
		case opRepl, opCommand: // serde_json::from_value::<HashMap<String, Value>>
			if _, ok := res.(map[string]any); !ok {
				return v, fmt.Errorf("result %v is not an object", res)
			}
		case opMetrics:
			if !hasResult {
				return v, errors.New("missing 'result' field")
			}
			m, _ := res.(map[string]any)
			if _, ok := m["sandboxes"].([]any); !ok {
				return v, errors.New("missing 'sandboxes' array")
			}
		}
		return readLoose(c, res, "rust")
	case "go":
		return readGo(c, status, body)
	}
	panic("unknown SDK " + s.SDK)
}

// decodeObject decodes an answer that must be a JSON object.
func decodeObject(body []byte) (map[string]any, error) {
	var x any
	if err := json.Unmarshal(body, &x); err != nil {
		return nil, fmt.Errorf("answer is not JSON: %w", err)
	}
	obj, ok := x.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("answer %s is not an object", body)
	}
	return obj, nil
}

// errMessage is error.message as the SDK reaches it: Python and JS index
// it (a non-object error is a crash, still an error), Rust defaults it.
func errMessage(e any, strict bool) string {
	m, _ := e.(map[string]any)
	msg, ok := m["message"].(string)
	if !ok && !strict {
		return "Unknown error"
	}
	return msg
}

// readLoose is the Python, JavaScript and Rust SDKs' reading of a result:
// dynamic, each with its own tolerance.
func readLoose(c call, res any, sdk string) (view, error) {
	var v view
	obj, _ := res.(map[string]any)
	switch c.Op {
	case opStart:
		v.StartResult, _ = res.(string)
		return v, nil
	case opStop:
		return v, nil
	case opRepl, opCommand:
		if obj == nil { // Python: not a dict → empty execution
			obj = map[string]any{}
		}
		lines, err := outputLines(obj["output"], sdk)
		if err != nil {
			return v, err
		}
		var out, errOut strings.Builder
		for _, l := range lines {
			switch l[0] {
			case "stdout":
				out.WriteString(l[1] + "\n")
				v.StdoutLines++
			case "stderr":
				errOut.WriteString(l[1] + "\n")
				if l[1] != "" {
					v.HasError = true
				}
			}
		}
		v.Stdout, v.Stderr = trimOutput(out.String(), sdk), trimOutput(errOut.String(), sdk)
		if c.Op == opRepl {
			v.Status = str(obj["status"], "unknown")
			v.Language = str(obj["language"], "unknown")
			if v.Status == "error" || v.Status == "exception" {
				v.HasError = true
			}
			return v, nil
		}
		v.HasError = false
		v.ExitCode = -1
		if n, ok := obj["exit_code"].(float64); ok {
			if sdk == "rust" && n != math.Trunc(n) { // as_i64
				n = -1
			}
			v.ExitCode = int(n)
		}
		if b, ok := obj["success"].(bool); ok {
			v.Success = b
		}
		return v, nil
	case opMetrics:
		var first map[string]any
		if obj != nil {
			if list, ok := obj["sandboxes"].([]any); ok && len(list) > 0 {
				first, _ = list[0].(map[string]any)
			}
		}
		if first == nil {
			return v, nil
		}
		v.Running, _ = first["running"].(bool)
		num := func(k string, unsigned bool) *float64 {
			n, ok := first[k].(float64)
			if !ok || (unsigned && sdk == "rust" && (n < 0 || n != math.Trunc(n))) { // as_u64
				return nil
			}
			return &n
		}
		v.CPU, v.Memory, v.Disk = num("cpu_usage", false), num("memory_usage", true), num("disk_usage", true)
		return v, nil
	}
	panic("no reading for " + c.Op)
}

// outputLines is result.output as [stream, text] pairs. Python adds
// text + "\n" (a non-string text raises), JS stringifies it, Rust skips a
// line that is not an object and defaults a non-string to "".
func outputLines(x any, sdk string) ([][2]string, error) {
	list, ok := x.([]any)
	if !ok {
		if x != nil && sdk == "python" {
			return nil, fmt.Errorf("output %v is not a list", x)
		}
		return nil, nil
	}
	var out [][2]string
	for _, e := range list {
		m, ok := e.(map[string]any)
		if !ok {
			continue
		}
		stream, _ := m["stream"].(string)
		text, ok := m["text"].(string)
		if !ok && sdk == "python" && (stream == "stdout" || stream == "stderr") {
			return nil, fmt.Errorf("output line %v: text is not a string", m)
		}
		out = append(out, [2]string{stream, text})
	}
	return out, nil
}

// trimOutput: Python rstrip()s, JS trim()s, Rust and Go drop one "\n".
func trimOutput(s, sdk string) string {
	switch sdk {
	case "python":
		return strings.TrimRight(s, " \t\n\r\v\f")
	case "javascript":
		return strings.TrimSpace(s)
	}
	return strings.TrimSuffix(s, "\n")
}

func str(x any, def string) string {
	if s, ok := x.(string); ok && s != "" {
		return s
	}
	return def
}

// readGo is the Go SDK: status 200 exactly, a typed envelope (id a string
// or null), typed results.
func readGo(c call, status int, body []byte) (view, error) {
	var v view
	if status != http.StatusOK {
		return v, fmt.Errorf("status %d: %s", status, body)
	}
	var env struct {
		JSONRPC string          `json:"jsonrpc"`
		Result  json.RawMessage `json:"result,omitempty"`
		Error   *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Data    any    `json:"data,omitempty"`
		} `json:"error,omitempty"`
		ID string `json:"id"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return v, fmt.Errorf("unmarshal response: %w", err)
	}
	if env.Error != nil {
		return v, fmt.Errorf("RPC error: %s", env.Error.Message)
	}
	type line struct {
		Stream string `json:"stream"`
		Text   string `json:"text"`
	}
	join := func(lines []line) {
		var out, errOut strings.Builder
		for _, l := range lines {
			switch l.Stream {
			case "stdout":
				out.WriteString(l.Text + "\n")
				v.StdoutLines++
			case "stderr":
				errOut.WriteString(l.Text + "\n")
				if l.Text != "" {
					v.HasError = true
				}
			}
		}
		v.Stdout, v.Stderr = trimOutput(out.String(), "go"), trimOutput(errOut.String(), "go")
	}
	switch c.Op {
	case opStart, opStop:
		return v, nil
	case opRepl:
		var r struct {
			Output   []line `json:"output"`
			Status   string `json:"status"`
			Language string `json:"language"`
		}
		if err := json.Unmarshal(env.Result, &r); err != nil {
			return v, fmt.Errorf("execution output could not be parsed: %w", err)
		}
		join(r.Output)
		v.Status, v.Language = r.Status, r.Language
		if r.Status == "error" || r.Status == "exception" {
			v.HasError = true
		}
		return v, nil
	case opCommand:
		var r struct {
			Output   []line   `json:"output"`
			Command  string   `json:"command"`
			Args     []string `json:"args"`
			ExitCode int      `json:"exit_code"`
			Success  bool     `json:"success"`
		}
		if err := json.Unmarshal(env.Result, &r); err != nil {
			return v, fmt.Errorf("execution output could not be parsed: %w", err)
		}
		join(r.Output)
		v.HasError = false
		v.ExitCode, v.Success = r.ExitCode, r.Success
		return v, nil
	case opMetrics:
		var r struct {
			Sandboxes []struct {
				Name        string  `json:"name"`
				Running     bool    `json:"running"`
				CPUUsage    float64 `json:"cpu_usage"`
				MemoryUsage int     `json:"memory_usage"`
				DiskUsage   int     `json:"disk_usage"`
			} `json:"sandboxes"`
		}
		if err := json.Unmarshal(env.Result, &r); err != nil {
			return v, fmt.Errorf("unmarshal metrics result: %w", err)
		}
		if len(r.Sandboxes) == 0 {
			return v, nil
		}
		m := r.Sandboxes[0]
		cpu, mem, disk := m.CPUUsage, float64(m.MemoryUsage), float64(m.DiskUsage)
		v.Running, v.CPU, v.Memory, v.Disk = m.Running, &cpu, &mem, &disk
		return v, nil
	}
	panic("no reading for " + c.Op)
}

// fmtNum prints a metric for a failure message.
func fmtNum(p *float64) string {
	if p == nil {
		return "nil"
	}
	return strconv.FormatFloat(*p, 'g', -1, 64)
}
