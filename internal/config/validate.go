package config

import (
	"fmt"
	"math"
	"net/url"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/egress"
)

// Bounds on what a file may hold, so a large file cannot make the server
// build large tables.
const (
	MaxNamespaces = 4096
	MaxPatterns   = 256 // images, isolation, write paths, hosts of one list
	MaxGrants     = 256
	MaxProviders  = 64
	MaxStores     = 64
)

// The kinds of [server] values, as the flags take them.
type kind int

const (
	kString   kind = iota // any string
	kBool                 // true or false
	kInt                  // a whole number
	kDuration             // a string time.ParseDuration takes ("10m")
	kSize                 // a size string as the flag takes it ("512M", "8G")
	kNumber               // a number, or a string ("auto")
	kList                 // an array of strings (a repeatable flag)
)

// serverKeys are the [server] keys: warren serve's flags, "-" written "_"
// (and -v as verbose). A flag added to serve is added here; a test checks
// the two agree.
var serverKeys = map[string]kind{
	"listen": kString, "dev": kBool, "prewarm": kInt,
	"idle_timeout": kDuration, "idle_action": kString, "max_lifetime": kDuration, "stopped_retention": kDuration,
	"max_sandboxes": kInt, "max_running": kInt,
	"python_image": kString, "node_image": kString, "log_text": kBool,
	"volume_root": kList, "max_tar_download": kSize, "disk": kSize,
	"pull": kBool, "pull_max_size": kSize, "pull_timeout": kDuration, "max_output": kSize,
	"max_memory": kSize, "max_cpus": kNumber, "pids": kNumber, "open_files": kNumber,
	"cpu_overcommit": kNumber, "keep_file_max": kBool, "keep_kernel_limits": kBool,
	// hostFlags
	"data_dir": kString, "run_dir": kString, "userns": kString, "uid_ranges": kString,
	"agent": kString, "spawner": kString, "verbose": kBool, "disk_pool": kString,
	// netFlags
	"network": kString, "dns_upstream": kString, "publish_address": kString, "net_pool": kString,
	"egress_upstream_ca": kString,
	// tierFlags
	"isolation": kString, "runsc": kString,
	// clusterFlags (node mode, docs/kubernetes.md)
	"cluster": kString, "node_name": kString, "cluster_namespace": kString, "node_label": kList, "lease_duration": kDuration,
}

// ServerKeys lists the [server] keys, sorted.
func ServerKeys() []string {
	out := make([]string, 0, len(serverKeys))
	for k := range serverKeys {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// FlagOf is the warren serve flag a [server] key sets.
func FlagOf(key string) string {
	if key == "verbose" {
		return "v"
	}
	return strings.ReplaceAll(key, "_", "-")
}

type validator struct {
	lines    *locator
	problems []Problem
}

func (v *validator) add(key, format string, args ...any) {
	v.problems = append(v.problems, Problem{Line: v.lines.at(key), Key: key, Msg: fmt.Sprintf(format, args...)})
}

// server checks the [server] values against the flags' kinds.
func (v *validator) server(m map[string]any) []Setting {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	// In the file's order, so a repeated setting reads as written.
	sort.SliceStable(keys, func(i, j int) bool {
		return v.lines.at("server."+keys[i]) < v.lines.at("server."+keys[j]) ||
			v.lines.at("server."+keys[i]) == v.lines.at("server."+keys[j]) && keys[i] < keys[j]
	})
	var out []Setting
	for _, k := range keys {
		at := "server." + k
		kd, ok := serverKeys[k]
		if !ok {
			v.add(at, "unknown key: [server] takes warren serve's flags, written with _ (%s)", strings.Join(ServerKeys(), ", "))
			continue
		}
		vals, msg := serverValue(kd, m[k])
		if msg != "" {
			v.add(at, "%s", msg)
			continue
		}
		out = append(out, Setting{Key: k, Flag: FlagOf(k), Values: vals, Line: v.lines.at(at)})
	}
	return out
}

// serverValue is x as the flag's value(s), or what is wrong with it.
func serverValue(kd kind, x any) ([]string, string) {
	switch kd {
	case kString:
		if s, ok := x.(string); ok {
			return []string{s}, ""
		}
		return nil, "want a string"
	case kBool:
		if b, ok := x.(bool); ok {
			return []string{strconv.FormatBool(b)}, ""
		}
		return nil, "want true or false"
	case kInt:
		if n, ok := x.(int64); ok {
			return []string{strconv.FormatInt(n, 10)}, ""
		}
		return nil, "want a whole number"
	case kDuration:
		s, ok := x.(string)
		if !ok {
			return nil, `want a duration as a string, like "10m" or "1h30m"`
		}
		if _, err := time.ParseDuration(s); err != nil {
			return nil, fmt.Sprintf("%q is not a duration (like \"10m\" or \"1h30m\")", s)
		}
		return []string{s}, ""
	case kSize:
		if s, ok := x.(string); ok {
			return []string{s}, ""
		}
		return nil, `want a size as a string with its unit, like "512M" or "8G"`
	case kNumber:
		switch n := x.(type) {
		case string:
			return []string{n}, ""
		case int64:
			return []string{strconv.FormatInt(n, 10)}, ""
		case float64:
			return []string{strconv.FormatFloat(n, 'g', -1, 64)}, ""
		}
		return nil, `want a number or "auto"`
	case kList:
		xs, ok := x.([]any)
		if !ok {
			return nil, "want an array of strings"
		}
		out := make([]string, 0, len(xs))
		for _, e := range xs {
			s, ok := e.(string)
			if !ok {
				return nil, "want an array of strings"
			}
			out = append(out, s)
		}
		return out, ""
	}
	return nil, "unknown kind"
}

// file checks everything but [server], filling in defaults.
func (v *validator) file(f *File) {
	d := f.Defaults
	v.size("defaults.disk", d.Disk)
	v.inodes("defaults.disk_inodes", d.DiskInodes)
	v.writePaths("defaults.write_paths", d.WritePaths)

	if f.Audit.Dir != "" && !cleanAbs(f.Audit.Dir) {
		v.add("audit.dir", "%q: want an absolute, clean path", f.Audit.Dir)
	}
	if c := f.Audit.CheckpointInterval; c.bad != "" {
		v.add("audit.checkpoint_interval", "%s", c.bad)
	} else if c.D < 0 {
		v.add("audit.checkpoint_interval", "%s: want a positive duration", c.D)
	}

	providers := map[string]bool{}
	if len(f.Secrets.Providers) > MaxProviders {
		v.add("secrets.providers", "%d providers, at most %d", len(f.Secrets.Providers), MaxProviders)
	}
	for i, p := range f.Secrets.Providers {
		at := fmt.Sprintf("secrets.providers[%d]", i)
		switch {
		case !nameRE().MatchString(p.Name):
			v.add(at+".name", "%q: want 1-63 of [A-Za-z0-9_-] starting with a letter or digit", p.Name)
		case providers[p.Name]:
			v.add(at+".name", "provider %q is defined twice", p.Name)
		}
		providers[p.Name] = true
		switch p.Type {
		case "dir":
			if !cleanAbs(p.Path) {
				v.add(at+".path", "%q: a dir provider needs an absolute, clean path", p.Path)
			}
			if p.Prefix != "" {
				v.add(at+".prefix", "a dir provider takes no prefix (that is for env)")
			}
		case "env":
			if p.Prefix != "" && !envNameRE().MatchString(p.Prefix) {
				v.add(at+".prefix", "%q: want [A-Za-z0-9_]", p.Prefix)
			}
			if p.Path != "" {
				v.add(at+".path", "an env provider takes no path (that is for dir)")
			}
		default:
			v.add(at+".type", "%q: want dir or env", p.Type)
		}
	}

	stores := map[string]bool{LocalStore: true}
	if len(f.Workspaces.Stores) > MaxStores {
		v.add("workspaces.stores", "%d stores, at most %d", len(f.Workspaces.Stores), MaxStores)
	}
	for _, name := range sortedKeys(f.Workspaces.Stores) {
		s := f.Workspaces.Stores[name]
		at := "workspaces.stores." + name
		stores[name] = true
		if !nameRE().MatchString(name) {
			v.add(at, "store name %q: want 1-63 of [A-Za-z0-9_-] starting with a letter or digit", name)
		}
		switch s.Type {
		case "dir":
			if !cleanAbs(s.Path) {
				v.add(at+".path", "%q: a dir store needs an absolute, clean path", s.Path)
			}
			for key, val := range map[string]string{"endpoint": s.Endpoint, "bucket": s.Bucket, "region": s.Region, "access_key_env": s.AccessKeyEnv, "secret_key_env": s.SecretKeyEnv} {
				if val != "" {
					v.add(at+"."+key, "a dir store takes no %s (that is for s3)", key)
				}
			}
		case "s3":
			if u, err := url.Parse(s.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				v.add(at+".endpoint", "%q: want an http or https URL", s.Endpoint)
			}
			if !bucketRE().MatchString(s.Bucket) {
				v.add(at+".bucket", "%q: want a bucket name (3-63 of [a-z0-9.-])", s.Bucket)
			}
			for key, val := range map[string]string{"access_key_env": s.AccessKeyEnv, "secret_key_env": s.SecretKeyEnv} {
				if val != "" && !envNameRE().MatchString(val) {
					v.add(at+"."+key, "%q: want an environment variable's name", val)
				}
			}
			if s.Path != "" {
				v.add(at+".path", "an s3 store takes no path (that is for dir)")
			}
		default:
			v.add(at+".type", "%q: want dir or s3", s.Type)
		}
	}

	if len(f.Namespaces) > MaxNamespaces {
		v.add("namespaces", "%d namespaces, at most %d", len(f.Namespaces), MaxNamespaces)
	}
	for _, name := range sortedKeys(f.Namespaces) {
		n := f.Namespaces[name]
		v.namespace(name, &n, providers, stores)
		f.Namespaces[name] = n
	}
}

func (v *validator) namespace(name string, n *Namespace, providers, stores map[string]bool) {
	at := "namespaces." + name
	if name == "*" || !auth.ValidNamespace(name) {
		v.add(at, "namespace name %q: want 1-63 of [A-Za-z0-9_-] starting with a letter or digit", name)
	}
	v.size(at+".max_memory", n.MaxMemory)
	v.size(at+".total_memory", n.TotalMemory)
	v.size(at+".disk", n.Disk)
	v.size(at+".workspace_quota", n.WorkspaceQuota)
	v.nonNegative(at+".max_cpus", n.MaxCPUs)
	v.nonNegative(at+".total_cpus", n.TotalCPUs)
	v.nonNegative(at+".max_sandboxes", float64(n.MaxSandboxes))
	v.nonNegative(at+".max_snapshots", float64(n.MaxSnapshots))
	v.size(at+".snapshot_bytes", n.SnapshotBytes)
	if n.DiskInodes != nil {
		v.inodes(at+".disk_inodes", *n.DiskInodes)
	}
	if n.MaxMemory.Bytes > 0 && n.TotalMemory.Bytes > 0 && n.MaxMemory.Bytes > n.TotalMemory.Bytes {
		v.add(at+".max_memory", "%s is above total_memory %s: no sandbox could use it", n.MaxMemory, n.TotalMemory)
	}
	if n.MaxCPUs > 0 && n.TotalCPUs > 0 && n.MaxCPUs > n.TotalCPUs {
		v.add(at+".max_cpus", "%g is above total_cpus %g: no sandbox could use it", n.MaxCPUs, n.TotalCPUs)
	}
	v.count(at+".images", len(n.Images))
	for i, p := range n.Images {
		if _, err := path.Match(p, ""); err != nil || p == "" || strings.ContainsAny(p, " \t\n") {
			v.add(fmt.Sprintf("%s.images[%d]", at, i), "%q is not a valid glob pattern (path.Match: * ? [a-z], \\ escapes)", p)
		}
	}
	if n.Egress != nil {
		if _, err := egress.Compile(*n.Egress); err != nil {
			v.add(at+".egress", "%s", oneLine(err))
		}
	}
	if _, err := egress.Compile(n.EgressDefault); err != nil {
		v.add(at+".egress_default", "%s", oneLine(err))
	} else if n.Egress != nil {
		for _, r := range n.EgressDefault {
			if ok, _ := egress.Covered(r, *n.Egress); !ok {
				v.add(at+".egress_default", "%q is not covered by the namespace's egress patterns", r)
			}
		}
	}
	v.count(at+".isolation", len(n.Isolation))
	for i, iso := range n.Isolation {
		if !slices.Contains(Isolations, iso) {
			v.add(fmt.Sprintf("%s.isolation[%d]", at, i), "%q: want one of %s", iso, strings.Join(Isolations, ", "))
		}
	}
	if n.WritePaths != nil {
		v.writePaths(at+".write_paths", *n.WritePaths)
	}
	if n.WorkspaceStore != "" && !stores[n.WorkspaceStore] {
		v.add(at+".workspace_store", "store %q is not defined under [workspaces.stores]", n.WorkspaceStore)
	}
	if len(n.Secrets) > MaxGrants {
		v.add(at+".secrets", "%d grants, at most %d", len(n.Secrets), MaxGrants)
	}
	seen := map[string]bool{}
	for i := range n.Secrets {
		g := &n.Secrets[i]
		gat := fmt.Sprintf("%s.secrets[%d]", at, i)
		switch {
		case !nameRE().MatchString(g.Name):
			v.add(gat+".name", "%q: want 1-63 of [A-Za-z0-9_-] starting with a letter or digit", g.Name)
		case seen[g.Name]:
			v.add(gat+".name", "secret %q is granted twice", g.Name)
		}
		seen[g.Name] = true
		if !providers[g.Provider] {
			v.add(gat+".provider", "provider %q is not defined under [[secrets.providers]]", g.Provider)
		}
		if g.Key == "" {
			g.Key = g.Name
		}
		if strings.ContainsAny(g.Key, "/\x00") || g.Key == "." || g.Key == ".." {
			v.add(gat+".key", "%q: a key is a file or variable name, without /", g.Key)
		}
		if g.Mode == "" {
			g.Mode = ModeProxy
		}
		if g.Env == "" {
			g.Env = strings.ToUpper(strings.ReplaceAll(g.Name, "-", "_"))
		}
		if !envNameRE().MatchString(g.Env) {
			v.add(gat+".env", "%q: want an environment variable's name ([A-Za-z_][A-Za-z0-9_]*)", g.Env)
		}
		v.count(gat+".hosts", len(g.Hosts))
		switch g.Mode {
		case ModeProxy:
			if len(g.Hosts) == 0 {
				v.add(gat+".hosts", "a proxy grant needs the hosts that may receive the secret")
			}
		case ModeEnv:
			if len(g.Hosts) > 0 {
				v.add(gat+".hosts", "an env grant takes no hosts: the sandbox holds the value itself")
			}
		default:
			v.add(gat+".mode", "%q: want env or proxy", g.Mode)
		}
		for j, h := range g.Hosts {
			if r, err := egress.ParseRule(h); err != nil || r.IsAddr() || r.AnyPort || r.Port != 0 {
				v.add(fmt.Sprintf("%s.hosts[%d]", gat, j), "%q: want a host name or a *.suffix wildcard, without a port", h)
			}
		}
	}
}

// Isolations are the isolation levels (backends) a namespace may allow.
var Isolations = []string{"native", "gvisor"}

// Compiled on first use, not at package initialisation, which every warren
// command pays (docs/performance.md).
var (
	nameRE    = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$`) })
	envNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`) })
	bucketRE  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`) })
)

func (v *validator) size(key string, s Size) {
	if s.bad != "" {
		v.add(key, "%s", s.bad)
	}
}

// inodes refuses a file-count limit: nothing would enforce it (a limit
// nothing enforces is refused, never dropped). The disk limits' btrfs
// has no file-count quota; each file's metadata counts against `disk`
// instead, and the pool's inodes are not the host's (docs/policy.md).
func (v *validator) inodes(key string, n int64) {
	if n != 0 {
		v.add(key, "%d: file counts are not limited apart from bytes (each file's metadata counts against disk; docs/policy.md#disk-limits): remove it, and bound files with disk", n)
	}
}

func (v *validator) nonNegative(key string, x float64) {
	if x < 0 || math.IsNaN(x) || math.IsInf(x, 0) {
		v.add(key, "%v: want 0 (no limit) or more", x)
	}
}

func (v *validator) count(key string, n int) {
	if n > MaxPatterns {
		v.add(key, "%d entries, at most %d", n, MaxPatterns)
	}
}

func (v *validator) writePaths(key string, ps []string) {
	v.count(key, len(ps))
	for i, p := range ps {
		if !cleanAbs(p) || p == "/" {
			v.add(fmt.Sprintf("%s[%d]", key, i), "%q: want an absolute, clean path below /", p)
		}
	}
}

func cleanAbs(p string) bool {
	return p != "" && filepath.IsAbs(p) && filepath.Clean(p) == p && !strings.ContainsRune(p, 0)
}

// oneLine joins a multi-line error (errors.Join) into one line.
func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
