package native

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/cgroup"
)

var _ backend.Pauser = (*Sandbox)(nil)

// pauseTimeout bounds how long Pause waits for every process of a sandbox
// to freeze (a process in an uninterruptible wait, on a slow disk say,
// freezes once that ends).
const pauseTimeout = 5 * time.Second

// Pause implements backend.Pauser with the sandbox's cgroup freezer: its
// processes, the agent among them, stop where they are with their memory
// kept. A pause that does not finish in time (or by ctx's deadline) is
// undone.
func (s *Sandbox) Pause(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || s.proc.exited() {
		return fmt.Errorf("pause sandbox %s: not running", s.cfg.ID)
	}
	timeout := pauseTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	if err := s.cg.Freeze(timeout); err != nil {
		return fmt.Errorf("pause sandbox %s: %w", s.cfg.ID, pauseErr(err))
	}
	return nil
}

// Resume implements backend.Pauser.
func (s *Sandbox) Resume(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || s.proc.exited() {
		return fmt.Errorf("resume sandbox %s: not running", s.cfg.ID)
	}
	if err := s.cg.Thaw(); err != nil {
		return fmt.Errorf("resume sandbox %s: %w", s.cfg.ID, pauseErr(err))
	}
	return nil
}

// Paused implements backend.Pauser: the freezer's state as the kernel
// keeps it, whoever froze it (this process or the server before a
// restart). A stopped sandbox, or one without a usable freezer, is not
// paused.
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

// pauseErr marks a missing freezer as what this host cannot do.
func pauseErr(err error) error {
	if errors.Is(err, cgroup.ErrControllerUnavailable) {
		return fmt.Errorf("%w (%w)", err, errors.ErrUnsupported)
	}
	return err
}

// thawLocked lets a paused sandbox's processes run once more so that a
// kill reaches them: a frozen process dies only once it runs, and a pid
// namespace's init that is killed waits for the rest to die.
func (s *Sandbox) thawLocked() {
	if s.cg == nil {
		return
	}
	if p, err := s.cg.Frozen(); err == nil && p {
		if err := s.cg.Thaw(); err != nil {
			s.b.log.Warn("thaw a paused sandbox to stop it", "id", s.cfg.ID, "err", err.Error())
		}
	}
}
