package audit

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// Params returns raw (a JSON object of params) fit for a record: values
// of keys that look secret (secret, token, key, password... anywhere in
// the name, at any depth) and the values of "env" entries ("K=V" strings
// or an object) are "[redacted]"; long strings are clipped with a
// "…[+N bytes]" marker; params still larger than MaxParams, too large to
// parse, nested deeper than maxParamsDepth or not JSON become
// {"[truncated]": "N bytes"}.
//
// It runs on every call's request path, so it rewrites raw in one pass
// (scrubber) rather than decoding it into maps and encoding those again:
// the members keep their order and numbers their text; strings are
// encoded as encoding/json encodes them.
func Params(raw []byte) json.RawMessage {
	if len(raw) == 0 {
		return nil
	}
	if len(raw) > maxParamsWalk {
		return truncatedParams(len(raw))
	}
	p := scrubber{in: raw, out: make([]byte, 0, len(raw)+16)}
	if !p.value(keep, 0) || p.space() != len(raw) || len(p.out) > MaxParams {
		return truncatedParams(len(raw))
	}
	return p.out
}

// maxParamsDepth bounds the nesting of params (encoding/json's own bound).
const maxParamsDepth = 10000

func truncatedParams(n int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"[truncated]":"params of %d bytes"}`, n))
}

// scrubber reads one JSON value from in and appends its redacted,
// clipped, compact form to out. Each method reads one value from in at i
// and reports false when in is not JSON (or too deep, or the output past
// MaxParams): Params then keeps a marker only.
type scrubber struct {
	in  []byte
	i   int
	out []byte
}

// How a value is written, by the key it is the value of.
type mode uint8

const (
	keep   mode = iota // as it is, its strings clipped
	secret             // a secret-looking key's: "[redacted]", whatever it is
	env                // "env"'s: an object's values and an array's entries redacted
	skip               // read and checked, not written
)

var redactedJSON = []byte(`"` + Redacted + `"`)

func (p *scrubber) emit(b []byte) {
	p.out = append(p.out, b...)
}

// space skips white space and returns i.
func (p *scrubber) space() int {
	for p.i < len(p.in) {
		switch p.in[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return p.i
		}
	}
	return p.i
}

func (p *scrubber) value(m mode, depth int) bool {
	if p.space() == len(p.in) || depth > maxParamsDepth || len(p.out) > MaxParams {
		return false
	}
	if m == secret {
		if !p.value(skip, depth) {
			return false
		}
		p.emit(redactedJSON)
		return true
	}
	switch p.in[p.i] {
	case '{':
		return p.object(m, depth+1)
	case '[':
		return p.array(m, depth+1)
	case '"':
		s, ok := p.str()
		switch {
		case !ok:
			return false
		case m == keep:
			p.out = appendString(p.out, clipBytes(s, maxString))
		case m == env:
			p.emit(redactedJSON)
		}
		return true
	}
	start := p.i
	if !p.scalar() {
		return false
	}
	switch lit := p.in[start:p.i]; {
	case m == env && lit[0] != 'n': // null stays null
		p.emit(redactedJSON)
	case m != skip:
		p.emit(lit)
	}
	return true
}

// object reads {"k": v, ...}; a member's value is written by its key:
// redacted when the key looks secret, as "env" when it is "env", all
// redacted in an "env" object.
func (p *scrubber) object(m mode, depth int) bool {
	p.i++ // {
	if m != skip {
		p.emit([]byte{'{'})
	}
	if p.space() < len(p.in) && p.in[p.i] == '}' {
		p.i++
		if m != skip {
			p.emit([]byte{'}'})
		}
		return true
	}
	for n := 0; ; n++ {
		if p.space() == len(p.in) || p.in[p.i] != '"' {
			return false
		}
		k, ok := p.str()
		if !ok || p.space() == len(p.in) || p.in[p.i] != ':' {
			return false
		}
		p.i++
		vm := skip
		if m != skip {
			if n > 0 {
				p.emit([]byte{','})
			}
			p.out = append(appendString(p.out, k), ':')
			switch name := string(k); {
			case m == env || secretName(name):
				vm = secret
			case name == "env":
				vm = env
			default:
				vm = keep
			}
		}
		if !p.value(vm, depth) {
			return false
		}
		if p.space() == len(p.in) {
			return false
		}
		switch p.in[p.i] {
		case ',':
			p.i++
		case '}':
			p.i++
			if m != skip {
				p.emit([]byte{'}'})
			}
			return true
		default:
			return false
		}
	}
}

// array reads [v, ...]: an "env" array's strings become "NAME=[redacted]"
// and its other entries "[redacted]"; other arrays' entries are written
// as values of no key.
func (p *scrubber) array(m mode, depth int) bool {
	p.i++ // [
	if m != skip {
		p.emit([]byte{'['})
	}
	if p.space() < len(p.in) && p.in[p.i] == ']' {
		p.i++
		if m != skip {
			p.emit([]byte{']'})
		}
		return true
	}
	for n := 0; ; n++ {
		if n > 0 && m != skip {
			p.emit([]byte{','})
		}
		switch {
		case m == env && p.space() < len(p.in) && p.in[p.i] == '"':
			s, ok := p.str()
			if !ok {
				return false
			}
			name, _, _ := cutByte(s, '=')
			// "NAME=[redacted]": the name encoded, then the rest, which
			// needs no escaping, inside its quotes.
			p.out = appendString(p.out, clipBytes(name, 256))
			p.out = append(p.out[:len(p.out)-1], "="+Redacted+`"`...)
		case m == env:
			if !p.value(secret, depth) {
				return false
			}
		default:
			if !p.value(m, depth) {
				return false
			}
		}
		if p.space() == len(p.in) {
			return false
		}
		switch p.in[p.i] {
		case ',':
			p.i++
		case ']':
			p.i++
			if m != skip {
				p.emit([]byte{']'})
			}
			return true
		default:
			return false
		}
	}
}

// str reads a string and returns its value: the bytes of in when they
// need no decoding (printable ASCII without escapes), else a decoded copy
// (invalid UTF-8 becomes U+FFFD, as encoding/json decodes it).
func (p *scrubber) str() ([]byte, bool) {
	start := p.i
	p.i++ // "
	plain := true
	for p.i < len(p.in) {
		switch c := p.in[p.i]; {
		case c == '"':
			p.i++
			if plain {
				return p.in[start+1 : p.i-1], true
			}
			var s string
			if json.Unmarshal(p.in[start:p.i], &s) != nil {
				return nil, false
			}
			return []byte(s), true
		case c == '\\':
			plain = false
			p.i += 2
		default:
			plain = plain && c >= 0x20 && c < utf8.RuneSelf
			p.i++
		}
	}
	return nil, false
}

// scalar reads a number, true, false or null (checked as JSON has them).
func (p *scrubber) scalar() bool {
	for _, lit := range []string{"true", "false", "null"} {
		if len(p.in)-p.i >= len(lit) && string(p.in[p.i:p.i+len(lit)]) == lit {
			p.i += len(lit)
			return true
		}
	}
	// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
	if p.i < len(p.in) && p.in[p.i] == '-' {
		p.i++
	}
	switch {
	case p.i < len(p.in) && p.in[p.i] == '0':
		p.i++
	case !p.digits():
		return false
	}
	if p.i < len(p.in) && p.in[p.i] == '.' {
		p.i++
		if !p.digits() {
			return false
		}
	}
	if p.i < len(p.in) && (p.in[p.i] == 'e' || p.in[p.i] == 'E') {
		p.i++
		if p.i < len(p.in) && (p.in[p.i] == '+' || p.in[p.i] == '-') {
			p.i++
		}
		if !p.digits() {
			return false
		}
	}
	return true
}

// digits reads one or more decimal digits.
func (p *scrubber) digits() bool {
	start := p.i
	for p.i < len(p.in) && p.in[p.i] >= '0' && p.in[p.i] <= '9' {
		p.i++
	}
	return p.i > start
}

func cutByte(s []byte, c byte) (before, after []byte, found bool) {
	for i, b := range s {
		if b == c {
			return s[:i], s[i+1:], true
		}
	}
	return s, nil, false
}

// clipBytes is Clip for a string held in bytes.
func clipBytes(s []byte, n int) []byte {
	if len(s) <= n {
		return s
	}
	return []byte(Clip(string(s), n))
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string, escaped exactly as
// encoding/json escapes it (HTML characters, U+2028 and U+2029 included;
// invalid UTF-8 becomes U+FFFD), so a record reads the same whichever
// wrote it.
func appendString[T string | []byte](b []byte, s T) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		var rb [utf8.UTFMax]byte
		r, size := utf8.DecodeRune(rb[:copy(rb[:], s[i:])])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
