package gvisor

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/netplumb"
)

// A sandbox's network link (backend.NetworkEgress), as on the native
// backend: the host's plumbing (Options.Net) gives a network namespace a
// veth whose host side it steers (nftables, the transparent proxy and
// resolver of package egress). Here the backend makes that namespace
// itself, before runsc starts, pinned by a bind mount at
// <RunDir>/.netns/<id>; the OCI spec names it and runsc, run with
// --network=sandbox, takes the veth's address and routes into the
// sentry's own network stack. The sandbox's code never reaches the host
// kernel's stack: only the sentry's packets leave by the veth, with the
// sandbox's address, so the host side is native's unchanged.
//
// The link lives until release: the namespace's unmount frees it (the
// kernel deletes the pair with the last reference, the sentry's), and
// Detach frees the address and the rules that named it. A restore from a
// checkpoint is a start: a namespace and link of its own, whose address
// runsc restore gives the restored sentry in place of the source's.

// netnsDir holds the pinned namespaces, beside the bundles.
const netnsDir = ".netns"

func (b *Backend) netnsPath(id string) string { return filepath.Join(b.opts.RunDir, netnsDir, id) }

// checkNet refuses a network link this backend cannot give.
func (b *Backend) checkNet(cfg backend.Config) error {
	if (cfg.Network == backend.NetworkEgress || len(cfg.Ports) > 0) && b.opts.Net == nil {
		return fmt.Errorf("network: this host gives sandboxes no network (see warren doctor): %w", backend.ErrUnsupported)
	}
	return nil
}

// runscNetwork is runsc's --network for cfg: the sentry's loopback only,
// or the link of the namespace the spec names.
func runscNetwork(cfg backend.Config) string {
	if cfg.Network == backend.NetworkEgress {
		return "sandbox"
	}
	return "none"
}

// attachNet makes the sandbox's namespace, gives it its link, points the
// spec at it and writes the resolv.conf naming the link's gateway (the
// host's resolver for the sandbox), bound read-only at /etc/resolv.conf.
// What it made stays for release on error.
func (s *Sandbox) attachNet(spec *specs.Spec, nVolumes int) error {
	b := s.b
	rd := b.runDir(s.id)
	if err := os.MkdirAll(rd, 0o700); err != nil {
		return err
	}
	p := b.netnsPath(s.id)
	if err := newNetns(p); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	ns, err := os.Open(p) //nolint:gosec // our own pin under RunDir
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	l, err := b.opts.Net.Attach(s.id, ns)
	_ = ns.Close()
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	s.mu.Lock()
	s.link = l
	s.mu.Unlock()
	for i, n := range spec.Linux.Namespaces {
		if n.Type == specs.NetworkNamespace {
			spec.Linux.Namespaces[i].Path = p
		}
	}
	resolv := filepath.Join(rd, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver "+l.Gateway.String()+"\n"), 0o644); err != nil { //nolint:gosec // 0644: every process reads resolv.conf
		return fmt.Errorf("network: %w", err)
	}
	// Before the volumes, which pinBinds finds last.
	m := specs.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: resolv, Options: []string{"bind", "ro"}}
	spec.Mounts = slices.Insert(spec.Mounts, len(spec.Mounts)-nVolumes, m)
	return nil
}

// newNetns makes a network namespace pinned at p, from a thread of its
// own that returns to the process's namespace after, or ends with the
// new one (never unlocked, so the runtime retires it).
func newNetns(p string) error {
	// Made again if gone: the native backend's reaper, in the server's
	// run directory, removes <run>/gvisor as if it were a sandbox's.
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	if err := unpin(p); err != nil { // a crashed start's
		return err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o600) //nolint:gosec // our own pin under RunDir
	if err != nil {
		return err
	}
	_ = f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		host, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer func() { _ = host.Close() }()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		err = unix.Mount("/proc/thread-self/ns/net", p, "", unix.MS_BIND, "")
		if serr := unix.Setns(int(host.Fd()), unix.CLONE_NEWNET); serr != nil {
			errc <- errors.Join(err, fmt.Errorf("back to the host's namespace: %w", serr))
			return // locked: the thread ends with the goroutine
		}
		runtime.UnlockOSThread()
		if err != nil {
			err = fmt.Errorf("pin the namespace: %w", err)
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		_ = os.Remove(p)
		return err
	}
	return nil
}

// releaseNet frees what the sandbox's link held: the host's address and
// rules, then the namespace's pin (none for a sandbox without a link). A
// pin this process did not attach (a crashed server's, found by Open or
// ReapOrphans) is detached too: while pinned its veth is there for
// Detach to find by name.
func (s *Sandbox) releaseNet() error {
	var errs []error
	p := s.b.netnsPath(s.id)
	s.mu.Lock()
	attached := s.link.Addr.IsValid()
	s.link = netplumb.Link{}
	s.mu.Unlock()
	_, err := os.Lstat(p)
	if pinned := err == nil; (attached || pinned) && s.b.opts.Net != nil {
		if err := s.b.opts.Net.Detach(s.id); err != nil {
			errs = append(errs, fmt.Errorf("network: %w", err))
		}
	}
	if err := unpin(p); err != nil {
		errs = append(errs, fmt.Errorf("network: %w", err))
	}
	return errors.Join(errs...)
}

// unpin unmounts and removes the namespace pinned at p, if any.
func unpin(p string) error {
	for unix.Unmount(p, unix.MNT_DETACH) == nil {
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// NetAddr implements backend.Networked.
func (s *Sandbox) NetAddr() netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client == nil {
		return netip.Addr{}
	}
	return s.link.Addr
}

var _ backend.Networked = (*Sandbox)(nil)
