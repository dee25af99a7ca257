package secrets

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/warren-sandbox/warren/internal/cabundle"
	"github.com/warren-sandbox/warren/internal/errdefs"
)

// Delivery modes (Grant.Mode).
const (
	// ModeProxy: the sandbox sees a placeholder; the egress proxy puts the
	// value in its requests to the grant's hosts. The default.
	ModeProxy = "proxy"
	// ModeEnv: the value is in the sandbox's environment.
	ModeEnv = "env"
)

// ProviderConfig is a provider of the server's configuration
// ([[secrets.providers]]).
type ProviderConfig struct {
	Name   string `json:"name"`
	Type   string `json:"type"` // "dir" (Path) or "env" (Prefix)
	Path   string `json:"path,omitempty"`
	Prefix string `json:"prefix,omitempty"`
}

// Grant lets a namespace use a secret ([[namespaces.NS.secrets]]).
type Grant struct {
	// Name is the logical name sandbox.create's secrets list uses.
	Name string `json:"name"`
	// Provider names a provider; Key is the value's name there (default
	// Name).
	Provider string `json:"provider"`
	Key      string `json:"key,omitempty"`
	// Mode is ModeEnv or ModeProxy ("" = ModeProxy).
	Mode string `json:"mode,omitempty"`
	// Env is the variable the sandbox sees (default Name upper-cased,
	// '-' and '.' as '_').
	Env string `json:"env,omitempty"`
	// Hosts are the only hosts that receive the value (proxy mode):
	// names, or "*.suffix" for the names below suffix.
	Hosts []string `json:"hosts,omitempty"`
}

// Config is the secrets part of the server's configuration: providers,
// and grants by namespace.
type Config struct {
	Providers []ProviderConfig   `json:"providers"`
	Grants    map[string][]Grant `json:"grants"`
}

// Bounds.
const (
	MaxGrants  = 256 // per namespace
	MaxHosts   = 64  // per grant
	MaxPerSpec = 64  // secrets one sandbox may name
)

// Compiled on first use, not at package initialisation, which every warren
// command pays (docs/performance.md).
var (
	nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`) })
	envRE  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`) })
	hostRE = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^(\*\.)?([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?\.)*[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$`)
	})
)

// ValidName reports whether s can name a secret.
func ValidName(s string) bool { return nameRE().MatchString(s) }

// Store is the server's providers and grants.
type Store struct {
	providers map[string]Provider
	grants    map[string]map[string]Grant // namespace → name → grant
	scrub     *Scrubber                   // told every value read (nil: none)
}

// ScrubWith makes sc know every value the store reads from now on. A nil
// store reads none.
func (s *Store) ScrubWith(sc *Scrubber) {
	if s != nil {
		s.scrub = sc
	}
}

// Open builds the store of cfg, reporting every problem at once.
func Open(cfg Config) (*Store, error) {
	providers := map[string]Provider{}
	var errs []error
	for i, pc := range cfg.Providers {
		where := fmt.Sprintf("secrets provider %d (%q)", i+1, pc.Name)
		if pc.Name == "" {
			errs = append(errs, fmt.Errorf("%s: no name", where))
			continue
		}
		if _, dup := providers[pc.Name]; dup {
			errs = append(errs, fmt.Errorf("%s: a provider of that name already exists", where))
			continue
		}
		switch pc.Type {
		case "dir":
			d, err := NewDir(pc.Path)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", where, err))
				continue
			}
			providers[pc.Name] = d
		case "env":
			if pc.Prefix == "" {
				// Without a prefix any of the server's variables could
				// be asked for by a grant's key.
				errs = append(errs, fmt.Errorf("%s: type env needs a prefix", where))
				continue
			}
			providers[pc.Name] = &Env{Prefix: pc.Prefix}
		default:
			errs = append(errs, fmt.Errorf("%s: type %q, want dir or env", where, pc.Type))
		}
	}
	s, err := NewStore(providers, cfg.Grants)
	if err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return s, nil
}

// NewStore builds a store of providers (by name) and grants (by
// namespace), checking every grant; defaults are filled in.
func NewStore(providers map[string]Provider, grants map[string][]Grant) (*Store, error) {
	s := &Store{providers: providers, grants: map[string]map[string]Grant{}}
	var errs []error
	for ns, gs := range grants {
		if len(gs) > MaxGrants {
			errs = append(errs, fmt.Errorf("namespace %q: %d secret grants, at most %d", ns, len(gs), MaxGrants))
			continue
		}
		byName := map[string]Grant{}
		for i, g := range gs {
			g, err := checkGrant(g, providers)
			if err != nil {
				errs = append(errs, fmt.Errorf("namespace %q: secret grant %d (%q): %w", ns, i+1, g.Name, err))
				continue
			}
			if _, dup := byName[g.Name]; dup {
				errs = append(errs, fmt.Errorf("namespace %q: secret %q is granted twice", ns, g.Name))
				continue
			}
			byName[g.Name] = g
		}
		s.grants[ns] = byName
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return s, nil
}

func checkGrant(g Grant, providers map[string]Provider) (Grant, error) {
	var errs []error
	if !ValidName(g.Name) {
		errs = append(errs, errors.New("name: want 1-63 of [a-z0-9_-] starting with a letter or digit"))
	}
	if _, ok := providers[g.Provider]; !ok {
		errs = append(errs, fmt.Errorf("provider %q is not configured", g.Provider))
	}
	if g.Key == "" {
		g.Key = g.Name
	}
	if err := checkKey(g.Key); err != nil {
		errs = append(errs, err)
	}
	if g.Mode == "" {
		g.Mode = ModeProxy
	}
	if g.Env == "" {
		g.Env = strings.NewReplacer("-", "_", ".", "_").Replace(strings.ToUpper(g.Name))
	}
	if !envRE().MatchString(g.Env) {
		errs = append(errs, fmt.Errorf("env %q: want a variable name of [A-Za-z0-9_]", g.Env))
	}
	switch g.Mode {
	case ModeEnv:
		if len(g.Hosts) > 0 {
			errs = append(errs, errors.New("hosts are for proxy mode: in env mode the sandbox has the value itself"))
		}
	case ModeProxy:
		if len(g.Hosts) == 0 {
			errs = append(errs, errors.New("proxy mode needs hosts: the value goes to those alone"))
		}
		if len(g.Hosts) > MaxHosts {
			errs = append(errs, fmt.Errorf("%d hosts, at most %d", len(g.Hosts), MaxHosts))
		}
		hosts := make([]string, 0, len(g.Hosts))
		for _, h := range g.Hosts {
			h = strings.TrimSuffix(strings.ToLower(h), ".")
			if len(h) > 253 || !hostRE().MatchString(h) {
				errs = append(errs, fmt.Errorf("host %.60q: want a DNS name or *.name", h))
				continue
			}
			hosts = append(hosts, h)
		}
		g.Hosts = hosts
	default:
		errs = append(errs, fmt.Errorf("mode %q: want env or proxy", g.Mode))
	}
	return g, errors.Join(errs...)
}

// Check says whether namespace ns may name every secret of names:
// ErrForbidden naming the first that is not granted there, ErrInvalid for
// a list that cannot be one. A nil store grants nothing.
func (s *Store) Check(ns string, names []string) error {
	if len(names) > MaxPerSpec {
		return errdefs.Errorf(errdefs.ErrInvalid, "secrets: %d names, at most %d", len(names), MaxPerSpec)
	}
	seen := map[string]bool{}
	for _, n := range names {
		if !ValidName(n) {
			return errdefs.Errorf(errdefs.ErrInvalid, "secrets: %.64q is not a secret name (1-63 of [a-z0-9_-])", n)
		}
		if seen[n] {
			return errdefs.Errorf(errdefs.ErrInvalid, "secrets: %q is named twice", n)
		}
		seen[n] = true
		if s == nil {
			return errdefs.Errorf(errdefs.ErrForbidden, "secret %q is not granted to namespace %q (this server has no secrets configured)", n, ns)
		}
		if _, ok := s.grants[ns][n]; !ok {
			return errdefs.Errorf(errdefs.ErrForbidden, "secret %q is not granted to namespace %q", n, ns)
		}
	}
	return nil
}

// Delivery is what a sandbox's start gets of its secrets.
type Delivery struct {
	// Env is added to the sandbox's environment: values (env mode),
	// placeholders (proxy mode) and, with a proxy, the variables that
	// name the trust store holding its CA. It holds values: it goes to
	// the backend's configuration and nowhere else.
	Env []string
	// Proxy is the egress proxy's part; nil without proxy-mode secrets.
	Proxy *Proxy
}

// BundlePath is where a sandbox with proxy-mode secrets finds a trust
// store holding the image's CAs and its own (SSL_CERT_FILE and the like
// name it).
const BundlePath = cabundle.Path

// Resolve reads the values of names, granted to ns (Check first), from
// their providers, and makes the delivery of a start: a new placeholder
// per proxy-mode secret and, for those, a new CA. label names the CA.
func (s *Store) Resolve(ctx context.Context, ns, label string, names []string) (*Delivery, error) {
	if err := s.Check(ns, names); err != nil {
		return nil, err
	}
	d := &Delivery{}
	var subs []Substitution
	var hosts []string
	for _, n := range names {
		g := s.grants[ns][n]
		v, err := s.providers[g.Provider].Get(ctx, g.Key)
		if err != nil {
			// The provider's word names the key and the problem, not the
			// value; the operator fixes it, the caller is told which.
			return nil, errdefs.Errorf(errdefs.ErrUnavailable, "secret %q (provider %q): %w", n, g.Provider, err)
		}
		s.scrub.Add(v)
		switch g.Mode {
		case ModeEnv:
			if bytes.IndexByte(v.Reveal(), 0) >= 0 {
				return nil, errdefs.Errorf(errdefs.ErrUnavailable, "secret %q (provider %q): the value holds a NUL byte, which an environment cannot", n, g.Provider)
			}
			d.Env = append(d.Env, g.Env+"="+string(v.Reveal()))
		case ModeProxy:
			if err := checkProxyValue(n, g, v); err != nil {
				return nil, err
			}
			ph := Placeholder(n)
			d.Env = append(d.Env, g.Env+"="+ph)
			subs = append(subs, Substitution{Name: n, Placeholder: []byte(ph), Value: v, Hosts: g.Hosts})
			hosts = append(hosts, g.Hosts...)
		}
	}
	if len(subs) == 0 {
		return d, nil
	}
	slices.Sort(hosts)
	ca, err := NewCA(label, slices.Compact(hosts))
	if err != nil {
		return nil, err
	}
	d.Proxy = &Proxy{ca: ca, subs: subs}
	d.Env = append(d.Env, "SSL_CERT_FILE="+BundlePath, "NODE_EXTRA_CA_CERTS="+BundlePath, "REQUESTS_CA_BUNDLE="+BundlePath)
	return d, nil
}

// Placeholder is a new placeholder for the secret name: not guessable (128
// random bits), and not the value.
func Placeholder(name string) string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return "warren-secret-" + name + "-" + hex.EncodeToString(b[:])
}

// Substitution is one proxy-mode secret of a sandbox.
type Substitution struct {
	Name        string
	Placeholder []byte
	Value       Value
	Hosts       []string
}

func (s *Substitution) matches(host string) bool {
	for _, h := range s.Hosts {
		if h == host || strings.HasPrefix(h, "*.") && strings.HasSuffix(host, h[1:]) {
			return true
		}
	}
	return false
}

// Proxy is a sandbox's proxy-mode secrets, as the egress proxy uses them:
// which hosts to intercept, and what to replace in requests to each.
type Proxy struct {
	ca   *CA
	subs []Substitution
}

// CA is the sandbox's CA.
func (p *Proxy) CA() *CA { return p.ca }

// Intercepts reports whether host gets at least one secret (so HTTPS to
// it is intercepted). A nil Proxy intercepts nothing.
func (p *Proxy) Intercepts(host string) bool {
	if p == nil {
		return false
	}
	for i := range p.subs {
		if p.subs[i].matches(host) {
			return true
		}
	}
	return false
}

// Replace returns b with the placeholder of every secret granted to host
// replaced by its value, and the names of the secrets replaced. b itself
// is returned when nothing is replaced.
func (p *Proxy) Replace(host string, b []byte) ([]byte, []string) {
	return p.replace(host, b, false)
}

// ReplaceInTarget is Replace for a request target: values are
// percent-encoded (a query's '&' or '=' in a value stays the value's).
func (p *Proxy) ReplaceInTarget(host, target string) (string, []string) {
	b, names := p.replace(host, []byte(target), true)
	return string(b), names
}

func (p *Proxy) replace(host string, b []byte, escape bool) ([]byte, []string) {
	if p == nil {
		return b, nil
	}
	var names []string
	for i := range p.subs {
		s := &p.subs[i]
		if !s.matches(host) || !bytes.Contains(b, s.Placeholder) {
			continue
		}
		v := s.Value.Reveal()
		if escape {
			v = []byte(url.QueryEscape(string(v)))
		}
		b = bytes.ReplaceAll(b, s.Placeholder, v)
		names = append(names, s.Name)
	}
	return b, names
}

// checkProxyValue refuses a value proxy mode cannot deliver: it goes into
// header fields, and a line break would be a way out of one.
func checkProxyValue(name string, g Grant, v Value) error {
	if bytes.ContainsAny(v.Reveal(), "\r\n\x00") {
		return errdefs.Errorf(errdefs.ErrUnavailable, "secret %q (provider %q): the value holds a line break or NUL byte, which proxy mode cannot put in a header", name, g.Provider)
	}
	return nil
}
