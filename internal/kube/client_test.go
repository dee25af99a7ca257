package kube_test

import (
	"encoding/base64"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/kube"
)

// apiStub is a TLS server answering like an API server, and a kubeconfig
// for it with a bearer token read from a file.
func apiStub(t *testing.T, h http.HandlerFunc) (srv *httptest.Server, kubeconfig, tokenFile string) {
	t.Helper()
	srv = httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	tokenFile = filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("t1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	kc := `apiVersion: v1
kind: Config
current-context: stub
clusters:
- name: other
  cluster: {server: "https://10.9.9.9:1"}
- name: stub
  cluster:
    server: ` + srv.URL + `
    certificate-authority-data: ` + base64.StdEncoding.EncodeToString(ca) + `
users:
- name: u
  user: {tokenFile: token}
contexts:
- name: stub
  context: {cluster: stub, user: u}
`
	kubeconfig = filepath.Join(dir, "config")
	if err := os.WriteFile(kubeconfig, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return srv, kubeconfig, tokenFile
}

func TestClientAgainstStub(t *testing.T) {
	var auth []string
	_, kc, tok := apiStub(t, func(w http.ResponseWriter, r *http.Request) {
		auth = append(auth, r.Header.Get("Authorization"))
		switch r.URL.Path {
		case "/ok":
			_, _ = w.Write([]byte(`{"metadata":{"name":"x","resourceVersion":"7"}}`))
		case "/conflict":
			w.WriteHeader(http.StatusConflict)
			_, _ = w.Write([]byte(`{"kind":"Status","reason":"Conflict","message":"the object has been modified"}`))
		case "/huge":
			_, _ = w.Write([]byte(`{"x":"`))
			for range 3 {
				_, _ = w.Write([]byte(strings.Repeat("a", 1<<20)))
			}
		default:
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write([]byte("upstream <b>gone</b>"))
		}
	})
	c, err := kube.Load(kc)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer kube.SetMaxResponse(1 << 20)()
	var l kube.Lease
	if err := c.Do(t.Context(), http.MethodGet, "/ok", nil, &l); err != nil || l.Metadata.ResourceVersion != "7" {
		t.Fatalf("ok: %v %+v", err, l)
	}
	err = c.Do(t.Context(), http.MethodPut, "/conflict", &l, nil)
	if !kube.IsCode(err, http.StatusConflict) || !strings.Contains(err.Error(), "the object has been modified") {
		t.Fatalf("conflict: %v", err)
	}
	if err := c.Do(t.Context(), http.MethodGet, "/bad", nil, nil); !kube.IsCode(err, http.StatusBadGateway) || !strings.Contains(err.Error(), "gone") {
		t.Fatalf("non-Status error: %v", err)
	}
	if err := c.Do(t.Context(), http.MethodGet, "/huge", nil, nil); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("huge answer: %v", err)
	}
	// A rotated token is used from the next request on.
	if err := os.WriteFile(tok, []byte("t2"), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = c.Do(t.Context(), http.MethodGet, "/ok", nil, nil)
	if auth[0] != "Bearer t1" || auth[len(auth)-1] != "Bearer t2" {
		t.Fatalf("authorization headers %q", auth)
	}
}

func TestKubeconfigRefusals(t *testing.T) {
	dir := t.TempDir()
	for name, text := range map[string]string{
		"no context":    "current-context: nope\ncontexts: []\n",
		"no cluster":    "current-context: a\ncontexts: [{name: a, context: {cluster: c, user: u}}]\n",
		"insecure":      "current-context: a\ncontexts: [{name: a, context: {cluster: c}}]\nclusters: [{name: c, cluster: {server: 'https://x', insecure-skip-tls-verify: true}}]\n",
		"exec plugin":   "current-context: a\ncontexts: [{name: a, context: {cluster: c, user: u}}]\nclusters: [{name: c, cluster: {server: 'https://x'}}]\nusers: [{name: u, user: {exec: {command: aws}}}]\n",
		"plain http":    "current-context: a\ncontexts: [{name: a, context: {cluster: c}}]\nclusters: [{name: c, cluster: {server: 'http://x'}}]\n",
		"missing CA":    "current-context: a\ncontexts: [{name: a, context: {cluster: c}}]\nclusters: [{name: c, cluster: {server: 'https://x', certificate-authority: nothere.crt}}]\n",
		"bad CA base64": "current-context: a\ncontexts: [{name: a, context: {cluster: c}}]\nclusters: [{name: c, cluster: {server: 'https://x', certificate-authority-data: '%%%'}}]\n",
		"not yaml":      "{{{",
	} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
			if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := kube.Load(p); err == nil {
				t.Fatal("loaded")
			}
		})
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, make([]byte, 2<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.Load(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("a 2 MiB kubeconfig: %v", err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := kube.Load("in-cluster"); err == nil {
		t.Fatal("in-cluster outside a pod: loaded")
	}
}
