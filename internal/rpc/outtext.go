package rpc

import (
	"encoding/base64"
	"encoding/json"
	"io"
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

// textChunk is how much of the text one piece escapes.
const textChunk = 64 << 10

// MarshalJSON is the string whole, for the answers that are not streamed
// (MCP, WebSocket).
func (t *outText) MarshalJSON() ([]byte, error) {
	if t.marker != nil {
		return t.marker, nil
	}
	return json.Marshal(string(t.b))
}

// pieces hands the string's JSON to f in pieces, quotes included, each
// escaped exactly as json.Marshal escapes the whole: b is valid UTF-8 and
// cut only at the start of a character, and escaping is by character.
func (t *outText) pieces(f func([]byte) error) error {
	if err := f([]byte(`"`)); err != nil {
		return err
	}
	for s := t.b; len(s) > 0; {
		n := min(len(s), textChunk)
		for n < len(s) && n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		b, err := json.Marshal(string(s[:n]))
		if err != nil {
			return err
		}
		if err := f(b[1 : len(b)-1]); err != nil {
			return err
		}
		s = s[n:]
	}
	return f([]byte(`"`))
}

// size is the length of the string's JSON.
func (t *outText) size() int64 {
	var n int64
	_ = t.pieces(func(b []byte) error { n += int64(len(b)); return nil })
	return n
}

// writeTo writes the string's JSON.
func (t *outText) writeTo(w io.Writer) error {
	return t.pieces(func(b []byte) error { _, err := w.Write(b); return err })
}
