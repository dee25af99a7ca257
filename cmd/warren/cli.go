package main

// The CLI's small shared layer over the flag package: help on stdout when
// asked for, one-line errors with a suggestion otherwise, missing
// arguments named, subcommands with flag sets of their own, and the global
// flags.
//
// Commands parse with flag sets from newFlagSet and return errors; main
// decides what reaches the user. The flag package calls a set's Usage on
// -h and on every parse error alike, so Usage only records which set asked
// (usageFS) and main tells the two apart by the error: flag.ErrHelp is a
// request for help (printed on stdout, exit 0), any other error after a
// Usage call is a parse error (one line on stderr, exit 2).

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// usageFS is the flag set whose Usage the flag package called last, and
// usageText prints its help; nil until one did.
var (
	usageFS   *flag.FlagSet
	usageText func(io.Writer)
)

// newFlagSet returns a flag set for command name ("warren ps"); its help is
// synopsis, about and the flags' defaults. The flag package's own messages
// are discarded: main prints the error and the help.
func newFlagSet(name, synopsis, about string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		usageFS = fs
		usageText = func(w io.Writer) {
			fmt.Fprintf(w, "Usage: %s\n\n%s\n", synopsis, strings.TrimSpace(about))
			n := 0
			fs.VisitAll(func(*flag.Flag) { n++ })
			if n == 0 {
				return
			}
			fmt.Fprint(w, "\nFlags:\n")
			fs.SetOutput(w)
			fs.PrintDefaults()
			fs.SetOutput(io.Discard)
		}
	}
	return fs
}

// usageError is a command line that cannot be run as written: main prints
// "<cmd>: <msg>; see '<cmd> -h'" and exits 2.
type usageError struct {
	cmd string // "warren logs"
	msg string
}

func (e usageError) Error() string { return e.msg }

// missing reports the first of the positional arguments want that args
// lacks, or an unexpected one; nil when args has exactly len(want). A want
// ending in "..." takes any number more.
func wantArgs(fs *flag.FlagSet, args []string, want ...string) error {
	more := len(want) > 0 && strings.HasSuffix(want[len(want)-1], "...")
	need := len(want)
	if more {
		need-- // "ARGS..." may be empty unless named otherwise
	}
	switch {
	case len(args) < need:
		return usageError{fs.Name(), "missing " + want[len(args)]}
	case len(args) > len(want) && !more:
		return usageError{fs.Name(), fmt.Sprintf("unexpected argument %.60q", args[len(want)])}
	}
	return nil
}

// subcommand returns the subcommand in args[0] if it is one of subs, or an error
// naming what is missing or suggesting the nearest.
func subcommand(fs *flag.FlagSet, args []string, subs ...string) (string, error) {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") && args[0] != "-h" && args[0] != "--help" && args[0] != "-help" {
		return "", usageError{fs.Name(), "missing a subcommand: " + strings.Join(subs, ", ")}
	}
	if slices.Contains(subs, args[0]) {
		return args[0], nil
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
		fs.Usage()
		return "", flag.ErrHelp
	}
	return "", usageError{fs.Name(), fmt.Sprintf("unknown subcommand %.40q%s", args[0], didYouMean(args[0], subs, ""))}
}

// subFlagSet is the flag set of parent's subcommand name: it has parent's
// flags too (sharing their values, so flags given before the subcommand
// keep theirs unless given again after it).
func subFlagSet(parent *flag.FlagSet, name, synopsis, about string) *flag.FlagSet {
	fs := newFlagSet(parent.Name()+" "+name, synopsis, about)
	parent.VisitAll(func(f *flag.Flag) { fs.Var(f.Value, f.Name, f.Usage) })
	return fs
}

// flagErrorText makes the flag package's error err one line: an unknown
// flag gets the nearest of fs's flags as a suggestion.
func flagErrorText(fs *flag.FlagSet, err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		msg = "unknown flag " + dashed(name) + didYouMean(name, names, "-")
	}
	return fmt.Sprintf("%s: %s; see '%s -h'", fs.Name(), msg, fs.Name())
}

// dashed is a flag's name as written: -v, --memory.
func dashed(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// didYouMean is " (did you mean X?)" for the candidate nearest to s, or ""
// when none is near. flagDash "-" writes candidates as flags.
func didYouMean(s string, candidates []string, flagDash string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		d := editDistance(s, c)
		if strings.HasPrefix(c, s) && len(s) >= 2 {
			d = min(d, 1) // a prefix: "insp" for "inspect"
		}
		if d < bestD && d <= max(1, len(c)/3) && d < len(s) {
			best, bestD = c, d
		}
	}
	if best == "" {
		return ""
	}
	if flagDash != "" {
		best = dashed(best)
	}
	return " (did you mean " + best + "?)"
}

// editDistance is the Levenshtein distance of a and b, with a swap of two
// neighbours ("memroy") counted as one edit.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64 // no suggestion for a long string
	}
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// globals are the global flags, given before the command; the commands
// that use them take them after it too (clientFlags, hostFlags.register)
// with these as defaults.
var globals struct {
	verbose   bool
	server    string
	key       string
	namespace string
}

// globalFlags parses the global flags at the start of args and returns the
// rest, or an error for an unknown flag; help and version requests come
// back as the words "help" and "version".
func globalFlags(args []string) ([]string, error) {
	valued := []string{"server", "key", "namespace"}
	for len(args) > 0 && strings.HasPrefix(args[0], "-") && args[0] != "-" {
		a := args[0]
		if a == "--" {
			return args[1:], nil
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch {
		case name == "h" || name == "help":
			return append([]string{"help"}, args[1:]...), nil
		case name == "version":
			return append([]string{"version"}, args[1:]...), nil
		case name == "v" && !hasVal:
			globals.verbose = true
			args = args[1:]
			continue
		case !slices.Contains(valued, name):
			return nil, usageError{"warren", fmt.Sprintf("unknown flag %s%s", dashed(name), didYouMean(name, append(valued, "v", "help", "version"), "-"))}
		}
		if !hasVal {
			if len(args) < 2 {
				return nil, usageError{"warren", "flag " + dashed(name) + " needs a value"}
			}
			val, args = args[1], args[1:]
		}
		args = args[1:]
		switch name {
		case "server":
			globals.server = val
		case "key":
			globals.key = val
		case "namespace":
			globals.namespace = val
		}
	}
	return args, nil
}

const globalHelp = `Global flags (before the command, or after it where the command uses them):
  -v                 say more on stderr (what is called, what happens)
  --server URL       the server's URL (env MSB_SERVER_URL; default http://127.0.0.1:5555)
  --key KEY          the API key (env MSB_API_KEY, better: a flag shows in ps and history)
  --namespace NS     the namespace (default: the API key's own; "default" for a key for all)
  --version          print the version and exit`

func usage(w io.Writer) {
	fmt.Fprint(w, `warren: sandboxes for untrusted code

Usage:
  warren [global flags] <command> [flags] [args]

Commands:
`)
	for _, c := range commands() {
		if !strings.HasPrefix(c.name, "_") {
			fmt.Fprintf(w, "  %-11s %s\n", c.name, c.summary)
		}
	}
	fmt.Fprintf(w, "\n%s\n\nRun 'warren help <command>' or 'warren <command> -h' for a command's flags;\ndocs/cli.md has more.\n", globalHelp)
}

const helpAbout = `
Prints the help of a command, or of a command's subcommand (the same as
'warren CMD [SUB] -h'); without a command, the list of commands.`

// helpCmd is "warren help [CMD [SUB]]": CMD's own -h.
func helpCmd(ctx context.Context, args []string) error {
	if len(args) == 0 {
		usage(os.Stdout)
		return nil
	}
	c, err := lookup(args[0])
	if err != nil {
		return err
	}
	if c.name == "help" {
		fs := newFlagSet("warren help", "warren help [CMD [SUBCOMMAND]]", helpAbout)
		fs.Usage()
		return flag.ErrHelp
	}
	return c.run(ctx, append(slices.Clone(args[1:]), "-h"))
}

// lookup finds the command called name.
func lookup(name string) (command, error) {
	var names []string
	for _, c := range commands() {
		if c.name == name {
			return c, nil
		}
		if !strings.HasPrefix(c.name, "_") {
			names = append(names, c.name)
		}
	}
	return command{}, usageError{"warren", fmt.Sprintf("unknown command %.40q%s", name, didYouMean(name, names, ""))}
}

// exitCode prints what err says (if anything) and returns the exit code.
func exitCode(name string, err error) int {
	var ee exitError
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee) && ee.code == 2 && usageFS != nil && usageText != nil:
		// A command that called fs.Usage itself and returned exit 2, the
		// old way to refuse a command line: its help, on stderr. (The flag
		// package calls Usage only on errors it returns, handled below.)
		usageText(os.Stderr)
		return 2
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, flag.ErrHelp):
		if usageText != nil {
			usageText(os.Stdout)
		}
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "%s: %s; see '%s -h'\n", ue.cmd, ue.msg, ue.cmd)
		return 2
	case usageFS != nil:
		// The flag package called a Usage: a flag the set refused.
		fmt.Fprintln(os.Stderr, flagErrorText(usageFS, err))
		return 2
	}
	fmt.Fprintf(os.Stderr, "warren %s: %v\n", name, err)
	return 1
}
