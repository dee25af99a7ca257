package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/agent"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/wire"
)

// RunAgent exercises every operation of the in-sandbox agent through
// sb.Agent(): the real agent in a real sandbox, fed hostile inputs. It uses
// only the backend interface, the agent client and programs of the image
// (sh, coreutils, python3 and node), so any backend can run it. Host-side
// checks only assert that nothing a sandbox wrote appeared on the host.
//
// Each group runs in a sandbox of its own, so an agent crash in one group
// (reported as such) does not cascade into the others; within a group,
// subtests share the sandbox. Every group ends by checking the agent still
// answers and still runs commands.
func RunAgent(t *testing.T, h *Harness) {
	t.Run("Exec", h.agentExec)
	t.Run("Shell", h.agentShell)
	t.Run("Processes", h.agentProcesses)
	t.Run("ProcessLimit", h.agentProcessLimit)
	t.Run("ProcessLateOutput", h.agentLateOutput)
	t.Run("Files", h.agentFiles)
	t.Run("Tar", h.agentTar)
	t.Run("Repl", h.agentRepl)
	t.Run("Connection", h.agentConnection)
}

// agentSuite is one sandbox shared by the subtests of a group.
type agentSuite struct {
	sb  backend.Sandbox
	c   *agent.Client
	tmp string // scratch directory inside the sandbox
}

func (h *Harness) newAgentSuite(t *testing.T, cfg backend.Config) *agentSuite {
	t.Helper()
	sb := h.Sandbox(t, cfg)
	s := &agentSuite{sb: sb, c: sb.Agent(), tmp: "/tmp/agentconf-" + randHex(4)}
	s.sh(t, "mkdir -p "+s.tmp)
	return s
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// ctxFor returns a context ending after d or with the test.
func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// errInfo renders an error with its agent kind, for failure messages.
func errInfo(err error) string {
	var ae *agent.Error
	if errors.As(err, &ae) {
		return fmt.Sprintf("agent error kind=%q status=%d: %s", ae.Kind, ae.Status, ae.Message)
	}
	if err == nil {
		return "no error"
	}
	return fmt.Sprintf("non-agent error %T: %v", err, err)
}

func wantKind(t testing.TB, err error, kind, what string) {
	t.Helper()
	if !agent.IsKind(err, kind) {
		t.Errorf("%s: got %s; want an agent error of kind %q", what, errInfo(err), kind)
	}
}

func clip(b []byte) string {
	if len(b) > 200 {
		return fmt.Sprintf("%q...(%d bytes)", b[:200], len(b))
	}
	return strconv.Quote(string(b))
}

type execResult struct {
	wire.ExitStatus
	Stdout, Stderr []byte
	Took           time.Duration
}

func (r execResult) String() string {
	return fmt.Sprintf("exit %+v stdout %s stderr %s after %v", r.ExitStatus, clip(r.Stdout), clip(r.Stderr), r.Took.Round(time.Millisecond))
}

func (s *agentSuite) exec(ctx context.Context, req *wire.ExecRequest) (execResult, error) {
	var r execResult
	var mu sync.Mutex
	start := time.Now()
	st, err := s.c.Exec(ctx, req, func(stream string, data []byte) {
		mu.Lock()
		defer mu.Unlock()
		switch stream {
		case wire.Stdout:
			r.Stdout = append(r.Stdout, data...)
		case wire.Stderr:
			r.Stderr = append(r.Stderr, data...)
		default:
			r.Stderr = append(r.Stderr, fmt.Sprintf("<unknown stream %q>", stream)...)
		}
	})
	r.Took = time.Since(start)
	r.ExitStatus = st
	return r, err
}

func (s *agentSuite) mustExec(t testing.TB, req *wire.ExecRequest) execResult {
	t.Helper()
	r, err := s.exec(ctxFor(t, 60*time.Second), req)
	if err != nil {
		t.Fatalf("exec %q: %s", req.Argv, errInfo(err))
	}
	return r
}

// sh runs a setup script in the sandbox and returns its stdout.
func (s *agentSuite) sh(t testing.TB, script string) string {
	t.Helper()
	r := s.mustExec(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", script}})
	if r.Code != 0 {
		t.Fatalf("sh -c %q: %v", script, r)
	}
	return string(r.Stdout)
}

// fresh drops the client's pooled connections, so the next request starts
// on a new one. It follows requests whose body the agent may reject unread,
// so that a connection-level defect (checked on its own by Connection) does
// not surface in unrelated tests.
func (s *agentSuite) fresh() { s.c.Close() }

// healthy checks the agent still answers and runs commands.
func (s *agentSuite) healthy(t *testing.T) {
	select {
	case <-s.sb.Done():
		t.Fatal("the sandbox's init (the agent) has exited")
	default:
	}
	hl, err := s.c.Health(ctxFor(t, 10*time.Second))
	if err != nil {
		t.Fatalf("agent no longer answers health: %s", errInfo(err))
	}
	if hl.Version != wire.Version || hl.Pid != 1 {
		t.Errorf("health %+v: want version %q and pid 1", hl, wire.Version)
	}
	r, err := s.exec(ctxFor(t, 10*time.Second), &wire.ExecRequest{Argv: []string{"/bin/true"}})
	if err != nil || r.Code != 0 || r.Error != "" {
		t.Errorf("/bin/true after the hostile calls: %v %s", r, errInfo(err))
	}
	if _, err := s.c.Processes(ctxFor(t, 10*time.Second)); err != nil {
		t.Errorf("list processes: %s", errInfo(err))
	}
}

// hostAbsent fails when a file of one of names appeared in a host directory
// a sandbox escape would most likely reach.
func hostAbsent(t testing.TB, names ...string) {
	t.Helper()
	wd, _ := os.Getwd()
	dirs := []string{"/", "/tmp", os.TempDir(), "/root", "/etc", "/var/tmp", wd, filepath.Dir(wd)}
	for _, n := range names {
		for _, d := range dirs {
			p := filepath.Join(d, n)
			if _, err := os.Lstat(p); err == nil {
				t.Errorf("%s appeared on the host", p)
			}
		}
	}
}
