// Command warren-agent runs as PID 1 inside every Warren sandbox. The host
// starts it in fresh namespaces with three inherited descriptors (see
// boot.FDConfig, FDListener, FDStatus); it sets the sandbox up, reports
// readiness and serves the agent protocol until the sandbox is stopped.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/confined"
	"github.com/warren-sandbox/warren/internal/guest/repl"
	"github.com/warren-sandbox/warren/internal/guest/service"
	"github.com/warren-sandbox/warren/internal/guest/setup"
	"github.com/warren-sandbox/warren/internal/wire/boot"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "attach" {
		// Run by the host in a running sandbox (boot.Attach): sets the
		// sandbox's hostname (a restored copy's own; the agent lacks the
		// capability) and hands the agent a new control socket.
		if err := attach(os.Args[2]); err != nil {
			fmt.Fprintf(os.Stderr, "warren-agent attach: %v\n", err)
			os.Exit(1)
		}
		return
	}
	status := inherited(boot.FDStatus, "status")
	if err := run(status); err != nil {
		fmt.Fprintf(status, "%v\n", err)
		fmt.Fprintf(os.Stderr, "warren-agent: %v\n", err)
		os.Exit(1)
	}
}

// inherited returns a descriptor the host passed, made non-blocking first so
// that the runtime's poller waits on it: a blocking one ties up an OS
// thread for as long as a read waits (the host's Go runtime hands them
// over blocking). Only this process holds these open file descriptions.
func inherited(fd int, name string) *os.File {
	_ = syscall.SetNonblock(fd, true)
	return passed(fd, name)
}

// passed returns a descriptor the host passed, close-on-exec: the host
// hands them over inheritable, and the commands the agent starts must not
// hold the lifeline (or anything else of the agent's).
func passed(fd int, name string) *os.File {
	syscall.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), name)
}

func run(status *os.File) error {
	// A small heap matters more here than GC throughput: one agent idles
	// in every sandbox.
	debug.SetGCPercent(50)
	if err := setup.DiscardSignals(); err != nil {
		return err
	}
	// The uid range's lock, when the host passed one, stays open for the
	// agent's life and reaches nothing it starts (nor does what the host
	// put at FDLifeline to place it, when there is no lifeline). Not an
	// *os.File: its finalizer would close it.
	for _, fd := range []int{boot.FDLifeline, boot.FDUIDRange} {
		_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC)
	}
	cfgFile := inherited(boot.FDConfig, "config")
	if cfgFile == nil || status == nil {
		return fmt.Errorf("started without the host's descriptors; warren-agent is run by warren, not by hand")
	}
	// A pooled agent mounts what every sandbox has while it waits for
	// its config; a failure only costs the time it saves.
	stage := os.Getenv(boot.EnvStage)
	go warmUp(stage != "")
	var staged *setup.Staged
	if dir := stage; dir != "" {
		var err error
		if staged, err = setup.Stage(dir); err != nil {
			fmt.Fprintf(os.Stderr, "warren-agent: staging the standard mounts (mounting them at start instead): %v\n", err)
		}
	}
	cfg, err := boot.ReadConfig(cfgFile)
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	_ = cfgFile.Close()
	if cfg.Lifeline {
		life := inherited(boot.FDLifeline, "lifeline")
		go func() {
			// Blocks until the host's end closes; then the sandbox ends:
			// PID 1 exiting kills every process in the namespace.
			_, _ = io.Copy(io.Discard, life)
			os.Exit(0)
		}()
	}
	cf := passed(boot.FDConn, "conn")
	first, err := net.FileConn(cf)
	if err != nil {
		return fmt.Errorf("first connection: %w", err)
	}
	_ = cf.Close()
	var l net.Listener
	var attach *boot.AttachListener
	if cfg.ConnsByFD {
		// A connected socket the host sends connections on; the
		// listener owns it, and the host's end closing ends it unless
		// the host detached first (a checkpoint) to attach again.
		attach, err = boot.NewAttachListener(inherited(boot.FDListener, "listener"), first)
		l = attach
	} else {
		lf := passed(boot.FDListener, "listener")
		l, err = net.FileListener(lf)
		_ = lf.Close()
		l = service.FirstConn(l, first)
	}
	if err != nil {
		return fmt.Errorf("listener: %w", err)
	}
	phases := map[string]float64{}
	launcher, err := setup.Apply(cfg, staged, phases)
	if err != nil {
		return err
	}
	reaper := setup.NewReaper(launcher)
	go reaper.Run(nil)
	env := cfg.Spec.Process.Env
	runner := &service.Runner{Starter: reaper, Env: env, Cwd: cfg.Spec.Process.Cwd}
	if cfg.User != "" {
		// Like a container runtime, a user the image names but does not
		// have fails the start rather than silently running as root.
		if runner.Cred, err = service.LookupUser(cfg.User); err != nil {
			return fmt.Errorf("the image's user: %w", err)
		}
	}
	root, err := confined.Open("/")
	if err != nil {
		return err
	}
	rm := repl.NewManager(repl.Options{
		Python: cfg.Python, Node: cfg.Node, Env: env, Dir: runner.Cwd, Starter: reaper,
		// Own process group, so an interrupt or kill reaches what the code
		// forked. No Pdeathsig: it fires when the forking thread exits.
		SysProcAttr: func() *syscall.SysProcAttr {
			return &syscall.SysProcAttr{Setpgid: true, Credential: runner.DefaultCredential()}
		},
	})
	srv := service.NewServer(runner, root, rm)
	if attach != nil {
		srv.Detach = attach.Detach
		if err := attach.ServeAttach(boot.AttachSocket); err != nil {
			return err
		}
	}
	// "ok" and the setup phases' timings, for the host's start log.
	report, _ := json.Marshal(phases)
	if _, err := status.WriteString("ok " + string(report) + "\n"); err != nil {
		return fmt.Errorf("report ready: %w", err)
	}
	_ = status.Close()
	if n := int(cfg.Procs); n != 1 {
		if n == 0 || n > runtime.NumCPU() {
			n = runtime.NumCPU()
		}
		runtime.GOMAXPROCS(n)
	}
	return srv.Serve(l)
}

// attach is `warren-agent attach HOSTNAME`.
func attach(hostname string) error {
	if err := unix.Sethostname([]byte(hostname)); err != nil {
		return fmt.Errorf("hostname: %w", err)
	}
	return boot.Attach(boot.AttachSocket, passed(boot.FDAttach, "control"))
}
