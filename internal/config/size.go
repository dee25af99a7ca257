package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Size is a number of bytes, written as an integer (bytes) or a string
// with a unit: "512MiB", "10GiB", "1G", "64k". Units are binary whatever
// their spelling (K = KB = KiB = 1024 bytes; M, G, T likewise); a string
// without a unit is bytes. Zero means unset (no limit, or the default).
type Size struct {
	Bytes int64
	text  string
	bad   string // what is wrong with it, reported by validation
}

// maxSize bounds a size (1 PiB), so sums and shifts cannot overflow.
const maxSize = 1 << 50

// UnmarshalTOML records the value; a bad one is a validation problem (so
// it is reported with the file's other problems, not alone).
func (s *Size) UnmarshalTOML(v any) error {
	switch x := v.(type) {
	case int64:
		s.Bytes, s.text = x, strconv.FormatInt(x, 10)
		if x < 0 || x > maxSize {
			s.bad = fmt.Sprintf("%d: want 0 to 1PiB", x)
		}
	case string:
		s.text = x
		n, err := ParseSize(x)
		if err != nil {
			s.bad = err.Error()
		}
		s.Bytes = n
	default:
		s.bad = fmt.Sprintf("want a size: an integer (bytes) or a string like \"512MiB\" or \"10GiB\", not %T", v)
	}
	return nil
}

func (s Size) String() string {
	if s.text != "" {
		return s.text
	}
	return strconv.FormatInt(s.Bytes, 10)
}

// ParseSize reads a size string (see Size).
func ParseSize(str string) (int64, error) {
	t := strings.TrimSpace(str)
	num := strings.TrimRightFunc(t, func(r rune) bool { return r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' })
	unit := strings.ToUpper(t[len(num):])
	shift := -1
	switch unit {
	case "", "B":
		shift = 0
	case "K", "KB", "KIB":
		shift = 10
	case "M", "MB", "MIB":
		shift = 20
	case "G", "GB", "GIB":
		shift = 30
	case "T", "TB", "TIB":
		shift = 40
	}
	n, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if shift < 0 || err != nil || len(str) > 32 {
		return 0, fmt.Errorf("%.40q is not a size (like \"512MiB\", \"10GiB\" or a number of bytes)", str)
	}
	b := n * float64(int64(1)<<shift)
	if math.IsNaN(b) || b < 0 || b > maxSize {
		return 0, fmt.Errorf("%.40q: want 0 to 1PiB", str)
	}
	return int64(b), nil
}

// Duration is a duration written as a string ("1m", "90s").
type Duration struct {
	D   time.Duration
	bad string
}

// UnmarshalTOML records the value (see Size.UnmarshalTOML).
func (d *Duration) UnmarshalTOML(v any) error {
	s, ok := v.(string)
	if !ok {
		d.bad = fmt.Sprintf("want a duration as a string, like \"1m\", not %T", v)
		return nil
	}
	x, err := time.ParseDuration(s)
	if err != nil {
		d.bad = fmt.Sprintf("%.40q is not a duration (like \"1m\" or \"1h30m\")", s)
	}
	d.D = x
	return nil
}
