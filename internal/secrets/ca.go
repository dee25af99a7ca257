package secrets

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"time"
)

// CA is a sandbox's own certificate authority: the egress proxy presents
// certificates it mints for the hosts of the sandbox's proxy-mode grants,
// so it can read (and complete) the HTTPS requests the sandbox sends them.
// Its key lives in the server's memory only; the sandbox gets the
// certificate, in its trust store. The certificate is name-constrained
// to the grants' hosts: it vouches for nothing else, wherever it ends up.
type CA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	pem     []byte
	mu      sync.Mutex
	leaves  map[string]*tls.Certificate
	subject string
}

// caValidity is how long a sandbox's CA and its leaves are valid: a CA is
// made at every start, and a sandbox runs at most 30 days
// (sandbox.MaxPeriod).
const caValidity = 31 * 24 * time.Hour

// maxLeaves bounds the minted certificates a CA caches (a wildcard grant
// could otherwise make it mint one per name the sandbox invents).
const maxLeaves = 256

// NewCA makes a CA (ECDSA P-256) allowed to vouch for hosts (names, or
// "*.suffix" for the names below suffix).
func NewCA(label string, hosts []string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	var permitted []string
	for _, h := range hosts {
		// A constraint "example.com" admits it and every name below.
		permitted = append(permitted, strings.TrimPrefix(h, "*."))
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:                serial(),
		Subject:                     pkix.Name{CommonName: "Warren sandbox CA " + label, Organization: []string{"Warren"}},
		NotBefore:                   now.Add(-time.Hour),
		NotAfter:                    now.Add(caValidity),
		IsCA:                        true,
		BasicConstraintsValid:       true,
		MaxPathLenZero:              true,
		KeyUsage:                    x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         permitted,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("sandbox CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("sandbox CA: %w", err)
	}
	return &CA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		leaves: map[string]*tls.Certificate{}, subject: tmpl.Subject.CommonName}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

// PEM is the CA's certificate, PEM-encoded.
func (c *CA) PEM() []byte { return c.pem }

// Certificate is the CA's certificate.
func (c *CA) Certificate() *x509.Certificate { return c.cert }

// Leaf returns a certificate for name signed by the CA, minted on first
// use and cached.
func (c *CA) Leaf(name string) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.leaves[name]; l != nil {
		return l, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     c.cert.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		return nil, fmt.Errorf("certificate for %s: %w", name, err)
	}
	leaf := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	if len(c.leaves) >= maxLeaves {
		clear(c.leaves)
	}
	c.leaves[name] = leaf
	return leaf, nil
}
