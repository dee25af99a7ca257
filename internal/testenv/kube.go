package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/warren-sandbox/warren/internal/kube"
)

// Kube is a real Kubernetes control plane for tests: etcd and
// kube-apiserver (scripts/kube.sh builds them once into a cache), on
// loopback ports of their own, with certificates made for the run. Without
// a kubelet, scheduler or controller manager: what the API server itself
// does (CRDs and their schemas, Leases, RBAC, watches) is real.
type Kube struct {
	// Server is https://127.0.0.1:PORT; Kubeconfig is a cluster-admin's
	// kubeconfig file for it.
	Server, Kubeconfig string
	// CA signs the server's and clients' certificates.
	CA                *x509.Certificate
	caKey             *ecdsa.PrivateKey
	dir               string
	etcd, apiserver   *exec.Cmd
	etcdLog, apiLog   SyncBuffer
	etcdDone, apiDone chan error
}

// KubeEnabled reports whether the tests against a real API server run:
// they need WARREN_TEST_KUBE=1 (make test-kube), because the first build
// of the control plane takes half an hour.
func KubeEnabled() bool { return os.Getenv("WARREN_TEST_KUBE") == "1" }

var kubeBinDir = sync.OnceValues(func() (string, error) {
	out, err := exec.Command(filepath.Join(ModuleRoot(), "scripts", "kube.sh")).Output() //nolint:gosec // the module's own script
	if err != nil {
		return "", fmt.Errorf("scripts/kube.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
})

func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// StartKube starts a control plane in a new directory and waits until the
// API server is ready (~4 s); Close stops it and removes the directory.
func StartKube() (_ *Kube, err error) {
	bin, err := kubeBinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "warren-kube-")
	if err != nil {
		return nil, err
	}
	k := &Kube{dir: dir}
	defer func() {
		if err != nil {
			_ = k.Close()
		}
	}()
	if err := k.writePKI(); err != nil {
		return nil, err
	}
	var ports [3]int
	for i := range ports {
		if ports[i], err = freeLoopbackPort(); err != nil {
			return nil, err
		}
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	k.Server = "https://127.0.0.1:" + strconv.Itoa(ports[2])
	k.etcd, k.etcdDone, err = start(&k.etcdLog, filepath.Join(bin, "etcd"), "--name", "warren-test", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "warren-test="+peerURL,
		"--unsafe-no-fsync", "--log-level", "warn")
	if err != nil {
		return nil, err
	}
	if err := waitHealthy(http.DefaultClient, etcdURL+"/health", k.etcdDone, &k.etcdLog, 30*time.Second); err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	p := func(name string) string { return filepath.Join(dir, name) }
	k.apiserver, k.apiDone, err = start(&k.apiLog, filepath.Join(bin, "kube-apiserver"),
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+strconv.Itoa(ports[2]),
		"--tls-cert-file="+p("apiserver.crt"), "--tls-private-key-file="+p("apiserver.key"),
		"--client-ca-file="+p("ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+p("sa.pub"), "--service-account-signing-key-file="+p("sa.key"),
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=RBAC",
		// Loopback advertise addresses are refused by the endpoint
		// reconciler, which tests do not need.
		"--endpoint-reconciler-type=none",
		"--cert-dir="+p("certs"), "--v=0")
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(k.CA)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	defer hc.CloseIdleConnections()
	if err := waitHealthy(hc, k.Server+"/readyz", k.apiDone, &k.apiLog, 90*time.Second); err != nil {
		return nil, fmt.Errorf("kube-apiserver: %w", err)
	}
	k.Kubeconfig, err = k.ClientKubeconfig("warren-test-admin", "system:masters")
	return k, err
}

func start(log *SyncBuffer, bin string, args ...string) (*exec.Cmd, chan error, error) {
	cmd := exec.Command(bin, args...) //nolint:gosec // the binaries the module's script built
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group, and killed with the test process if that dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return cmd, done, nil
}

func waitHealthy(hc *http.Client, url string, done chan error, log *SyncBuffer, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := hc.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case err := <-done:
			done <- err // for Close
			return fmt.Errorf("exited (%w) before %s answered:\n%s", err, url, tail(log.String()))
		case <-ctx.Done():
			return fmt.Errorf("%s not ready within %s:\n%s", url, limit, tail(log.String()))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func tail(s string) string {
	if len(s) > 4000 {
		return "..." + s[len(s)-4000:]
	}
	return s
}

// Close stops the API server and etcd (SIGTERM, SIGKILL after 10 s) and
// removes their files.
func (k *Kube) Close() error {
	var errs []error
	for _, p := range []struct {
		cmd  *exec.Cmd
		done chan error
	}{{k.apiserver, k.apiDone}, {k.etcd, k.etcdDone}} {
		if p.cmd == nil {
			continue
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
			errs = append(errs, fmt.Errorf("%s ignored SIGTERM for 10s", filepath.Base(p.cmd.Path)))
		}
	}
	errs = append(errs, os.RemoveAll(k.dir))
	return errors.Join(errs...)
}

// Logs is what the API server printed, for a failing test.
func (k *Kube) Logs() string { return tail(k.apiLog.String()) }

// ClientKubeconfig writes a kubeconfig for a new client certificate with
// user name cn in groups (O=), and returns its path: RBAC then decides what
// that user may do ("system:masters" may do anything).
func (k *Kube) ClientKubeconfig(cn string, groups ...string) (string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature,
	}
	base := filepath.Join(k.dir, "user-"+cn)
	if err := k.sign(tmpl, key, base); err != nil {
		return "", err
	}
	path := base + ".kubeconfig"
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: test
  context: {cluster: test, user: %s}
current-context: test
`, k.Server, filepath.Join(k.dir, "ca.crt"), cn, base+".crt", base+".key", cn)
	return path, os.WriteFile(path, []byte(kc), 0o600)
}

// writePKI makes the run's certificate authority, the API server's serving
// certificate and the service-account signing key.
func (k *Kube) writePKI() error {
	var err error
	if k.caKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		return err
	}
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "warren-test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, ca, ca, &k.caKey.PublicKey, k.caKey)
	if err != nil {
		return err
	}
	if k.CA, err = x509.ParseCertificate(der); err != nil {
		return err
	}
	if err := writePEM(filepath.Join(k.dir, "ca.crt"), "CERTIFICATE", der); err != nil {
		return err
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	srv := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		DNSNames:    []string{"localhost", "kubernetes.default.svc"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature,
	}
	if err := k.sign(srv, srvKey, filepath.Join(k.dir, "apiserver")); err != nil {
		return err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	saDER, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(k.dir, "sa.key"), "EC PRIVATE KEY", saDER); err != nil {
		return err
	}
	return writePEM(filepath.Join(k.dir, "sa.pub"), "PUBLIC KEY", pubDER)
}

var serial = struct {
	sync.Mutex
	n int64
}{n: 1}

// sign makes tmpl a certificate of key signed by the CA, written to
// base.crt and base.key.
func (k *Kube) sign(tmpl *x509.Certificate, key *ecdsa.PrivateKey, base string) error {
	serial.Lock()
	serial.n++
	tmpl.SerialNumber = big.NewInt(serial.n)
	serial.Unlock()
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, k.CA, &key.PublicKey, k.caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := writePEM(base+".crt", "CERTIFICATE", der); err != nil {
		return err
	}
	return writePEM(base+".key", "EC PRIVATE KEY", keyDER)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// manifestPaths is where each kind a manifest of the repository holds is
// created, "%s" standing for its namespace.
var manifestPaths = map[string]string{
	"CustomResourceDefinition": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
	"Namespace":                "/api/v1/namespaces",
	"ServiceAccount":           "/api/v1/namespaces/%s/serviceaccounts",
	"ClusterRole":              "/apis/rbac.authorization.k8s.io/v1/clusterroles",
	"ClusterRoleBinding":       "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
	"Role":                     "/apis/rbac.authorization.k8s.io/v1/namespaces/%s/roles",
	"RoleBinding":              "/apis/rbac.authorization.k8s.io/v1/namespaces/%s/rolebindings",
}

// Apply creates, as cluster-admin, the objects of a YAML manifest of the
// repository (path relative to the module root; documents split by ---),
// after replacing each old with its new in the text (replace is pairs),
// and waits until the custom resources it defines are served.
func (k *Kube) Apply(ctx context.Context, path string, replace ...string) error {
	b, err := os.ReadFile(filepath.Join(ModuleRoot(), path)) //nolint:gosec // a manifest of the repository a test names
	if err != nil {
		return err
	}
	text := strings.NewReplacer(replace...).Replace(string(b))
	c, err := kube.Load(k.Kubeconfig)
	if err != nil {
		return err
	}
	defer c.Close()
	var served []string
	for _, doc := range strings.Split(text, "\n---") {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if obj == nil {
			continue
		}
		kind, _ := obj["kind"].(string)
		where, ok := manifestPaths[kind]
		if !ok {
			return fmt.Errorf("%s: kind %q: add its path to testenv's manifestPaths", path, kind)
		}
		meta, _ := obj["metadata"].(map[string]any)
		if strings.Contains(where, "%s") {
			ns, _ := meta["namespace"].(string)
			where = fmt.Sprintf(where, ns)
		}
		if err := c.Do(ctx, http.MethodPost, where, obj, nil); err != nil {
			return fmt.Errorf("%s: create %s %v: %w", path, kind, meta["name"], err)
		}
		if kind == "CustomResourceDefinition" {
			spec, _ := obj["spec"].(map[string]any)
			names, _ := spec["names"].(map[string]any)
			versions, _ := spec["versions"].([]any)
			v, _ := versions[0].(map[string]any)
			served = append(served, fmt.Sprintf("/apis/%s/%s/%s", spec["group"], v["name"], names["plural"]))
		}
	}
	for _, list := range served {
		// Served once a list answers (discovery lags the create a moment).
		for c.Do(ctx, http.MethodGet, list, nil, nil) != nil {
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s: %s not served: %w", path, list, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// ServiceAccountClient is a client acting as service account ns/name,
// with a token the API server issues for ten minutes (TokenRequest; no
// controller manager is needed), as a pod of that account would be.
func (k *Kube) ServiceAccountClient(ctx context.Context, ns, name string) (*kube.Client, error) {
	c, err := kube.Load(k.Kubeconfig)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	req := map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": map[string]any{"expirationSeconds": 600}}
	var resp struct {
		Status struct{ Token string } `json:"status"`
	}
	if err := c.Do(ctx, http.MethodPost, "/api/v1/namespaces/"+ns+"/serviceaccounts/"+name+"/token", req, &resp); err != nil {
		return nil, fmt.Errorf("token for %s/%s: %w", ns, name, err)
	}
	return kube.New(kube.Config{Server: k.Server, Token: resp.Status.Token,
		CAPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: k.CA.Raw})})
}
