package rpc

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"slices"
	"unicode/utf8"
)

// outText is a command's stdout or stderr in a sandbox.exec or
// sandbox.shell answer: the JSON string of its text (invalid UTF-8
// replaced) or of its base64. An HTTP answer writes it in pieces
// (writeStreamed) rather than marshaling it whole: escaped, one byte of
// output can take six (\u0001), and an answer holding 64 MiB of control
// bytes took ~400 MB to marshal, and as much again to send, per call.
type outText struct {
	b []byte // valid UTF-8 (or base64)
	// n is the length of its JSON, once size has counted it.
	n int64
	// marker: while set, MarshalJSON writes it instead (writeStreamed).
	marker []byte
}

// newOutText is output as an answer carries it: its text, or its base64
// when binary. Valid UTF-8 (the usual case) is kept as it is, not copied.
func newOutText(out []byte, binary bool) *outText {
	switch {
	case binary:
		return &outText{b: base64.StdEncoding.AppendEncode(nil, out)}
	case utf8.Valid(out):
		return &outText{b: out}
	}
	return &outText{b: []byte(text(out))}
}

// textChunk is how much of the text one piece escapes: one turn of bulk
// work (fair.go) of well under a millisecond.
const textChunk = 64 << 10

// MarshalJSON is the string whole, for the answers that are not streamed
// (MCP, WebSocket).
func (t *outText) MarshalJSON() ([]byte, error) {
	if t.marker != nil {
		return t.marker, nil
	}
	return json.Marshal(string(t.b))
}

// size is the length of the string's JSON, quotes included.
func (t *outText) size() int64 {
	if t.n == 0 {
		_ = t.count(bulk{})
	}
	return t.n
}

// count measures the string's JSON a piece at a time, in b's turns when
// it is bulk: counting 64 MiB is bulk work as much as escaping it.
func (t *outText) count(bk bulk) error {
	if t.n != 0 {
		return nil
	}
	n := int64(2)
	for s := t.b; len(s) > 0; {
		k := min(len(s), textChunk)
		for k < len(s) && k > 0 && !utf8.RuneStart(s[k]) {
			k--
		}
		piece := func() error { n += escapedLen(s[:k]); return nil }
		if len(t.b) < bulkBytes {
			_ = piece()
		} else if err := bk.do(piece); err != nil {
			return err
		}
		s = s[k:]
	}
	t.n = n
	return nil
}

// writeTo writes the string's JSON, escaping it a piece at a time in b's
// turns and writing each piece outside them. b is valid UTF-8, cut only at
// the start of a character, and escaping is by character, so the pieces
// make what json.Marshal makes of the whole.
func (t *outText) writeTo(w io.Writer, bk bulk) error {
	// Room for the quote, a piece escaped, and appendEscaped's slack.
	buf := make([]byte, 0, 1+6*textChunk+2)
	buf = append(buf, '"')
	for s := t.b; len(s) > 0; {
		n := min(len(s), textChunk)
		for n < len(s) && n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		escape := func() error { buf = appendEscaped(buf, s[:n]); return nil }
		if len(t.b) < bulkBytes {
			_ = escape()
		} else if err := bk.do(escape); err != nil {
			return err
		}
		if _, err := w.Write(buf); err != nil {
			return err
		}
		buf, s = buf[:0], s[n:]
	}
	_, err := w.Write(append(buf, '"'))
	return err
}

// escWord and escLen are the JSON escape of each ASCII byte json.Marshal
// escapes (control bytes, the quote, the backslash, and <, > and & as
// HTML-safe JSON has them): its escLen bytes, little-endian in a word, so
// that appendEscaped writes an escape with one 8-byte store. Two appends
// per escape cost 2-2.5x as much, and a 64 MiB answer of control bytes is
// 64 Mi escapes. escLen is 0 for the bytes json.Marshal keeps.
var escWord, escLen = func() (w [utf8.RuneSelf]uint64, n [utf8.RuneSelf]uint8) {
	const hex = "0123456789abcdef"
	for c := range utf8.RuneSelf {
		var e []byte
		switch {
		case c == '"' || c == '\\':
			e = []byte{'\\', byte(c)}
		case c == '\b':
			e = []byte(`\b`)
		case c == '\f':
			e = []byte(`\f`)
		case c == '\n':
			e = []byte(`\n`)
		case c == '\r':
			e = []byte(`\r`)
		case c == '\t':
			e = []byte(`\t`)
		case c < 0x20 || c == '<' || c == '>' || c == '&':
			e = []byte{'\\', 'u', '0', '0', hex[c>>4], hex[c&0xF]}
		}
		var b [8]byte
		n[c] = uint8(copy(b[:], e))
		w[c] = binary.LittleEndian.Uint64(b[:])
	}
	return w, n
}()

// escapedLen is the length of valid UTF-8 s escaped as appendEscaped does.
func escapedLen(s []byte) int64 {
	n := int64(len(s))
	for i, c := range s {
		switch {
		case c < utf8.RuneSelf:
			if l := escLen[c]; l != 0 {
				n += int64(l) - 1
			}
		case isLineSep(s, i):
			n += 3 // \u2028 is 6 bytes, the character 3
		}
	}
	return n
}

// isLineSep: s[i:] starts with U+2028 or U+2029, which json.Marshal
// escapes for JavaScript's sake.
func isLineSep(s []byte, i int) bool {
	return s[i] == 0xE2 && i+2 < len(s) && s[i+1] == 0x80 && (s[i+2] == 0xA8 || s[i+2] == 0xA9)
}

// appendEscaped appends valid UTF-8 s as the inside of a JSON string,
// escaped byte for byte as json.Marshal escapes a string. It makes room
// for the worst case first (six bytes for each byte of s, and two more for
// the last escape's 8-byte store) and writes into it: no growth check per
// escape, and no copy between two escapes in a row (a copy of nothing
// still calls memmove: that alone cost 2.5x).
func appendEscaped(dst, s []byte) []byte {
	dst = slices.Grow(dst, 6*len(s)+2)
	n := len(dst)
	d := dst[:cap(dst)]
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		var word uint64
		var l int
		switch {
		case c < utf8.RuneSelf:
			if l = int(escLen[c]); l == 0 {
				continue
			}
			word = escWord[c]
		case isLineSep(s, i):
			word, l = lineSepWord[s[i+2]-0xA8], 6
		default:
			continue
		}
		if start < i {
			n += copy(d[n:], s[start:i])
		}
		binary.LittleEndian.PutUint64(d[n:], word)
		n += l
		if c >= utf8.RuneSelf {
			i += 2 // the rest of U+2028 or U+2029
		}
		start = i + 1
	}
	n += copy(d[n:], s[start:])
	return d[:n]
}

// lineSepWord is the escape of U+2028 and of U+2029, as escWord holds
// an escape.
var lineSepWord = [2]uint64{
	binary.LittleEndian.Uint64([]byte("\\u2028\x00\x00")),
	binary.LittleEndian.Uint64([]byte("\\u2029\x00\x00")),
}
