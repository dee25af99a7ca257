package service

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/warren-sandbox/warren/internal/wire"
)

// Starter starts the agent's child processes and is told when one has been
// waited for. In the agent it is PID 1's reaper (setup.Reaper), which must
// not reap a child its owner waits for.
type Starter interface {
	Start(cmd *exec.Cmd) error
	Release(pid int)
}

// Runner starts processes in the sandbox on behalf of the host.
type Runner struct {
	Starter Starter
	Env     []string // default environment
	Cwd     string   // default working directory
	// Cred is the default credential (the image's user); nil runs a
	// process that names no user as the agent's (root).
	Cred *syscall.Credential
}

// DefaultCredential returns a copy of Cred (each process gets its own, as
// exec may change it), or nil.
func (r *Runner) DefaultCredential() *syscall.Credential {
	if r.Cred == nil {
		return nil
	}
	c := *r.Cred
	return &c
}

// errStart is a program that could not be started: cause is its
// wire.Cause*, or "" for a failure that is neither (out of memory, say).
type errStart struct {
	cause string
	err   error
}

func (e *errStart) Error() string { return e.err.Error() }

// status is the exit status a shell would give: 127 for a program not
// found, 126 for any other failure to start it.
func (e *errStart) status() wire.ExitStatus {
	code := 126
	if e.cause == wire.CauseNotFound {
		code = 127
	}
	return wire.ExitStatus{Code: code, Error: e.err.Error()}
}

// startError classifies the error of starting a program by its errno:
// lookPath's checks pass a file that execve still refuses (a script whose
// interpreter is missing: ENOENT; a file that is no program: ENOEXEC; a
// noexec mount: EACCES).
func startError(err error) *errStart {
	switch {
	case errors.Is(err, syscall.ENOENT):
		return &errStart{wire.CauseNotFound, err}
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.ENOEXEC), errors.Is(err, syscall.EISDIR):
		return &errStart{wire.CauseNotExecutable, err}
	}
	return &errStart{"", err}
}

// command validates req and builds the command it describes.
func (r *Runner) command(req *wire.ExecRequest) (*exec.Cmd, error) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return nil, invalidf("argv is empty")
	}
	for _, a := range req.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, invalidf("argv contains a NUL byte")
		}
	}
	env := r.Env
	if req.Env != nil {
		env = mergeEnv(r.Env, req.Env)
	}
	for _, e := range env {
		if strings.IndexByte(e, 0) >= 0 || !strings.Contains(e, "=") {
			return nil, invalidf("env entry %q is not K=V", e)
		}
	}
	if len(req.Stdin) > wire.MaxStdin {
		return nil, &apiError{wire.ErrTooLarge, fmt.Sprintf("stdin is %d bytes, limit %d", len(req.Stdin), wire.MaxStdin)}
	}
	path, err := lookPath(req.Argv[0], env)
	if err != nil {
		return nil, err
	}
	cmd := &exec.Cmd{Path: path, Args: req.Argv, Env: env, Dir: r.Cwd}
	if req.Cwd != "" {
		cmd.Dir = req.Cwd
	}
	if st, err := os.Stat(cmd.Dir); err != nil || !st.IsDir() {
		return nil, &errStart{wire.CauseNotExecutable, fmt.Errorf("working directory %q does not exist", cmd.Dir)}
	}
	// Own process group, so a timeout or kill reaches what it forked.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	switch {
	case req.User != "":
		cred, err := LookupUser(req.User)
		if err != nil {
			return nil, err
		}
		cmd.SysProcAttr.Credential = cred
	default:
		cmd.SysProcAttr.Credential = r.DefaultCredential()
	}
	if len(req.Stdin) > 0 {
		cmd.Stdin = bytes.NewReader(req.Stdin)
		// A descendant may hold stdin open without reading it; once the
		// process has exited, Wait gives the copy this long, then closes.
		cmd.WaitDelay = 100 * time.Millisecond
	}
	return cmd, nil
}

// mergeEnv overlays extra on base, later entries winning.
func mergeEnv(base, extra []string) []string {
	out := make([]string, 0, len(base)+len(extra))
	idx := map[string]int{}
	for _, kv := range append(append([]string(nil), base...), extra...) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := idx[k]; ok {
			out[i] = kv
			continue
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	return out
}

func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		st, err := os.Stat(name)
		if err != nil {
			return "", &errStart{wire.CauseNotFound, fmt.Errorf("%s: no such file", name)}
		}
		if st.IsDir() || st.Mode()&0o111 == 0 {
			return "", &errStart{wire.CauseNotExecutable, fmt.Errorf("%s: permission denied (not an executable file)", name)}
		}
		return name, nil
	}
	pathEnv := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			pathEnv = v
		}
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", &errStart{wire.CauseNotFound, fmt.Errorf("%s: command not found in PATH", name)}
}

// LookupUser resolves "uid", "uid:gid", "name" or "name:group" against
// the sandbox's /etc/passwd and /etc/group. A bare uid without a passwd
// entry gets the same gid.
func LookupUser(spec string) (*syscall.Credential, error) {
	name, group, hasGroup := strings.Cut(spec, ":")
	var uid, gid uint64
	var err error
	if uid, err = strconv.ParseUint(name, 10, 32); err != nil {
		u, lerr := user.Lookup(name)
		if lerr != nil {
			return nil, &apiError{wire.ErrNotFound, fmt.Sprintf("user %q not found in /etc/passwd", name)}
		}
		uid, _ = strconv.ParseUint(u.Uid, 10, 32)
		gid, _ = strconv.ParseUint(u.Gid, 10, 32)
	} else {
		gid = uid
		if u, lerr := user.LookupId(name); lerr == nil {
			gid, _ = strconv.ParseUint(u.Gid, 10, 32)
		}
	}
	if hasGroup {
		if gid, err = strconv.ParseUint(group, 10, 32); err != nil {
			g, lerr := user.LookupGroup(group)
			if lerr != nil {
				return nil, &apiError{wire.ErrNotFound, fmt.Sprintf("group %q not found in /etc/group", group)}
			}
			gid, _ = strconv.ParseUint(g.Gid, 10, 32)
		}
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

// Exec runs req to completion, calling emit for each chunk of output in the
// order it is read, and returns how the process ended. Cancelling ctx (the
// client went away) kills the process group.
func (r *Runner) Exec(ctx context.Context, req *wire.ExecRequest, emit func(wire.ExecEvent)) (wire.ExitStatus, error) {
	cmd, err := r.command(req)
	if err != nil {
		var se *errStart
		if errors.As(err, &se) {
			return se.status(), nil
		}
		return wire.ExitStatus{}, err
	}
	limit := req.OutputLimit
	if limit <= 0 {
		limit = wire.DefaultOutputLimit
	}
	limit = min(limit, wire.MaxStreamedOutput)
	if req.NoOutputLimit {
		limit = math.MaxInt64
	}
	out := &capped{limit: limit, emit: emit}
	outR, outW, errR, errW, err := stdPipes()
	if err != nil {
		return wire.ExitStatus{}, err
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	p, err := startProcess(r.Starter, cmd, []*os.File{outW, errW}, []*os.File{outR, errR}, []func(){
		func() { out.copy(wire.Stdout, outR); _ = outR.Close() },
		func() { out.copy(wire.Stderr, errR); _ = errR.Close() },
	}, time.Duration(req.TimeoutMs)*time.Millisecond)
	if err != nil {
		return startError(err).status(), nil
	}
	// The client went away: kill it (not what it left behind once it has
	// exited, as the timeout does not).
	stop := context.AfterFunc(ctx, p.killRunning)
	// Descendants may still hold the pipes open; take what they wrote
	// promptly, but never wait on them beyond a short grace. Closing our
	// ends ends the readers, so emit is not called once Exec returns.
	st := p.wait(100*time.Millisecond, func() { _ = outR.Close(); _ = errR.Close() }, outR, errR)
	stop()
	st.Truncated = out.truncated
	return st, nil
}

// capped forwards output until a byte limit shared by both streams, then
// keeps draining so the writer never blocks on a full pipe.
type capped struct {
	mu        sync.Mutex
	limit     int64
	used      int64
	truncated bool
	emit      func(wire.ExecEvent)
}

func (c *capped) copy(stream string, r io.Reader) {
	pump(r, func(b []byte) {
		c.mu.Lock()
		defer c.mu.Unlock()
		keep := int64(len(b))
		if c.used+keep > c.limit {
			keep = c.limit - c.used
			c.truncated = true
		}
		if keep > 0 {
			c.used += keep
			c.emit(wire.ExecEvent{Stream: stream, Data: bytes.Clone(b[:keep])})
		}
	})
}

// apiError is an error with an agent error kind.
type apiError struct {
	kind string
	msg  string
}

func (e *apiError) Error() string { return e.msg }

func invalidf(format string, args ...any) error {
	return &apiError{wire.ErrInvalid, fmt.Sprintf(format, args...)}
}
