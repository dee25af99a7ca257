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

// writeTo writes the array's JSON.
func (sp *lineSpool) writeTo(w io.Writer) error {
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
	if err := sp.writeTo(&b); err != nil {
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

// writeSpooled writes v, an answer that holds sp, with sp streamed from
// its spool: the rest is marshaled with a marker in sp's place.
func writeSpooled(w http.ResponseWriter, status int, v any, sp *lineSpool) {
	defer sp.Close()
	sp.marker = true
	b, err := json.Marshal(v)
	sp.marker = false
	i := bytes.Index(b, spoolMarker)
	if err != nil || i < 0 {
		writeJSON(w, http.StatusInternalServerError, response{JSONRPC: "2.0", ID: nullID,
			Error: &errorObject{Code: -32603, Message: fmt.Sprintf("encode response: %v (spooled output not found)", err), Data: map[string]any{"kind": errdefs.Internal}}})
		return
	}
	head, tail := b[:i], b[i+len(spoolMarker):]
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.FormatInt(int64(len(head))+sp.size()+int64(len(tail)), 10))
	w.WriteHeader(status)
	if _, err := w.Write(head); err != nil {
		return
	}
	if err := sp.writeTo(w); err != nil {
		return // the client sees a short body
	}
	_, _ = w.Write(tail)
}
