// Package kube is Warren's side of a Kubernetes cluster: a small REST client
// for the API server (kubeconfig or in-cluster credentials), a node's
// registration as a coordination.k8s.io Lease carrying its capacity, and
// the placement controller that binds Sandbox custom resources to nodes.
//
// It does not use client-go on purpose: client-go's package initialisers
// (every API group's scheme) would run in every warren command, and its
// dependency graph would triple the binary. The handful of calls Warren
// makes (get, create, update, list of two resource kinds) are plain JSON
// over HTTPS; docs/kubernetes.md says when that trade should be revisited.
package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// maxResponse bounds what the API server sends back: a page of a list
// (listPage objects) fits, a runaway or hostile answer does not. A
// variable for the tests.
var maxResponse = 64 << 20

const (
	maxKubeconfig = 1 << 20
	// requestTimeout bounds one call when the caller's ctx does not.
	requestTimeout = 30 * time.Second
)

// In-cluster credentials, where Kubernetes mounts a pod's service account.
const (
	saDir = "/var/run/secrets/kubernetes.io/serviceaccount"
)

// Client calls one API server.
type Client struct {
	base  string // https://host:port, no trailing slash
	http  *http.Client
	token string
}

// StatusError is an API server's refusal: its HTTP code and its Status
// object's reason and message.
type StatusError struct {
	Code    int
	Reason  string // e.g. "Conflict", "NotFound", "Invalid", "Forbidden"
	Message string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("kubernetes: %d %s: %s", e.Code, e.Reason, e.Message)
}

// IsCode reports whether err is a StatusError with HTTP code code.
func IsCode(err error, code int) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Code == code
}

// Config is how to reach an API server.
type Config struct {
	Server string // https://host:port
	// CAPEM verifies the server; empty = the system roots.
	CAPEM []byte
	// A client certificate, or a bearer token (TokenFile is re-read at
	// each request: projected service-account tokens rotate).
	CertPEM, KeyPEM  []byte
	Token, TokenFile string
}

// New returns a client for cfg.
func New(cfg Config) (*Client, error) {
	u, err := url.Parse(cfg.Server)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("kubernetes server %q: want https://host[:port]", cfg.Server)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if len(cfg.CAPEM) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(cfg.CAPEM) {
			return nil, errors.New("kubernetes: no certificate in the certificate authority data")
		}
		tc.RootCAs = pool
	}
	if len(cfg.CertPEM) > 0 || len(cfg.KeyPEM) > 0 {
		cert, err := tls.X509KeyPair(cfg.CertPEM, cfg.KeyPEM)
		if err != nil {
			return nil, fmt.Errorf("kubernetes client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	c := &Client{
		base:  strings.TrimSuffix(u.String(), "/"),
		http:  &http.Client{Transport: &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 8}},
		token: cfg.Token,
	}
	if cfg.TokenFile != "" {
		c.token = "" // read at each request
		c.http.Transport = &tokenFile{path: cfg.TokenFile, next: c.http.Transport}
	}
	return c, nil
}

// tokenFile sets the bearer token read from a file that may be rotated.
type tokenFile struct {
	path string
	next http.RoundTripper
}

func (t *tokenFile) RoundTrip(r *http.Request) (*http.Response, error) {
	b, err := readBounded(t.path, 64<<10)
	if err != nil {
		return nil, fmt.Errorf("kubernetes token: %w", err)
	}
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(b)))
	return t.next.RoundTrip(r)
}

// Load returns a client from a kubeconfig file (its current context), or
// with path "in-cluster" from the pod's service account.
func Load(path string) (*Client, error) {
	if path == "in-cluster" {
		host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
		if host == "" || port == "" {
			return nil, errors.New("in-cluster: KUBERNETES_SERVICE_HOST/PORT are not set (not running in a pod?)")
		}
		ca, err := readBounded(filepath.Join(saDir, "ca.crt"), maxKubeconfig)
		if err != nil {
			return nil, fmt.Errorf("in-cluster: %w", err)
		}
		return New(Config{Server: "https://" + joinHostPort(host, port), CAPEM: ca, TokenFile: filepath.Join(saDir, "token")})
	}
	cfg, err := ReadKubeconfig(path)
	if err != nil {
		return nil, err
	}
	return New(cfg)
}

func joinHostPort(host, port string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + port
	}
	return host + ":" + port
}

// kubeconfig is the part of a kubeconfig file Warren reads.
type kubeconfig struct {
	CurrentContext string `yaml:"current-context"`
	Clusters       []struct {
		Name    string `yaml:"name"`
		Cluster struct {
			Server   string `yaml:"server"`
			CA       string `yaml:"certificate-authority"`
			CAData   string `yaml:"certificate-authority-data"`
			Insecure bool   `yaml:"insecure-skip-tls-verify"`
		} `yaml:"cluster"`
	} `yaml:"clusters"`
	Users []struct {
		Name string `yaml:"name"`
		User struct {
			Cert      string `yaml:"client-certificate"`
			CertData  string `yaml:"client-certificate-data"`
			Key       string `yaml:"client-key"`
			KeyData   string `yaml:"client-key-data"`
			Token     string `yaml:"token"`
			TokenFile string `yaml:"tokenFile"`
			Exec      any    `yaml:"exec"`
		} `yaml:"user"`
	} `yaml:"users"`
	Contexts []struct {
		Name    string `yaml:"name"`
		Context struct {
			Cluster string `yaml:"cluster"`
			User    string `yaml:"user"`
		} `yaml:"context"`
	} `yaml:"contexts"`
}

// ReadKubeconfig reads the current context of a kubeconfig file: its
// server, certificate authority and client credentials (certificate, token
// or token file; exec plugins are refused, not run).
func ReadKubeconfig(path string) (Config, error) {
	b, err := readBounded(path, maxKubeconfig)
	if err != nil {
		return Config{}, fmt.Errorf("kubeconfig: %w", err)
	}
	var kc kubeconfig
	if err := yaml.Unmarshal(b, &kc); err != nil {
		return Config{}, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	fail := func(format string, a ...any) (Config, error) {
		return Config{}, fmt.Errorf("kubeconfig %s: "+format, append([]any{path}, a...)...)
	}
	var clusterName, userName string
	for _, c := range kc.Contexts {
		if c.Name == kc.CurrentContext {
			clusterName, userName = c.Context.Cluster, c.Context.User
		}
	}
	if clusterName == "" {
		return fail("no context %q with a cluster", kc.CurrentContext)
	}
	dir := filepath.Dir(path)
	// file reads a credential given inline (base64) or as a path relative
	// to the kubeconfig.
	file := func(what, data, name string) ([]byte, error) {
		if data != "" {
			b, err := base64.StdEncoding.DecodeString(data)
			if err != nil {
				return nil, fmt.Errorf("kubeconfig %s: %s-data: %w", path, what, err)
			}
			return b, nil
		}
		if name == "" {
			return nil, nil
		}
		if !filepath.IsAbs(name) {
			name = filepath.Join(dir, name)
		}
		b, err := readBounded(name, maxKubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %s: %w", path, what, err)
		}
		return b, nil
	}
	var cfg Config
	found := false
	for _, c := range kc.Clusters {
		if c.Name != clusterName {
			continue
		}
		found = true
		if c.Cluster.Insecure {
			return fail("cluster %q: insecure-skip-tls-verify is not supported", clusterName)
		}
		cfg.Server = c.Cluster.Server
		if cfg.CAPEM, err = file("certificate-authority", c.Cluster.CAData, c.Cluster.CA); err != nil {
			return Config{}, err
		}
	}
	if !found {
		return fail("no cluster %q", clusterName)
	}
	for _, u := range kc.Users {
		if u.Name != userName {
			continue
		}
		if u.User.Exec != nil {
			return fail("user %q: exec credential plugins are not supported; use a certificate or a token", userName)
		}
		if cfg.CertPEM, err = file("client-certificate", u.User.CertData, u.User.Cert); err != nil {
			return Config{}, err
		}
		if cfg.KeyPEM, err = file("client-key", u.User.KeyData, u.User.Key); err != nil {
			return Config{}, err
		}
		cfg.Token, cfg.TokenFile = u.User.Token, u.User.TokenFile
		if cfg.TokenFile != "" && !filepath.IsAbs(cfg.TokenFile) {
			cfg.TokenFile = filepath.Join(dir, cfg.TokenFile)
		}
	}
	return cfg, nil
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path) //nolint:gosec // a path the operator configured
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return b, nil
}

// Do sends in (JSON, when not nil) to path with method and decodes the
// answer into out (when not nil). A refusal is a *StatusError.
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, requestTimeout)
		defer cancel()
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("kubernetes %s %s: %w", method, path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, int64(maxResponse)+1))
	if err != nil {
		return fmt.Errorf("kubernetes %s %s: %w", method, path, err)
	}
	if len(b) > maxResponse {
		return fmt.Errorf("kubernetes %s %s: answer larger than %d bytes", method, path, maxResponse)
	}
	if resp.StatusCode/100 != 2 {
		se := &StatusError{Code: resp.StatusCode, Reason: http.StatusText(resp.StatusCode)}
		var st struct{ Reason, Message string }
		if json.Unmarshal(b, &st) == nil && st.Message != "" {
			se.Reason, se.Message = st.Reason, st.Message
		} else {
			se.Message = string(b[:min(len(b), 512)])
		}
		return se
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("kubernetes %s %s: decode: %w", method, path, err)
	}
	return nil
}

// Close releases the client's idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }
