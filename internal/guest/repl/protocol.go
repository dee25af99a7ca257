//go:build linux

package repl

// The control channel between the engine and a driver program.
//
// Every frame, in both directions, is a 1-byte type, a 4-byte big-endian
// payload length and the payload. The interpreter is untrusted (user code can
// write to any descriptor it finds), so the reader bounds every length, skips
// unknown types and never panics; a frame longer than maxFrame desynchronises
// the stream and ends the interpreter.
//
// Engine → driver:
//
//	'c' {"limit":N}                               configure; answered by 'h'
//	'x' {"id":N,"code":S,"marker":S,"interruptible":B,"limit":N} run code
//	'i' {"id":N}                                  interrupt run N (Node: awaits)
//
// Driver → engine:
//
//	'h' {}                  ready
//	'o' bytes               stdout written by the code (sys.stdout, console.log)
//	'e' bytes               stderr written by the code, and tracebacks
//	'r' resultFrame         run finished; written after the end markers
//
// Output written straight to fd 1/2 (subprocesses) travels on the
// interpreter's real stdout/stderr pipes. At the end of each run the driver
// writes the run's marker (markerPrefix + id + "\n") to both, so the engine
// can tell what was written before the run ended.

import (
	"bytes"
	"encoding/binary"
	"io"
	"sync"
	"unicode/utf8"

	"github.com/warren-sandbox/warren/internal/wire"
)

const (
	frameConfig    = 'c'
	frameRun       = 'x'
	frameInterrupt = 'i'

	frameHello  = 'h'
	frameStdout = 'o'
	frameStderr = 'e'
	frameResult = 'r'

	headerLen = 5
	// maxFrame bounds any frame the engine accepts. Output frames are
	// streamed, not buffered; result frames hold at most 1 MiB of repr,
	// which JSON escaping can grow up to sixfold.
	maxFrame = 8 << 20
	// maxErrorLen bounds ReplResult.Error.
	maxErrorLen = 4096
)

// resultFrame is the payload of a 'r' frame.
type resultFrame struct {
	ID        uint64  `json:"id"`
	Status    string  `json:"status"` // "ok", "error", "interrupted"
	Result    *string `json:"result"`
	Error     string  `json:"error"`
	Truncated bool    `json:"truncated"`
	// Marks says which of fd 1 and fd 2 got the end marker.
	Marks [2]bool `json:"marks"`
}

// appendFrame appends one frame to dst.
func appendFrame(dst []byte, typ byte, payload []byte) []byte {
	dst = append(dst, typ, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(dst[len(dst)-4:], uint32(len(payload))) //nolint:gosec // payloads are bounded by MaxCode (16 MiB), far below 4 GiB
	return append(dst, payload...)
}

// stream indexes: 0 stdout, 1 stderr.
var streamNames = [2]string{wire.Stdout, wire.Stderr}

// Output sources: frames from the driver, and the raw fd 1/2 pipes.
const (
	srcFrame = 0
	srcRaw   = 1
)

// collector gathers the output of one run as lines, within a byte budget.
// Each line costs its text length plus one for the newline (when it had
// one), so even a flood of empty lines is bounded.
//
// Partial lines are assembled per source and stream: frames and raw pipe
// bytes arrive on different pipes, so their relative order is only as good
// as their arrival order, and mixing them into one line could garble both.
type collector struct {
	seq   uint64
	limit int

	mu        sync.Mutex
	used      int
	truncated bool
	lines     []wire.OutputLine
	pend      [2][2][]byte // partial line per source and stream
}

func newCollector(seq uint64, limit int) *collector {
	return &collector{seq: seq, limit: limit}
}

// write adds bytes written by source src to stream s.
func (c *collector) write(src, s int, b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pend := &c.pend[src][s]
	for len(b) > 0 && !c.truncated {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			*pend = append(*pend, b...)
			if len(*pend) > c.limit-c.used {
				// Valid text never shrinks, so this line cannot fit.
				c.addLine(s, *pend, false)
			}
			return
		}
		line := b[:i]
		if len(*pend) > 0 {
			line = append(*pend, line...)
		}
		c.addLine(s, line, true)
		*pend = (*pend)[:0]
		b = b[i+1:]
	}
}

// addLine appends one line, or as much of it as the budget allows.
func (c *collector) addLine(s int, raw []byte, newline bool) {
	text := sanitize(raw)
	cost := len(text)
	if newline {
		cost++
	}
	if c.used+cost > c.limit || len(c.lines) >= wire.MaxReplLines {
		room := c.limit - c.used
		if room > 0 && len(c.lines) < wire.MaxReplLines {
			text = cutUTF8(text, room)
			if text != "" {
				c.lines = append(c.lines, wire.OutputLine{Stream: streamNames[s], Text: text})
				c.used += len(text)
			}
		}
		c.truncated = true
		c.pend = [2][2][]byte{}
		return
	}
	c.lines = append(c.lines, wire.OutputLine{Stream: streamNames[s], Text: text})
	c.used += cost
}

// flushLocked turns the partial lines into lines: a trailing partial line
// counts as a line.
func (c *collector) flushLocked() {
	for src := range c.pend {
		for s := range c.pend[src] {
			if len(c.pend[src][s]) > 0 && !c.truncated {
				c.addLine(s, c.pend[src][s], false)
			}
			c.pend[src][s] = nil
		}
	}
}

// finish flushes partial lines and returns the output.
func (c *collector) finish() ([]wire.OutputLine, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flushLocked()
	lines := c.lines
	if lines == nil {
		lines = []wire.OutputLine{}
	}
	return lines, c.truncated
}

// add appends a line the engine itself writes (timeouts, restarts) after
// flushing partial lines. It ignores the budget: these lines are short and
// must not be lost.
func (c *collector) add(s int, text string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flushLocked()
	c.lines = append(c.lines, wire.OutputLine{Stream: streamNames[s], Text: text})
}

// sanitize converts raw output to a string, replacing every byte that is not
// part of valid UTF-8 with U+FFFD.
func sanitize(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	out := make([]byte, 0, len(b)+8)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			out = utf8.AppendRune(out, utf8.RuneError)
		} else {
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return string(out)
}

// cutUTF8 returns the longest prefix of s of at most n bytes that does not
// split a rune.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// truncateError bounds an error summary and keeps it one valid line.
func truncateError(s string) string {
	if i := bytes.IndexAny([]byte(s), "\r\n"); i >= 0 {
		s = s[:i]
	}
	return cutUTF8(sanitize([]byte(s)), maxErrorLen)
}

// markerScanner splits a raw output pipe into output bytes and end markers
// (prefix + decimal run id + "\n"). It keeps a tail that may be the start of
// a marker until more bytes arrive.
type markerScanner struct {
	prefix []byte
	carry  []byte
}

// maxSeqDigits bounds the decimal run id in a marker.
const maxSeqDigits = 20

// scan processes data, calling out for output bytes and mark for each
// complete marker, in stream order. It must not retain data.
func (m *markerScanner) scan(data []byte, out func([]byte), mark func(uint64)) {
	if len(m.carry) > 0 {
		data = append(m.carry, data...)
		m.carry = nil
	}
	for len(data) > 0 {
		i := bytes.Index(data, m.prefix)
		if i < 0 {
			k := partialPrefix(data, m.prefix)
			out(data[:len(data)-k])
			if k > 0 {
				m.carry = append([]byte(nil), data[len(data)-k:]...)
			}
			return
		}
		out(data[:i])
		rest := data[i+len(m.prefix):]
		lim := min(len(rest), maxSeqDigits+1)
		j := bytes.IndexByte(rest[:lim], '\n')
		if j < 0 && len(rest) <= maxSeqDigits {
			m.carry = append([]byte(nil), data[i:]...)
			return
		}
		seq, ok := parseSeq(rest, j)
		if !ok {
			// Not a marker after all: pass the prefix through as output.
			out(data[i : i+len(m.prefix)])
			data = rest
			continue
		}
		mark(seq)
		data = rest[j+1:]
	}
}

// flush returns bytes held back at EOF.
func (m *markerScanner) flush(out func([]byte)) {
	if len(m.carry) > 0 {
		out(m.carry)
		m.carry = nil
	}
}

func parseSeq(b []byte, j int) (uint64, bool) {
	if j <= 0 {
		return 0, false
	}
	var n uint64
	for _, c := range b[:j] {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if n > (1<<64-1-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}

// partialPrefix is the length of the longest suffix of data that is a
// proper prefix of p.
func partialPrefix(data, p []byte) int {
	k := min(len(data), len(p)-1)
	for ; k > 0; k-- {
		if bytes.HasSuffix(data, p[:k]) {
			return k
		}
	}
	return 0
}

// frameReader reads driver frames with bounded sizes.
type frameReader struct {
	r   io.Reader
	hdr [headerLen]byte
	buf []byte
}

// next reads one frame header and returns its type and length.
func (f *frameReader) next() (byte, int, error) {
	if _, err := io.ReadFull(f.r, f.hdr[:]); err != nil {
		return 0, 0, err
	}
	return f.hdr[0], int(binary.BigEndian.Uint32(f.hdr[1:])), nil
}

// payload reads n bytes into a reused buffer.
func (f *frameReader) payload(n int) ([]byte, error) {
	if cap(f.buf) < n {
		f.buf = make([]byte, n)
	}
	b := f.buf[:n]
	_, err := io.ReadFull(f.r, b)
	if cap(f.buf) > 1<<20 {
		f.buf = nil // do not pin a large result buffer
	}
	return b, err
}

// stream passes n bytes to fn in chunks without buffering them whole.
func (f *frameReader) stream(n int, fn func([]byte)) error {
	if cap(f.buf) < 32<<10 {
		f.buf = make([]byte, 32<<10)
	}
	for n > 0 {
		b := f.buf[:min(n, cap(f.buf))]
		if _, err := io.ReadFull(f.r, b); err != nil {
			return err
		}
		fn(b)
		n -= len(b)
	}
	return nil
}
