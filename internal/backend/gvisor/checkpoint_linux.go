package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/agent"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/wire/boot"
)

// Checkpoint and restore. A snapshot directory holds what runsc
// checkpoint wrote (the sentry's memory and kernel state, checkpointDir)
// and a copy of the sandbox's writable layer (upperDir) taken while the
// sandbox was paused, so the two agree. The image's layers are not
// copied: a restore mounts the same image under the copy.
//
// The agent's channel to the host is host descriptors, which a restored
// sandbox would not have: the agent drops them first (boot.AttachListener)
// and the host hands it a new control socket after (attach), the source
// as well as every copy; a copy never sees its source's.
//
// The restored agent's code is the binary its sandbox mounted, read again
// after a restore: agentFile records which (agentbin names each build's
// by its hash), and a restore by another build's agent is refused.
const (
	checkpointDir = "checkpoint"
	upperDir      = "upper"
	agentFile     = "agent"
)

// Checkpoint implements backend.Checkpointer: the running sandbox's state
// into dir (which must not exist; it is made whole or not at all by the
// caller). The sandbox is paused for the copy and runs on after with a
// new agent connection; requests in flight on the old one fail.
func (s *Sandbox) Checkpoint(ctx context.Context, dir string) (err error) {
	s.startMu.Lock()
	defer s.startMu.Unlock()
	s.mu.Lock()
	client, ctl, cfg := s.client, s.ctl, s.cfg
	s.mu.Unlock()
	if client == nil {
		return fmt.Errorf("sandbox %s is not running", s.id)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, agentFile), []byte(s.b.opts.AgentPath), 0o600); err != nil {
		return err
	}
	if err := client.Detach(ctx); err != nil {
		return fmt.Errorf("checkpoint: the agent did not detach: %w", err)
	}
	client.Close()
	// The agent answers before it lets go of its host descriptors, and
	// a checkpoint that finds one open fails ("not savable") or makes an
	// image that cannot be restored; it closes its end of the control
	// socket last (boot.AttachListener.Detach).
	err = waitEOF(ctx, ctl)
	_ = ctl.Close()
	if err != nil {
		return fmt.Errorf("checkpoint: the agent did not let go of its connections: %w", err)
	}
	// Whatever happens next, the sandbox runs on attached again, or is
	// stopped with the reason.
	defer func() {
		if aerr := s.reattach(context.WithoutCancel(ctx), cfg); aerr != nil {
			_ = s.release(context.Background())
			err = errors.Join(err, fmt.Errorf("the sandbox was stopped: %w", aerr))
		}
	}()
	b := s.b
	if out, err := b.runsc(ctx, "pause", s.id).CombinedOutput(); err != nil {
		return fmt.Errorf("runsc pause: %w: %s", err, strings.TrimSpace(string(out)))
	}
	defer func() {
		if out, rerr := b.runsc(context.WithoutCancel(ctx), "resume", s.id).CombinedOutput(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("runsc resume: %w: %s", rerr, strings.TrimSpace(string(out))))
		}
	}()
	if out, err := b.runsc(ctx, "checkpoint", "--image-path="+filepath.Join(dir, checkpointDir),
		"--leave-running", "--compression=none", s.id).CombinedOutput(); err != nil {
		return fmt.Errorf("runsc checkpoint: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return copyTree(ctx, filepath.Join(b.sandboxDir(s.id), "upper"), filepath.Join(dir, upperDir))
}

// waitEOF waits until f's peer has closed its end of the socket, for at
// most 10 s or until ctx ends. f is a blocking file (it also carries the
// descriptors the dialer sends), so it polls rather than reads with a
// deadline; what the peer sent meanwhile is read and dropped.
func waitEOF(ctx context.Context, f *os.File) error {
	deadline := time.Now().Add(10 * time.Second)
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	buf := make([]byte, 512)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return errors.New("its end is still open after 10s")
		}
		var eof bool
		var opErr error
		if err := rc.Control(func(fd uintptr) {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}} //nolint:gosec // a descriptor number fits an int32
			n, err := unix.Poll(fds, int(min(left, 100*time.Millisecond)/time.Millisecond)+1)
			if err != nil || n == 0 {
				if !errors.Is(err, unix.EINTR) {
					opErr = err
				}
				return
			}
			r, _, err := unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
			switch {
			case err == nil && r == 0:
				eof = true
			case err != nil && !errors.Is(err, unix.EAGAIN):
				opErr = err
			}
		}); err != nil {
			return err
		}
		switch {
		case eof:
			return nil
		case opErr != nil:
			return opErr
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// reattach hands the running agent a new control socket (attach) and
// makes it the sandbox's connection.
func (s *Sandbox) reattach(ctx context.Context, cfg backend.Config) error {
	ctl, err := s.attach(ctx, cfg)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.ctl, s.client = ctl, agent.NewClientDial(dialer(ctl, nil))
	s.mu.Unlock()
	return nil
}

// attach runs `warren-agent attach` in the sandbox with a new control
// socket and the sandbox's hostname, and returns the host's end. It may
// set the hostname (CAP_SYS_ADMIN in the sentry's UTS namespace), which
// the agent's own capabilities do not allow.
func (s *Sandbox) attach(ctx context.Context, cfg backend.Config) (*os.File, error) {
	host, far, err := socketPair()
	if err != nil {
		return nil, err
	}
	defer func() { _ = far.Close() }()
	cmd := s.b.runsc(ctx, "exec", fmt.Sprintf("--pass-fd=3:%d", boot.FDAttach), "--cap=CAP_SYS_ADMIN",
		s.id, agentInSandbox, "attach", hostname(cfg))
	cmd.ExtraFiles = []*os.File{far}
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = host.Close()
		return nil, fmt.Errorf("attach the agent: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return host, nil
}

func hostname(cfg backend.Config) string {
	if cfg.Hostname != "" {
		return cfg.Hostname
	}
	return backend.DefaultHostname
}

// copyTree copies a writable layer as it is: owners, modes, times, the
// overlay's whiteouts and xattrs (cp -a as root keeps trusted.overlay.*).
func copyTree(ctx context.Context, src, dst string) error {
	out, err := exec.CommandContext(ctx, "cp", "-a", "--", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy the writable layer: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Restore implements backend.Restorer: a new sandbox, cfg.ID, from the
// snapshot in dir, running (its processes as they were) and attached to
// a new agent connection under cfg's identity.
func (b *Backend) Restore(ctx context.Context, cfg backend.Config, dir string) (backend.Sandbox, error) {
	if _, err := os.Stat(filepath.Join(dir, checkpointDir)); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if a, err := os.ReadFile(filepath.Join(dir, agentFile)); err != nil { //nolint:gosec // the snapshot's own file
		return nil, fmt.Errorf("snapshot: %w", err)
	} else if string(a) != b.opts.AgentPath {
		return nil, fmt.Errorf("the snapshot's sandbox ran another warren build's agent (%s; this server's is %s): restore it with that build: %w", a, b.opts.AgentPath, backend.ErrUnsupported)
	}
	sb, err := b.Create(ctx, cfg)
	if err != nil {
		return nil, err
	}
	s := sb.(*Sandbox)
	upper := filepath.Join(b.sandboxDir(s.id), "upper")
	err = os.Remove(upper)
	if err == nil {
		err = copyTree(ctx, filepath.Join(dir, upperDir), upper)
	}
	if err == nil {
		s.startMu.Lock()
		ctx, cancel := context.WithTimeout(ctx, b.opts.StartTimeout)
		err = s.restore(ctx, cfg, filepath.Join(dir, checkpointDir))
		cancel()
		s.startMu.Unlock()
	}
	if err != nil {
		_ = s.Remove(context.Background())
		return nil, fmt.Errorf("restore sandbox %s: %w", cfg.ID, err)
	}
	return s, nil
}

// restore is start's counterpart for a snapshot: runsc restore in place
// of runsc run, and the agent attached after rather than at its start.
func (s *Sandbox) restore(ctx context.Context, cfg backend.Config, image string) error {
	b := s.b
	rd, _, err := s.prepareBundle(cfg)
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(rd, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600) //nolint:gosec // under our own RunDir
	if err != nil {
		return err
	}
	defer func() { _ = logf.Close() }()
	run := b.runscNet(context.Background(), runscNetwork(cfg), "restore", "--bundle="+rd, "--image-path="+image, s.id)
	run.Stdout, run.Stderr = logf, logf
	// As `runsc run` in start: its own group, ended with the server.
	run.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := startTied(run); err != nil {
		return fmt.Errorf("runsc restore: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = run.Wait()
		close(done)
	}()
	s.mu.Lock()
	s.run, s.done = run, done
	s.mu.Unlock()
	_ = logf.Close()
	pid, err := s.waitRunning(ctx, done, filepath.Join(rd, "agent.log"))
	if err != nil {
		return err
	}
	ctl, err := s.attach(ctx, cfg)
	if err != nil {
		return err
	}
	cg, err := b.cgroups.Open(s.id)
	if err != nil {
		_ = ctl.Close()
		return fmt.Errorf("the sandbox's cgroup: %w", err)
	}
	s.mu.Lock()
	s.ctl, s.client, s.cg, s.pid = ctl, agent.NewClientDial(dialer(ctl, nil)), cg, pid
	s.mu.Unlock()
	return nil
}

// waitRunning waits for runsc to record the restored container running,
// reading its state file (a runsc state per poll would cost a process
// each), and returns the sentry's pid from it.
func (s *Sandbox) waitRunning(ctx context.Context, done <-chan struct{}, logPath string) (int, error) {
	state := filepath.Join(s.b.opts.RunDir, runscState, s.id+"_sandbox:"+s.id+".state")
	for {
		if b, err := os.ReadFile(state); err == nil { //nolint:gosec // runsc's state under our RunDir
			var st struct {
				Status  string `json:"status"`
				Sandbox struct {
					Pid int `json:"pid"`
				} `json:"sandbox"`
			}
			if json.Unmarshal(b, &st) == nil && st.Status == "running" && st.Sandbox.Pid > 0 {
				return st.Sandbox.Pid, nil
			}
		}
		select {
		case <-done:
			return 0, fmt.Errorf("runsc restore exited: %s", tail(logPath))
		case <-ctx.Done():
			return 0, fmt.Errorf("the restore did not finish in time: %w (%s)", ctx.Err(), tail(logPath))
		case <-time.After(2 * time.Millisecond):
		}
	}
}
