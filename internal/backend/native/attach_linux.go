package native

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/agent"
	"github.com/warren-sandbox/warren/internal/backend"
)

// Open returns the sandbox cfg.ID that Create made earlier, possibly in an
// earlier process (a daemon that restarted). When its agent still runs, the
// handle is attached to it: exec, stop and stats work as if this process had
// started it. Otherwise the handle is stopped and Start starts it again with
// its files kept.
func (b *Backend) Open(ctx context.Context, cfg backend.Config) (backend.Sandbox, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid sandbox config: %w", err)
	}
	if b.opts.ExitWithHost {
		return nil, errors.New("open sandbox: sandboxes of this backend end with their creator (ExitWithHost)")
	}
	dir := filepath.Join(b.opts.DataDir, "sandboxes", cfg.ID)
	if _, err := os.Stat(filepath.Join(dir, "upper")); err != nil {
		return nil, fmt.Errorf("sandbox %q: %w", cfg.ID, fs.ErrNotExist)
	}
	// Its cap as stored may be another than cfg's (the policy changed
	// while the server was down): the next start applies cfg's.
	s := &Sandbox{b: b, cfg: cfg, dir: dir, run: filepath.Join(b.opts.RunDir, cfg.ID), diskCap: -1}
	if err := s.attach(); err == nil {
		// A crash during a start may have left a running sandbox's cap
		// lifted (liftFullCap): it is not started again, so it is put
		// back now.
		if _, limit, ok := s.quotaUsage(); ok && limit == 0 && cfg.DiskBytes > 0 {
			s.setDiskLimit(cfg.DiskBytes)
		}
	} else {
		b.log.Warn("sandbox agent not reattached", "id", cfg.ID, "err", err)
		// What the dead agent left (cgroup, runtime dir) goes now, so a
		// later Start begins clean.
		s.destroyStaleCgroup()
		_ = os.RemoveAll(s.run)
	}
	return s, nil
}

// attach connects s to its running agent, identified by the pid and start
// time the agent's starter recorded.
func (s *Sandbox) attach() error {
	pid, ok := recordedPid(s.run)
	if !ok {
		return errors.New("no live agent recorded")
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("pidfd_open: %w", err)
	}
	// The pid could have been reused between reading the record and
	// opening the pidfd: check again now that the pidfd pins the process.
	if !alive(s.run) {
		unix.Close(pidfd)
		return errors.New("agent exited")
	}
	cg, err := s.b.cgroups.Open(s.cfg.ID)
	if err != nil {
		unix.Close(pidfd)
		return fmt.Errorf("cgroup: %w", err)
	}
	// Not this process's child: watched through its pidfd, never reaped
	// here.
	s.proc = watchProc(pid, pidfd)
	s.cg = cg
	s.client = agent.NewClient(filepath.Join(s.run, "agent.sock"))
	if err := s.restoreNet(); err != nil {
		// Running, but its traffic would reach nothing with its rules:
		// the sandbox is attached and its network reported broken.
		s.b.log.Warn("sandbox network not restored", "id", s.cfg.ID, "err", err.Error())
	}
	return nil
}

// recordedPid reads runDir/agent.pid if the agent it names still runs.
func recordedPid(runDir string) (int, bool) {
	if !alive(runDir) {
		return 0, false
	}
	b, err := os.ReadFile(filepath.Join(runDir, "agent.pid")) //nolint:gosec // runDir is this backend's run directory for the sandbox; agent.pid is written by the backend
	if err != nil {
		return 0, false
	}
	var pid int
	if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &pid); err != nil {
		return 0, false
	}
	return pid, true
}

// IDs lists every persistent sandbox that has state on this host, running
// or not (the daemon compares it with its database to find orphans).
// Ephemeral sandboxes (`warren run`'s) are left out: they belong to the
// process that made them, which may be running beside the daemon on the
// same data directory, and ReapOrphans clears those whose process is gone.
func (b *Backend) IDs() ([]string, error) {
	dir := filepath.Join(b.opts.DataDir, "sandboxes")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if _, err := os.Lstat(filepath.Join(dir, e.Name(), ephemeralMarker)); err == nil {
			continue
		}
		ids = append(ids, e.Name())
	}
	return ids, nil
}

// SetConfig replaces the configuration a stopped sandbox starts with next
// (its id stays). A running sandbox keeps the one it started with until it
// is stopped.
func (s *Sandbox) SetConfig(cfg backend.Config) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cfg.ID = s.cfg.ID
	s.cfg = cfg
}

// DiskUsage is the space the sandbox's writable layer takes on the host,
// in bytes (allocated blocks; hard links counted once).
func (s *Sandbox) DiskUsage() (int64, error) { return s.b.disk.DiskUsage(s.dir, "upper") }
