package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/config"
	"github.com/warren-sandbox/warren/internal/testenv"
)

// TestServerKeysAreFlags: every [server] key names a flag of warren
// serve, and every flag (but --config) has its key.
func TestServerKeysAreFlags(t *testing.T) {
	var c serveConfig
	fs, err := c.flagSet()
	if err != nil {
		t.Fatal(err)
	}
	keys := config.ServerKeys()
	for _, k := range keys {
		if fs.Lookup(config.FlagOf(k)) == nil {
			t.Errorf("[server] %s: warren serve has no flag --%s", k, config.FlagOf(k))
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		switch f.Name {
		case "config", "audit", "audit-dir", "audit-checkpoint-interval": // the last two: [audit]
			return
		}
		if !slices.ContainsFunc(keys, func(k string) bool { return config.FlagOf(k) == f.Name }) {
			t.Errorf("flag --%s has no [server] key", f.Name)
		}
	})
}

func writeConfig(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestApplyConfig: the file's [server] keys set the flags the command
// line did not give; a flag given wins; a value a flag refuses is an
// error naming the line.
func TestApplyConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.toml")
	writeConfig(t, path, `[server]
listen = "127.0.0.1:1"
idle_timeout = "7m"
volume_root = ["/a", "/b"]
verbose = true
max_memory = "2G"
`)
	var c serveConfig
	fs, err := c.flagSet()
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.Parse([]string{"--config", path, "--listen", "127.0.0.1:9", "--max-memory=1G"}); err != nil {
		t.Fatal(err)
	}
	if err := c.applyConfig(fs); err != nil {
		t.Fatal(err)
	}
	if c.listen != "127.0.0.1:9" || c.maxMemory != "1G" || c.idleTimeout != 7*time.Minute || !slices.Equal(c.volumeRoots, []string{"/a", "/b"}) || !c.hf.verbose {
		t.Errorf("listen %q max-memory %q idle %v volume roots %q verbose %v", c.listen, c.maxMemory, c.idleTimeout, c.volumeRoots, c.hf.verbose)
	}
	if !slices.Equal(c.policy.overridden, []string{"listen", "max_memory"}) {
		t.Errorf("overridden %q", c.policy.overridden)
	}

	writeConfig(t, path, "[server]\nprewarm = 1\npull = true\nnetwork = \"off\"\nstopped_retention = \"-1s\"\n")
	var c2 serveConfig
	fs2, _ := c2.flagSet()
	_ = fs2.Parse([]string{"--config", path})
	if err := c2.applyConfig(fs2); err != nil || c2.prewarm != 1 || c2.net.mode != "off" || c2.stoppedRetention != -time.Second {
		t.Errorf("%v: prewarm %d network %q retention %v", err, c2.prewarm, c2.net.mode, c2.stoppedRetention)
	}
	writeConfig(t, path, "[server]\nbogus = 1\nprewarm = \"x\"\n")
	var c3 serveConfig
	fs3, _ := c3.flagSet()
	_ = fs3.Parse([]string{"--config", path})
	if err := c3.applyConfig(fs3); err == nil || !strings.Contains(err.Error(), "line 2: server.bogus: unknown key") || !strings.Contains(err.Error(), "line 3: server.prewarm") {
		t.Errorf("bad file: %v", err)
	}
}

// TestReload exercises the reload directly: a valid file's policies
// replace the old at once, an invalid one is refused with every problem
// logged and the old one stays, and what needs a restart is named.
func TestReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.toml")
	writeConfig(t, path, "[server]\nidle_timeout = \"5m\"\n[defaults]\ndisk = \"1GiB\"\n[namespaces.team-a]\nmax_memory = \"1GiB\"\negress = []\n")
	var c serveConfig
	fs, _ := c.flagSet()
	_ = fs.Parse([]string{"--config", path})
	if err := c.applyConfig(fs); err != nil {
		t.Fatal(err)
	}
	lp := c.policy
	if p := lp.Policy("team-a"); p.MaxMemoryMiB != 1024 || p.Egress == nil || p.DiskBytes != 1<<30 || p.WorkspaceStore != "local" {
		t.Fatalf("team-a: %+v", p)
	}
	if p := lp.Policy("other"); p.MaxMemoryMiB != 0 || p.Egress != nil || p.DiskBytes != 1<<30 {
		t.Fatalf("other: %+v", p)
	}
	var logBuf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logBuf, nil))

	writeConfig(t, path, "[server]\nidle_timeout = \"6m\"\n[audit]\ndir = \"/x\"\n[namespaces.team-a]\nmax_memory = \"2GiB\"\nmax_cpus = 0.5\n[namespaces.b]\nmax_sandboxes = 1\n")
	if err := lp.reload(log); err != nil {
		t.Fatal(err)
	}
	if p := lp.Policy("team-a"); p.MaxMemoryMiB != 2048 || p.MaxCPUs != 0.5 || p.Egress != nil || p.DiskBytes != 0 {
		t.Errorf("after reload: %+v", p)
	}
	if !slices.Equal(lp.Namespaces(), []string{"b", "team-a"}) {
		t.Errorf("namespaces %q", lp.Namespaces())
	}
	for _, want := range []string{`"key":"server.idle_timeout"`, `"key":"audit"`, `"msg":"config reloaded"`} {
		if !strings.Contains(logBuf.String(), want) {
			t.Errorf("log lacks %s:\n%s", want, logBuf.String())
		}
	}
	logBuf.Reset()
	writeConfig(t, path, "[namespaces.team-a]\nmax_memory = \"lots\"\nmax_cpus = -1\n[namespaces.\"*\"]\n")
	if err := lp.reload(log); err == nil {
		t.Fatal("a bad file was reloaded")
	}
	if p := lp.Policy("team-a"); p.MaxMemoryMiB != 2048 {
		t.Errorf("a refused reload changed the policy: %+v", p)
	}
	for _, want := range []string{"namespaces.team-a.max_memory", "namespaces.team-a.max_cpus", `namespaces.*`, "config not reloaded"} {
		if !strings.Contains(logBuf.String(), want) {
			t.Errorf("log lacks %s:\n%s", want, logBuf.String())
		}
	}
}

// TestServeConfigSIGHUP: a real warren serve with --config: the file's
// [server] settings apply (a command-line flag wins), its quotas refuse a
// start, SIGHUP swaps in a valid new file and refuses a bad one (every
// problem logged, the old quotas kept), and warren ns shows the quotas.
func TestServeConfigSIGHUP(t *testing.T) {
	dir := stateDir(t)
	path := filepath.Join(dir, "warren.toml")
	writeConfig(t, path, "[server]\nlisten = \"127.0.0.1:1\"\nnetwork = \"off\"\nidle_timeout = \"9m\"\n[namespaces.team-a]\nmax_memory = \"256MiB\"\nmax_sandboxes = 3\n")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	cmd := warren(t, dir, "serve", "--dev", "--config", path, "--listen", addr, "--prewarm", "0", "--keep-file-max")
	var stderr testenv.SyncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	url := "http://" + addr
	waitUntil(t, func() bool {
		resp, err := http.Get(url + "/api/v1/health")
		if err == nil {
			_ = resp.Body.Close()
		}
		return err == nil
	})
	if s := stderr.String(); !strings.Contains(s, `"network":false`) || !strings.Contains(s, `"key":"server.listen"`) {
		t.Fatalf("the file's settings were not applied, or the flag's win not said:\n%s", s)
	}
	call := func(method string, params map[string]any) (json.RawMessage, map[string]any) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method, "params": params, "id": 1})
		resp, err := http.Post(url+"/api/v1/rpc", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var r struct {
			Result json.RawMessage `json:"result"`
			Error  map[string]any  `json:"error"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			t.Fatal(err)
		}
		return r.Result, r.Error
	}
	create := func(mem int) map[string]any {
		_, e := call("sandbox.create", map[string]any{"name": fmt.Sprint("s", mem), "namespace": "team-a", "memory_mib": mem, "image": "host"})
		if e == nil {
			_, _ = call("sandbox.remove", map[string]any{"sandbox": fmt.Sprint("s", mem), "namespace": "team-a"})
		}
		return e
	}
	if e := create(512); e == nil || !strings.Contains(fmt.Sprint(e["message"]), `max_memory of 256 MiB`) {
		t.Fatalf("create over the quota: %v", e)
	}
	reloads := func() int { return strings.Count(stderr.String(), "config reloaded") }
	writeConfig(t, path, "[server]\nlisten = \"127.0.0.1:1\"\nnetwork = \"on\"\nidle_timeout = \"9m\"\n[namespaces.team-a]\nmax_memory = \"1GiB\"\nmax_sandboxes = 3\n")
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool { return reloads() == 1 })
	// network changed: needs a restart; listen is the flag's, not the
	// file's: said once, at start.
	if s := stderr.String(); !strings.Contains(s, `"key":"server.network"`) || strings.Count(s, `"key":"server.listen"`) != 1 {
		t.Errorf("needs-restart report:\n%s", s)
	}
	if e := create(1024); e != nil {
		t.Errorf("the reloaded quota does not apply: %v", e)
	}
	if e := create(2048); e == nil || !strings.Contains(fmt.Sprint(e["message"]), `max_memory of 1024 MiB`) {
		t.Errorf("create over the new quota: %v", e)
	}
	writeConfig(t, path, "[namespaces.team-a]\nmax_memory = \"huge\"\nmax_sandboxes = -1\n")
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool { return strings.Contains(stderr.String(), "config not reloaded") })
	for _, want := range []string{"namespaces.team-a.max_memory", "namespaces.team-a.max_sandboxes"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("the refused reload's log lacks %s", want)
		}
	}
	if e := create(2048); e == nil || !strings.Contains(fmt.Sprint(e["message"]), `max_memory of 1024 MiB`) {
		t.Errorf("after a refused reload: %v", e)
	}
	ns := warren(t, dir, "ns")
	ns.Env = append(ns.Env, "MSB_SERVER_URL="+url)
	r := run(t, ns, "")
	if r.code != 0 || !strings.Contains(r.stdout, "team-a") || !strings.Contains(r.stdout, "0/3") || !strings.Contains(r.stdout, "1024 MiB") {
		t.Errorf("warren ns: %+v", r)
	}
	stopServe(t, cmd)
}

// TestDiskSetting: a file that sets a disk limit is named, so a server
// without disk limits refuses to start on it rather than drop the limit.
func TestDiskSetting(t *testing.T) {
	if got := (*livePolicy)(nil).diskSetting(); got != "" {
		t.Errorf("no file: %q", got)
	}
	path := filepath.Join(t.TempDir(), "w.toml")
	for _, c := range []struct{ text, want string }{
		{"[namespaces.a]\nmax_sandboxes = 1\n", ""},
		{"[defaults]\ndisk = \"1GiB\"\n", "defaults.disk"},
		{"[namespaces.a]\nmax_sandboxes = 1\n[namespaces.b]\ndisk = \"64MiB\"\n", "namespaces.b.disk"},
	} {
		writeConfig(t, path, c.text)
		var sc serveConfig
		fs, err := sc.flagSet()
		if err != nil {
			t.Fatal(err)
		}
		sc.configPath = path
		if err := sc.applyConfig(fs); err != nil {
			t.Fatal(err)
		}
		if got := sc.policy.diskSetting(); got != c.want {
			t.Errorf("%q: %q, want %q", c.text, got, c.want)
		}
	}
}
