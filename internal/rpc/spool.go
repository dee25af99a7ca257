package rpc

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"

	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/wire"
)

// The output of sandbox.command.run and sandbox.repl.run is an array of
// lines, up to Options.MaxOutput (64 MiB by default) of text, which JSON
// and its per-line objects can make several times larger. Held as Go
// values, then marshaled whole and copied, one such answer once took the
// server to 1.6 GB. A lineSpool instead keeps the array as its JSON
// encoding, line by line as the output arrives: the first spoolMem bytes
// in memory, the rest in an unlinked temporary file (in $TMPDIR), and the
// answer is written from it. The server's memory then grows with the
// longest line, not with the output.

// spoolMem is how much of a spool stays in memory.
const spoolMem = 1 << 20

// lineSpool is the JSON array of a result's output lines. Its zero value
// is an empty array; it is not safe for concurrent use.
type lineSpool struct {
	mem   bytes.Buffer // the array's first bytes (no brackets)
	f     *os.File     // the rest, when there is more
	fw    *bufio.Writer
	fn    int64 // bytes in f
	count int
	err   error
	// partial lines of stdout and stderr, for add.
	partial [2][]byte
	scratch bytes.Buffer
	enc     *json.Encoder
	// marker: MarshalJSON writes spoolMarker instead (writeSpooled).
	marker bool
}

// add splits a chunk of a stream's output into lines, in the order lines
// are completed.
func (sp *lineSpool) add(stream string, data []byte) {
	i := 0
	if stream == wire.Stderr {
		i = 1
	}
	p := sp.partial[i]
	for len(data) > 0 {
		j := bytes.IndexByte(data, '\n')
		if j < 0 {
			p = append(p, data...)
			break
		}
		if len(p) > 0 {
			p = append(p, data[:j]...)
			sp.line(stream, text(p))
			p = p[:0]
		} else {
			sp.line(stream, text(data[:j]))
		}
		data = data[j+1:]
	}
	sp.partial[i] = p
}

// flush ends the partial lines: a last line without a newline is a line.
func (sp *lineSpool) flush() {
	for i, stream := range []string{wire.Stdout, wire.Stderr} {
		if len(sp.partial[i]) > 0 {
			sp.line(stream, text(sp.partial[i]))
		}
		sp.partial[i] = nil
	}
}

// line appends one line.
func (sp *lineSpool) line(stream, text string) {
	if sp.err != nil {
		return
	}
	if sp.enc == nil {
		sp.enc = json.NewEncoder(&sp.scratch)
	}
	sp.scratch.Reset()
	if sp.count > 0 {
		sp.scratch.WriteByte(',')
	}
	if err := sp.enc.Encode(outputLine{Stream: stream, Text: text}); err != nil {
		sp.err = err
		return
	}
	b := sp.scratch.Bytes()
	b = b[:len(b)-1] // Encode's newline
	sp.count++
	if sp.f == nil && sp.mem.Len()+len(b) <= spoolMem {
		sp.mem.Write(b)
		return
	}
	if sp.f == nil {
		f, err := os.CreateTemp("", "warren-output-*")
		if err != nil {
			sp.err = fmt.Errorf("spool output: %w", err)
			return
		}
		// Unlinked at once: nothing is left behind whatever happens.
		_ = os.Remove(f.Name())
		sp.f, sp.fw = f, bufio.NewWriterSize(f, 64<<10)
	}
	n, err := sp.fw.Write(b)
	sp.fn += int64(n)
	if err != nil {
		sp.err = fmt.Errorf("spool output: %w", err)
	}
}

// done flushes the partial lines and reports whether every line was kept.
func (sp *lineSpool) done() error {
	sp.flush()
	if sp.err == nil && sp.fw != nil {
		if err := sp.fw.Flush(); err != nil {
			sp.err = fmt.Errorf("spool output: %w", err)
		}
	}
	if sp.err != nil {
		sp.Close()
	}
	return sp.err
}

// size is the length of the array's JSON.
func (sp *lineSpool) size() int64 { return 2 + int64(sp.mem.Len()) + sp.fn }

// writeTo writes the array's JSON: a copy, no bulk work to take turns for.
func (sp *lineSpool) writeTo(w io.Writer, _ bulk) error {
	if _, err := io.WriteString(w, "["); err != nil {
		return err
	}
	if _, err := w.Write(sp.mem.Bytes()); err != nil {
		return err
	}
	if sp.f != nil {
		if _, err := io.Copy(w, io.NewSectionReader(sp.f, 0, sp.fn)); err != nil {
			return err
		}
	}
	_, err := io.WriteString(w, "]")
	return err
}

// MarshalJSON is the array whole, for the answers that are not streamed
// (MCP, WebSocket).
func (sp *lineSpool) MarshalJSON() ([]byte, error) {
	if sp == nil {
		return []byte("[]"), nil
	}
	if sp.marker {
		return spoolMarker, nil
	}
	var b bytes.Buffer
	b.Grow(int(sp.size()))
	if err := sp.writeTo(&b, bulk{}); err != nil {
		return nil, fmt.Errorf("read spooled output: %w", err)
	}
	return b.Bytes(), nil
}

// Close releases the file; a spool not closed has it closed when it is
// garbage (os.File's cleanup).
func (sp *lineSpool) Close() {
	if sp != nil && sp.f != nil {
		_ = sp.f.Close()
		sp.f, sp.fw = nil, nil
	}
}

// spoolMarker stands for a spool in the JSON of an answer: a string no
// client can guess, so none can forge it in an id or a command's args.
var spoolMarker = func() []byte {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return []byte(`"warren-spooled-output-` + hex.EncodeToString(b) + `"`)
}()

// textMarkers stand for the stdout and stderr of an exec answer, as
// spoolMarker does for a spool.
var textMarkers = [2][]byte{
	append(spoolMarker[:len(spoolMarker)-1:len(spoolMarker)-1], `-stdout"`...),
	append(spoolMarker[:len(spoolMarker)-1:len(spoolMarker)-1], `-stderr"`...),
}

// streamedPart is a part of an answer that is written in pieces rather
// than marshaled with the rest: the length of its JSON, and its JSON.
type streamedPart interface {
	size() int64
	writeTo(io.Writer, bulk) error
}

// streamedParts returns the parts of result that are streamed, with the
// marker each marshals as until done is called; nil when there are none.
func streamedParts(result any) (parts []streamedPart, markers [][]byte, done func()) {
	switch r := result.(type) {
	case commandResult, replResult:
		sp := spoolOf(r)
		if sp == nil {
			return nil, nil, nil
		}
		sp.marker = true
		return []streamedPart{sp}, [][]byte{spoolMarker}, func() { sp.marker = false }
	case execResult:
		if r.Stdout == nil || r.Stderr == nil {
			return nil, nil, nil
		}
		r.Stdout.marker, r.Stderr.marker = textMarkers[0], textMarkers[1]
		return []streamedPart{r.Stdout, r.Stderr}, textMarkers[:], func() { r.Stdout.marker, r.Stderr.marker = nil, nil }
	}
	return nil, nil, nil
}

// spoolOf is the spooled output of a method's result, if it has one.
func spoolOf(result any) *lineSpool {
	switch r := result.(type) {
	case commandResult:
		return r.Output
	case replResult:
		return r.Output
	}
	return nil
}

// writeStreamed writes v, an answer holding parts, each streamed in its
// place: the rest is marshaled with the parts' markers standing in for
// them (until done), then cut at the markers. Parts that hold a file are
// closed once written.
func writeStreamed(w http.ResponseWriter, status int, bk bulk, v any, parts []streamedPart, markers [][]byte, done func()) {
	defer func() {
		for _, p := range parts {
			if c, ok := p.(interface{ Close() }); ok {
				c.Close()
			}
		}
	}()
	b, err := json.Marshal(v)
	done()
	type at struct {
		i    int
		part streamedPart
		mark int
	}
	var cuts []at
	length := int64(len(b))
	for _, p := range parts {
		if t, ok := p.(*outText); ok && t.count(bk) != nil {
			return // the client went away
		}
	}
	for k, m := range markers {
		i := bytes.Index(b, m)
		if err != nil || i < 0 {
			writeJSON(w, http.StatusInternalServerError, response{JSONRPC: "2.0", ID: nullID,
				Error: &errorObject{Code: -32603, Message: fmt.Sprintf("encode response: %v (streamed output not found)", err), Data: map[string]any{"kind": errdefs.Internal}}})
			return
		}
		cuts = append(cuts, at{i, parts[k], len(m)})
		length += parts[k].size() - int64(len(m))
	}
	slices.SortFunc(cuts, func(a, b at) int { return a.i - b.i })
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.FormatInt(length, 10))
	w.WriteHeader(status)
	from := 0
	for _, c := range cuts {
		if _, err := w.Write(b[from:c.i]); err != nil {
			return
		}
		if err := c.part.writeTo(w, bk); err != nil {
			return // the client sees a short body
		}
		from = c.i + c.mark
	}
	_, _ = w.Write(b[from:])
}
