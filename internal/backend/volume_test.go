package backend

import (
	"strings"
	"testing"
)

// FuzzParseVolume: whatever a client sends, parsing never panics, and an
// accepted volume is absolute, clean, outside the reserved trees, and
// round-trips through its string form.
func FuzzParseVolume(f *testing.F) {
	for _, s := range []string{"/a:/b", "/a:/b:ro", "/a:/proc", "a:/b", "/a/../b:/c", "/a:/b:rw", ":", "/:/x", "/a:/b:ro:x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseVolume(s)
		if err != nil {
			return
		}
		if !strings.HasPrefix(v.Source, "/") || !strings.HasPrefix(v.Target, "/") || v.Target == "/" ||
			strings.Contains(v.Target, "/../") || strings.HasPrefix(v.Target, "/proc") && (v.Target == "/proc" || strings.HasPrefix(v.Target, "/proc/")) {
			t.Fatalf("accepted %q as %+v", s, v)
		}
		w, err := ParseVolume(v.String())
		if err != nil || w != v {
			t.Fatalf("round trip of %q: %+v %v", s, w, err)
		}
	})
}
