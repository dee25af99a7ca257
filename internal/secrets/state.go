package secrets

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/warren-sandbox/warren/internal/errdefs"
)

// A running sandbox outlives its server: the next server reattaches it,
// and its proxy-mode secrets must work on, with the placeholders in its
// environment and the CA in its trust store. State is what that takes,
// and nothing more: the CA (its key included) and the placeholders, by
// name. No value: the next server reads them from the providers again.
// The manager keeps it in a 0600 file of the run directory while the
// sandbox runs.

type state struct {
	CACert       []byte            `json:"ca_cert"` // DER
	CAKey        []byte            `json:"ca_key"`  // PKCS #8 DER
	Placeholders map[string]string `json:"placeholders"`
}

// State is what Restore needs to rebuild p in another server.
func (p *Proxy) State() ([]byte, error) {
	key, err := x509.MarshalPKCS8PrivateKey(p.ca.key)
	if err != nil {
		return nil, err
	}
	st := state{CACert: p.ca.cert.Raw, CAKey: key, Placeholders: map[string]string{}}
	for _, s := range p.subs {
		st.Placeholders[s.Name] = string(s.Placeholder)
	}
	return json.Marshal(st)
}

// Restore rebuilds the proxy part of a delivery from State: the same CA
// and placeholders, with the values read again from the providers, for
// the secrets of names still granted to ns in proxy mode (a grant since
// withdrawn or changed is left out: its placeholder goes as it is).
func (s *Store) Restore(ctx context.Context, ns string, names []string, b []byte) (*Proxy, error) {
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("secrets state: %w", err)
	}
	cert, err := x509.ParseCertificate(st.CACert)
	if err != nil {
		return nil, fmt.Errorf("secrets state: %w", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(st.CAKey)
	if err != nil {
		return nil, fmt.Errorf("secrets state: %w", err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("secrets state: the CA's key does not match its certificate")
	}
	p := &Proxy{ca: &CA{cert: cert, key: key, leaves: map[string]*tls.Certificate{}}}
	if s == nil {
		return p, nil
	}
	for _, n := range names {
		ph, ok := st.Placeholders[n]
		g, granted := s.grants[ns][n]
		if !ok || !granted || g.Mode != ModeProxy {
			continue
		}
		v, err := s.providers[g.Provider].Get(ctx, g.Key)
		if err != nil {
			return nil, errdefs.Errorf(errdefs.ErrUnavailable, "secret %q (provider %q): %w", n, g.Provider, err)
		}
		s.scrub.Add(v)
		if err := checkProxyValue(n, g, v); err != nil {
			return nil, err
		}
		p.subs = append(p.subs, Substitution{Name: n, Placeholder: []byte(ph), Value: v, Hosts: g.Hosts})
	}
	return p, nil
}

// Remember tells the scrubber (ScrubWith) the values of names granted to
// ns, as they are now: for a sandbox a server reattaches, whose
// environment got them at its start under the former server. Best effort:
// a value that cannot be read is not known.
func (s *Store) Remember(ctx context.Context, ns string, names []string) {
	if s == nil || s.scrub == nil {
		return
	}
	for _, n := range names {
		g, ok := s.grants[ns][n]
		if !ok {
			continue
		}
		if v, err := s.providers[g.Provider].Get(ctx, g.Key); err == nil {
			s.scrub.Add(v)
		}
	}
}
