package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"text/template"
)

// listFlags are the output flags of every listing: a table for people by
// default, --json, -q (ids only) or --format (a Go template per row) for
// scripts.
type listFlags struct {
	json   bool
	quiet  bool
	format string
}

func (l *listFlags) register(fs *flag.FlagSet, idName string) {
	fs.BoolVar(&l.json, "json", false, "print a JSON array, one object per row")
	fs.BoolVar(&l.quiet, "q", false, "print only the "+idName+", one per line")
	fs.StringVar(&l.format, "format", "", "print each row with a Go template, like '{{.Name}}\\t{{.State}}' (fields: the --json keys, capitalised as in --json's Go names; docs/cli.md)")
}

// printList writes rows as l asks: id gives -q's column, header and line
// the table's (no header: a plain list).
func printList[T any](l *listFlags, rows []T, id func(T) string, header string, line func(T) string) error {
	if l.json || l.quiet || l.format != "" {
		rs, err := newRowStream(l, os.Stdout, id)
		if err != nil {
			return err
		}
		for _, r := range rows {
			if err := rs.write(r); err != nil {
				return err
			}
		}
		return rs.close()
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	if header != "" { // none for a plain list, one item per line
		fmt.Fprintln(tw, header)
	}
	for _, r := range rows {
		fmt.Fprintln(tw, line(r))
	}
	return tw.Flush()
}

// rowStream writes rows one at a time as --json, -q or --format ask, for
// a listing too long to hold (the audit log) and for printList.
type rowStream[T any] struct {
	l    *listFlags
	w    io.Writer
	id   func(T) string
	tmpl *template.Template
	n    int
}

// newRowStream checks l's flags (one at most) and the template.
func newRowStream[T any](l *listFlags, w io.Writer, id func(T) string) (*rowStream[T], error) {
	n := 0
	for _, set := range []bool{l.json, l.quiet, l.format != ""} {
		if set {
			n++
		}
	}
	if n > 1 {
		return nil, fmt.Errorf("--json, -q and --format exclude each other")
	}
	rs := &rowStream[T]{l: l, w: w, id: id}
	if l.format != "" {
		text := strings.NewReplacer(`\t`, "\t", `\n`, "\n").Replace(l.format)
		t, err := template.New("format").Funcs(template.FuncMap{
			"json": func(v any) (string, error) { b, err := json.Marshal(v); return string(b), err },
		}).Option("missingkey=error").Parse(text)
		if err != nil {
			return nil, fmt.Errorf("--format: %w", err)
		}
		rs.tmpl = t
	}
	return rs, nil
}

// write writes one row: a JSON array's element, an id, or the template's
// line ("\t" and "\n" written in it as two characters are a tab and a
// newline, as a shell argument carries them).
func (rs *rowStream[T]) write(r T) error {
	rs.n++
	switch {
	case rs.l.json:
		b, err := json.MarshalIndent(r, "  ", "  ")
		if err != nil {
			return err
		}
		sep := ",\n  "
		if rs.n == 1 {
			sep = "[\n  "
		}
		_, err = fmt.Fprintf(rs.w, "%s%s", sep, b)
		return err
	case rs.l.quiet:
		_, err := fmt.Fprintln(rs.w, rs.id(r))
		return err
	}
	if err := rs.tmpl.Execute(rs.w, r); err != nil {
		return fmt.Errorf("--format: %w", err)
	}
	_, err := fmt.Fprintln(rs.w)
	return err
}

// close ends the JSON array ([] for none).
func (rs *rowStream[T]) close() error {
	if !rs.l.json {
		return nil
	}
	end := "\n]\n"
	if rs.n == 0 {
		end = "[]\n"
	}
	_, err := io.WriteString(rs.w, end)
	return err
}
