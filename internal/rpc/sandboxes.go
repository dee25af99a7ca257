package rpc

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

type startParams struct {
	Sandbox   string `json:"sandbox"`
	Namespace string `json:"namespace"`
	// Config is nil when the request has none.
	Config *startConfig `json:"config"`
}

type startConfig struct {
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
	// Warren holds Warren's extensions to microsandbox's config, which
	// a microsandbox server ignores.
	Warren *startExtensions `json:"warren"`
}

// startExtensions are the settings of Warren's own a microsandbox start
// may carry under "warren".
type startExtensions struct {
	Egress    []string `json:"egress"`
	Secrets   []string `json:"secrets"`
	Isolation string   `json:"isolation"`
}

func (s *Server) sandboxStart(ctx context.Context, c *call, p *startParams) (any, error) {
	if err := sandboxName(p.Sandbox); err != nil {
		return nil, err
	}
	ns, err := c.namespace(p.Namespace)
	if err != nil {
		return nil, err
	}
	if p.Config == nil {
		// No config: a sandbox that exists starts again as it last ran,
		// as microsandbox restarts one from its stored config; a new one
		// gets the server's defaults (microsandbox refuses it, having no
		// default image; docs/compat.md).
		if info, err := s.mgr.Get(ns, p.Sandbox); err == nil {
			return s.startSpec(ctx, ns, p.Sandbox, info.Spec, sandbox.Plan{})
		}
		p.Config = &startConfig{}
	}
	cfg := p.Config
	vols, err := parseVolumes(cfg.Volumes)
	if err != nil {
		return nil, err
	}
	ports, err := parsePorts(cfg.Ports)
	if err != nil {
		return nil, err
	}
	// Unset memory, cpus and image stay zero: the manager fills in the
	// server's defaults.
	if cfg.Memory != float64(int64(cfg.Memory)) {
		return nil, errdefs.Errorf(errInvalidParams, "memory %v: want a whole number of MiB", cfg.Memory)
	}
	run, err := startCommand(cfg.Shell, cfg.Exec, cfg.Scripts)
	if err != nil {
		return nil, err
	}
	spec := sandbox.Spec{Image: cfg.Image, MemoryMiB: int64(cfg.Memory), CPUs: cfg.CPUs, Env: cfg.Envs, Workdir: cfg.Workdir, Volumes: vols, Ports: ports}
	if cfg.Warren != nil {
		spec.Egress, spec.Secrets, spec.Isolation = cfg.Warren.Egress, cfg.Warren.Secrets, cfg.Warren.Isolation
	}
	return s.startSpec(ctx, ns, p.Sandbox, spec, sandbox.Plan{DependsOn: cfg.DependsOn, Command: run})
}

// startSpec starts ns/name with spec and plan and answers as sandbox.start.
func (s *Server) startSpec(ctx context.Context, ns, name string, spec sandbox.Spec, plan sandbox.Plan) (any, error) {
	t0 := time.Now()
	_, started, err := s.mgr.StartPlanned(ctx, ns, name, spec, plan)
	if started {
		// A start of a sandbox that was already running is not timed as
		// a start.
		s.m.startLatency(ns, time.Since(t0))
	}
	if err != nil {
		return nil, err
	}
	return fmt.Sprintf("Sandbox %s started successfully", name), nil
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

// parsePorts reads microsandbox's "HOST:GUEST" (or "PORT") published
// ports, of sandbox.start's config and sandbox.create alike; whether the
// sandbox can publish them is the backend's to say, and duplicates the
// spec's check (backend.ValidatePorts).
func parsePorts(ps []string) ([]backend.PortMapping, error) {
	if len(ps) > backend.MaxPorts {
		return nil, errdefs.Errorf(errInvalidParams, "ports: %d given, at most %d", len(ps), backend.MaxPorts)
	}
	var out []backend.PortMapping
	for _, p := range ps {
		pm, err := backend.ParsePort(p)
		if err != nil {
			return nil, errdefs.Errorf(errInvalidParams, "%w", err)
		}
		out = append(out, pm)
	}
	return out, nil
}

// Limits on a start config's commands.
const (
	maxScripts     = 64
	maxScriptLen   = 64 << 10
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

type stopParams = sandboxRef

func (s *Server) sandboxStop(ctx context.Context, c *call, p *stopParams) (any, error) {
	ns, name, err := c.resolveRef(*p)
	if err != nil {
		return nil, err
	}
	if err := s.mgr.Stop(ctx, ns, name); err != nil {
		return nil, err
	}
	return fmt.Sprintf("Sandbox %s stopped successfully", name), nil
}

// sandboxInfo is SandboxInfo on the wire.
type sandboxInfo struct {
	Namespace   string            `json:"namespace"`
	Name        string            `json:"name"`
	State       string            `json:"state"`
	Error       string            `json:"error,omitempty"`
	Image       string            `json:"image"`
	MemoryMiB   int64             `json:"memory_mib"`
	CPUs        float64           `json:"cpus"`
	Labels      map[string]string `json:"labels"`
	CreatedAt   *time.Time        `json:"created_at,omitempty"`
	StartedAt   *time.Time        `json:"started_at,omitempty"`
	StoppedAt   *time.Time        `json:"stopped_at,omitempty"`
	IdleTimeout float64           `json:"idle_timeout"`
	MaxLifetime float64           `json:"max_lifetime"`
	IdleAction  string            `json:"idle_action,omitempty"`
	// Isolation is the tier the sandbox got (native, gvisor).
	Isolation string `json:"isolation"`
	// DiskMiB is the disk limit asked for (absent: the server's default);
	// DiskUsage and DiskLimit (bytes) what the sandbox keeps on disk and
	// the cap in force, in sandbox.get.
	DiskMiB   int64  `json:"disk_mib,omitempty"`
	DiskUsage *int64 `json:"disk_usage,omitempty"`
	DiskLimit *int64 `json:"disk_limit,omitempty"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

func toInfo(in sandbox.Info) sandboxInfo {
	labels := in.Spec.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	return sandboxInfo{Namespace: in.Namespace, Name: in.Name, State: string(in.State), Error: in.Error,
		Image: in.Spec.Image, MemoryMiB: in.Spec.MemoryMiB, CPUs: in.Spec.CPUs, Labels: labels,
		CreatedAt: timePtr(in.Created), StartedAt: timePtr(in.Started), StoppedAt: timePtr(in.Stopped),
		IdleTimeout: in.Spec.IdleTimeout.Seconds(), MaxLifetime: in.Spec.MaxLifetime.Seconds(), DiskMiB: in.Spec.DiskMiB,
		IdleAction: in.Spec.IdleAction, Isolation: in.Spec.Isolation}
}

type createParams struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace"`
	Image       string            `json:"image"`
	MemoryMiB   int64             `json:"memory_mib"`
	CPUs        float64           `json:"cpus"`
	Env         []string          `json:"env"`
	Workdir     string            `json:"workdir"`
	Labels      map[string]string `json:"labels"`
	IdleTimeout float64           `json:"idle_timeout"`
	MaxLifetime float64           `json:"max_lifetime"`
	DiskMiB     int64             `json:"disk_mib"`
	Workspace   string            `json:"workspace"`
	Secrets     []string          `json:"secrets"`
	Egress      []string          `json:"egress"`
	Volumes     []string          `json:"volumes"`
	Ports       []string          `json:"ports"`
	IdleAction  string            `json:"idle_action"`
	Isolation   string            `json:"isolation"`
}

func (s *Server) sandboxCreate(ctx context.Context, c *call, p *createParams) (any, error) {
	if p.Name == "" {
		return nil, errdefs.Errorf(errInvalidParams, "\"name\" is missing")
	}
	ns, name, err := c.resolve(p.Namespace, p.Name)
	if err != nil {
		return nil, err
	}
	switch {
	case p.Workspace != "" && s.opts.Workspaces == nil:
		return nil, errdefs.Errorf(errInvalidParams, "workspace: workspaces are not configured on this server")
	}
	// Unset memory, cpus and image stay zero: the manager fills in the
	// server's defaults. The periods' bound is the manager's too; it is
	// checked here only because a float of seconds beyond it could
	// overflow a Duration.
	idle, err := seconds("idle_timeout", p.IdleTimeout, sandbox.MaxPeriod)
	if err != nil {
		return nil, err
	}
	life, err := seconds("max_lifetime", p.MaxLifetime, sandbox.MaxPeriod)
	if err != nil {
		return nil, err
	}
	vols, err := parseVolumes(p.Volumes)
	if err != nil {
		return nil, err
	}
	ports, err := parsePorts(p.Ports)
	if err != nil {
		return nil, err
	}
	spec := sandbox.Spec{Image: p.Image, MemoryMiB: p.MemoryMiB, CPUs: p.CPUs, Env: p.Env, Workdir: p.Workdir,
		Labels: p.Labels, IdleTimeout: idle, MaxLifetime: life, Volumes: vols, Ports: ports, Egress: p.Egress, Secrets: p.Secrets, DiskMiB: p.DiskMiB, Workspace: p.Workspace,
		IdleAction: p.IdleAction, Isolation: p.Isolation}
	t0 := time.Now()
	info, err := s.mgr.Start(ctx, ns, name, spec, true)
	if err != nil {
		return nil, err
	}
	s.m.startLatency(ns, time.Since(t0))
	return toInfo(info), nil
}

func (s *Server) sandboxGet(_ context.Context, c *call, p *sandboxRef) (any, error) {
	ns, name, err := c.resolveRef(*p)
	if err != nil {
		return nil, err
	}
	info, err := s.mgr.Get(ns, name)
	if err != nil {
		return nil, err
	}
	out := toInfo(info)
	if u, err := s.mgr.Usage(ns, name); err == nil {
		out.DiskUsage, out.DiskLimit = u.DiskBytes, u.DiskLimitBytes
	}
	return out, nil
}

type listParams struct {
	Namespace string            `json:"namespace"`
	State     string            `json:"state"`
	Labels    map[string]string `json:"labels"`
}

type sandboxList struct {
	Sandboxes []sandboxInfo `json:"sandboxes"`
}

func (s *Server) sandboxList(_ context.Context, c *call, p *listParams) (any, error) {
	nss, err := c.namespaces(p.Namespace)
	if err != nil {
		return nil, err
	}
	if p.State != "" && !sandbox.ValidState(p.State) {
		return nil, errdefs.Errorf(errInvalidParams, "state %.40q: want starting, running, paused, stopping, stopped or error", p.State)
	}
	infos := s.mgr.List(sandbox.Filter{Namespaces: nss, State: sandbox.State(p.State), Labels: p.Labels})
	out := make([]sandboxInfo, len(infos))
	for i, in := range infos {
		out[i] = toInfo(in)
	}
	return sandboxList{Sandboxes: out}, nil
}

type removedResult struct {
	Removed bool `json:"removed"`
}

func (s *Server) sandboxRemove(ctx context.Context, c *call, p *sandboxRef) (any, error) {
	ns, name, err := c.resolveRef(*p)
	if err != nil {
		return nil, err
	}
	removed, err := s.mgr.Remove(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	return removedResult{Removed: removed}, nil
}

type logsParams struct {
	sandboxRef
	Tail int `json:"tail"`
}

type logLines struct {
	Lines []string `json:"lines"`
}

func (s *Server) sandboxLogs(_ context.Context, c *call, p *logsParams) (any, error) {
	ns, name, err := c.resolveRef(p.sandboxRef)
	if err != nil {
		return nil, err
	}
	lines, err := s.mgr.Logs(ns, name, p.Tail)
	if err != nil {
		return nil, err
	}
	return logLines{Lines: lines}, nil
}
