package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"sync/atomic"

	"github.com/warren-sandbox/warren/internal/config"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/secrets"
	"github.com/warren-sandbox/warren/internal/workspace"
)

// The configuration file of warren serve (--config, docs/policy.md).
//   - Its [server] keys set the flags of the same names, before the server
//     starts, through the flags' own parsing: a value is checked as the
//     flag would check it. A flag given on the command line wins over the
//     file (the operator's one-off override), and the start says so.
//   - Its namespaces' policies are live: the manager asks livePolicy at
//     every start, and a reload (SIGHUP) swaps the whole table at once, so
//     a start sees the old file or the new one, never a mix.
//   - A file that does not parse changes nothing: at start the server
//     does not start; on reload the old file stays, and the log lists
//     every problem.
//   - What is read only at start ([server], [audit], secret providers,
//     workspace stores) keeps its running value on reload; a change to it
//     is logged as needing a restart.

// applyConfig reads --config, when given, and sets the flags its [server]
// keys name that the command line did not.
func (c *serveConfig) applyConfig(fs *flag.FlagSet) error {
	if c.configPath == "" {
		return nil
	}
	f, err := config.Load(c.configPath)
	if err != nil {
		return err
	}
	explicit := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { explicit[fl.Name] = true })
	var errs []error
	var overridden []string
	for _, s := range f.Server {
		if explicit[s.Flag] {
			overridden = append(overridden, s.Key)
			continue
		}
		for _, v := range s.Values {
			if err := fs.Set(s.Flag, v); err != nil {
				errs = append(errs, fmt.Errorf("config %s: line %d: server.%s: %w", c.configPath, s.Line, s.Key, err))
			}
		}
	}
	// [audit] sets the audit log's flags the same way.
	if a := f.Audit; a.Dir != "" && !explicit["audit-dir"] {
		c.auditDir = a.Dir
	}
	if a := f.Audit; a.CheckpointInterval.D > 0 && !explicit["audit-checkpoint-interval"] {
		c.auditCheckpointing = a.CheckpointInterval.D
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	c.policy = &livePolicy{path: c.configPath, boot: f, explicit: explicit, overridden: overridden}
	c.policy.cur.Store(newPolicyTable(f))
	return nil
}

// livePolicy is the namespaces' policy of the file the server runs with.
type livePolicy struct {
	path string
	// boot is the file the server started with: what is read only at
	// start is compared with it.
	boot     *config.File
	explicit map[string]bool // flags given on the command line
	// recorder, once set, records each load and reload (the audit log).
	recorder   atomic.Pointer[func(accepted bool, problems []string)]
	overridden []string // [server] keys those flags won over
	cur        atomic.Pointer[policyTable]
}

// policyTable is one file's policies, built once per load.
type policyTable struct {
	byNS  map[string]sandbox.NamespacePolicy
	def   sandbox.NamespacePolicy // a namespace without a section
	names []string
}

func newPolicyTable(f *config.File) *policyTable {
	t := &policyTable{byNS: map[string]sandbox.NamespacePolicy{}, def: namespacePolicy(f, nil)}
	for name, n := range f.Namespaces {
		t.byNS[name] = namespacePolicy(f, &n)
		t.names = append(t.names, name)
	}
	sort.Strings(t.names)
	return t
}

// Policy is sandbox.Options.Policy.
func (l *livePolicy) Policy(ns string) sandbox.NamespacePolicy {
	t := l.cur.Load()
	if p, ok := t.byNS[ns]; ok {
		return p
	}
	return t.def
}

// Namespaces is sandbox.Options.Namespaces.
func (l *livePolicy) Namespaces() []string { return l.cur.Load().names }

// namespacePolicy is n's policy under f's defaults (n nil: a namespace
// without a section).
func namespacePolicy(f *config.File, n *config.Namespace) sandbox.NamespacePolicy {
	d := f.Defaults
	p := sandbox.NamespacePolicy{DiskBytes: d.Disk.Bytes, ReadOnlyRoot: d.ReadOnlyRoot,
		WritePaths: d.WritePaths, WorkspaceStore: config.LocalStore}
	if n == nil {
		return p
	}
	p.MaxMemoryMiB, p.MaxCPUs = mib(n.MaxMemory.Bytes), n.MaxCPUs
	p.TotalMemoryMiB, p.TotalCPUs, p.MaxSandboxes = mib(n.TotalMemory.Bytes), n.TotalCPUs, n.MaxSandboxes
	if n.Disk.Bytes > 0 {
		p.DiskBytes = n.Disk.Bytes
	}
	p.Images, p.EgressDefault, p.Isolation = n.Images, n.EgressDefault, n.Isolation
	if n.Egress != nil {
		p.Egress = append([]string{}, *n.Egress...) // set, even empty: nothing beyond it
	}
	if n.ReadOnlyRoot != nil {
		p.ReadOnlyRoot = *n.ReadOnlyRoot
	}
	if n.WritePaths != nil {
		p.WritePaths = *n.WritePaths
	}
	for _, g := range n.Secrets {
		p.Secrets = append(p.Secrets, g.Name)
	}
	if n.WorkspaceStore != "" {
		p.WorkspaceStore = n.WorkspaceStore
	}
	p.WorkspaceQuota = n.WorkspaceQuota.Bytes
	p.MaxSnapshots, p.SnapshotBytes = n.MaxSnapshots, n.SnapshotBytes.Bytes
	return p
}

// mib is bytes in MiB, a nonzero amount below 1 MiB counting as 1 (so a
// tiny quota limits rather than reading as none).
func mib(bytes int64) int64 {
	if bytes > 0 && bytes < 1<<20 {
		return 1
	}
	return bytes >> 20
}

// reload reads the file again: a valid one's policies apply to the
// requests after it; an invalid one is refused, every problem logged, and
// the old one stays.
func (l *livePolicy) reload(log *slog.Logger) error {
	f, err := config.Load(l.path)
	if err != nil {
		var ce *config.Error
		problems := []string{err.Error()}
		if errors.As(err, &ce) {
			problems = problems[:0]
			for _, p := range ce.Problems {
				problems = append(problems, p.String())
			}
		}
		log.Error("config not reloaded: it has problems, and the server keeps the one it runs with", "path", l.path, "problems", problems)
		l.record(false, problems)
		return err
	}
	l.cur.Store(newPolicyTable(f))
	l.record(true, nil)
	for _, k := range l.needsRestart(f) {
		log.Warn("config: this setting needs a restart to change; the server keeps its running value", "key", k)
	}
	log.Info("config reloaded", "path", l.path, "namespaces", len(f.Namespaces))
	return nil
}

// record tells the audit log of a load or reload (recorded when set).
func (l *livePolicy) record(accepted bool, problems []string) {
	if f := l.recorder.Load(); f != nil {
		(*f)(accepted, problems)
	}
}

// needsRestart lists what f changes of what is read only at start: the
// [server] keys (but those a command-line flag set) and the sections
// other parts of the server are built from.
func (l *livePolicy) needsRestart(f *config.File) []string {
	values := func(f *config.File) map[string][]string {
		m := map[string][]string{}
		for _, s := range f.Server {
			if !l.explicit[s.Flag] {
				m[s.Key] = s.Values
			}
		}
		return m
	}
	old, cur := values(l.boot), values(f)
	var out []string
	for _, k := range config.ServerKeys() {
		if !slices.Equal(old[k], cur[k]) {
			out = append(out, "server."+k)
		}
	}
	if !reflect.DeepEqual(l.boot.Audit, f.Audit) {
		out = append(out, "audit")
	}
	if !reflect.DeepEqual(l.boot.Secrets, f.Secrets) {
		out = append(out, "secrets.providers")
	}
	if !reflect.DeepEqual(secretsConfig(l.boot).Grants, secretsConfig(f).Grants) {
		out = append(out, "namespaces.*.secrets")
	}
	if !reflect.DeepEqual(l.boot.Workspaces, f.Workspaces) {
		out = append(out, "workspaces.stores")
	}
	return out
}

// secretStore opens the file's secret providers and namespace grants (read
// at start: a change needs a restart); nil without a file or without
// providers, and a sandbox naming secrets is refused.
func (l *livePolicy) secretStore() (*secrets.Store, error) {
	if l == nil || len(l.boot.Secrets.Providers) == 0 {
		return nil, nil
	}
	st, err := secrets.Open(secretsConfig(l.boot))
	if err != nil {
		return nil, fmt.Errorf("config %s: secrets: %w", l.path, err)
	}
	return st, nil
}

// secretsConfig is f's [secrets] section and namespace grants as the
// secrets package takes them.
func secretsConfig(f *config.File) secrets.Config {
	var c secrets.Config
	for _, p := range f.Secrets.Providers {
		c.Providers = append(c.Providers, secrets.ProviderConfig{Name: p.Name, Type: p.Type, Path: p.Path, Prefix: p.Prefix})
	}
	for ns, n := range f.Namespaces {
		for _, g := range n.Secrets {
			if c.Grants == nil {
				c.Grants = map[string][]secrets.Grant{}
			}
			c.Grants[ns] = append(c.Grants[ns], secrets.Grant{Name: g.Name, Provider: g.Provider, Key: g.Key, Mode: g.Mode, Env: g.Env, Hosts: g.Hosts})
		}
	}
	return c
}

// diskSetting names the first disk limit the file sets ("" for none, or
// without a file), for a server that has no disk limits to refuse it.
func (l *livePolicy) diskSetting() string {
	if l == nil {
		return ""
	}
	if l.boot.Defaults.Disk.Bytes > 0 {
		return "defaults.disk"
	}
	for _, name := range l.cur.Load().names {
		if n := l.boot.Namespaces[name]; n.Disk.Bytes > 0 {
			return "namespaces." + name + ".disk"
		}
	}
	return ""
}

// workspaceStores are the file's [workspaces.stores] as the workspace
// package takes them (nil without a file); dataDir holds the S3 stores'
// local copies.
func (l *livePolicy) workspaceStores(ctx context.Context, dataDir string) (map[string]workspace.Store, error) {
	if l == nil || len(l.boot.Workspaces.Stores) == 0 {
		return nil, nil
	}
	out := map[string]workspace.Store{}
	for name, st := range l.boot.Workspaces.Stores {
		switch st.Type {
		case "dir":
			out[name] = &workspace.Dir{Root: st.Path}
		case "s3":
			s3, err := workspace.NewS3(ctx, workspace.S3Options{Endpoint: st.Endpoint, Bucket: st.Bucket, Region: st.Region, Prefix: st.Prefix,
				AccessKeyEnv: st.AccessKeyEnv, SecretKeyEnv: st.SecretKeyEnv, Cache: filepath.Join(dataDir, "workspaces", ".s3", name)})
			if err != nil {
				return nil, fmt.Errorf("config %s: workspaces.stores.%s: %w", l.path, name, err)
			}
			out[name] = s3
		}
	}
	return out, nil
}

// workspaceOf is a namespace's workspace store and quota, as the workspace
// manager asks for them (the live policy's: a reload applies).
func (l *livePolicy) workspaceOf(ns string) (string, int64) {
	p := l.Policy(ns)
	return p.WorkspaceStore, p.WorkspaceQuota
}
