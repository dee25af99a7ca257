// Package fake is an in-memory backend for tests of what sits above the
// backend contract (the sandbox manager, the RPC server): no root, no
// kernel features, deterministic. A sandbox is a record in a map; its
// "init" is an agent served in-process (agent.go), so Agent() is a real
// *agent.Client speaking the wire protocol over in-memory connections.
//
// What a real backend does that this one does not: isolation, images,
// volumes, limits. A test that needs those runs against the native
// backend (the conformance suite). What the fake adds for tests: a hook
// that fails or holds starts (SetStartHook), an init that dies on demand
// (Sandbox.Die), a record of the calls made (Calls), and settable usage
// (Sandbox.SetStats, Sandbox.SetDiskUsage).
package fake

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/netip"
	"slices"
	"sync"

	"github.com/warren-sandbox/warren/internal/agent"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/wire"
)

// The contract and every optional ability.
var (
	_ backend.Backend      = (*Backend)(nil)
	_ backend.Sandbox      = (*Sandbox)(nil)
	_ backend.Reconfigurer = (*Sandbox)(nil)
	_ backend.DiskUser     = (*Sandbox)(nil)
	_ backend.Pauser       = (*Sandbox)(nil)
)

// Call is one call made to the backend or one of its sandboxes.
type Call struct {
	Op string // "create", "open", "start", "stop", "remove", "reap", "pause", "resume"
	ID string
}

// Backend is the fake backend. Its map of sandboxes plays the host: it
// outlives a manager, so a second manager on the same Backend finds the
// first one's sandboxes as a restarted daemon finds them on disk.
type Backend struct {
	mu        sync.Mutex
	sandboxes map[string]*Sandbox // created and not removed
	calls     []Call
	startHook func(id string) error
	nextAddr  netip.Addr // the next running sandbox's link address
}

// New returns an empty backend.
func New() *Backend { return &Backend{sandboxes: map[string]*Sandbox{}} }

// SetStartHook sets a function every Start calls before it starts the
// sandbox: a non-nil error fails the start (with nothing left running); a
// hook that blocks holds the start, for races. nil removes it.
func (b *Backend) SetStartHook(f func(id string) error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.startHook = f
}

// Calls returns the calls made so far, oldest first.
func (b *Backend) Calls() []Call {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.calls)
}

func (b *Backend) record(op, id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, Call{op, id})
}

// Sandbox returns the sandbox id on the "host", nil if there is none.
func (b *Backend) Sandbox(id string) *Sandbox {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sandboxes[id]
}

// Running lists the ids of the sandboxes whose init runs, sorted.
func (b *Backend) Running() []string {
	b.mu.Lock()
	sbs := make([]*Sandbox, 0, len(b.sandboxes))
	for _, s := range b.sandboxes {
		sbs = append(sbs, s)
	}
	b.mu.Unlock()
	var ids []string
	for _, s := range sbs {
		if s.running() {
			ids = append(ids, s.ID())
		}
	}
	slices.Sort(ids)
	return ids
}

// Close stops every sandbox, as a host shutting down would: nothing of the
// in-process agents is left running (a synctest bubble must end with no
// goroutine blocked).
func (b *Backend) Close() {
	b.mu.Lock()
	sbs := make([]*Sandbox, 0, len(b.sandboxes))
	for _, s := range b.sandboxes {
		sbs = append(sbs, s)
	}
	b.mu.Unlock()
	for _, s := range sbs {
		s.kill()
	}
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "fake" }

// Capabilities implements backend.Backend: the fake runs nothing, so it
// declares none of the behaviours a real kernel gives; its sandboxes live
// in the Backend, which a new manager reopens (Reattach).
func (b *Backend) Capabilities() backend.Capabilities { return backend.Capabilities{Reattach: true} }

// Create implements backend.Backend.
func (b *Backend) Create(_ context.Context, cfg backend.Config) (backend.Sandbox, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid sandbox config: %w", err)
	}
	b.record("create", cfg.ID)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sandboxes[cfg.ID] != nil {
		return nil, fmt.Errorf("sandbox %q: %w", cfg.ID, fs.ErrExist)
	}
	s := &Sandbox{b: b, cfg: cfg, done: closed(), fs: newFS()}
	b.sandboxes[cfg.ID] = s
	return s, nil
}

// Open implements backend.Backend: the sandbox Create made, running or not.
func (b *Backend) Open(_ context.Context, cfg backend.Config) (backend.Sandbox, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid sandbox config: %w", err)
	}
	b.record("open", cfg.ID)
	b.mu.Lock()
	s := b.sandboxes[cfg.ID]
	b.mu.Unlock()
	if s == nil {
		return nil, fmt.Errorf("sandbox %q: %w", cfg.ID, fs.ErrNotExist)
	}
	s.SetConfig(cfg)
	return s, nil
}

// IDs implements backend.Backend.
func (b *Backend) IDs() ([]string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ids := make([]string, 0, len(b.sandboxes))
	for id := range b.sandboxes {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// ReapOrphans implements backend.Backend. A fake sandbox whose init died
// leaves nothing behind at runtime, so there is nothing to reap; the call
// is recorded.
func (b *Backend) ReapOrphans(func(id string) bool) ([]string, error) {
	b.record("reap", "")
	return nil, nil
}

// Sandbox is a fake sandbox.
type Sandbox struct {
	b *Backend

	mu      sync.Mutex
	cfg     backend.Config
	removed bool
	done    chan struct{} // closed when not running
	agent   *agentServer  // nil when not running
	client  *agent.Client
	stats   backend.Stats
	disk    int64
	fs      *fsys      // kept across stops, as a writable layer is
	addr    netip.Addr // its link's, while it runs with NetworkEgress
	paused  bool       // while it runs; its agent serves on regardless
}

func closed() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// ID implements backend.Sandbox.
func (s *Sandbox) ID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.ID
}

// Config is the configuration the sandbox starts (or started) with.
func (s *Sandbox) Config() backend.Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg
}

// SetConfig implements backend.Reconfigurer.
func (s *Sandbox) SetConfig(cfg backend.Config) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cfg.ID = s.cfg.ID
	s.cfg = cfg
}

// Start implements backend.Sandbox.
func (s *Sandbox) Start(ctx context.Context) error {
	id := s.ID()
	s.b.record("start", id)
	s.b.mu.Lock()
	hook := s.b.startHook
	s.b.mu.Unlock()
	if hook != nil {
		if err := hook(id); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.removed:
		return fmt.Errorf("sandbox %s was removed", id)
	case s.agent != nil:
		return nil // already running
	}
	if s.cfg.Network == backend.NetworkEgress {
		s.addr = s.b.takeAddr()
	}
	s.done = make(chan struct{})
	s.agent = serveAgent(s, s.fs, s.done)
	s.client = agent.NewClientDial(s.agent.dial)
	return nil
}

func (s *Sandbox) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.agent != nil
}

// Agent implements backend.Sandbox.
func (s *Sandbox) Agent() *agent.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.client
}

// Done implements backend.Sandbox.
func (s *Sandbox) Done() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.done
}

// Die ends the sandbox's init as a crash would: Done closes and the agent's
// connections break, with no call to Stop.
func (s *Sandbox) Die() { s.kill() }

// kill ends the init if it runs.
func (s *Sandbox) kill() {
	s.mu.Lock()
	a, client := s.agent, s.client
	s.agent, s.client, s.addr, s.paused = nil, nil, netip.Addr{}, false
	s.mu.Unlock()
	if a == nil {
		return
	}
	a.close()
	client.Close()
}

// NetAddr implements backend.Networked: a sandbox running with
// NetworkEgress has an address of its own (from 10.99.0.0/16, one per
// start, never reused), with nothing behind it.
func (s *Sandbox) NetAddr() netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

func (b *Backend) takeAddr() netip.Addr {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.nextAddr.IsValid() {
		b.nextAddr = netip.MustParseAddr("10.99.0.2")
	}
	a := b.nextAddr
	b.nextAddr = a.Next()
	return a
}

// Pause implements backend.Pauser: the sandbox is marked paused (its
// in-process agent goes on serving: what is above the contract must not
// send it requests meanwhile).
func (s *Sandbox) Pause(context.Context) error { return s.setPaused("pause", true) }

// Resume implements backend.Pauser.
func (s *Sandbox) Resume(context.Context) error { return s.setPaused("resume", false) }

func (s *Sandbox) setPaused(op string, p bool) error {
	s.b.record(op, s.ID())
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.agent == nil {
		return fmt.Errorf("%s sandbox %s: not running", op, s.cfg.ID)
	}
	s.paused = p
	return nil
}

// Paused implements backend.Pauser.
func (s *Sandbox) Paused() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.paused, nil
}

// Stop implements backend.Sandbox.
func (s *Sandbox) Stop(context.Context) error {
	s.b.record("stop", s.ID())
	s.kill()
	return nil
}

// Remove implements backend.Sandbox.
func (s *Sandbox) Remove(context.Context) error {
	id := s.ID()
	s.b.record("remove", id)
	s.kill()
	s.mu.Lock()
	s.removed = true
	s.fs = newFS()
	s.mu.Unlock()
	s.b.mu.Lock()
	if s.b.sandboxes[id] == s {
		delete(s.b.sandboxes, id)
	}
	s.b.mu.Unlock()
	return nil
}

// SetStats sets what Stats and OOMKills report.
func (s *Sandbox) SetStats(st backend.Stats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats = st
}

// Stats implements backend.Sandbox. A stopped sandbox has no cgroup to
// read, as in a real backend.
func (s *Sandbox) Stats() (backend.Stats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.agent == nil {
		return backend.Stats{}, errors.New("sandbox is not running")
	}
	return s.stats, nil
}

// OOMKills implements backend.Sandbox.
func (s *Sandbox) OOMKills() (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats.OOMKills, nil
}

func (s *Sandbox) oomKill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.OOMKills++
}

// SetDiskUsage sets what DiskUsage reports.
func (s *Sandbox) SetDiskUsage(n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.disk = n
}

// DiskUsage implements backend.DiskUser.
func (s *Sandbox) DiskUsage() (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.disk, nil
}

// errNotServed answers what the fake agent does not implement.
func errNotServed(w http.ResponseWriter, r *http.Request) {
	writeError(w, wire.ErrorBody{Kind: wire.ErrNotFound, Message: "the fake agent does not serve " + r.Method + " " + r.URL.Path})
}
