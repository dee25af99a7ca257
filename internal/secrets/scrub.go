package secrets

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
)

// A Scrubber knows the secret values the server has read and replaces
// them, wherever they occur, with ScrubMarker in text the server is about
// to write for others to read: its log and its audit log. It is defence
// in depth: no code path puts a value there (values travel as Value,
// which never prints, and params carry names), but a value the server
// never meant to handle (a client sending one in a command's input, say)
// is caught as well.
//
// Invariants:
//   - a value is known from the first start that reads it for as long as
//     the server runs (a rotated value stays secret), at most
//     MaxScrubbed values (the oldest forgotten first);
//   - a value shorter than MinScrub bytes is not scrubbed: blindly
//     replacing short strings would scrub common words and numbers
//     wherever they appear, and mangle records for nothing;
//   - each value is looked for as it is and in the escaped forms the
//     server's encoders give it (JSON, Go-quoted), so a value with a
//     quote or a backslash is caught inside a JSON string or a log line;
//   - the cost of a text without values is one pass over it, whatever the
//     number of values (a window filter); JSON stays valid JSON.
//
// A Scrubber is safe for concurrent use; reads take no lock.
type Scrubber struct {
	mu  sync.Mutex // serialises Add
	set atomic.Pointer[scrubSet]
}

// ScrubMarker replaces a value a Scrubber finds.
const ScrubMarker = "[secret]"

// Bounds.
const (
	// MinScrub is the shortest value scrubbed, in bytes.
	MinScrub = 8
	// MaxScrubbed bounds the values known.
	MaxScrubbed = 4096
)

// scrubSet is an immutable set of values, with the forms looked for.
type scrubSet struct {
	values []scrubValue // in the order added
	forms  [][]byte     // every value's forms, each once
	// filter has a bit for the hash of each form's first 8 bytes: a
	// text's window whose bit is clear starts no form.
	filter [filterBits / 64]uint64
	heads  map[uint64][]int // first 8 bytes → forms
}

type scrubValue struct {
	v     []byte
	forms [][]byte
}

const filterBits = 1 << 16

func windowHash(w uint64) uint64 { return (w * 0x9E3779B97F4A7C15) >> (64 - 16) }

// NewScrubber returns a Scrubber that knows no value yet.
func NewScrubber() *Scrubber { return &Scrubber{} }

// Add makes the scrubber know values (those of at least MinScrub bytes).
// A nil Scrubber ignores them.
func (s *Scrubber) Add(values ...Value) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.set.Load()
	if old == nil {
		old = &scrubSet{}
	}
	var added []scrubValue
	for _, v := range values {
		b := v.Reveal()
		if len(b) < MinScrub || old.known(b) || slices.ContainsFunc(added, func(x scrubValue) bool { return bytes.Equal(x.v, b) }) {
			continue
		}
		c := bytes.Clone(b)
		added = append(added, scrubValue{v: c, forms: forms(c)})
	}
	if len(added) == 0 {
		return
	}
	all := append(slices.Clip(old.values), added...)
	if len(all) > MaxScrubbed {
		// The oldest forgotten: the set is made again.
		s.set.Store(newScrubSet(nil, all[len(all)-MaxScrubbed:]))
		return
	}
	s.set.Store(newScrubSet(old, added))
}

func (set *scrubSet) known(b []byte) bool {
	if len(b) < 8 {
		return false
	}
	for _, fi := range set.heads[binary.LittleEndian.Uint64(b)] {
		if bytes.Equal(set.forms[fi], b) {
			return true
		}
	}
	return false
}

// newScrubSet is base (nil: empty) with values added; base is not changed.
func newScrubSet(base *scrubSet, values []scrubValue) *scrubSet {
	set := &scrubSet{heads: map[uint64][]int{}}
	if base != nil {
		set.values = slices.Clip(base.values)
		set.forms = slices.Clip(base.forms)
		set.filter = base.filter
		for h, fis := range base.heads {
			set.heads[h] = slices.Clip(fis)
		}
	}
	for _, v := range values {
		set.values = append(set.values, v)
		for _, f := range v.forms {
			if len(f) < MinScrub || set.known(f) {
				continue
			}
			head := binary.LittleEndian.Uint64(f)
			h := windowHash(head)
			set.filter[h/64] |= 1 << (h % 64)
			set.heads[head] = append(set.heads[head], len(set.forms))
			set.forms = append(set.forms, f)
		}
	}
	return set
}

// forms are v and its escaped forms: in a JSON string (as encoding/json
// writes it, HTML characters escaped or not) and in a Go-quoted string
// (slog's text handler).
func forms(v []byte) [][]byte {
	fs := [][]byte{v}
	var buf bytes.Buffer
	for _, html := range []bool{true, false} {
		buf.Reset()
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(html)
		if enc.Encode(string(v)) == nil {
			q := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
			fs = append(fs, bytes.Clone(q[1:len(q)-1]))
		}
	}
	q := strconv.Quote(string(v))
	return append(fs, []byte(q[1:len(q)-1]))
}

// find returns the first occurrence of a form in b at or after from: its
// offset and the form's index, or -1.
func (set *scrubSet) find(b []byte, from int) (int, int) {
	for i := from; i+8 <= len(b); i++ {
		w := binary.LittleEndian.Uint64(b[i:])
		h := windowHash(w)
		if set.filter[h/64]&(1<<(h%64)) == 0 {
			continue
		}
		for _, fi := range set.heads[w] {
			if bytes.HasPrefix(b[i:], set.forms[fi]) {
				return i, fi
			}
		}
	}
	return -1, -1
}

// Scrub returns b with every known value (in every form) replaced by
// ScrubMarker; b itself when it holds none.
func (s *Scrubber) Scrub(b []byte) []byte {
	set := s.load()
	if set == nil {
		return b
	}
	i, fi := set.find(b, 0)
	if i < 0 {
		return b
	}
	out := make([]byte, 0, len(b))
	last := 0
	for i >= 0 {
		out = append(append(out, b[last:i]...), ScrubMarker...)
		last = i + len(set.forms[fi])
		i, fi = set.find(b, last)
	}
	return append(out, b[last:]...)
}

// ScrubJSON is Scrub for a JSON text, whose result is JSON still: a value
// found is replaced where it is when that leaves the text valid, else in
// every string of the decoded text, which is encoded again (member order
// kept). It fits audit.Options.Redact.
func (s *Scrubber) ScrubJSON(b []byte) []byte {
	set := s.load()
	if set == nil {
		return b
	}
	if i, _ := set.find(b, 0); i < 0 {
		return b
	}
	out := s.Scrub(b)
	if json.Valid(out) {
		return out
	}
	re, err := rewriteStrings(b, func(str string) string {
		sb := []byte(str)
		for _, v := range set.values {
			sb = bytes.ReplaceAll(sb, v.v, []byte(ScrubMarker))
		}
		return string(sb)
	})
	if err != nil {
		// Not JSON to begin with: nothing better than the plain scrub.
		return out
	}
	return re
}

func (s *Scrubber) load() *scrubSet {
	if s == nil {
		return nil
	}
	return s.set.Load()
}

// rewriteStrings re-encodes the JSON text b with every string (member
// names too) passed through f, members in their order.
func rewriteStrings(b []byte, f func(string) string) ([]byte, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var out bytes.Buffer
	// Per open container: whether it is an object, and how many tokens
	// it has had (in an object, even ones are names).
	type level struct {
		object bool
		n      int
	}
	var stack []level
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if delim, ok := tok.(json.Delim); ok && (delim == '}' || delim == ']') {
			stack = stack[:len(stack)-1]
			out.WriteByte(byte(delim))
			continue
		}
		if len(stack) > 0 {
			top := &stack[len(stack)-1]
			switch {
			case top.object && top.n%2 == 1:
				out.WriteByte(':')
			case top.n > 0:
				out.WriteByte(',')
			}
			top.n++
		}
		switch x := tok.(type) {
		case json.Delim:
			out.WriteByte(byte(x))
			stack = append(stack, level{object: x == '{'})
		case string:
			enc, err := json.Marshal(f(x))
			if err != nil {
				return nil, err
			}
			out.Write(enc)
		case json.Number:
			out.WriteString(string(x))
		case bool:
			out.WriteString(strconv.FormatBool(x))
		case nil:
			out.WriteString("null")
		}
	}
	return out.Bytes(), nil
}

// Writer returns w behind s: every Write's bytes are scrubbed first. Each
// Write must hold whole lines (slog's handlers write a record at once),
// so that no value is split between two writes.
func (s *Scrubber) Writer(w io.Writer) io.Writer { return scrubWriter{s: s, w: w} }

type scrubWriter struct {
	s *Scrubber
	w io.Writer
}

func (sw scrubWriter) Write(p []byte) (int, error) {
	if _, err := sw.w.Write(sw.s.Scrub(p)); err != nil {
		return 0, err
	}
	return len(p), nil
}
