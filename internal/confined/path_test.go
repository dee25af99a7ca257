package confined

import (
	"errors"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/wire"
)

func TestCleanPath(t *testing.T) {
	long := strings.Repeat("a/", 2048) // 4096 bytes
	tests := []struct {
		in, want string // want "" means rejected with kind invalid
	}{
		{"", "."},
		{"/", "."},
		{".", "."},
		{"./", "."},
		{"//./", "."},
		{"etc/x", "etc/x"},
		{"/etc/x", "etc/x"},
		{"//etc//x/", "etc/x"},
		{"./a/./b/.", "a/b"},
		{"a/.../b", "a/.../b"},
		{"..a/b..", "..a/b.."},
		{"bad\xff\xfe", "bad\xff\xfe"},
		{"a b/\n", "a b/\n"},
		{"..", ""},
		{"../x", ""},
		{"/../x", ""},
		{"a/../../x", ""},
		{"a/..", ""},
		{"a/../b", ""},
		{"x\x00y", ""},
		{"\x00", ""},
		{long, strings.TrimSuffix(long, "/")},
		{long + "a", ""},
		{strings.Repeat("n", 255), strings.Repeat("n", 255)},
		{"d/" + strings.Repeat("n", 256), ""},
	}
	for _, tt := range tests {
		got, err := cleanPath(tt.in)
		if tt.want == "" {
			if err == nil || Kind(err) != wire.ErrInvalid {
				t.Errorf("cleanPath(%.40q) = %q, %v; want kind invalid", tt.in, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("cleanPath(%.40q) = %.40q, %v; want %.40q", tt.in, got, err, tt.want)
		}
	}
}

func TestKind(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{nil, ""},
		{errors.New("boom"), wire.ErrInternal},
		{&Error{Op: "x", Kind: wire.ErrLimit}, wire.ErrLimit},
		{&Error{Op: "x", Err: &Error{Kind: wire.ErrTooLarge}}, wire.ErrTooLarge},
	}
	for _, tt := range tests {
		if got := Kind(tt.err); got != tt.want {
			t.Errorf("Kind(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"", "/", ".", "a/b", "/a//b/./c/", "../x", "a/../../x", "x\x00y", "bad\xff", strings.Repeat("x", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := cleanPath(in)
		comps := strings.Split(in, "/")
		hasDotDot := false
		for _, c := range comps {
			if c == ".." {
				hasDotDot = true
			}
		}
		if err != nil {
			if Kind(err) != wire.ErrInvalid {
				t.Fatalf("cleanPath(%q): error kind %q, want invalid", in, Kind(err))
			}
			return
		}
		if hasDotDot || strings.IndexByte(in, 0) >= 0 || len(in) > MaxPathLen {
			t.Fatalf("cleanPath(%q) = %q, want rejection", in, got)
		}
		if got == "." {
			// The root only comes from names made of "/" and ".".
			for _, c := range comps {
				if c != "" && c != "." {
					t.Fatalf("cleanPath(%q) = root", in)
				}
			}
			return
		}
		if strings.HasPrefix(got, "/") || strings.HasSuffix(got, "/") || len(got) > len(in) {
			t.Fatalf("cleanPath(%q) = %q: not a clean relative path", in, got)
		}
		for c := range strings.SplitSeq(got, "/") {
			if c == "" || c == "." || c == ".." || len(c) > MaxNameLen {
				t.Fatalf("cleanPath(%q) = %q: bad component %q", in, got, c)
			}
		}
		if again, err := cleanPath(got); err != nil || again != got {
			t.Fatalf("cleanPath not idempotent on %q: %q, %v", got, again, err)
		}
		if abs, err := cleanPath("/" + in); len(in) < MaxPathLen && (err != nil || abs != got) {
			t.Fatalf("cleanPath(%q) = %q, %v; want %q as for the relative name", "/"+in, abs, err, got)
		}
	})
}
