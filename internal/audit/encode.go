package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strconv"
)

// appendRecord appends r's JSON encoding to b: the bytes json.Marshal(r)
// gives (TestEncodeAsMarshal), written without reflection for what the
// request path records (the envelope, calls and runs), since encoding was
// a quarter of a record's cost there; the other kinds' parts go through
// json.Marshal.
func appendRecord(b []byte, r *Record) ([]byte, error) {
	var err error
	b = append(b, `{"kind":`...)
	b = appendString(b, string(r.Kind))
	b = append(b, `,"time":"`...)
	if b, err = r.Time.AppendText(b); err != nil {
		return nil, err
	}
	b = append(b, '"')
	b = appendField(b, "namespace", r.Namespace)
	b = appendField(b, "sandbox", r.Sandbox)
	if len(r.Labels) > 0 {
		b = appendLabels(b, r.Labels)
	}
	b = appendField(b, "key_id", r.KeyID)
	b = appendField(b, "request_id", r.RequestID)
	if r.Call != nil {
		if b, err = appendCall(append(b, `,"call":`...), r.Call); err != nil {
			return nil, err
		}
	}
	if r.Exec != nil {
		if b, err = appendExec(append(b, `,"exec":`...), r.Exec); err != nil {
			return nil, err
		}
	}
	for _, p := range []struct {
		name string
		v    any
		set  bool
	}{
		{"egress", r.Egress, r.Egress != nil}, {"refusal", r.Refusal, r.Refusal != nil}, {"key", r.Key, r.Key != nil},
		{"config", r.Config, r.Config != nil}, {"usage", r.Usage, r.Usage != nil},
		{"checkpoint", r.Checkpoint, r.Checkpoint != nil}, {"recovery", r.Recovery, r.Recovery != nil},
	} {
		if !p.set {
			continue
		}
		v, err := json.Marshal(p.v)
		if err != nil {
			return nil, err
		}
		b = append(appendString(append(b, ','), p.name), ':')
		b = append(b, v...)
	}
	return append(b, '}'), nil
}

func appendCall(b []byte, c *Call) ([]byte, error) {
	b = append(b, `{"method":`...)
	b = appendString(b, c.Method)
	if len(c.Params) > 0 {
		// Checked, compacted and HTML-escaped, as json.Marshal does a
		// RawMessage (Params' own result already is all three).
		b = append(b, `,"params":`...)
		start := len(b)
		buf := bytes.NewBuffer(b)
		if err := json.Compact(buf, c.Params); err != nil {
			return nil, err
		}
		b = buf.Bytes()
		if needsHTMLEscape(b[start:]) {
			var esc bytes.Buffer
			json.HTMLEscape(&esc, b[start:])
			b = append(b[:start], esc.Bytes()...)
		}
	}
	b = append(b, `,"outcome":`...)
	b = appendString(b, c.Outcome)
	b = append(b, `,"duration_ms":`...)
	b, err := appendFloat(b, c.DurationMs)
	return append(b, '}'), err
}

func appendExec(b []byte, e *Exec) ([]byte, error) {
	b = append(b, `{"via":`...)
	b = appendString(b, e.Via)
	if len(e.Argv) > 0 {
		b = append(b, `,"argv":[`...)
		for i, a := range e.Argv {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, a)
		}
		b = append(b, ']')
	}
	b = appendField(b, "argv_sha256", e.ArgvSHA256)
	b = appendField(b, "language", e.Language)
	b = appendField(b, "code_sha256", e.CodeSHA256)
	if e.CodeBytes != 0 {
		b = strconv.AppendInt(append(b, `,"code_bytes":`...), int64(e.CodeBytes), 10)
	}
	if e.ExitCode != nil {
		b = strconv.AppendInt(append(b, `,"exit_code":`...), int64(*e.ExitCode), 10)
	}
	b = appendField(b, "signal", e.Signal)
	if e.TimedOut {
		b = append(b, `,"timed_out":true`...)
	}
	if e.OOMKilled {
		b = append(b, `,"oom_killed":true`...)
	}
	b = appendField(b, "process_id", e.ProcessID)
	b = append(b, `,"outcome":`...)
	b = appendString(b, e.Outcome)
	b = append(b, `,"duration_ms":`...)
	b, err := appendFloat(b, e.DurationMs)
	return append(b, '}'), err
}

// needsHTMLEscape reports whether b may hold what json.HTMLEscape escapes:
// <, > or &, or the first byte of U+2028 or U+2029.
func needsHTMLEscape(b []byte) bool {
	for _, c := range b {
		if c == '<' || c == '>' || c == '&' || c == 0xe2 {
			return true
		}
	}
	return false
}

// appendField appends ,"name":"v" unless v is empty (omitempty).
func appendField(b []byte, name, v string) []byte {
	if v == "" {
		return b
	}
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	return appendString(b, v)
}

// appendLabels appends ,"labels":{...} with the keys sorted, as
// encoding/json orders a map's.
func appendLabels(b []byte, labels map[string]string) []byte {
	var arr [16]string
	keys := arr[:0]
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, `,"labels":{`...)
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(appendString(b, k), ':')
		b = appendString(b, labels[k])
	}
	return append(b, '}')
}

// appendFloat appends f as encoding/json writes a float64.
func appendFloat(b []byte, f float64) ([]byte, error) {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return nil, errors.New("audit: unsupported value " + strconv.FormatFloat(f, 'g', -1, 64))
	}
	format := byte('f')
	if a := math.Abs(f); a != 0 && (a < 1e-6 || a >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// e-09 to e-9, as encoding/json does
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, nil
}
