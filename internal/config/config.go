// Package config owns the server's configuration file (warren serve
// --config, docs/policy.md): its TOML schema as plain Go values, a strict
// decoder and a validation that reports every problem at once, each with
// its line and key path. It knows nothing of what consumes the values: the
// server maps them onto its flags, the sandbox manager's namespace policy,
// and the other subsystems' options.
//
// Invariants (the tests and FuzzParse hold it to them):
//   - Parse never panics and reads at most MaxFileSize bytes.
//   - It returns a File, or an error listing every problem it found;
//     never a File built from part of a bad input. Syntax and type errors
//     stop the TOML decoder, so they come one at a time; every other
//     problem (unknown keys, values out of range, references to what is
//     not defined) is reported together with the rest.
//   - A File that parsed has only valid namespace names, sizes, patterns
//     and references.
package config

import (
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/BurntSushi/toml"
)

// MaxFileSize bounds a configuration file.
const MaxFileSize = 1 << 20

// File is a parsed, valid configuration file.
type File struct {
	// Server holds the [server] keys that are set, in the file's order:
	// the flags of warren serve, by name (Setting.Flag).
	Server     []Setting
	Defaults   Defaults
	Audit      Audit
	Secrets    Secrets
	Workspaces Workspaces
	// Namespaces by name; a namespace without a section gets Defaults
	// and no quotas (Policy).
	Namespaces map[string]Namespace
}

// Setting is one [server] key: the flag it sets and its value(s) as the
// flag takes them (a repeatable flag has several).
type Setting struct {
	Key    string
	Flag   string
	Values []string
	Line   int
}

// Defaults are what every namespace gets unless its section overrides it.
type Defaults struct {
	Disk         Size     `toml:"disk"`
	DiskInodes   int64    `toml:"disk_inodes"` // refused when set: see validator.inodes
	ReadOnlyRoot bool     `toml:"read_only_root"`
	WritePaths   []string `toml:"write_paths"`
}

// Audit is the [audit] section.
type Audit struct {
	Dir                string   `toml:"dir"`
	CheckpointInterval Duration `toml:"checkpoint_interval"`
}

// Secrets is the [secrets] section: where secret values come from.
type Secrets struct {
	Providers []Provider `toml:"providers"`
}

// Provider is one [[secrets.providers]]: "dir" reads one file per secret
// under Path; "env" reads the server's environment variable Prefix+KEY.
type Provider struct {
	Name   string `toml:"name"`
	Type   string `toml:"type"`
	Path   string `toml:"path"`
	Prefix string `toml:"prefix"`
}

// Workspaces is the [workspaces] section.
type Workspaces struct {
	Stores map[string]Store `toml:"stores"`
}

// Store is one [workspaces.stores.NAME]: "dir" (Path) or "s3".
type Store struct {
	Type         string `toml:"type"`
	Path         string `toml:"path"`
	Endpoint     string `toml:"endpoint"`
	Bucket       string `toml:"bucket"`
	Region       string `toml:"region"`
	Prefix       string `toml:"prefix"`
	AccessKeyEnv string `toml:"access_key_env"`
	SecretKeyEnv string `toml:"secret_key_env"`
}

// LocalStore is the workspace store that exists without being defined.
const LocalStore = "local"

// Namespace is one [namespaces.NAME] section. Zero quotas do not limit;
// the pointer fields are nil when the section does not set them (then
// Defaults, or no restriction, apply).
type Namespace struct {
	MaxMemory    Size    `toml:"max_memory"`
	MaxCPUs      float64 `toml:"max_cpus"`
	TotalMemory  Size    `toml:"total_memory"`
	TotalCPUs    float64 `toml:"total_cpus"`
	MaxSandboxes int     `toml:"max_sandboxes"`
	Disk         Size    `toml:"disk"`
	DiskInodes   *int64  `toml:"disk_inodes"` // refused when set: see validator.inodes
	// Images are glob patterns (path.Match); empty = any image.
	Images []string `toml:"images"`
	// Egress, when set (even empty), is what rules a sandbox may ask
	// for; nil = any.
	Egress        *[]string `toml:"egress"`
	EgressDefault []string  `toml:"egress_default"`
	// Isolation lists the allowed backends; empty = any.
	Isolation      []string  `toml:"isolation"`
	ReadOnlyRoot   *bool     `toml:"read_only_root"`
	WritePaths     *[]string `toml:"write_paths"`
	WorkspaceStore string    `toml:"workspace_store"`
	WorkspaceQuota Size      `toml:"workspace_quota"`
	Secrets        []Grant   `toml:"secrets"`
	// MaxSnapshots and SnapshotBytes cap the namespace's snapshots.
	MaxSnapshots  int  `toml:"max_snapshots"`
	SnapshotBytes Size `toml:"snapshot_bytes"`
}

// Grant is one [[namespaces.NAME.secrets]]: the secret Name, as
// sandbox.create's secrets names it, comes from Provider's Key and reaches
// the sandbox as Env, by Mode ("env" or "proxy"; proxy only to Hosts).
// Parse fills in the defaults: Key = Name, Mode = "proxy", Env =
// upper(Name).
type Grant struct {
	Name     string   `toml:"name"`
	Provider string   `toml:"provider"`
	Key      string   `toml:"key"`
	Mode     string   `toml:"mode"`
	Env      string   `toml:"env"`
	Hosts    []string `toml:"hosts"`
}

// The grant modes.
const (
	ModeEnv   = "env"
	ModeProxy = "proxy"
)

// Problem is one thing wrong with a file: where (line, 0 when unknown,
// and key path) and what.
type Problem struct {
	Line int
	Key  string
	Msg  string
}

func (p Problem) String() string {
	var b strings.Builder
	if p.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", p.Line)
	}
	if p.Key != "" {
		b.WriteString(p.Key)
		b.WriteString(": ")
	}
	b.WriteString(p.Msg)
	return b.String()
}

// Error is a file that does not parse or validate: every problem found.
type Error struct {
	File     string
	Problems []Problem
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "config %s: ", e.File)
	if len(e.Problems) == 1 {
		b.WriteString(e.Problems[0].String())
		return b.String()
	}
	fmt.Fprintf(&b, "%d problems:", len(e.Problems))
	for i, p := range e.Problems {
		if i == maxShown {
			fmt.Fprintf(&b, "\n  ... and %d more", len(e.Problems)-maxShown)
			break
		}
		b.WriteString("\n  ")
		b.WriteString(p.String())
	}
	return b.String()
}

// maxShown bounds the problems Error's message lists (Problems has all).
const maxShown = 100

// Load reads and parses the file at path.
func Load(path string) (*File, error) {
	f, err := os.Open(path) //nolint:gosec // the operator's own file
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer func() { _ = f.Close() }()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return Parse(path, data)
}

// raw is the file as decoded, before validation; [server] is kept as
// values to check against the flags' table.
type raw struct {
	Server     map[string]any       `toml:"server"`
	Defaults   Defaults             `toml:"defaults"`
	Audit      Audit                `toml:"audit"`
	Secrets    Secrets              `toml:"secrets"`
	Workspaces Workspaces           `toml:"workspaces"`
	Namespaces map[string]Namespace `toml:"namespaces"`
}

// Parse parses and validates a file's contents; name is for messages.
func Parse(name string, data []byte) (*File, error) {
	if len(data) > MaxFileSize {
		return nil, &Error{File: name, Problems: []Problem{{Msg: fmt.Sprintf("larger than %d bytes", MaxFileSize)}}}
	}
	var r raw
	md, err := toml.NewDecoder(strings.NewReader(string(data))).Decode(&r)
	if err != nil {
		return nil, &Error{File: name, Problems: []Problem{decodeProblem(err)}}
	}
	v := &validator{lines: locate(md, data)}
	for _, k := range md.Undecoded() {
		// Keys under [server] are decoded into a map, so an unknown one
		// is reported by the server check (with the flags it could be).
		path, line := v.lines.next(k)
		v.problems = append(v.problems, Problem{Line: line, Key: path, Msg: "unknown key"})
	}
	v.problems = append(v.problems, caseProblems(md, v.lines)...)
	f := &File{Defaults: r.Defaults, Audit: r.Audit, Secrets: r.Secrets, Workspaces: r.Workspaces, Namespaces: r.Namespaces}
	if f.Namespaces == nil {
		f.Namespaces = map[string]Namespace{}
	}
	f.Server = v.server(r.Server)
	v.file(f)
	if len(v.problems) > 0 {
		sort.SliceStable(v.problems, func(i, j int) bool { return v.problems[i].Line < v.problems[j].Line })
		return nil, &Error{File: name, Problems: v.problems}
	}
	return f, nil
}

// decodeProblem turns the TOML decoder's error into a Problem.
func decodeProblem(err error) Problem {
	var pe toml.ParseError
	if errors.As(err, &pe) {
		return Problem{Line: pe.Position.Line, Key: pe.LastKey, Msg: pe.Message}
	}
	// Type errors are plain errors: "toml: line 2 (last key "a.b"): msg".
	if m := decodeErrRE().FindStringSubmatch(err.Error()); m != nil {
		line, _ := strconv.Atoi(m[1])
		return Problem{Line: line, Key: m[2], Msg: m[3]}
	}
	return Problem{Msg: strings.TrimPrefix(err.Error(), "toml: ")}
}

// Compiled on first use, not at package initialisation, which every warren
// command pays (docs/performance.md).
var decodeErrRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`(?s)^toml: line (\d+) \(last key "(.*?)"\): (.*)$`) })
