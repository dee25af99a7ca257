package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/secrets"
)

// A sandbox's secrets, seen from the manager. Invariants:
//   - the spec (and so the database, sandbox.get and every response) holds
//     the secrets' names only; their values are read from the providers at
//     every start (Options.Secrets.Resolve), go into the backend's
//     configuration for that start (the environment) and into the
//     sandbox's egress state while it runs (proxy mode), and nowhere else;
//   - a name the namespace has no grant for is refused (ErrForbidden)
//     before anything is made;
//   - with proxy-mode secrets, the sandbox's trust store holds the CA of
//     the current start before its first process runs (the backend puts
//     it there: backend.Config.TrustCA), and the proxy has its
//     secrets from then until the stop (netDown clears them);
//   - while it runs, a 0600 file of the run directory holds what a next
//     server needs to go on with them (its CA, its placeholders, no
//     value): removed at the stop.

// checkSecrets refuses names ns may not use.
func (m *Manager) checkSecrets(ns string, names []string) error {
	if len(names) == 0 {
		return nil
	}
	return m.opts.Secrets.Check(ns, names)
}

// resolveSecrets reads the values of e's secrets for this start: what the
// sandbox's environment gets, and the proxy's part (nil without
// proxy-mode secrets). Holds e.life.
func (m *Manager) resolveSecrets(ctx context.Context, e *entry, names []string) (*secrets.Delivery, error) {
	if len(names) == 0 {
		return &secrets.Delivery{}, nil
	}
	d, err := m.opts.Secrets.Resolve(ctx, e.ns, e.name, names)
	if err != nil {
		return nil, secretsError{err}
	}
	if d.Proxy != nil && !m.networking() {
		return nil, errdefs.Errorf(errdefs.ErrInvalid, "secrets: proxy mode needs the server's network (warren serve --network), which this server does not give sandboxes")
	}
	return d, nil
}

// secretsError is a start refused for its secrets (a provider that
// failed): a new sandbox refused so leaves nothing behind.
type secretsError struct{ error }

func (e secretsError) Unwrap() error { return e.error }

// withSecrets is cfg with d's environment added last (so it wins over
// the spec's and the image's variables of the same names) and, with
// proxy-mode secrets, the sandbox's CA for its trust store: the backend
// installs it as the sandbox boots, before a read-only root turns
// read-only.
func withSecrets(cfg backend.Config, d *secrets.Delivery) backend.Config {
	if len(d.Env) > 0 {
		cfg.Env = append(slices.Clone(cfg.Env), d.Env...)
	}
	if d.Proxy != nil {
		cfg.TrustCA = d.Proxy.CA().PEM()
	}
	return cfg
}

// keepSecrets makes p e's proxy-mode secrets for this run, and keeps
// their state for a later server (Options.SecretsDir). Holds e.life.
func (m *Manager) keepSecrets(e *entry, p *secrets.Proxy) error {
	m.mu.Lock()
	e.secrets = p
	m.mu.Unlock()
	if m.opts.SecretsDir == "" || p == nil {
		return nil
	}
	st, err := p.State()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(m.opts.SecretsDir, 0o700); err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	if err := writeFileAtomic(m.secretsFile(e), st); err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	return nil
}

func (m *Manager) secretsFile(e *entry) string {
	return filepath.Join(m.opts.SecretsDir, e.id+".json")
}

// dropSecrets forgets the state keepSecrets kept.
func (m *Manager) dropSecrets(e *entry) {
	if m.opts.SecretsDir == "" {
		return
	}
	if err := os.Remove(m.secretsFile(e)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		m.log.Warn("remove a sandbox's secrets state", "id", e.id, "err", err)
	}
}

// restoreSecrets gives a sandbox reattached after a server restart its
// proxy-mode secrets again: the former server's CA and placeholders, the
// values read again.
func (m *Manager) restoreSecrets(ctx context.Context, e *entry) error {
	if len(e.spec.Secrets) > 0 {
		m.opts.Secrets.Remember(ctx, e.ns, e.spec.Secrets)
	}
	if m.opts.SecretsDir == "" || len(e.spec.Secrets) == 0 {
		return nil
	}
	b, err := os.ReadFile(m.secretsFile(e))
	if errors.Is(err, fs.ErrNotExist) {
		return nil // none in proxy mode
	}
	if err != nil {
		return err
	}
	p, err := m.opts.Secrets.Restore(ctx, e.ns, e.spec.Secrets, b)
	if err != nil {
		return err
	}
	m.mu.Lock()
	e.secrets = p
	m.mu.Unlock()
	return nil
}

// writeFileAtomic writes b to path, mode 0600, by a rename.
func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// sweepSecrets removes the secrets state of sandboxes that do not run
// (a server that crashed before their stop was done). At New.
func (m *Manager) sweepSecrets() {
	if m.opts.SecretsDir == "" {
		return
	}
	running := map[string]bool{}
	for _, e := range m.entries {
		if e.state == Running {
			running[e.id+".json"] = true
		}
	}
	des, _ := os.ReadDir(m.opts.SecretsDir)
	for _, de := range des {
		if !running[de.Name()] {
			_ = os.Remove(filepath.Join(m.opts.SecretsDir, de.Name()))
		}
	}
}
