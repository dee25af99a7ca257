package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/sandbox"
	"github.com/warren-sandbox/warren/internal/wire"
)

type method func(ctx context.Context, c *call) (any, error)

// call is one method invocation.
type call struct {
	s      *Server
	claims auth.Claims
	params json.RawMessage
	method string
}

// decode reads params into v. Strict decoding (Warren's own methods and
// every policy-bearing object) refuses unknown fields; the microsandbox
// methods accept what clients of any version send.
func (c *call) decode(v any, strict bool) error {
	d := json.NewDecoder(bytes.NewReader(c.params))
	if strict {
		d.DisallowUnknownFields()
	}
	if err := d.Decode(v); err != nil {
		return errdefs.Errorf(errInvalidParams, "%s params: %s", c.method, jsonMessage(err))
	}
	return nil
}

// namespace resolves a request's namespace and checks the caller may touch
// it. Absent, it is the key's namespace when the key is for one namespace
// (the only one it may touch), and "default" for a key for every
// namespace and in dev mode, as microsandbox clients that send none expect.
func (c *call) namespace(ns string) (string, error) {
	if ns == "" {
		ns = c.defaultNamespace()
	}
	if !sandbox.ValidName(ns) {
		return "", errdefs.Errorf(errInvalidParams, "namespace %.70q: want 1-63 of [A-Za-z0-9_-] starting with a letter or digit", ns)
	}
	if !c.claims.Allows(ns) {
		return "", errdefs.Errorf(errdefs.ErrForbidden, "this API key is for namespace %q, not %q", c.claims.Namespace, ns)
	}
	return ns, nil
}

// defaultNamespace is the namespace of a request that names none.
func (c *call) defaultNamespace() string {
	if k := c.claims.Namespace; k != "" && k != "*" {
		return k
	}
	return DefaultNamespace
}

// namespaces resolves a namespace filter that may be "*": nil means all.
func (c *call) namespaces(ns string) ([]string, error) {
	if ns == "*" {
		if c.claims.Namespace != "*" {
			return nil, errdefs.Errorf(errdefs.ErrForbidden, "this API key is for namespace %q and cannot list all namespaces", c.claims.Namespace)
		}
		return nil, nil
	}
	ns, err := c.namespace(ns)
	if err != nil {
		return nil, err
	}
	return []string{ns}, nil
}

// requireAdmin checks the caller holds a key for every namespace.
func (c *call) requireAdmin() error {
	if c.claims.Namespace != "*" {
		return errdefs.Errorf(errdefs.ErrForbidden, "%s needs an API key with namespace \"*\"", c.method)
	}
	return nil
}

func sandboxName(name string) error {
	if name == "" {
		return errdefs.Errorf(errInvalidParams, "\"sandbox\" (the sandbox's name) is missing")
	}
	if !sandbox.ValidName(name) {
		return errdefs.Errorf(errInvalidParams, "sandbox name %.70q: want 1-63 of [A-Za-z0-9_-] starting with a letter or digit", name)
	}
	return nil
}

// seconds converts a duration given in seconds (a timeout, a wait, a
// lifetime) to a time.Duration bounded by max. The bound is checked on the
// float, before any conversion: converting a value past the range of
// time.Duration gives an arbitrary (on amd64, negative) duration, which
// would slip past a check made after it. A positive value under a
// millisecond counts as one millisecond, the unit timeouts travel in, so
// it never turns into 0 (no timeout). NaN and infinities cannot come from
// JSON, but are refused all the same.
func seconds(what string, v float64, max time.Duration) (time.Duration, error) {
	if math.IsNaN(v) || v < 0 || v > max.Seconds() {
		return 0, errdefs.Errorf(errInvalidParams, "%s %g: want a number of seconds from 0 up to %g", what, v, max.Seconds())
	}
	d := time.Duration(v * float64(time.Second))
	if v > 0 && d < time.Millisecond {
		d = time.Millisecond
	}
	return d, nil
}

// maxTimeout bounds every command and code timeout.
const maxTimeout = 24 * time.Hour

type startParams struct {
	Sandbox   string `json:"sandbox"`
	Namespace string `json:"namespace"`
	Config    struct {
		Image     string            `json:"image"`
		Memory    float64           `json:"memory"`
		CPUs      float64           `json:"cpus"`
		Volumes   []string          `json:"volumes"`
		Ports     []string          `json:"ports"`
		Envs      []string          `json:"envs"`
		DependsOn []string          `json:"depends_on"`
		Workdir   string            `json:"workdir"`
		Shell     string            `json:"shell"`
		Scripts   map[string]string `json:"scripts"`
		Exec      string            `json:"exec"`
	} `json:"config"`
}

func (s *Server) sandboxStart(ctx context.Context, c *call) (any, error) {
	var p startParams
	if err := c.decode(&p, false); err != nil {
		return nil, err
	}
	if err := sandboxName(p.Sandbox); err != nil {
		return nil, err
	}
	ns, err := c.namespace(p.Namespace)
	if err != nil {
		return nil, err
	}
	cfg := p.Config
	vols, err := parseVolumes(cfg.Volumes)
	if err != nil {
		return nil, err
	}
	if len(cfg.Ports) > 0 {
		return nil, errdefs.Errorf(errInvalidParams, "ports: sandboxes have no network but loopback; publishing ports is not supported")
	}
	if cfg.Memory == 0 {
		cfg.Memory = 512
	}
	if cfg.CPUs == 0 {
		cfg.CPUs = 1
	}
	if cfg.Memory != float64(int64(cfg.Memory)) {
		return nil, errdefs.Errorf(errInvalidParams, "memory %v: want a whole number of MiB", cfg.Memory)
	}
	run, err := startCommand(cfg.Shell, cfg.Exec, cfg.Scripts)
	if err != nil {
		return nil, err
	}
	img := cfg.Image
	if img == "" {
		img = "python"
	}
	spec := sandbox.Spec{Image: img, MemoryMiB: int64(cfg.Memory), CPUs: cfg.CPUs, Env: cfg.Envs, Workdir: cfg.Workdir, Volumes: vols}
	var deps []string // the dependencies this start started
	if len(cfg.DependsOn) > 0 {
		// A config that will be refused starts no dependency (the
		// manager validates it again; without dependencies, only there).
		if err := spec.Validate(); err != nil {
			return nil, err
		}
		if deps, err = s.startDependencies(ctx, ns, p.Sandbox, cfg.DependsOn); err != nil {
			return nil, err
		}
	}
	t0 := time.Now()
	info, err := s.mgr.Start(ctx, ns, p.Sandbox, spec, false)
	if err != nil {
		return nil, err
	}
	// A start of a sandbox that was already running changes nothing: it
	// is not timed as a start, and its start command is not run again.
	started := !info.Started.Before(t0)
	if started {
		s.m.startLatency(ns, time.Since(t0))
	}
	if len(deps) > 0 || (run != nil && started) {
		if err := s.afterStart(ctx, ns, p.Sandbox, deps, run); err != nil {
			return nil, err
		}
	}
	return fmt.Sprintf("Sandbox %s started successfully", p.Sandbox), nil
}

// parseVolumes reads "HOST:GUEST[:ro]" volumes; the manager applies the
// server's host-mount policy.
func parseVolumes(vs []string) ([]backend.Volume, error) {
	var out []backend.Volume
	for _, v := range vs {
		vol, err := backend.ParseVolume(v)
		if err != nil {
			return nil, errdefs.Errorf(errInvalidParams, "%w", err)
		}
		out = append(out, vol)
	}
	return out, nil
}

// Limits on a start config's commands.
const (
	maxScripts     = 64
	maxScriptLen   = 64 << 10
	maxDependsOn   = 16
	maxShellPath   = 4096
	defaultShell   = "/bin/sh"
	startScriptKey = "start"
)

// startCommand is the argv a start config runs once the sandbox is up, as
// microsandbox does: `exec` when given, otherwise the script named "start";
// either runs as `<shell> -c <command>` (shell default /bin/sh). Nil when
// there is nothing to run. Every script is checked, run or not.
func startCommand(shell, exec string, scripts map[string]string) ([]string, error) {
	if shell == "" {
		shell = defaultShell
	}
	if !strings.HasPrefix(shell, "/") || len(shell) > maxShellPath || strings.ContainsRune(shell, 0) {
		return nil, errdefs.Errorf(errInvalidParams, "shell %.64q: want an absolute path inside the sandbox, like /bin/bash", shell)
	}
	if len(scripts) > maxScripts {
		return nil, errdefs.Errorf(errInvalidParams, "scripts: %d given, at most %d", len(scripts), maxScripts)
	}
	for name, cmd := range scripts {
		if !sandbox.ValidName(name) {
			return nil, errdefs.Errorf(errInvalidParams, "scripts: name %.64q: want 1-63 of [A-Za-z0-9_-] starting with a letter or digit", name)
		}
		if err := checkCommand("scripts."+name, cmd); err != nil {
			return nil, err
		}
	}
	if err := checkCommand("exec", exec); err != nil {
		return nil, err
	}
	cmd := exec
	if cmd == "" {
		cmd = scripts[startScriptKey]
	}
	if cmd == "" {
		return nil, nil
	}
	return []string{shell, "-c", cmd}, nil
}

func checkCommand(what, cmd string) error {
	if len(cmd) > maxScriptLen {
		return errdefs.Errorf(errInvalidParams, "%s: %d bytes, at most %d", what, len(cmd), maxScriptLen)
	}
	if strings.ContainsRune(cmd, 0) {
		return errdefs.Errorf(errInvalidParams, "%s contains a NUL byte", what)
	}
	return nil
}

// startDependencies makes every sandbox in deps run before name starts:
// each must already exist in the namespace (the server has no
// Sandboxfile to create it from); a stopped one is started again with the
// config it last ran with. It returns those it started.
func (s *Server) startDependencies(ctx context.Context, ns, name string, deps []string) ([]string, error) {
	if len(deps) > maxDependsOn {
		return nil, errdefs.Errorf(errInvalidParams, "depends_on: %d given, at most %d", len(deps), maxDependsOn)
	}
	var started []string
	seen := map[string]bool{}
	for _, d := range deps {
		if err := sandboxName(d); err != nil {
			return nil, fmt.Errorf("depends_on: %w", err)
		}
		if d == name {
			return nil, errdefs.Errorf(errInvalidParams, "depends_on: sandbox %q cannot depend on itself", d)
		}
		if seen[d] {
			continue
		}
		seen[d] = true
		info, err := s.mgr.Get(ns, d)
		if err != nil {
			return nil, fmt.Errorf("depends_on: %w", err)
		}
		if info.State == sandbox.Running {
			continue
		}
		if _, err := s.mgr.Start(ctx, ns, d, info.Spec, false); err != nil {
			return nil, fmt.Errorf("depends_on: start %q: %w", d, err)
		}
		started = append(started, d)
	}
	return started, nil
}

// afterStart records in the log of the sandbox just started the
// dependencies its start started, and runs its start command (argv, when
// not nil) as a background process.
func (s *Server) afterStart(ctx context.Context, ns, name string, deps, argv []string) error {
	l, err := s.mgr.Lease(ns, name)
	if err != nil {
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

type nameParams struct {
	Sandbox   string `json:"sandbox"`
	Namespace string `json:"namespace"`
}

func (c *call) target(strict bool) (ns, name string, err error) {
	var p nameParams
	if err := c.decode(&p, strict); err != nil {
		return "", "", err
	}
	return c.resolve(p.Namespace, p.Sandbox)
}

func (c *call) resolve(ns, name string) (string, string, error) {
	if err := sandboxName(name); err != nil {
		return "", "", err
	}
	ns, err := c.namespace(ns)
	return ns, name, err
}

func (s *Server) sandboxStop(ctx context.Context, c *call) (any, error) {
	ns, name, err := c.target(false)
	if err != nil {
		return nil, err
	}
	if err := s.mgr.Stop(ctx, ns, name); err != nil {
		return nil, err
	}
	return fmt.Sprintf("Sandbox %s stopped successfully", name), nil
}

type replParams struct {
	Sandbox   string  `json:"sandbox"`
	Namespace string  `json:"namespace"`
	Language  string  `json:"language"`
	Code      *string `json:"code"`
	Timeout   float64 `json:"timeout"`
}

// replResult is sandbox.repl.run's answer: microsandbox's shape plus
// Warren's fields.
type replResult struct {
	Status     string            `json:"status"`
	Language   string            `json:"language"`
	Output     []wire.OutputLine `json:"output"`
	HasError   bool              `json:"has_error"`
	Result     *string           `json:"result,omitempty"`
	Error      string            `json:"error,omitempty"`
	Truncated  bool              `json:"truncated,omitempty"`
	DurationMs float64           `json:"duration_ms"`
}

// maxCode bounds the code of one REPL run.
const maxCode = 16 << 20

func (s *Server) sandboxRepl(ctx context.Context, c *call) (any, error) {
	var p replParams
	if err := c.decode(&p, false); err != nil {
		return nil, err
	}
	ns, name, err := c.resolve(p.Namespace, p.Sandbox)
	if err != nil {
		return nil, err
	}
	switch p.Language {
	case "python", "nodejs", "node", "javascript":
	case "":
		return nil, errdefs.Errorf(errInvalidParams, "\"language\" is missing: want python, nodejs, node or javascript")
	default:
		return nil, errdefs.Errorf(errInvalidParams, "language %.40q: want python, nodejs, node or javascript", p.Language)
	}
	if p.Code == nil {
		return nil, errdefs.Errorf(errInvalidParams, "\"code\" is missing")
	}
	if len(*p.Code) > maxCode {
		return nil, errdefs.Errorf(errdefs.ErrTooLarge, "code is larger than %d MiB", maxCode>>20)
	}
	timeout, err := seconds("timeout", p.Timeout, maxTimeout)
	if err != nil {
		return nil, err
	}
	l, err := s.mgr.Lease(ns, name)
	if err != nil {
		return nil, err
	}
	defer l.Release()
	t0 := time.Now()
	res, err := l.Repl(ctx, wire.ReplRequest{Language: p.Language, Code: *p.Code, TimeoutMs: timeout.Milliseconds()})
	s.m.execLatency(ns, "repl", time.Since(t0))
	if err != nil {
		return nil, err
	}
	out := replResult{Status: "success", Language: p.Language, Output: res.Output, Result: res.Result,
		Error: res.Error, Truncated: res.Truncated, DurationMs: res.DurationMs}
	if out.Output == nil {
		out.Output = []wire.OutputLine{}
	}
	if res.Status != wire.ReplSuccess {
		out.Status = "error"
		out.HasError = true
	}
	for _, l := range out.Output {
		if l.Stream == wire.Stderr {
			out.HasError = true
		}
	}
	return out, nil
}

type commandParams struct {
	Sandbox   string   `json:"sandbox"`
	Namespace string   `json:"namespace"`
	Command   string   `json:"command"`
	Args      []string `json:"args"`
	Timeout   float64  `json:"timeout"`
}

type commandResult struct {
	Command    string            `json:"command"`
	Args       []string          `json:"args"`
	ExitCode   int               `json:"exit_code"`
	Success    bool              `json:"success"`
	Output     []wire.OutputLine `json:"output"`
	Truncated  bool              `json:"truncated,omitempty"`
	DurationMs float64           `json:"duration_ms"`
}

func (s *Server) sandboxCommand(ctx context.Context, c *call) (any, error) {
	var p commandParams
	if err := c.decode(&p, false); err != nil {
		return nil, err
	}
	ns, name, err := c.resolve(p.Namespace, p.Sandbox)
	if err != nil {
		return nil, err
	}
	if p.Command == "" {
		return nil, errdefs.Errorf(errInvalidParams, "\"command\" is missing")
	}
	timeout, err := seconds("timeout", p.Timeout, maxTimeout)
	if err != nil {
		return nil, err
	}
	if p.Args == nil {
		p.Args = []string{}
	}
	argv := append([]string{p.Command}, p.Args...)
	var lines lineSplitter
	res, err := s.exec(ctx, ns, name, "command", &wire.ExecRequest{Argv: argv, TimeoutMs: timeout.Milliseconds()}, lines.add)
	if err != nil {
		return nil, err
	}
	switch {
	case res.Error != "":
		return nil, errdefs.Errorf(errdefs.ErrExecFailed, "command %.100q could not be started: %s", p.Command, res.Error)
	case res.TimedOut:
		return nil, errdefs.Errorf(errdefs.ErrTimeout, "command %.100q did not finish within its %v timeout and was killed", p.Command, timeout)
	}
	out := lines.done()
	if res.OOMKilled {
		out = append(out, wire.OutputLine{Stream: wire.Stderr, Text: "warren: the command was killed: the sandbox ran out of memory"})
	}
	return commandResult{Command: p.Command, Args: p.Args, ExitCode: res.Code, Success: res.Code == 0,
		Output: out, Truncated: res.Truncated, DurationMs: res.DurationMs}, nil
}

// exec runs one command in a running sandbox, timed for the metrics.
func (s *Server) exec(ctx context.Context, ns, name, kind string, req *wire.ExecRequest, onOutput func(string, []byte)) (backend.ExecResult, error) {
	l, err := s.mgr.Lease(ns, name)
	if err != nil {
		return backend.ExecResult{}, err
	}
	defer l.Release()
	t0 := time.Now()
	res, err := l.Exec(ctx, kind, req, onOutput)
	s.m.execLatency(ns, kind, time.Since(t0))
	return res, err
}

// lineSplitter turns output chunks into lines per stream, in the order
// lines were completed.
type lineSplitter struct {
	lines   []wire.OutputLine
	partial [2][]byte
}

const maxLines = 100000

func (l *lineSplitter) add(stream string, data []byte) {
	i := 0
	if stream == wire.Stderr {
		i = 1
	}
	buf := append(l.partial[i], data...)
	for {
		j := bytes.IndexByte(buf, '\n')
		if j < 0 {
			break
		}
		l.emit(stream, buf[:j])
		buf = buf[j+1:]
	}
	l.partial[i] = append([]byte(nil), buf...)
}

func (l *lineSplitter) emit(stream string, b []byte) {
	if len(l.lines) >= maxLines {
		return
	}
	l.lines = append(l.lines, wire.OutputLine{Stream: stream, Text: text(b)})
}

func (l *lineSplitter) done() []wire.OutputLine {
	for i, stream := range []string{wire.Stdout, wire.Stderr} {
		if len(l.partial[i]) > 0 {
			l.emit(stream, l.partial[i])
		}
	}
	if l.lines == nil {
		return []wire.OutputLine{}
	}
	return l.lines
}

// text makes output valid UTF-8 for JSON (invalid bytes become U+FFFD).
func text(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

type metricsParams struct {
	Sandbox   string `json:"sandbox"`
	Namespace string `json:"namespace"`
}

type sandboxMetrics struct {
	Namespace   string   `json:"namespace"`
	Name        string   `json:"name"`
	Running     bool     `json:"running"`
	CPUUsage    *float64 `json:"cpu_usage"`
	MemoryUsage *int64   `json:"memory_usage"`
	DiskUsage   *int64   `json:"disk_usage"`
}

func (s *Server) sandboxMetrics(_ context.Context, c *call) (any, error) {
	var p metricsParams
	if err := c.decode(&p, false); err != nil {
		return nil, err
	}
	var infos []sandbox.Info
	if p.Sandbox != "" {
		ns, name, err := c.resolve(p.Namespace, p.Sandbox)
		if err != nil {
			return nil, err
		}
		info, err := s.mgr.Get(ns, name)
		if err != nil {
			return nil, err
		}
		infos = []sandbox.Info{info}
	} else {
		nss, err := c.namespaces(p.Namespace)
		if err != nil {
			return nil, err
		}
		infos = s.mgr.List(sandbox.Filter{Namespaces: nss})
	}
	out := make([]sandboxMetrics, 0, len(infos))
	for _, in := range infos {
		u, err := s.mgr.Usage(in.Namespace, in.Name)
		if err != nil {
			continue // removed meanwhile
		}
		out = append(out, sandboxMetrics{Namespace: u.Namespace, Name: u.Name, Running: u.Running,
			CPUUsage: u.CPUPercent, MemoryUsage: u.MemoryMiB, DiskUsage: u.DiskBytes})
	}
	return map[string]any{"sandboxes": out}, nil
}
