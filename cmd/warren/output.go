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
	w := os.Stdout
	n := 0
	for _, set := range []bool{l.json, l.quiet, l.format != ""} {
		if set {
			n++
		}
	}
	if n > 1 {
		return fmt.Errorf("--json, -q and --format exclude each other")
	}
	switch {
	case l.json:
		if rows == nil {
			rows = []T{} // [] rather than null
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	case l.quiet:
		for _, r := range rows {
			if _, err := fmt.Fprintln(w, id(r)); err != nil {
				return err
			}
		}
		return nil
	case l.format != "":
		return printTemplate(w, l.format, rows)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if header != "" { // none for a plain list, one item per line
		fmt.Fprintln(tw, header)
	}
	for _, r := range rows {
		fmt.Fprintln(tw, line(r))
	}
	return tw.Flush()
}

// printTemplate writes each row through the template text; "\t" and "\n"
// written in it as two characters are a tab and a newline, as a shell
// argument carries them.
func printTemplate[T any](w io.Writer, text string, rows []T) error {
	text = strings.NewReplacer(`\t`, "\t", `\n`, "\n").Replace(text)
	t, err := template.New("format").Funcs(template.FuncMap{
		"json": func(v any) (string, error) { b, err := json.Marshal(v); return string(b), err },
	}).Option("missingkey=error").Parse(text)
	if err != nil {
		return fmt.Errorf("--format: %w", err)
	}
	for _, r := range rows {
		if err := t.Execute(w, r); err != nil {
			return fmt.Errorf("--format: %w", err)
		}
		if _, err := fmt.Fprintln(w); err != nil {
			return err
		}
	}
	return nil
}
