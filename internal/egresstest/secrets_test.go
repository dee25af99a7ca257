package egresstest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/testenv/fakenet"
)

// TestSecrets runs a real server with a directory provider (proxy mode)
// and an environment provider (env mode) against the fake internet: the
// sandbox sees the env-mode value and only a placeholder for the other;
// the granted host gets the value over HTTPS and HTTP, another allowed
// host the placeholder; a second request on one connection naming a
// denied host is cut; a rotated value takes effect at the next start;
// and no value is in any response, log line, metric, sandbox log or
// database file of the server.
func TestSecrets(t *testing.T) { testSecrets(t, "native") }

// TestSecretsGvisor: the same with the sandboxes in the gvisor tier,
// whose agent installs the CA at its start too; a read-only root with
// the CA is refused there, and a server restart stops its sandboxes.
func TestSecretsGvisor(t *testing.T) { testSecrets(t, "gvisor") }

func testSecrets(t *testing.T, tier string) {
	start := time.Now()
	in := fakenet.Start(t)
	random := func(p string) string {
		b := make([]byte, 12)
		_, _ = rand.Read(b)
		return p + hex.EncodeToString(b)
	}
	fileValue, envValue, rotated := random("FILEVAL"), random("ENVVAL"), random("ROTATED")
	values := []string{fileValue, envValue, rotated}
	dir := t.TempDir()
	secretsDir := filepath.Join(dir, "secrets")
	if err := os.Mkdir(secretsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(secretsDir, "openai_key"), []byte(fileValue+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("WARREN_SECRET_T_DB", envValue)
	cfg := fmt.Sprintf(`
[[secrets.providers]]
name = "files"
type = "dir"
path = %q

[[secrets.providers]]
name = "env"
type = "env"
prefix = "WARREN_SECRET_T_"

[namespaces.%s]
[[namespaces.%s.secrets]]
name = "openai"
provider = "files"
key = "openai_key"
env = "OPENAI_API_KEY"
hosts = ["allowed.test"]

[[namespaces.%s.secrets]]
name = "db"
provider = "env"
key = "DB"
mode = "env"
env = "DB_PASSWORD"

[namespaces.%s-ro]
read_only_root = true
[[namespaces.%s-ro.secrets]]
name = "openai"
provider = "files"
key = "openai_key"
env = "OPENAI_API_KEY"
hosts = ["allowed.test"]
`, secretsDir, ns, ns, ns, ns, ns)
	cfgPath := filepath.Join(dir, "warren.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	hostBundle, _ := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	s := startServer(t, append([]string{"--dns-upstream", in.DNS.String(), "--config", cfgPath, "--egress-upstream-ca", in.CAFile}, tierFlags(t, tier)...)...)
	t.Logf("fake internet and server up in %v", time.Since(start))

	// Every answer of the server, by who said it (scanned at the end),
	// and the methods called.
	ans := newAnswers()
	reflected := false // the next answers carry what a grant's host echoed
	rpc := func(key, method string, params any) (json.RawMessage, *rpcError) {
		t.Helper()
		ans.called[method] = true
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
		req, _ := http.NewRequest("POST", s.url+"/api/v1/rpc", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := s.client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		raw, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		switch {
		case reflected:
			ans.add(byGrantHost, raw)
		case sandboxOutput[method]:
			ans.add(bySandbox, raw)
		default:
			ans.add(byServer, raw)
		}
		var ans struct {
			Result json.RawMessage `json:"result"`
			Error  *struct {
				Message string `json:"message"`
				Data    struct {
					Kind string `json:"kind"`
				} `json:"data"`
			} `json:"error"`
		}
		if err := json.Unmarshal(raw, &ans); err != nil {
			t.Fatalf("%s: %s", method, raw)
		}
		if ans.Error != nil {
			return nil, &rpcError{Status: resp.StatusCode, Kind: ans.Error.Data.Kind, Message: ans.Error.Message}
		}
		return ans.Result, nil
	}
	must := func(method string, params any) json.RawMessage {
		t.Helper()
		r, err := rpc(s.key, method, params)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		return r
	}
	sh := func(script string) string {
		t.Helper()
		var r execResult
		if err := json.Unmarshal(must("sandbox.exec", map[string]any{"sandbox": "sec", "namespace": ns, "argv": []string{"sh", "-c", script}, "timeout": 60}), &r); err != nil {
			t.Fatal(err)
		}
		if r.ExitCode != 0 {
			t.Fatalf("%s: exit %d: %s %s", script, r.ExitCode, r.Stdout, r.Stderr)
		}
		return r.Stdout
	}

	// A name the namespace has no grant for: forbidden, by name.
	if _, err := rpc(s.key, "sandbox.create", map[string]any{"name": "nope", "namespace": ns, "secrets": []string{"openai", "stripe"}}); err == nil ||
		err.Kind != "forbidden" || !strings.Contains(err.Message, `"stripe"`) {
		t.Fatalf("an ungranted secret: %v", err)
	}
	must("sandbox.create", map[string]any{"name": "sec", "namespace": ns, "egress": []string{"allowed.test", "*.wild.test"}, "secrets": []string{"openai", "db"}})
	sh(`cat > /tmp/fakenet-ca.pem <<'EOF'
` + string(in.CAPEM) + `EOF`)

	var placeholder string
	t.Run("environment", func(t *testing.T) {
		env := sh("env")
		if !strings.Contains(env, "DB_PASSWORD="+envValue+"\n") {
			t.Errorf("env mode: DB_PASSWORD not in the environment:\n%s", env)
		}
		m := regexp.MustCompile(`(?m)^OPENAI_API_KEY=(warren-secret-openai-[0-9a-f]{32})$`).FindStringSubmatch(env)
		if m == nil {
			t.Fatalf("proxy mode: no placeholder in the environment:\n%s", env)
		}
		placeholder = m[1]
		if strings.Contains(env, fileValue) {
			t.Error("the proxy-mode value is in the sandbox's environment")
		}
		for _, k := range []string{"SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE"} {
			if !strings.Contains(env, k+"=/etc/ssl/certs/ca-certificates.crt\n") {
				t.Errorf("%s not set", k)
			}
		}
	})
	if placeholder == "" {
		t.FailNow()
	}
	echo := func(url string, extra string) map[string]any {
		t.Helper()
		reflected = true
		defer func() { reflected = false }()
		out := sh(`curl -sS --max-time 20 ` + extra + ` -H "Authorization: Bearer $OPENAI_API_KEY" --data "k=$OPENAI_API_KEY" "` + url + `?key=$OPENAI_API_KEY"`)
		var m map[string]any
		if err := json.Unmarshal([]byte(out), &m); err != nil {
			t.Fatalf("%s: %q", url, out)
		}
		return m
	}
	wantGot := func(what string, m map[string]any, v string) {
		t.Helper()
		if m["authorization"] != "Bearer "+v || m["query"] != "key="+v || m["body"] != "k="+v {
			t.Errorf("%s got %v, want %.12s... in the header, query and body", what, m, v)
		}
	}
	t.Run("proxy", func(t *testing.T) {
		// The granted host, over HTTPS (the sandbox trusts its CA through
		// the system bundle) and HTTP: the value.
		m := echo("https://allowed.test/echo", "")
		wantGot("https://allowed.test", m, fileValue)
		if m["tls"] != true {
			t.Errorf("not over TLS: %v", m)
		}
		wantGot("http://allowed.test", echo("http://allowed.test/echo", ""), fileValue)
		// Python's ssl reads SSL_CERT_FILE.
		py := sh(`python3 -c 'import os, urllib.request, json; r = urllib.request.Request("https://allowed.test/echo", headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}); print(json.load(urllib.request.urlopen(r, timeout=20))["authorization"] == "Bearer " + os.environ["OPENAI_API_KEY"])'`)
		if strings.TrimSpace(py) != "False" {
			t.Errorf("python: the server got the placeholder (%s)", py)
		}
		// Another allowed host: the placeholder, as the sandbox sent it;
		// over HTTPS with the host's own certificate (spliced).
		wantGot("https://a.wild.test", echo("https://a.wild.test/echo", "--cacert /tmp/fakenet-ca.pem"), placeholder)
		wantGot("http://a.wild.test", echo("http://a.wild.test/echo", ""), placeholder)
		// The CA vouches for the grant's host alone.
		if out := sh(`curl -sS --max-time 20 https://a.wild.test/echo 2>&1 || echo FAILED`); !strings.Contains(out, "FAILED") {
			t.Errorf("a.wild.test was trusted without the fake internet's CA: %s", out)
		}
	})
	t.Run("read-only-root", func(t *testing.T) {
		// A namespace whose sandboxes' root is read-only: the CA is in
		// the trust store all the same, and the root stays read-only.
		roNS := ns + "-ro"
		_, err := rpc(s.admin, "sandbox.create", map[string]any{"name": "ro", "namespace": roNS, "egress": []string{"allowed.test"}, "secrets": []string{"openai"}})
		if tier == "gvisor" {
			if err == nil || err.Kind != "unsupported" || !strings.Contains(err.Message, "read-only root") {
				t.Errorf("gvisor: a read-only root with proxy-mode secrets: %v, want unsupported", err)
			}
			_, _ = rpc(s.admin, "sandbox.remove", map[string]any{"sandbox": "ro", "namespace": roNS})
			return
		}
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		defer func() { _, _ = rpc(s.admin, "sandbox.remove", map[string]any{"sandbox": "ro", "namespace": roNS}) }()
		reflected = true
		defer func() { reflected = false }()
		raw, rerr := rpc(s.admin, "sandbox.exec", map[string]any{"sandbox": "ro", "namespace": roNS, "timeout": 60, "argv": []string{"sh", "-c", `
curl -sS --max-time 20 -H "Authorization: Bearer $OPENAI_API_KEY" https://allowed.test/echo
echo
python3 -c 'import os, urllib.request, json; r = urllib.request.Request("https://allowed.test/echo", headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}); print(json.load(urllib.request.urlopen(r, timeout=20))["authorization"] == "Bearer " + os.environ["OPENAI_API_KEY"])'
touch /etc/ssl/certs/x /usr/x /x 2>&1 | wc -l`}})
		if rerr != nil {
			t.Fatalf("exec: %v", rerr)
		}
		var r execResult
		_ = json.Unmarshal(raw, &r)
		lines := slices.DeleteFunc(strings.Split(r.Stdout, "\n"), func(l string) bool { return l == "" })
		if len(lines) != 3 {
			t.Fatalf("exit %d: %s %s", r.ExitCode, r.Stdout, r.Stderr)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(lines[0]), &m); err != nil || m["authorization"] != "Bearer "+fileValue || m["tls"] != true {
			t.Errorf("curl over HTTPS from a read-only root: %s %s", lines[0], r.Stderr)
		}
		if lines[1] != "False" {
			t.Errorf("python over HTTPS from a read-only root: the server got the placeholder (%s) %s", lines[1], r.Stderr)
		}
		if lines[2] != "3" {
			t.Errorf("the root (its trust store included) is not read-only: %s of 3 writes refused", lines[2])
		}
	})
	t.Run("keep-alive-host", func(t *testing.T) {
		out := sh(`python3 - <<'EOF'
import socket
s = socket.create_connection(("allowed.test", 80), timeout=20)
s.sendall(b"GET /k1 HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
first = s.recv(65536).split(b"\r\n")[0].decode()
s.sendall(b"GET /k2 HTTP/1.1\r\nHost: denied.test\r\n\r\n")
try:
    second = "got %r" % s.recv(65536)[:40]
except ConnectionResetError:
    second = "reset"
print(first, "|", second)
EOF`)
		if !strings.HasPrefix(out, "HTTP/1.1 200") || !strings.Contains(out, "| reset") {
			t.Errorf("second request naming a denied host: %s", out)
		}
		if n := in.Requests("denied.test"); n != 0 {
			t.Errorf("the fake internet got %d requests for denied.test", n)
		}
	})
	t.Run("rotation", func(t *testing.T) {
		// A new value is read at the next start, with a new placeholder
		// and CA; the bundle holds one CA of Warren's.
		if err := os.WriteFile(filepath.Join(secretsDir, "openai_key"), []byte(rotated), 0o600); err != nil {
			t.Fatal(err)
		}
		must("sandbox.stop", map[string]any{"sandbox": "sec", "namespace": ns})
		must("sandbox.start", map[string]any{"sandbox": "sec", "namespace": ns})
		wantGot("https://allowed.test after a restart", echo("https://allowed.test/echo", ""), rotated)
		if env := sh("env"); strings.Contains(env, placeholder) {
			t.Error("the placeholder survived a restart")
		}
		if n := strings.Count(sh("cat /etc/ssl/certs/ca-certificates.crt"), "BEGIN warren sandbox CA"); n != 1 {
			t.Errorf("%d CAs of Warren's in the bundle", n)
		}
	})
	t.Run("server-restart", func(t *testing.T) {
		// The sandbox runs on; the next server goes on with its
		// placeholders and CA, the values read again. Without a warm
		// pool: its agents' links can take a reattached sandbox's
		// address before it is restored (reported separately).
		s.args = append(s.args, "--prewarm", "0")
		s.restart()
		if tier == "gvisor" {
			// Its sandboxes stop with the server (no reattach).
			must("sandbox.start", map[string]any{"sandbox": "sec", "namespace": ns})
		}
		wantGot("https://allowed.test after a server restart", echo("https://allowed.test/echo", ""), rotated)
		wantGot("http://allowed.test after a server restart", echo("http://allowed.test/echo", ""), rotated)
	})
	// A provider that refuses (a file others may read): the start fails
	// naming the secret and the reason.
	if err := os.Chmod(filepath.Join(secretsDir, "openai_key"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := rpc(s.key, "sandbox.create", map[string]any{"name": "loose", "namespace": ns, "egress": []string{"allowed.test"}, "secrets": []string{"openai"}}); err == nil ||
		!strings.Contains(err.Message, `secret "openai"`) || !strings.Contains(err.Message, "mode 0644") {
		t.Errorf("a 0644 secret file: %v", err)
	}

	// Every method of the server's, the WebSocket and the HTTP routes,
	// on the running sandbox with its secrets (secrets_scan_test.go).
	t.Run("every-method", func(t *testing.T) {
		everyMethod(t, s, ans, func(key, method string, params any) (json.RawMessage, error) {
			r, err := rpc(key, method, params)
			if err != nil {
				return nil, err
			}
			return r, nil
		}, envValue, "warren-secret-openai-", envValue+" "+rotated)
	})
	req, _ := http.NewRequest("GET", s.url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+s.admin)
	if resp, err := s.client.Do(req); err == nil {
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		ans.add(byServer, b)
	} else {
		t.Error(err)
	}
	must("sandbox.stop", map[string]any{"sandbox": "sec", "namespace": ns})
	if err := s.stop(); err != nil {
		t.Error(err)
	}
	if left, _ := os.ReadDir(filepath.Join(s.run, "secrets")); len(left) > 0 {
		t.Errorf("the stopped sandbox's secrets state is left: %v", left)
	}
	scanEverything(t, s, ans, values, []string{envValue})
	if now, _ := os.ReadFile("/etc/ssl/certs/ca-certificates.crt"); !bytes.Equal(now, hostBundle) {
		t.Error("the host's trust store changed")
	}
}

func devOf(p string) uint64 {
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		return 0
	}
	return st.Dev
}
