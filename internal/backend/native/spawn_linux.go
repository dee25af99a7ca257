package native

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/cgroup"
	"github.com/warren-sandbox/warren/internal/netplumb"
	"github.com/warren-sandbox/warren/internal/oci"
	"github.com/warren-sandbox/warren/internal/spawner"
	"github.com/warren-sandbox/warren/internal/timerslack"
	"github.com/warren-sandbox/warren/internal/wire/boot"
)

// agentProc is a started warren-agent, in its namespaces, that has not been
// configured yet: it blocks reading its config. Its socket and log live in
// dir, which can be renamed while it waits.
type agentProc struct {
	proc    *initProc
	dir     string
	cfgW    *os.File // the host's end of the config socket
	statusR *os.File
	// conn is the host's end of the first agent connection (boot.FDConn),
	// until the agent's client takes it.
	conn  net.Conn
	lifeW *os.File // the host's end of the lifeline; nil unless ExitWithHost
	// cg is the pooled agent's own cgroup (nil when spawned for a start),
	// in the scheduler's idle class when idle.
	cg   *cgroup.Cgroup
	idle bool
	// netID names the pooled agent's link in plumb (the host's plumbing)
	// while the pool holds it: its cgroup's name; "" without one, and
	// once a start took the link.
	plumb *netplumb.Host
	netID string
	link  netplumb.Link
	// setupPhases are the agent's own setup timings (ms), from its report.
	setupPhases map[string]float64
	// uid is the first host id of the agent's uid range: its own
	// (uidrange) or the storage range; 0 without a user namespace.
	uid uint32
}

// kill ends the agent and releases the host's ends of its pipes.
func (a *agentProc) kill() {
	a.proc.kill()
	a.proc.close()
	a.closePipes()
}

func (a *agentProc) closePipes() {
	_ = a.cfgW.Close()
	_ = a.statusR.Close()
	if a.conn != nil {
		_ = a.conn.Close()
	}
	if a.lifeW != nil {
		_ = a.lifeW.Close()
	}
}

// setupCapabilities are the capabilities the agent's threads may hold: the
// sandbox's own plus what setup needs. Everything else leaves the bounding
// set before the clone.
var setupCapabilities = func() uint64 {
	m, err := oci.CapMask(append(append([]string(nil), oci.DefaultCapabilities...), oci.SetupCapabilities...))
	if err != nil {
		panic(err)
	}
	return m
}()

// spawnAgent starts an agent in new namespaces, in cgroup cg, its socket
// and log in dir, through the spawner process. With a stage directory (pooled agents) the
// agent stages its standard mounts there while it waits (setup.Stage).
func (b *Backend) spawnAgent(dir string, cg *cgroup.Cgroup, stage string) (a *agentProc, err error) {
	sock := filepath.Join(dir, "agent.sock")
	_ = os.Remove(sock)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	l.SetUnlinkOnClose(false)
	lf, err := l.File()
	_ = l.Close()
	if err != nil {
		return nil, err
	}
	defer func() { _ = lf.Close() }()
	logf, err := os.OpenFile(filepath.Join(dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600) //nolint:gosec // dir is the sandbox's run directory, made by this backend
	if err != nil {
		return nil, err
	}
	defer func() { _ = logf.Close() }()
	var closers []*os.File // child ends, closed once the child has them
	defer func() {
		for _, f := range closers {
			_ = f.Close()
		}
	}()
	a = &agentProc{dir: dir}
	cfgR, cfgW, err := socketPair()
	if err != nil {
		return nil, err
	}
	closers = append(closers, cfgR)
	a.cfgW = cfgW
	statusR, statusW, err := os.Pipe()
	if err != nil {
		_ = cfgW.Close()
		return nil, err
	}
	closers = append(closers, statusW)
	a.statusR = statusR
	connAgent, connHost, err := connPair()
	if err != nil {
		a.closePipes()
		return nil, err
	}
	closers = append(closers, connAgent)
	a.conn = connHost
	// The child's descriptors 1.. (boot.FDConfig is 3).
	files := []*os.File{logf, logf, cfgR, lf, statusW, connAgent}
	if b.opts.ExitWithHost {
		lifeR, lifeW, err := os.Pipe()
		if err != nil {
			a.closePipes()
			return nil, err
		}
		closers = append(closers, lifeR)
		a.lifeW = lifeW
		files = append(files, lifeR)
	}
	if m := b.userNS; m != nil {
		a.uid = m.Host
	}
	if b.ranges != nil {
		// The agent inherits the range's lock (boot.FDUIDRange) and
		// holds it for its life; the host's copy goes with this call.
		r, err := b.ranges.Take()
		if err != nil {
			a.closePipes()
			return nil, fmt.Errorf("start agent: %w", err)
		}
		closers = append(closers, r.Lock())
		a.uid = r.Host
		for len(files) < boot.FDLifeline {
			files = append(files, logf) // no lifeline: a placeholder, read by nobody
		}
		files = append(files, r.Lock())
	}
	// One P until the config says otherwise (boot.Config.Procs).
	env := []string{"GOMAXPROCS=1"}
	if stage != "" {
		env = append(env, boot.EnvStage+"="+stage)
	}
	req := spawner.Request{
		Path: b.agentPath, Args: []string{"warren-agent"}, Env: env,
		// No CLONE_NEWCGROUP: the agent keeps the host's view. Its
		// launcher thread enters a new cgroup namespace from inside the
		// cgroup the agent is born in, so every sandbox process sees that
		// cgroup as its root (a pooled agent's is renamed, not changed,
		// at start).
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWIPC |
			syscall.CLONE_NEWUTS | syscall.CLONE_NEWNET,
		KeepCaps: setupCapabilities,
	}
	// Coarse for the agent (package timerslack says why); its launcher
	// gives the sandbox's processes the host's back (boot.Config
	// .TimerSlack), which must be known for that.
	if timerslack.Original() != 0 {
		req.TimerSlack = timerslack.Coarse
	}
	if m := b.userNS; m != nil {
		req.UserNS = &spawner.IDMap{Host: a.uid, Size: m.Size}
	}
	target, err := cg.OpenSpawnTarget()
	if err != nil {
		a.closePipes()
		return nil, err
	}
	defer target.Close()
	var pid, pidfd int
	// A spawner found dead before it got the request (ErrGone) is
	// replaced once. One that dies while serving it is not retried: a
	// child it may have started shares this request's pipes.
	for try := 0; try < 2; try++ {
		var sp *spawner.Client
		if sp, err = b.liveSpawner(); err != nil {
			break
		}
		if pid, pidfd, err = sp.Spawn(req, target, files); !errors.Is(err, spawner.ErrGone) {
			break
		}
	}
	if err != nil {
		a.closePipes()
		return nil, fmt.Errorf("start agent: %w", err)
	}
	a.proc = watchProc(pid, pidfd)
	return a, nil
}

// configure sends the agent its config, with the root's mount when the host
// made one (nil otherwise) and the volumes' (boot.Config.BindMounts), and
// waits until it serves.
func (a *agentProc) configure(ctx context.Context, cfg *boot.Config, rootMount *os.File, binds []*os.File) error {
	if err := boot.SendConfig(a.cfgW, cfg, rootMount, binds); err != nil {
		return fmt.Errorf("send config to agent: %w", a.failure(err))
	}
	_ = a.cfgW.Close()
	ready := make(chan error, 1)
	go func() {
		b, err := io.ReadAll(io.LimitReader(a.statusR, 64<<10))
		switch {
		case err != nil:
			ready <- err
		case strings.HasPrefix(string(b), "ok"):
			// The agent's setup timings; informational, so a malformed
			// report is ignored.
			_ = json.Unmarshal([]byte(strings.TrimSpace(strings.TrimPrefix(string(b), "ok"))), &a.setupPhases)
			ready <- nil
		case len(b) == 0:
			ready <- errors.New("agent exited during setup")
		default:
			ready <- errors.New(strings.TrimSpace(string(b)))
		}
	}()
	select {
	case err := <-ready:
		if err != nil {
			return fmt.Errorf("sandbox setup failed: %w", a.failure(err))
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("sandbox setup: %w", ctx.Err())
	}
}

// sendWorkload passes the agent the file through which its launcher
// thread joins the workload's leaf of cg (package cgroup, split_linux.go),
// ahead of its config; nothing when cg is not split. The host opens it:
// the kernel checks the move against the opener's credentials.
func sendWorkload(a *agentProc, cg *cgroup.Cgroup) error {
	work, err := cg.OpenWorkload()
	if err != nil || work == nil {
		return err
	}
	defer func() { _ = work.Close() }()
	if err := boot.SendWorkload(a.cfgW, work); err != nil {
		return fmt.Errorf("send the workload cgroup to agent: %w", a.failure(err))
	}
	return nil
}

// failure adds the agent's own log to err, which is where a setup failure's
// details are.
func (a *agentProc) failure(err error) error {
	b, _ := os.ReadFile(filepath.Join(a.dir, "agent.log"))
	b = []byte(strings.TrimSpace(string(b)))
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	if len(b) > 0 && !strings.Contains(err.Error(), string(b)) {
		return fmt.Errorf("%w (agent log: %s)", err, b)
	}
	return err
}

// connPair is the first agent connection: the agent's end as a file to
// pass, the host's as a connection.
func connPair() (agent *os.File, host net.Conn, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("agent connection: %w", err)
	}
	hf := os.NewFile(uintptr(fds[1]), "agent-conn")
	defer func() { _ = hf.Close() }()
	if host, err = net.FileConn(hf); err != nil {
		unix.Close(fds[0])
		return nil, nil, fmt.Errorf("agent connection: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "agent-conn"), host, nil
}

// socketPair is a connected unix stream socket pair: the agent's end (r)
// and the host's (w), both close-on-exec.
func socketPair() (r, w *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("config socket: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "config"), os.NewFile(uintptr(fds[1]), "config"), nil
}
