package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/cgroup"
)

var _ backend.Pauser = (*Sandbox)(nil)

// pauseTimeout bounds a pause or resume: the runsc call and the freeze.
const pauseTimeout = 5 * time.Second

// Pause implements backend.Pauser in two steps. `runsc pause` stops the
// sandbox's tasks inside its sentry, so the sandbox's kernel sees a
// pause (its timers and watchdog stop with its tasks) rather than a stall.
// That leaves the sentry's and gofer's own Go runtimes ticking on the
// host (about 0.9 ms of CPU a second, measured idle), so the sandbox's
// host cgroup is then frozen too: no thread of it runs at all. A pause
// that fails half way is undone.
func (s *Sandbox) Pause(ctx context.Context) error {
	s.startMu.Lock() // not while it starts or stops
	defer s.startMu.Unlock()
	cg, err := s.runningCgroup()
	if err != nil {
		return fmt.Errorf("pause sandbox %s: %w", s.id, err)
	}
	ctx, cancel := context.WithTimeout(ctx, pauseTimeout)
	defer cancel()
	if err := s.runscCall(ctx, "pause"); err != nil {
		return fmt.Errorf("pause sandbox %s: %w", s.id, err)
	}
	timeout := pauseTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	if err := cg.Freeze(timeout); err != nil {
		_ = s.runscCall(context.Background(), "resume")
		return fmt.Errorf("pause sandbox %s: %w", s.id, freezeErr(err))
	}
	return nil
}

// Resume implements backend.Pauser: the cgroup thawed, then the sentry's
// tasks resumed.
func (s *Sandbox) Resume(ctx context.Context) error {
	s.startMu.Lock()
	defer s.startMu.Unlock()
	cg, err := s.runningCgroup()
	if err != nil {
		return fmt.Errorf("resume sandbox %s: %w", s.id, err)
	}
	if err := cg.Thaw(); err != nil {
		return fmt.Errorf("resume sandbox %s: %w", s.id, freezeErr(err))
	}
	ctx, cancel := context.WithTimeout(ctx, pauseTimeout)
	defer cancel()
	if err := s.runscCall(ctx, "resume"); err != nil {
		// Not paused in runsc's eyes (resumed by hand, say): thawed,
		// it runs, and saying otherwise would leave it paused for good
		// in the caller's.
		if st, serr := s.runscStatus(ctx); serr == nil && st == "running" {
			return nil
		}
		return fmt.Errorf("resume sandbox %s: %w", s.id, err)
	}
	return nil
}

// runscStatus is the container's status as `runsc state` says it
// ("running", "paused", ...).
func (s *Sandbox) runscStatus(ctx context.Context) (string, error) {
	out, err := s.b.runsc(ctx, "state", s.id).Output()
	if err != nil {
		return "", fmt.Errorf("runsc state: %w", err)
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return "", fmt.Errorf("runsc state: %w in %.200q", err, out)
	}
	return st.Status, nil
}

// Paused implements backend.Pauser: the freezer's state as the kernel
// keeps it. A stopped sandbox is not paused.
func (s *Sandbox) Paused() (bool, error) {
	s.mu.Lock()
	cg := s.cg
	s.mu.Unlock()
	if cg == nil {
		return false, nil
	}
	p, err := cg.Frozen()
	if errors.Is(err, cgroup.ErrControllerUnavailable) {
		return false, nil
	}
	return p, err
}

// runningCgroup is the running sandbox's cgroup.
func (s *Sandbox) runningCgroup() (*cgroup.Cgroup, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cg == nil {
		return nil, errors.New("not running")
	}
	select {
	case <-s.done:
		return nil, errors.New("not running")
	default:
	}
	return s.cg, nil
}

// runscCall runs `runsc <verb> <id>`, its output in the error.
func (s *Sandbox) runscCall(ctx context.Context, verb string) error {
	if out, err := s.b.runsc(ctx, verb, s.id).CombinedOutput(); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return fmt.Errorf("runsc %s: %w: %s", verb, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// freezeErr marks a missing freezer as what this host cannot do.
func freezeErr(err error) error {
	if errors.Is(err, cgroup.ErrControllerUnavailable) {
		return fmt.Errorf("%w (%w)", err, errors.ErrUnsupported)
	}
	return err
}
