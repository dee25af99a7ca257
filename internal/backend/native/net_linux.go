package native

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

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
	l, err := attachLink(s.b.opts.Net, s.cfg.ID, pid)
	if err != nil {
		return netplumb.Link{}, err
	}
	if err := s.recordNet(l); err != nil {
		_ = s.b.opts.Net.Detach(s.cfg.ID)
		return netplumb.Link{}, err
	}
	return l, nil
}

// adoptNet hands a pooled agent's link, attached when the pool filled, to
// the sandbox: a rename of its id (the interface's alias) and the record,
// a tenth of a millisecond where attaching takes milliseconds. Holds s.mu.
func (s *Sandbox) adoptNet(a *agentProc) (netplumb.Link, error) {
	if err := a.plumb.Rename(a.netID, s.cfg.ID); err != nil {
		return netplumb.Link{}, fmt.Errorf("network: %w", err)
	}
	a.netID = "" // the sandbox's now: discarding a no longer detaches it
	if err := s.recordNet(a.link); err != nil {
		_ = a.plumb.Detach(s.cfg.ID)
		return netplumb.Link{}, err
	}
	return a.link, nil
}

// attachLink attaches the network namespace of pid under id.
func attachLink(h *netplumb.Host, id string, pid int) (netplumb.Link, error) {
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return netplumb.Link{}, fmt.Errorf("network: the agent's namespace: %w", err)
	}
	defer func() { _ = ns.Close() }()
	l, err := h.Attach(id, ns)
	if err != nil {
		return netplumb.Link{}, fmt.Errorf("network: %w", err)
	}
	return l, nil
}

// recordNet writes the running sandbox's link into its run directory.
func (s *Sandbox) recordNet(l netplumb.Link) error {
	b, _ := json.Marshal(l)
	return os.WriteFile(filepath.Join(s.run, netFile), b, 0o600)
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

// reserveNet restores the links that sandboxes of this run directory
// recorded, before the warm pool attaches links of its own: after a server
// restart a pooled agent must not take the address of a sandbox that is
// still running and about to be reattached (Open, restoreNet, which finds
// its link already restored). A recorded link whose sandbox is gone fails
// here (its veth went with its namespace) or is swept with the sandbox
// (ReapOrphans).
func (b *Backend) reserveNet() {
	if b.opts.Net == nil {
		return
	}
	ents, err := os.ReadDir(b.opts.RunDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(b.opts.RunDir, e.Name(), netFile)) //nolint:gosec // the backend's own run directory
		if err != nil {
			continue
		}
		var l netplumb.Link
		if err := json.Unmarshal(raw, &l); err != nil {
			continue
		}
		if err := b.opts.Net.Restore(e.Name(), l); err != nil {
			b.log.Debug("network: a recorded link was not reserved", "id", e.Name(), "err", err.Error())
		}
	}
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
// gone (a crashed server's), and for pooled agents of processes that are
// gone. A live process's pooled links stay, this one's included: a link
// being renamed to its sandbox may still show the pool's id.
func (b *Backend) sweepNet() error {
	if b.opts.Net == nil {
		return nil
	}
	_, err := b.opts.Net.Sweep(func(id string) bool {
		if pool, live := isLivePoolID(id); pool {
			return live
		}
		return alive(filepath.Join(b.opts.RunDir, id))
	})
	return err
}
