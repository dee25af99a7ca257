package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/wire"
)

// Plan is what a start does besides starting the sandbox, as
// microsandbox's start config asks: the sandboxes it depends on, started
// first, and a command run in the background once it is up.
type Plan struct {
	// DependsOn names sandboxes of the same namespace that must run
	// before this one starts. Each must exist (the server has no
	// Sandboxfile to create one from); a stopped one is started again
	// with the spec it last ran with.
	DependsOn []string
	// Command, when not nil, runs as a background process once the
	// sandbox is up, when this start started it: a start that finds the
	// sandbox running runs nothing.
	Command []string
}

// MaxDependsOn bounds Plan.DependsOn.
const MaxDependsOn = 16

// StartPlanned starts ns/name with spec as Start does (never as a create),
// after the sandboxes plan depends on, then runs plan's command. started
// reports whether this call started the sandbox (false: it ran already).
// A spec that will be refused starts no dependency. A command that cannot
// be started (its shell is missing) is exec_failed; the sandbox keeps
// running.
func (m *Manager) StartPlanned(ctx context.Context, ns, name string, spec Spec, plan Plan) (info Info, started bool, err error) {
	var deps []string // the dependencies this start started
	if len(plan.DependsOn) > 0 {
		// Without dependencies the spec is checked in Start alone.
		if err := spec.Validate(); err != nil {
			return Info{}, false, err
		}
		if len(spec.Ports) > 0 && !m.networking() {
			return Info{}, false, errNoPorts(spec.Ports, nil)
		}
		if deps, err = m.startDependencies(ctx, ns, name, plan.DependsOn); err != nil {
			return Info{}, false, err
		}
	}
	t0 := time.Now()
	info, err = m.Start(ctx, ns, name, spec, false)
	if err != nil {
		return Info{}, false, err
	}
	started = !info.Started.Before(t0)
	cmd := plan.Command
	if !started {
		cmd = nil
	}
	if len(deps) > 0 || cmd != nil {
		if err := m.afterStart(ctx, ns, name, deps, cmd); err != nil {
			return Info{}, started, err
		}
	}
	return info, started, nil
}

// startDependencies makes every sandbox in deps run before name starts,
// and returns those it started.
func (m *Manager) startDependencies(ctx context.Context, ns, name string, deps []string) ([]string, error) {
	if len(deps) > MaxDependsOn {
		return nil, errdefs.Errorf(errdefs.ErrInvalid, "depends_on: %d given, at most %d", len(deps), MaxDependsOn)
	}
	var started []string
	seen := map[string]bool{}
	for _, d := range deps {
		if !ValidName(d) {
			return nil, errdefs.Errorf(errdefs.ErrInvalid, "depends_on: sandbox name %.70q: want 1-63 of [A-Za-z0-9_-] starting with a letter or digit", d)
		}
		if d == name {
			return nil, errdefs.Errorf(errdefs.ErrInvalid, "depends_on: sandbox %q cannot depend on itself", d)
		}
		if seen[d] {
			continue
		}
		seen[d] = true
		info, err := m.Get(ns, d)
		if err != nil {
			return nil, fmt.Errorf("depends_on: %w", err)
		}
		if info.State == Running {
			continue
		}
		if _, err := m.Start(ctx, ns, d, info.Spec, false); err != nil {
			return nil, fmt.Errorf("depends_on: start %q: %w", d, err)
		}
		started = append(started, d)
	}
	return started, nil
}

// afterStart records in the log of the sandbox just started the
// dependencies its start started, and runs its start command (argv, when
// not nil) as a background process.
func (m *Manager) afterStart(ctx context.Context, ns, name string, deps, argv []string) error {
	l, err := m.Lease(ns, name)
	if err != nil {
		if argv == nil {
			return nil // stopped meanwhile: only log lines are lost
		}
		return err
	}
	defer l.Release()
	for _, d := range deps {
		l.Logf("started %q, which it depends on", d)
	}
	if argv == nil {
		return nil
	}
	pi, err := l.Agent().StartProcess(ctx, &wire.ExecRequest{Argv: argv})
	if err != nil {
		switch errdefs.Kind(err) {
		case errdefs.ErrNotFound.Error(), errdefs.ErrInvalid.Error(), errdefs.ErrForbidden.Error():
			// The shell is missing or cannot run: the command's fault,
			// as for command.run. The sandbox keeps running.
			return errdefs.Errorf(errdefs.ErrExecFailed, "start command could not be started (the sandbox runs): %s", err.Error())
		}
		return fmt.Errorf("start command: %w", err)
	}
	l.Logf("start command started as process %s", pi.ID)
	return nil
}
