package main

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/netplumb"
	"github.com/warren-sandbox/warren/internal/testenv"
	"github.com/warren-sandbox/warren/internal/testenv/fakenet"
)

// fetchPy fetches url with Python's urllib and prints the body.
func fetchPy(url string) []string {
	return []string{"/usr/bin/python3", "-c", "import urllib.request as u; print(u.urlopen('" + url + "', timeout=20).read().decode().strip())"}
}

// TestRunEgress: `warren run --egress` gives the sandbox the policed
// network of a server's sandbox, against a fake internet: an allowed name
// is fetched, a denied name and a denied address fail fast and are
// reported, in the gvisor tier too, bad settings are refused before
// anything starts, and nothing of the run's network is left.
func TestRunEgress(t *testing.T) {
	testenv.RequireRoot(t)
	runsc := testenv.RunscBinary(t)
	in := fakenet.Start(t)
	dir := stateDir(t)
	base := native.InstancePrefix(filepath.Join(dir, "run"))
	dns := in.DNS.String()
	for _, tc := range []struct {
		name       string
		args       []string
		code       int
		stdout     string
		stderrHas  []string
		stderrRe   string
		stderrNone string
	}{
		{name: "allowed name", args: append([]string{"run", "--dns-upstream", dns, "--egress", "allowed.test", "--"}, fetchPy("http://allowed.test/x")...),
			stdout: "host=allowed.test path=/x tls=false\n", stderrNone: "egress denied"},
		{name: "denied name", args: append([]string{"run", "--dns-upstream", dns, "--egress", "allowed.test", "--"}, fetchPy("http://denied.test/")...),
			code: 1, stderrHas: []string{"urlopen error"}, stderrRe: `warren run: egress denied 0 connection\(s\) and [1-9][0-9]* DNS query\(ies\) \(-v lists them\)`},
		{name: "denied address, listed", args: append([]string{"run", "-v", "--dns-upstream", dns, "--egress", "allowed.test", "--"}, fetchPy("http://"+in.Addr("denied.test").String()+"/")...),
			code: 1, stderrHas: []string{"warren run: egress denied connection to " + in.Addr("denied.test").String() + ":80"}},
		{name: "allowed name, gvisor", args: append([]string{"run", "--isolation", "gvisor", "--runsc", runsc, "--dns-upstream", dns, "--egress", "allowed.test", "--"}, fetchPy("http://allowed.test/g")...),
			stdout: "host=allowed.test path=/g tls=false\n", stderrNone: "egress denied"},
		{name: "denied name, gvisor", args: append([]string{"run", "--isolation", "gvisor", "--runsc", runsc, "--dns-upstream", dns, "--egress", "allowed.test", "--"}, fetchPy("http://denied.test/")...),
			code: 1, stderrHas: []string{"urlopen error"}, stderrRe: `warren run: egress denied 0 connection\(s\) and [1-9][0-9]* DNS query\(ies\) \(-v lists them\)`},
		{name: "no rules", args: append([]string{"run", "--net", "egress", "--dns-upstream", dns, "--"}, fetchPy("http://allowed.test/")...),
			code: 1, stderrHas: []string{"urlopen error", "warren run: egress denied 0 connection(s)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := warren(t, dir, tc.args...) // the first builds warren: not timed
			start := time.Now()
			r := run(t, cmd, "")
			// A denial is a fast failure, never a timeout.
			if took := time.Since(start); took > 15*time.Second {
				t.Errorf("took %v", took)
			}
			if r.code != tc.code {
				t.Errorf("exit %d, want %d (stdout %q, stderr %q)", r.code, tc.code, r.stdout, r.stderr)
			}
			if tc.stdout != "" && r.stdout != tc.stdout {
				t.Errorf("stdout %q, want %q", r.stdout, tc.stdout)
			}
			for _, s := range tc.stderrHas {
				if !strings.Contains(r.stderr, s) {
					t.Errorf("stderr lacks %q:\n%s", s, r.stderr)
				}
			}
			if tc.stderrRe != "" && !regexp.MustCompile(tc.stderrRe).MatchString(r.stderr) {
				t.Errorf("stderr does not match %q:\n%s", tc.stderrRe, r.stderr)
			}
			if tc.stderrNone != "" && strings.Contains(r.stderr, tc.stderrNone) {
				t.Errorf("stderr has %q:\n%s", tc.stderrNone, r.stderr)
			}
			assertNoRunNet(t, base)
		})
	}
	// The policy held on the wire: the denied name was never looked up
	// upstream, the allowed one was fetched once per tier.
	if slices.Contains(in.Queries(), "denied.test") {
		t.Error("the fake internet was asked for denied.test")
	}
	if n := in.Requests("allowed.test"); n != 2 {
		t.Errorf("allowed.test got %d requests, want 2", n)
	}
	assertNoSandboxState(t, dir)
}

// TestRunNetSettingsRefused: bad network settings fail before anything
// starts (no run directory, no table).
func TestRunNetSettingsRefused(t *testing.T) {
	testenv.RequireRoot(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	taken := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	for _, tc := range []struct {
		name, has string
		args      []string
	}{
		{"invalid rule", `--egress: rule 1 "bad rule!": invalid egress rule`, []string{"--egress", "ok.example", "--egress", "bad rule!"}},
		{"egress with --net none", "--egress gives the sandbox a network: not with --net none", []string{"--net", "none", "--egress", "ok.example"}},
		{"unknown mode", `--net "host": want none (loopback only) or egress`, []string{"--net", "host"}},
		{"upstream without a network", "--dns-upstream: the sandbox has no network", []string{"--dns-upstream", "192.0.2.1"}},
		{"bad upstream", `--dns-upstream "nonsense": want ADDR or ADDR:PORT`, []string{"--egress", "ok.example", "--dns-upstream", "nonsense"}},
		{"publish port 0", `--publish: port "0:80": want HOST:GUEST or PORT`, []string{"--publish", "0:80"}},
		{"publish beyond 65535", `--publish: port "8080:65536": want HOST:GUEST or PORT`, []string{"--publish", "8080:65536"}},
		{"publish twice", "host port 18080 given twice", []string{"--publish", "18080:80", "--publish", "18080:81"}},
		{"publish with --net none", "--publish gives the sandbox a network: not with --net none", []string{"--net", "none", "--publish", "8080:80"}},
		{"publish a taken port", "--publish " + taken + ":80: host port " + taken + " on 127.0.0.1 is taken", []string{"--publish", taken + ":80"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := stateDir(t)
			r := run(t, warren(t, dir, append(append([]string{"run"}, tc.args...), "--", "/bin/true")...), "")
			if r.code != 1 || !strings.Contains(r.stderr, tc.has) {
				t.Errorf("exit %d, stderr %q; want 1 and %q", r.code, r.stderr, tc.has)
			}
			if _, err := os.Stat(filepath.Join(dir, "run")); !os.IsNotExist(err) {
				t.Errorf("the run directory exists (%v): something started", err)
			}
			assertNoRunNet(t, native.InstancePrefix(filepath.Join(dir, "run")))
		})
	}
}

// TestRunPublish: `warren run --publish` serves a sandbox port on the
// host while CMD runs (python's http.server answering one request through
// it), and nothing of it is left when CMD ends.
func TestRunPublish(t *testing.T) {
	testenv.RequireRoot(t)
	dir := stateDir(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hp := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	serveOne := `import http.server as h
class H(h.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"published")
h.HTTPServer(("0.0.0.0", 8000), H).handle_request()`
	cmd := warren(t, dir, "run", "--publish", strconv.Itoa(hp)+":8000", "--", "/usr/bin/python3", "-c", serveOne)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	var body []byte
	for {
		resp, err := c.Get("http://127.0.0.1:" + strconv.Itoa(hp) + "/")
		if err == nil {
			body, _ = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("GET through --publish: %v\n%s", err, stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if string(body) != "published" {
		t.Errorf("GET through --publish: %q", body)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("warren run: %v\n%s", err, stderr.String())
	}
	if conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(hp), time.Second); err == nil {
		_ = conn.Close()
		t.Error("the published port listens after warren run ended")
	}
	assertNoRunNet(t, native.InstancePrefix(filepath.Join(dir, "run")))
	assertNoSandboxState(t, dir)
}

// TestRunNetInstances: concurrent `warren run`s with a network are
// instances of their own (a table each, a pool slot each); one killed with
// SIGKILL leaves its table, which the next `warren run` (even without a
// network) removes.
func TestRunNetInstances(t *testing.T) {
	testenv.RequireRoot(t)
	dir := stateDir(t)
	base := native.InstancePrefix(filepath.Join(dir, "run"))
	// Prints the sandbox's address: the source of its route out.
	const addrPy = `import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(("192.0.2.1", 9)); print(s.getsockname()[0], flush=True)`
	// A then becomes a process the test can find by name.
	marker := "sleep-runnet"
	a := warren(t, dir, "run", "--net", "egress", "--", "/usr/bin/python3", "-c",
		addrPy+"\nimport os, shutil; shutil.copy('/bin/sleep', '/tmp/"+marker+"'); os.execv('/tmp/"+marker+"', ['"+marker+"', '600'])")
	out, err := a.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// On a failure: what the test would have removed.
		_ = a.Process.Kill()
		_ = a.Wait()
		for _, p := range runTables(t, base) {
			_ = netplumb.RemoveInstance(p)
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("run A printed no address: %v", err)
	}
	addrA := parseAddr(t, line)
	tables := runTables(t, base)
	if len(tables) != 1 || !strings.HasPrefix(tables[0], base+"-run-"+strconv.Itoa(a.Process.Pid)+"-") {
		t.Fatalf("tables while run A runs: %v, want one named by A's pid %d", tables, a.Process.Pid)
	}
	tableA := tables[0]
	// B runs while A does: another slot of the auto range.
	b := run(t, warren(t, dir, "run", "--net", "egress", "--", "/usr/bin/python3", "-c", addrPy), "")
	if b.code != 0 {
		t.Fatalf("run B: %+v", b)
	}
	addrB := parseAddr(t, b.stdout)
	auto := netip.MustParsePrefix("10.201.0.0/16")
	slotA, slotB := netip.PrefixFrom(addrA, 20).Masked(), netip.PrefixFrom(addrB, 20).Masked()
	if !auto.Contains(addrA) || !auto.Contains(addrB) || slotA == slotB {
		t.Errorf("run A's address %v (slot %v) and run B's %v (slot %v): want two slots of %v", addrA, slotA, addrB, slotB, auto)
	}
	// B's table went with B.
	if ts := runTables(t, base); !slices.Equal(ts, []string{tableA}) {
		t.Errorf("tables after run B: %v, want only A's %s", ts, tableA)
	}
	waitUntil(t, func() bool { return countProcs(marker) == 1 })
	if err := a.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = a.Wait()
	// Its sandbox ends with it (and the kernel deletes its link).
	waitUntil(t, func() bool { return countProcs(marker) == 0 })
	if ts := runTables(t, base); !slices.Equal(ts, []string{tableA}) {
		t.Fatalf("tables after SIGKILL of run A: %v, want A's %s left", ts, tableA)
	}
	if r := run(t, warren(t, dir, "run", "--", "/bin/true"), ""); r.code != 0 {
		t.Fatalf("next run: %+v", r)
	}
	assertNoRunNet(t, base)
	assertNoSandboxState(t, dir)
}

func parseAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil {
		t.Fatalf("address %q: %v", s, err)
	}
	return a
}

// runTables lists the tables of warren runs of the instance base.
func runTables(t *testing.T, base string) []string {
	t.Helper()
	ts, err := netplumb.Tables(base + "-run-")
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

// assertNoRunNet: no table and no link of a warren run of base is left.
func assertNoRunNet(t *testing.T, base string) {
	t.Helper()
	if ts := runTables(t, base); len(ts) > 0 {
		t.Errorf("tables left: %v", ts)
	}
	var links []netlink.Link
	var err error
	for range 20 { // other tests' links come and go: a dump may be interrupted
		if links, err = netlink.LinkList(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Alias, base+"-run-") {
			t.Errorf("link left: %s (%s)", l.Attrs().Name, l.Attrs().Alias)
		}
	}
}
