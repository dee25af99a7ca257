package sandbox

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/errdefs"
)

// A sandbox's network policy, seen from the manager. The backend gives a
// running sandbox a link of its own (backend.Networked); the manager puts
// the sandbox's egress state (egress.Sandbox: rules, pins, log) in the
// registry under the link's address, where the host's resolver and proxy
// find it by a packet's source. Invariants:
//   - a sandbox is in the registry only while it runs: it is registered
//     once its start succeeded and taken out BEFORE its backend stop, which
//     frees its address for the next sandbox; so an address never names
//     the wrong sandbox;
//   - the rules in the registry are the spec's: a live change is written
//     to the store first, then swapped in, and the next start compiles
//     the stored ones;
//   - the egress state (its log, its pins) outlives stops: the log of a
//     stopped sandbox stays readable, and pins are checked against the
//     addresses this sandbox's resolver handed out, whoever held them
//     before.

// networking reports whether sandboxes get a link (and so egress rules).
func (m *Manager) networking() bool { return m.opts.Egress != nil }

// netUp registers e's egress state under its sandbox's address. Holds
// e.life; sb runs.
func (m *Manager) netUp(e *entry, sb backend.Sandbox) error {
	if !m.networking() {
		return nil
	}
	nw, ok := sb.(backend.Networked)
	if !ok {
		return nil
	}
	addr := nw.NetAddr()
	if !addr.IsValid() {
		return nil
	}
	m.mu.Lock()
	rules := e.spec.Egress
	es := e.egress
	sec := e.secrets
	m.mu.Unlock()
	p, err := egress.Compile(rules)
	if err != nil {
		// Validated when stored; a server with a stricter parser than
		// the one that stored them says which rule.
		return errdefs.Errorf(errdefs.ErrInvalid, "egress: %w", err)
	}
	if es == nil {
		es = egress.NewSandbox(e.ns, e.name, p)
		if m.opts.Audit != nil {
			es.Observe(func(r egress.Record) { m.auditEgress(e, r) })
		}
	} else {
		es.SetPolicy(p)
	}
	es.SetSecrets(sec)
	m.mu.Lock()
	e.egress, e.netAddr = es, addr
	m.mu.Unlock()
	if err := m.opts.Egress.Add(addr, es); err != nil {
		// Registered: what the gate did not open is refused, and the
		// sandbox's log and the server's say why.
		e.logf("egress: the host's gate: %v", err)
		m.log.Warn("egress: the host's gate failed", "namespace", e.ns, "sandbox", e.name, "err", err.Error())
	}
	return nil
}

// netDown takes e out of the registry, its published ports (and their
// connections) first; before the backend stops it.
func (m *Manager) netDown(e *entry) {
	m.portsDown(e)
	m.mu.Lock()
	addr := e.netAddr
	e.netAddr = netip.Addr{}
	es := e.egress
	e.secrets = nil
	m.mu.Unlock()
	if addr.IsValid() && m.opts.Egress != nil {
		if err := m.opts.Egress.Remove(addr); err != nil {
			m.log.Warn("egress: the host's gate did not close", "namespace", e.ns, "sandbox", e.name, "err", err.Error())
		}
	}
	// The values leave the server's memory with the run.
	es.SetSecrets(nil)
	m.dropSecrets(e)
}

// Egress returns ns/name's egress rules.
func (m *Manager) Egress(ns, name string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[key{ns, name}]
	if e == nil || e.removed {
		return nil, notFound(ns, name)
	}
	return append([]string{}, e.spec.Egress...), nil
}

// SetEgress replaces ns/name's egress rules, at once for a running
// sandbox's new connections and queries, and for its later starts.
func (m *Manager) SetEgress(ctx context.Context, ns, name string, rules []string) ([]string, error) {
	if !m.networking() {
		return nil, errNoNetwork
	}
	p, err := egress.Compile(rules)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrInvalid, "egress: %w", err)
	}
	if err := checkEgressPolicy(ns, m.policy(ns), p.Rules()); err != nil {
		return nil, err
	}
	m.mu.Lock()
	e := m.entries[key{ns, name}]
	m.mu.Unlock()
	if e == nil {
		return nil, notFound(ns, name)
	}
	e.life.Lock()
	defer e.life.Unlock()
	m.mu.Lock()
	if e.removed {
		m.mu.Unlock()
		return nil, notFound(ns, name)
	}
	e.spec.Egress = p.Rules()
	es := e.egress
	m.mu.Unlock()
	if err := m.persistErr(ctx, e); err != nil {
		return nil, err
	}
	if es != nil {
		es.SetPolicy(p)
	}
	e.logf("egress rules set: %d rule(s)", len(p.Rules()))
	return p.Rules(), nil
}

// EgressLog returns ns/name's connection log after seq since, at most
// limit records (oldest first).
func (m *Manager) EgressLog(ns, name string, since uint64, limit int) ([]egress.Record, error) {
	m.mu.Lock()
	e := m.entries[key{ns, name}]
	var es *egress.Sandbox
	if e != nil && !e.removed {
		es = e.egress
	}
	m.mu.Unlock()
	if e == nil || e.removed {
		return nil, notFound(ns, name)
	}
	if es == nil {
		return []egress.Record{}, nil
	}
	return es.Log(since, limit), nil
}

var errNoNetwork = errdefs.Errorf(errdefs.ErrInvalid, "egress: this server gives sandboxes no network (warren serve --network off, or the host cannot: see warren doctor)")

// checkEgress validates rules for a spec.
func checkEgress(rules []string) error {
	if len(rules) == 0 {
		return nil
	}
	if _, err := egress.Compile(rules); err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	return nil
}
