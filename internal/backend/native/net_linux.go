package native

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/netplumb"
)

// A sandbox's network link (backend.NetworkEgress). The host's plumbing
// (Options.Net) gives the agent's network namespace a link at start,
// before the agent reads its config, so the config can name the link's
// gateway as the sandbox's nameserver. The link lives as long as the
// namespace: when the agent ends, the kernel deletes the pair, and the
// release of the run detaches what the host holds for it (its address,
// its rules). The link is recorded in the run directory (netFile), so a
// server that reattaches to a running sandbox restores it.

// netFile records a running sandbox's link in its run directory.
const netFile = "net.json"

// attachNet gives the agent of pid (not yet configured) the sandbox's
// link, records it, and returns it. Holds s.mu.
func (s *Sandbox) attachNet(pid int) (netplumb.Link, error) {
	if s.b.opts.Net == nil {
		return netplumb.Link{}, errors.New("network: this host gives sandboxes no network (see warren doctor)")
	}
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return netplumb.Link{}, fmt.Errorf("network: the agent's namespace: %w", err)
	}
	defer func() { _ = ns.Close() }()
	l, err := s.b.opts.Net.Attach(s.cfg.ID, ns)
	if err != nil {
		return netplumb.Link{}, fmt.Errorf("network: %w", err)
	}
	b, _ := json.Marshal(l)
	if err := os.WriteFile(filepath.Join(s.run, netFile), b, 0o600); err != nil {
		_ = s.b.opts.Net.Detach(s.cfg.ID)
		return netplumb.Link{}, err
	}
	return l, nil
}

// restoreNet restores the link of a sandbox this process reattached to.
func (s *Sandbox) restoreNet() error {
	if s.cfg.Network != backend.NetworkEgress || s.b.opts.Net == nil {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(s.run, netFile)) //nolint:gosec // the backend's own run directory
	if errors.Is(err, os.ErrNotExist) {
		return nil // started without a network
	}
	if err != nil {
		return err
	}
	var l netplumb.Link
	if err := json.Unmarshal(b, &l); err != nil {
		return fmt.Errorf("network: %s: %w", netFile, err)
	}
	if err := s.b.opts.Net.Restore(s.cfg.ID, l); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	s.link = l
	return nil
}

// NetAddr implements backend.Networked.
func (s *Sandbox) NetAddr() netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return netip.Addr{}
	}
	return s.link.Addr
}

// sweepNet removes what the plumbing holds for sandboxes whose agent is
// gone (a crashed server's).
func (b *Backend) sweepNet() error {
	if b.opts.Net == nil {
		return nil
	}
	_, err := b.opts.Net.Sweep(func(id string) bool { return alive(filepath.Join(b.opts.RunDir, id)) })
	return err
}
