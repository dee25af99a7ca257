package secrets

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"testing"
)

func TestScrub(t *testing.T) {
	s := NewScrubber()
	plain, quoted, html := "sk-live-0123456789abcdef", `pa"ss\word-0123`, "a<b>&c-0123456"
	s.Add(NewValue([]byte(plain)), NewValue([]byte(quoted)), NewValue([]byte(html)), NewValue([]byte("short")))
	for _, c := range []struct{ in, want string }{
		{"key " + plain + " and " + plain + ".", "key [secret] and [secret]."},
		{plain[:len(plain)-1], plain[:len(plain)-1]}, // a part is not the value
		{"short and shorter", "short and shorter"},   // under MinScrub: left
		{"nothing", "nothing"},
		{"", ""},
		{quoted, "[secret]"},
		{html, "[secret]"},
	} {
		if got := string(s.Scrub([]byte(c.in))); got != c.want {
			t.Errorf("Scrub(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	// In the forms the server's encoders give values.
	for _, v := range []string{plain, quoted, html} {
		rec, _ := json.Marshal(map[string]any{"kind": "api_call", "call": map[string]any{"params": map[string]string{"stdin": "x" + v + "y"}}})
		out := s.ScrubJSON(rec)
		if !json.Valid(out) || bytes.Contains(out, []byte(v)) || !bytes.Contains(out, []byte(`"x[secret]y"`)) {
			t.Errorf("JSON record with %q: %s", v, out)
		}
		line := "msg=x err=" + strconv.Quote("a "+v)
		if out := string(s.Scrub([]byte(line))); out != `msg=x err="a [secret]"` {
			t.Errorf("log line with %q: %s", v, out)
		}
	}
	// A match that would cut an escape sequence: the text stays JSON,
	// and the decoded string (which does not hold the value) is kept.
	s.Add(NewValue([]byte("u003cabcdefgh")))
	in := []byte(`{"kind":"k","a":["\u003cabcdefgh",1,true,null,{"b":"u003cabcdefgh"}]}`)
	out := s.ScrubJSON(in)
	if want := `{"kind":"k","a":["\u003cabcdefgh",1,true,null,{"b":"[secret]"}]}`; string(out) != want {
		t.Errorf("ScrubJSON(%s) = %s, want %s", in, out, want)
	}
	// Nothing to scrub: the text itself, not a copy.
	if in := []byte("clean text of some length"); &s.Scrub(in)[0] != &in[0] {
		t.Error("a clean text was copied")
	}
	var nilScrubber *Scrubber
	nilScrubber.Add(NewValue([]byte(plain)))
	if got := string(nilScrubber.ScrubJSON([]byte(plain))); got != plain {
		t.Error("a nil scrubber changed a text")
	}
}

func TestScrubWriter(t *testing.T) {
	s := NewScrubber()
	var buf bytes.Buffer
	w := s.Writer(&buf)
	s.Add(NewValue([]byte("hunter2-hunter2")))
	line := "level=INFO msg=\"x hunter2-hunter2\"\n"
	if n, err := w.Write([]byte(line)); n != len(line) || err != nil {
		t.Fatal(n, err)
	}
	if buf.String() != "level=INFO msg=\"x [secret]\"\n" {
		t.Errorf("wrote %q", buf.String())
	}
}

func TestScrubBound(t *testing.T) {
	s := NewScrubber()
	var vs []Value
	for i := range MaxScrubbed {
		vs = append(vs, NewValue(fmt.Appendf(nil, "value-%08d", i)))
	}
	s.Add(vs...)
	for i := range 10 {
		s.Add(NewValue(fmt.Appendf(nil, "value-%08d", MaxScrubbed+i)))
	}
	if got := string(s.Scrub([]byte("value-00000009 value-00000010 value-00004105"))); got != "value-00000009 [secret] [secret]" {
		t.Errorf("after %d values: %q (the oldest are forgotten, the rest known)", MaxScrubbed+10, got)
	}
}

// TestScrubConcurrent: values are added while texts are scrubbed (run
// with -race).
func TestScrubConcurrent(t *testing.T) {
	s := NewScrubber()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				v := fmt.Sprintf("secret-%d-%06d", g, i)
				s.Add(NewValue([]byte(v)))
				if out := s.Scrub([]byte("a " + v + " b")); string(out) != "a [secret] b" {
					t.Errorf("%s: %s", v, out)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkScrubJSON is what the audit log's Redact hook costs a record
// with no value in it (the common case), with 1 and 100 values known.
func BenchmarkScrubJSON(b *testing.B) {
	rec := []byte(`{"kind":"api_call","time":"2026-11-26T13:00:00.123456789Z","namespace":"team-a","sandbox":"web-1","labels":{"project":"billing","team":"a"},"key_id":"0123456789abcdef","request_id":"9f8e7d6c5b4a3210","call":{"method":"sandbox.exec","params":{"sandbox":"web-1","namespace":"team-a","argv":["python3","-c","print(1)"],"env":["TOKEN=[redacted]"],"timeout":30},"outcome":"ok","duration_ms":12.5}}`)
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("values=%d", n), func(b *testing.B) {
			s := NewScrubber()
			for i := range n {
				sum := sha256.Sum256([]byte{byte(i)})
				s.Add(NewValue([]byte("sk-" + hex.EncodeToString(sum[:16]))))
			}
			b.SetBytes(int64(len(rec)))
			for b.Loop() {
				if out := s.ScrubJSON(rec); len(out) != len(rec) {
					b.Fatal("scrubbed a clean record")
				}
			}
		})
	}
}
