package rpc

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/wire"
)

// TestLineSpool: a spool's JSON, from memory and its file alike, is what
// marshaling the lines would give, whatever chunks the output came in.
func TestLineSpool(t *testing.T) {
	for _, total := range []int{0, 10, 5000, 3 * spoolMem / 2} {
		t.Run(strconv.Itoa(total), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(total)))
			var want []outputLine
			var chunks [][2]string // stream, data
			streams := [2]string{wire.Stdout, wire.Stderr}
			size := 0
			for size < total {
				s := rng.IntN(2)
				text := strings.Repeat(string(rune('a'+rng.IntN(26))), rng.IntN(200)) + "<&\"\\\x01é"
				if rng.IntN(50) == 0 {
					text += "\xff" // invalid UTF-8 becomes U+FFFD
				}
				data := text + "\n"
				// Split the line at random points into chunks.
				for len(data) > 0 {
					k := 1 + rng.IntN(len(data))
					chunks = append(chunks, [2]string{streams[s], data[:k]})
					data = data[k:]
				}
				want = append(want, outputLine{Stream: streams[s], Text: strings.ToValidUTF8(text, "\uFFFD")})
				size += len(text)
			}
			// A last line without a newline.
			chunks = append(chunks, [2]string{wire.Stderr, "tail"})
			want = append(want, outputLine{Stream: wire.Stderr, Text: "tail"})
			sp := &lineSpool{}
			defer sp.Close()
			for _, c := range chunks {
				sp.add(c[0], []byte(c[1]))
			}
			if err := sp.done(); err != nil {
				t.Fatal(err)
			}
			if (sp.f != nil) != (sp.size() > spoolMem+2) {
				t.Errorf("%d bytes, file %v", sp.size(), sp.f != nil)
			}
			wantJSON, _ := json.Marshal(want)
			got, err := sp.MarshalJSON()
			if err != nil || !bytes.Equal(got, wantJSON) || int64(len(got)) != sp.size() {
				t.Fatalf("spool: %d bytes (size %d), %v; want %d bytes", len(got), sp.size(), err, len(wantJSON))
			}
			// Streamed as an answer: the same JSON as marshaling it whole.
			res := commandResult{Command: "c", Args: []string{"<a>"}, Output: sp}
			rec := httptest.NewRecorder()
			writeJSON(rec, 200, response{JSONRPC: "2.0", Result: res, ID: json.RawMessage(`"id"`)})
			whole, _ := json.Marshal(response{JSONRPC: "2.0", Result: struct {
				commandResult
				Output []outputLine `json:"output"`
			}{res, want}, ID: json.RawMessage(`"id"`)})
			if !jsonEqual(t, rec.Body.Bytes(), whole) || rec.Header().Get("Content-Length") != strconv.Itoa(rec.Body.Len()) {
				t.Fatalf("streamed answer (Content-Length %s, %d bytes) differs from the whole one (%d bytes)",
					rec.Header().Get("Content-Length"), rec.Body.Len(), len(whole))
			}
		})
	}
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatal(err)
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

func TestMaxOutputBounds(t *testing.T) {
	for _, tc := range []struct {
		in, want int64
		ok       bool
	}{
		{0, DefaultMaxOutput, true}, {MinMaxOutput, MinMaxOutput, true}, {MaxMaxOutput, MaxMaxOutput, true},
		{MinMaxOutput - 1, 0, false}, {MaxMaxOutput + 1, 0, false}, {-1, 0, false},
	} {
		got, err := maxOutput(tc.in)
		if got != tc.want || (err == nil) != tc.ok {
			t.Errorf("maxOutput(%d) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}
