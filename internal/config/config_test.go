package config

import (
	"errors"
	"os"
	"strings"
	"testing"
)

func TestExampleParses(t *testing.T) {
	f, err := Load("../../docs/warren.example.toml")
	if err != nil {
		t.Fatal(err)
	}
	a := f.Namespaces["team-a"]
	if a.MaxMemory.Bytes != 4<<30 || a.TotalMemory.Bytes != 16<<30 || a.MaxCPUs != 2 || a.MaxSandboxes != 20 {
		t.Errorf("team-a quotas: %+v", a)
	}
	if a.Egress == nil || len(*a.Egress) != 3 || *a.ReadOnlyRoot != true || (*a.WritePaths)[0] != "/home/user" {
		t.Errorf("team-a policy: %+v", a)
	}
	g := a.Secrets[0]
	if g.Name != "openai" || g.Key != "openai_key" || g.Mode != ModeProxy || g.Env != "OPENAI_API_KEY" || g.Hosts[0] != "api.openai.com" {
		t.Errorf("grant: %+v", g)
	}
	if ci := f.Namespaces["ci"]; ci.Egress == nil || len(*ci.Egress) != 0 {
		t.Errorf("ci: an empty egress list must stay set (nothing allowed): %+v", ci.Egress)
	}
	if f.Defaults.Disk.Bytes != 10<<30 || f.Audit.CheckpointInterval.D.Minutes() != 1 || len(f.Secrets.Providers) != 2 ||
		f.Workspaces.Stores["s3"].Bucket != "warren" {
		t.Errorf("other sections: %+v", f)
	}
	want := map[string]string{"listen": "127.0.0.1:5555", "max_memory": "8G", "idle_timeout": "10m", "max_cpus": "auto"}
	for _, s := range f.Server {
		if w, ok := want[s.Key]; ok && (len(s.Values) != 1 || s.Values[0] != w) {
			t.Errorf("server %s = %q, want %q", s.Key, s.Values, w)
		}
		if s.Line == 0 {
			t.Errorf("server %s has no line", s.Key)
		}
	}
}

// TestAllProblems is a file with a problem of each kind: every one is
// reported, with its line and key path.
func TestAllProblems(t *testing.T) {
	const file = `[server]
listen = 5555
bogus = 1
idle_timeout = "ten minutes"
max_memory = 8

[defaults]
disk = "ten gigs"
write_paths = ["relative", "/a/../b"]
color = "blue"

[audit]
checkpoint_interval = 60

[[secrets.providers]]
name = "files"
type = "vault"

[[secrets.providers]]
name = "files"
type = "dir"
path = "etc/secrets"

[workspaces.stores.s3]
type = "s3"
endpoint = "ftp://x"
bucket = "B"

[namespaces."*"]
max_cpus = 1

[namespaces."bad name"]
max_cpus = 1

[namespaces.team-a]
max_memory = "-4GiB"
max_cpus = -1
total_memory = "1GiB"
max_sandboxes = -2
images = ["[python"]
egress = ["*", "pypi.org"]
egress_default = ["evil.com"]
isolation = ["vm"]
workspace_store = "nowhere"
write_paths = ["/"]

[[namespaces.team-a.secrets]]
name = "openai"
provider = "nope"
mode = "plain"

[[namespaces.team-a.secrets]]
name = "openai"
provider = "files"
extra = true

[[namespaces.team-a.secrets]]
name = "gh"
provider = "files"

[namespaces.team-b]
disk_inodes = 5000
`
	_, err := Parse("test.toml", []byte(file))
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want *Error", err)
	}
	want := []struct {
		line int
		key  string
		msg  string
	}{
		{2, "server.listen", "want a string"},
		{3, "server.bogus", "unknown key"},
		{4, "server.idle_timeout", "not a duration"},
		{5, "server.max_memory", "want a size"},
		{8, "defaults.disk", "not a size"},
		{9, "defaults.write_paths[0]", "absolute"},
		{9, "defaults.write_paths[1]", "clean"},
		{10, "defaults.color", "unknown key"},
		{13, "audit.checkpoint_interval", "want a duration"},
		{17, "secrets.providers[0].type", "want dir or env"},
		{20, "secrets.providers[1].name", "defined twice"},
		{22, "secrets.providers[1].path", "absolute"},
		{26, "workspaces.stores.s3.endpoint", "http"},
		{27, "workspaces.stores.s3.bucket", "bucket"},
		{29, "namespaces.*", "namespace name"},
		{32, "namespaces.bad name", "namespace name"},
		{36, "namespaces.team-a.max_memory", "want 0 to 1PiB"},
		{37, "namespaces.team-a.max_cpus", "want 0"},
		{39, "namespaces.team-a.max_sandboxes", "want 0"},
		{40, "namespaces.team-a.images[0]", "glob"},
		{41, "namespaces.team-a.egress", "rule 0"},
		{42, "namespaces.team-a.egress_default", "not covered"},
		{43, "namespaces.team-a.isolation[0]", "want one of"},
		{44, "namespaces.team-a.workspace_store", "not defined"},
		{45, "namespaces.team-a.write_paths[0]", "below /"},
		{49, "namespaces.team-a.secrets[0].provider", "not defined"},
		{50, "namespaces.team-a.secrets[0].mode", "want env or proxy"},
		{53, "namespaces.team-a.secrets[1].name", "granted twice"},
		{55, "namespaces.team-a.secrets[1].extra", "unknown key"},
		{52, "namespaces.team-a.secrets[1].hosts", "needs the hosts"},
		{57, "namespaces.team-a.secrets[2].hosts", "needs the hosts"},
		{62, "namespaces.team-b.disk_inodes", "not limited apart from bytes"},
	}
	got := ce.Problems
	for _, w := range want {
		found := false
		for _, p := range got {
			if p.Key == w.key && strings.Contains(p.Msg, w.msg) {
				found = true
				if p.Line != w.line {
					t.Errorf("%s: line %d, want %d", w.key, p.Line, w.line)
				}
			}
		}
		if !found {
			t.Errorf("no problem %s: %q", w.key, w.msg)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d problems, want %d:\n%v", len(got), len(want), err)
	}
	if !strings.Contains(err.Error(), "line 41: namespaces.team-a.egress:") {
		t.Errorf("message: %v", err)
	}
}

func TestDecodeErrors(t *testing.T) {
	for _, c := range []struct {
		file string
		line int
		msg  string
	}{
		{"[namespaces.a]\nmax_cpus = \"two\"\n", 2, "max_cpus"},
		{"a = \n", 1, ""},
		{"[server]\nlisten = \"x\"\n[server]\n", 3, ""},
		{"[namespaces.a]\nsecrets = 1\n", 2, ""},
	} {
		_, err := Parse("t.toml", []byte(c.file))
		var ce *Error
		if !errors.As(err, &ce) || len(ce.Problems) != 1 {
			t.Errorf("%q: err = %v", c.file, err)
			continue
		}
		if p := ce.Problems[0]; p.Line != c.line || !strings.Contains(p.String(), c.msg) {
			t.Errorf("%q: %+v, want line %d", c.file, p, c.line)
		}
	}
}

// TestKeysCaseSensitive: the decoder would take "Max_Memory" for
// max_memory; TOML keys are case-sensitive, and so is the file.
func TestKeysCaseSensitive(t *testing.T) {
	// One spelling of a key each: with both "type" and "TYPE" the decoder
	// would keep either, and the follow-on problem would depend on which.
	_, err := Parse("t.toml", []byte("[namespaces.Team]\nMax_Memory = \"1G\"\n[[secrets.providers]]\nname = \"f\"\nTYPE = \"dir\"\n[Defaults]\ndisk = 1\n"))
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v", err)
	}
	want := []string{
		`line 2: namespaces.Team.Max_Memory: keys are case-sensitive: write "max_memory"`,
		`line 5: secrets.providers[0].TYPE: keys are case-sensitive: write "type"`,
		`line 6: Defaults: keys are case-sensitive: write "defaults"`,
		`line 3: secrets.providers[0].path: "": a dir provider needs an absolute, clean path`, // TYPE set it
	}
	if len(ce.Problems) != len(want) {
		t.Errorf("problems: %v", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("no %q in %v", w, err)
		}
	}
}

func TestSizes(t *testing.T) {
	for s, want := range map[string]int64{
		"0": 0, "512": 512, "1K": 1024, "1kib": 1024, "512MiB": 512 << 20, "10GiB": 10 << 30, "1G": 1 << 30,
		"1.5G": 3 << 29, "2TB": 2 << 40, " 4 GiB ": 4 << 30,
	} {
		if got, err := ParseSize(s); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "G", "-1G", "1P", "1e300", "NaN", "1.0.0M", "10 gigs", "0x10", "2048T"} {
		if n, err := ParseSize(s); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", s, n)
		}
	}
}

func TestTooLarge(t *testing.T) {
	data := []byte("# " + strings.Repeat("x", MaxFileSize) + "\n")
	if _, err := Parse("big", data); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("err = %v", err)
	}
	p := t.TempDir() + "/big.toml"
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("Load: err = %v", err)
	}
}

func TestEmptyFile(t *testing.T) {
	f, err := Parse("empty", nil)
	if err != nil || len(f.Namespaces) != 0 || len(f.Server) != 0 {
		t.Fatalf("%+v %v", f, err)
	}
}

func FuzzParse(f *testing.F) {
	ex, err := os.ReadFile("../../docs/warren.example.toml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(ex)
	f.Add([]byte("[namespaces.a]\nmax_memory = \"1G\"\n[[namespaces.a.secrets]]\nname=\"x\"\n"))
	f.Add([]byte("[server]\nvolume_root = [\"/a\", 1]\nx = {a = 1}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse("fuzz", data)
		if err != nil {
			var ce *Error
			if !errors.As(err, &ce) || len(ce.Problems) == 0 {
				t.Fatalf("error without problems: %v", err)
			}
			return
		}
		for name, n := range file.Namespaces {
			if name == "*" || !nameRE().MatchString(name) {
				t.Fatalf("namespace %q accepted", name)
			}
			if n.MaxMemory.Bytes < 0 || n.MaxCPUs < 0 || n.MaxSandboxes < 0 {
				t.Fatalf("negative quota accepted: %+v", n)
			}
		}
	})
}
