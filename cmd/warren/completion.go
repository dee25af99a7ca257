package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

const completionAbout = `
Prints a script that makes SHELL (bash, zsh or fish) complete warren's
commands, subcommands, global flags and each command's flags (those its
-h lists: 'warren run --<TAB>'), the sandbox names of a server
(from 'warren ps -a', with the same --server and key) and the image names
of the local store. Load it:

  bash:  source <(warren completion bash)      (in ~/.bashrc)
  zsh:   source <(warren completion zsh)       (in ~/.zshrc, after compinit)
  fish:  warren completion fish > ~/.config/fish/completions/warren.fish

The script asks 'warren __complete WORDS...' for each completion.`

// The scripts hand every word after "warren" (the last one the word being
// completed, maybe empty) to 'warren __complete', which prints the
// candidates one per line; with none, the shell falls back to files.
var completionScripts = map[string]string{
	"bash": `# warren completion for bash: source <(warren completion bash)
_warren() {
	local IFS=$'\n'
	COMPREPLY=($(warren __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null))
}
complete -o default -F _warren warren
`,
	"zsh": `#compdef warren
# warren completion for zsh: source <(warren completion zsh)
_warren() {
	local -a c
	c=("${(@f)$(warren __complete "${(@)words[2,CURRENT]}" 2>/dev/null)}")
	c=(${c:#})
	if (( ${#c} )); then compadd -a c; else _files; fi
}
compdef _warren warren
`,
	"fish": `# warren completion for fish: warren completion fish > ~/.config/fish/completions/warren.fish
complete -c warren -f -a '(warren __complete (commandline -opc)[2..-1] (commandline -ct) 2>/dev/null)'
`,
}

func completionCmd(_ context.Context, args []string) error {
	fs := newFlagSet("warren completion", "warren completion bash|zsh|fish", completionAbout)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := wantArgs(fs, fs.Args(), "SHELL (bash, zsh or fish)"); err != nil {
		return err
	}
	s, ok := completionScripts[fs.Arg(0)]
	if !ok {
		return usageError{fs.Name(), fmt.Sprintf("unknown shell %.40q%s: want bash, zsh or fish", fs.Arg(0), didYouMean(fs.Arg(0), []string{"bash", "zsh", "fish"}, ""))}
	}
	fmt.Print(s)
	return nil
}

// subcommands are the subcommands of the commands that have them.
var subcommands = map[string][]string{
	"image":      {"import", "pull", "build-base", "ls", "inspect", "rm", "prune"},
	"key":        {"create", "list", "revoke"},
	"workspace":  {"create", "ls", "get", "rm", "push", "pull", "sync"},
	"snapshot":   {"create", "restore", "fork", "ls", "get", "rm"},
	"egress":     {"get", "set", "log"},
	"ports":      {"expose", "unexpose"},
	"audit":      {"export", "verify", "checkpoints"},
	"bench":      {"soak"},
	"completion": {"bash", "zsh", "fish"},
}

// sandboxFirst are the commands whose first argument (after the
// subcommand, if any) is a sandbox's name; those not (yet) in commands()
// are never reached.
var sandboxFirst = []string{"logs", "exec", "pause", "resume", "egress", "ports",
	"start", "stop", "rm", "inspect", "shell", "top", "stats", "cp"}

// completeCmd is the hidden '__complete WORDS...': the candidates for the
// last word, one per line. It never fails loudly: a shell shows nothing
// rather than an error.
func completeCmd(ctx context.Context, words []string) error {
	if len(words) == 0 {
		words = []string{""}
	}
	cur, before := words[len(words)-1], words[:len(words)-1]
	// Global flags and their values come first.
	for len(before) > 0 && strings.HasPrefix(before[0], "-") {
		if !strings.Contains(before[0], "=") && slices.Contains([]string{"--server", "-server", "--key", "-key", "--namespace", "-namespace"}, before[0]) {
			if len(before) == 1 {
				return nil // completing a global flag's value
			}
			before = before[1:]
		}
		before = before[1:]
	}
	var out []string
	switch {
	case len(before) == 0 && strings.HasPrefix(cur, "-"):
		out = []string{"-v", "--server", "--key", "--namespace", "--version", "--help"}
	case len(before) == 0:
		for _, c := range commands() {
			if !strings.HasPrefix(c.name, "_") {
				out = append(out, c.name)
			}
		}
	case before[0] == "help" && len(before) == 1:
		for _, c := range commands() {
			out = append(out, c.name)
		}
	case before[len(before)-1] == "--image" || before[len(before)-1] == "-image":
		out = localImages()
	case strings.HasPrefix(cur, "-"):
		out = commandFlags(ctx, before[0], positional(before[1:]))
	default:
		out = completeArgs(ctx, before[0], positional(before[1:]))
	}
	for _, c := range out {
		if strings.HasPrefix(c, cur) {
			fmt.Println(c)
		}
	}
	return nil
}

// commandFlags are the flags of command name, or of its subcommand in
// pos[0], as its flag set defines them: the command runs with -h, which
// parses no further and records the set (usageFS) for its help.
func commandFlags(ctx context.Context, name string, pos []string) []string {
	c, err := lookup(name)
	if err != nil || c.name == "help" || c.name == "completion" || strings.HasPrefix(c.name, "_") {
		return nil // no flags, or arguments that are not subcommands
	}
	args := []string{"-h"}
	if len(pos) > 0 && slices.Contains(subcommands[name], pos[0]) {
		args = []string{pos[0], "-h"}
	}
	usageFS = nil
	if err := c.run(ctx, args); !errors.Is(err, flag.ErrHelp) || usageFS == nil {
		return nil
	}
	var out []string
	usageFS.VisitAll(func(f *flag.Flag) { out = append(out, dashed(f.Name)) })
	return out
}

// positional is args without flags (a flag's separate value is not told
// apart: it counts as an argument, which at worst offers no names).
func positional(args []string) []string {
	var pos []string
	for _, a := range args {
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") {
			pos = append(pos, a)
		}
	}
	return pos
}

// completeArgs offers what the argument after pos of command cmd can be.
func completeArgs(ctx context.Context, cmd string, pos []string) []string {
	subs, hasSubs := subcommands[cmd]
	if hasSubs && len(pos) == 0 {
		if cmd == "ports" { // its subcommand is optional
			return append(slices.Clone(subs), sandboxNames(ctx)...)
		}
		return subs
	}
	if hasSubs && slices.Contains(subs, pos[0]) {
		if cmd == "image" && len(pos) == 1 && (pos[0] == "inspect" || pos[0] == "rm") {
			return localImages()[1:] // not "host": the store does not hold it
		}
		pos = pos[1:]
	}
	if len(pos) == 0 && slices.Contains(sandboxFirst, cmd) && cmd != "image" {
		return sandboxNames(ctx)
	}
	return nil
}

// sandboxNames are the names of the server's sandboxes, as 'warren ps -a'
// would list them (the environment's server and key, the global flags
// given before), or none within a second.
func sandboxNames(ctx context.Context) []string {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c := &apiClient{hc: &http.Client{}, url: cmp.Or(globals.server, envOr("MSB_SERVER_URL", "http://127.0.0.1:5555")), key: cmp.Or(globals.key, os.Getenv("MSB_API_KEY"))}
	var out struct {
		Sandboxes []psRow `json:"sandboxes"`
	}
	if err := c.call(ctx, "sandbox.list", map[string]any{"namespace": globals.namespace}, &out); err != nil {
		return nil
	}
	names := make([]string, len(out.Sandboxes))
	for i, s := range out.Sandboxes {
		names[i] = s.Name
	}
	return names
}

// localImages are the names in the local image store, none when it does
// not exist yet (completion creates nothing).
func localImages() []string {
	names := []string{"host"}
	var hf hostFlags
	hf.dataDir = envOr("WARREN_DATA_DIR", "/var/lib/warren")
	hf.userNS = "auto"
	if _, err := os.Stat(filepath.Join(hf.dataDir, "warren.db")); err != nil {
		return names
	}
	st, db, err := hf.imageStore()
	if err != nil {
		return names
	}
	defer func() { _ = db.Close() }()
	recs, err := st.List()
	if err != nil {
		return names
	}
	for _, r := range recs {
		names = append(names, r.Name)
	}
	return names
}
