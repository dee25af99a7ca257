package main

import (
	"slices"
	"testing"
)

// TestExposeArg: [HOST:]GUEST, no HOST being any free port; everything
// else refused.
func TestExposeArg(t *testing.T) {
	for _, c := range []struct {
		in          string
		host, guest uint16
		ok          bool
	}{
		{"8080:80", 8080, 80, true},
		{"80", 0, 80, true},
		{"65535:65535", 65535, 65535, true},
		{"0:80", 0, 0, false},
		{"80:0", 0, 0, false},
		{"0", 0, 0, false},
		{"65536", 0, 0, false},
		{"8080:80/tcp", 0, 0, false},
		{"127.0.0.1:8080:80", 0, 0, false},
		{":80", 0, 0, false},
		{"-1", 0, 0, false},
		{"", 0, 0, false},
	} {
		h, g, err := exposeArg(c.in)
		if (err == nil) != c.ok || h != c.host || g != c.guest {
			t.Errorf("exposeArg(%q) = %d, %d, %v; want %d, %d, ok %v", c.in, h, g, err, c.host, c.guest, c.ok)
		}
	}
}

// TestParseInterspersed: flags before, between and after the names.
func TestParseInterspersed(t *testing.T) {
	for _, args := range [][]string{
		{"--address", "127.0.0.2", "web", "80"},
		{"web", "--address", "127.0.0.2", "80"},
		{"web", "80", "--address", "127.0.0.2"},
	} {
		fs := newFlagSet("t", "t", "")
		addr := fs.String("address", "", "")
		pos, err := parseInterspersed(fs, args)
		if err != nil || !slices.Equal(pos, []string{"web", "80"}) || *addr != "127.0.0.2" {
			t.Errorf("%q: %q %q %v", args, pos, *addr, err)
		}
	}
}
