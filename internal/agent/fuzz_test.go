package agent

import (
	"bytes"
	"testing"

	"github.com/warren-sandbox/warren/internal/wire"
)

// FuzzExecStream feeds arbitrary agent output to the host's exec decoder: it
// must never panic, and must only deliver output for the two known streams.
func FuzzExecStream(f *testing.F) {
	f.Add([]byte(`{"stream":"stdout","data":"aGk="}` + "\n" + `{"exit":{"code":0,"duration_ms":1}}` + "\n"))
	f.Add([]byte(`{"stream":"x","data":"aGk="}`))
	f.Add([]byte(`{"exit":null}` + "\n"))
	f.Add(bytes.Repeat([]byte("a"), 2<<20))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = readExecStream(bytes.NewReader(b), func(stream string, data []byte) {
			if stream != wire.Stdout && stream != wire.Stderr {
				t.Fatalf("output for stream %q", stream)
			}
		})
	})
}

func TestExecStreamErrors(t *testing.T) {
	for name, in := range map[string]string{
		"empty":          "",
		"no exit":        `{"stream":"stdout","data":"aGk="}` + "\n",
		"garbage":        "not json\n",
		"unknown stream": `{"stream":"evil","data":"aGk="}` + "\n",
		"huge line":      string(bytes.Repeat([]byte("a"), 2<<20)),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := readExecStream(bytes.NewReader([]byte(in)), nil); err == nil {
				t.Error("want an error")
			}
		})
	}
	st, err := readExecStream(bytes.NewReader([]byte(`{"stream":"stderr","data":"/w=="}`+"\n"+`{"exit":{"code":3,"signal":"SIGTERM","duration_ms":2}}`+"\n")), func(s string, d []byte) {
		if s != wire.Stderr || !bytes.Equal(d, []byte{0xff}) {
			t.Errorf("got %s %q", s, d)
		}
	})
	if err != nil || st.Code != 3 || st.Signal != "SIGTERM" {
		t.Errorf("got %+v %v", st, err)
	}
}
