package audit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"
)

// Filter selects records; zero fields select everything.
type Filter struct {
	Namespace string
	Sandbox   string
	KeyID     string
	// Labels must all be on the record, with these values.
	Labels map[string]string
	// Kinds and Methods: any of them (a method matches api_call and
	// refusal records).
	Kinds   []Kind
	Methods []string
	// Since and Until bound the record's time: Since <= t < Until.
	Since, Until time.Time
}

// Match reports whether e passes f.
func (f *Filter) Match(e *Entry) bool {
	switch {
	case f.Namespace != "" && e.Namespace != f.Namespace,
		f.Sandbox != "" && e.Sandbox != f.Sandbox,
		f.KeyID != "" && e.KeyID != f.KeyID,
		len(f.Kinds) > 0 && !slices.Contains(f.Kinds, e.Kind),
		!f.Since.IsZero() && e.Time.Before(f.Since),
		!f.Until.IsZero() && !e.Time.Before(f.Until):
		return false
	}
	for k, v := range f.Labels {
		if got, ok := e.Labels[k]; !ok || got != v {
			return false
		}
	}
	if len(f.Methods) > 0 {
		m := ""
		switch {
		case e.Call != nil:
			m = e.Call.Method
		case e.Refusal != nil:
			m = e.Refusal.Method
		}
		if !slices.Contains(f.Methods, m) {
			return false
		}
	}
	return true
}

// Scan calls fn with every record of the log in dir that f selects, in
// order, with its line as stored. Lines that are no record are skipped:
// finding them is Verify's work.
func Scan(dir string, f Filter, fn func(line []byte, e *Entry) error) error {
	segs, err := segments(dir)
	if err != nil {
		return err
	}
	for _, n := range segs {
		if err := scanFile(SegmentPath(dir, n), &f, fn); err != nil {
			return err
		}
	}
	return nil
}

func scanFile(path string, f *Filter, fn func([]byte, *Entry) error) error {
	fh, err := os.Open(path) //nolint:gosec // a segment of the operator's log
	if err != nil {
		return err
	}
	defer func() { _ = fh.Close() }()
	lr := newLineReader(fh)
	for {
		line, terminated, long, err := lr.next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if !terminated || long {
			continue
		}
		if _, _, _, ok := parsePrefix(line); !ok {
			continue
		}
		var e Entry
		if json.Unmarshal(line, &e) != nil || !f.Match(&e) {
			continue
		}
		if err := fn(line, &e); err != nil {
			return err
		}
	}
}
