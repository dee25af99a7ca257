package warren

import (
	"context"
	"encoding/json"
	"strings"
	"time"
)

// Sandbox states, as reported in [SandboxInfo].State.
const (
	StateStarting = "starting"
	StateRunning  = "running"
	StateStopping = "stopping"
	StateStopped  = "stopped"
	StateError    = "error" // SandboxInfo.Error says why
)

// Spec is what [Client.Create] asks for. Zero fields take the server's
// defaults, except MemoryMiB and CPUs, which default to 512 and 1 here.
type Spec struct {
	// Name of the sandbox: 1-63 of [A-Za-z0-9_-], starting alphanumeric.
	Name string
	// Image: "host", a stored image name, or a language alias ("python",
	// "node", "microsandbox/python", "microsandbox/node"). Empty: the
	// server's default.
	Image string
	// MemoryMiB is the memory limit (default 512).
	MemoryMiB int
	// CPUs is the CPU limit (default 1).
	CPUs float64
	// Env is the sandbox's environment, "K=V" entries.
	Env []string
	// Workdir is the default working directory of commands.
	Workdir string
	// Labels are free-form key/values for filtering, audit and billing.
	Labels map[string]string
	// IdleTimeout stops the sandbox after this long without requests;
	// 0 means the server's default. Sent in seconds.
	IdleTimeout time.Duration
	// MaxLifetime stops the sandbox this long after it started; 0 means the
	// server's default. Sent in seconds.
	MaxLifetime time.Duration
	// Workspace names a workspace to mount at /workspace. Policy-bearing:
	// the server currently accepts it only empty.
	Workspace string
	// Secrets are logical secret names the server resolves into the
	// environment. Policy-bearing: currently accepted only empty.
	Secrets []string
	// Egress is the allowlist of hostnames the sandbox may reach; empty
	// means none. Policy-bearing: currently accepted only empty (the
	// network is loopback-only).
	Egress []string
	// Volumes bind host paths, "HOST:GUEST" or "HOST:GUEST:ro".
	// Policy-bearing: refused unless the server allows host mounts
	// beneath the HOST path (warren serve --volume-root).
	Volumes []string
	// Ports publish sandbox ports on the server's host, "HOST:GUEST" or
	// "PORT" (both), at every start; refused by a server without the
	// sandbox network.
	Ports []string
	// Isolation is the sandbox's tier, [IsolationNative] or
	// [IsolationGvisor]; empty: the server's (or namespace's) default. A
	// tier the server cannot run is an error of kind unavailable, one the
	// namespace does not allow forbidden; never another tier.
	Isolation string
}

// Isolation tiers (Spec.Isolation, SandboxInfo.Isolation).
const (
	IsolationNative = "native" // namespaces and cgroups, the host's kernel
	IsolationGvisor = "gvisor" // a second kernel (gVisor)
)

type createParams struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace,omitempty"`
	Image       string            `json:"image,omitempty"`
	MemoryMiB   int               `json:"memory_mib"`
	CPUs        float64           `json:"cpus"`
	Env         []string          `json:"env,omitempty"`
	Workdir     string            `json:"workdir,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	IdleTimeout float64           `json:"idle_timeout,omitempty"`
	MaxLifetime float64           `json:"max_lifetime,omitempty"`
	Workspace   string            `json:"workspace,omitempty"`
	Secrets     []string          `json:"secrets,omitempty"`
	Egress      []string          `json:"egress,omitempty"`
	Volumes     []string          `json:"volumes,omitempty"`
	Ports       []string          `json:"ports,omitempty"`
	Isolation   string            `json:"isolation,omitempty"`
}

// SandboxInfo describes a sandbox.
type SandboxInfo struct {
	Namespace   string
	Name        string
	State       string // one of the State* constants
	Error       string // why, when State is StateError
	Image       string
	MemoryMiB   int
	CPUs        float64
	Labels      map[string]string
	CreatedAt   time.Time // zero if it has not happened
	StartedAt   time.Time // zero if it has not happened
	StoppedAt   time.Time // zero if it has not happened
	IdleTimeout time.Duration
	MaxLifetime time.Duration
	Isolation   string // the tier it got
}

type sandboxInfoWire struct {
	Namespace   string            `json:"namespace"`
	Name        string            `json:"name"`
	State       string            `json:"state"`
	Error       string            `json:"error"`
	Image       string            `json:"image"`
	MemoryMiB   int               `json:"memory_mib"`
	CPUs        float64           `json:"cpus"`
	Labels      map[string]string `json:"labels"`
	CreatedAt   *time.Time        `json:"created_at"`
	StartedAt   *time.Time        `json:"started_at"`
	StoppedAt   *time.Time        `json:"stopped_at"`
	IdleTimeout float64           `json:"idle_timeout"`
	MaxLifetime float64           `json:"max_lifetime"`
	Isolation   string            `json:"isolation"`
}

// UnmarshalJSON decodes the API's SandboxInfo (times RFC 3339, durations in
// seconds).
func (s *SandboxInfo) UnmarshalJSON(b []byte) error {
	var w sandboxInfoWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*s = SandboxInfo{
		Namespace:   w.Namespace,
		Name:        w.Name,
		State:       w.State,
		Error:       w.Error,
		Image:       w.Image,
		MemoryMiB:   w.MemoryMiB,
		CPUs:        w.CPUs,
		Labels:      w.Labels,
		CreatedAt:   deref(w.CreatedAt),
		StartedAt:   deref(w.StartedAt),
		StoppedAt:   deref(w.StoppedAt),
		IdleTimeout: dur(w.IdleTimeout),
		MaxLifetime: dur(w.MaxLifetime),
		Isolation:   w.Isolation,
	}
	return nil
}

func deref(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

// sandboxParams names one sandbox.
type sandboxParams struct {
	Sandbox   string `json:"sandbox"`
	Namespace string `json:"namespace,omitempty"`
}

// Create creates and starts a sandbox (sandbox.create) and returns its
// handle. A name already in use is an error of kind conflict ([IsConflict]).
func (c *Client) Create(ctx context.Context, spec Spec) (*Sandbox, error) {
	if spec.MemoryMiB <= 0 {
		spec.MemoryMiB = 512
	}
	if spec.CPUs <= 0 {
		spec.CPUs = 1
	}
	p := createParams{
		Name:        spec.Name,
		Namespace:   c.namespace,
		Image:       spec.Image,
		MemoryMiB:   spec.MemoryMiB,
		CPUs:        spec.CPUs,
		Env:         spec.Env,
		Workdir:     spec.Workdir,
		Labels:      spec.Labels,
		Volumes:     spec.Volumes,
		Ports:       spec.Ports,
		IdleTimeout: secs(spec.IdleTimeout),
		MaxLifetime: secs(spec.MaxLifetime),
		Workspace:   spec.Workspace,
		Secrets:     spec.Secrets,
		Egress:      spec.Egress,
		Isolation:   spec.Isolation,
	}
	var info SandboxInfo
	if err := c.Call(ctx, "sandbox.create", p, &info); err != nil {
		return nil, err
	}
	return c.Sandbox(spec.Name), nil
}

// Get returns the handle of an existing sandbox (sandbox.get); a missing
// one is an error of kind not_found ([IsNotFound]).
func (c *Client) Get(ctx context.Context, name string) (*Sandbox, error) {
	sb := c.Sandbox(name)
	if _, err := sb.Info(ctx); err != nil {
		return nil, err
	}
	return sb, nil
}

// Sandbox returns a handle to the sandbox called name without asking the
// server whether it exists.
func (c *Client) Sandbox(name string) *Sandbox {
	return &Sandbox{Name: name, c: c}
}

// ListOptions filter [Client.List].
type ListOptions struct {
	// Namespace overrides the client's namespace; "*" lists every namespace
	// the key may see.
	Namespace string
	// State keeps only sandboxes in this state (a State* constant).
	State string
	// Labels keeps only sandboxes carrying all of these labels.
	Labels map[string]string
}

// List lists sandboxes (sandbox.list).
func (c *Client) List(ctx context.Context, opts ListOptions) ([]SandboxInfo, error) {
	ns := opts.Namespace
	if ns == "" {
		ns = c.namespace
	}
	p := struct {
		Namespace string            `json:"namespace,omitempty"`
		State     string            `json:"state,omitempty"`
		Labels    map[string]string `json:"labels,omitempty"`
	}{ns, opts.State, opts.Labels}
	var res struct {
		Sandboxes []SandboxInfo `json:"sandboxes"`
	}
	if err := c.Call(ctx, "sandbox.list", p, &res); err != nil {
		return nil, err
	}
	return res.Sandboxes, nil
}

// Remove stops and deletes a sandbox and its files (sandbox.remove). Removing
// a sandbox that does not exist is not an error.
func (c *Client) Remove(ctx context.Context, name string) error {
	return c.Call(ctx, "sandbox.remove", sandboxParams{Sandbox: name, Namespace: c.namespace}, nil)
}

// Sandbox is a handle to one named sandbox. It is a name plus a client:
// cheap to create, safe for concurrent use, and valid across restarts of the
// sandbox.
type Sandbox struct {
	// Name is the sandbox's name.
	Name string
	c    *Client
}

func (s *Sandbox) params() sandboxParams {
	return sandboxParams{Sandbox: s.Name, Namespace: s.c.namespace}
}

// Info returns the sandbox's description (sandbox.get).
func (s *Sandbox) Info(ctx context.Context) (SandboxInfo, error) {
	var info SandboxInfo
	err := s.c.Call(ctx, "sandbox.get", s.params(), &info)
	return info, err
}

// Stop stops the sandbox (sandbox.stop), keeping its files; Warren's stop is
// immediate (processes are killed, not asked to exit). Stopping a stopped
// sandbox is not an error.
func (s *Sandbox) Stop(ctx context.Context) error {
	return s.c.Call(ctx, "sandbox.stop", s.params(), nil)
}

// Pause pauses the sandbox (sandbox.pause): its processes stop where they
// are, keeping their memory, and use no CPU until [Sandbox.Resume]. Calls
// that need it running fail meanwhile with KindConflict; a server whose
// backend cannot pause answers KindUnsupported.
func (s *Sandbox) Pause(ctx context.Context) error {
	return s.c.Call(ctx, "sandbox.pause", s.params(), nil)
}

// Resume lets a paused sandbox run again (sandbox.resume).
func (s *Sandbox) Resume(ctx context.Context) error {
	return s.c.Call(ctx, "sandbox.resume", s.params(), nil)
}

// Kill stops the sandbox at once. Warren's stop is already immediate, so
// Kill sends sandbox.stop, exactly like [Sandbox.Stop]; it exists for code
// written against clients that distinguish the two.
func (s *Sandbox) Kill(ctx context.Context) error {
	return s.Stop(ctx)
}

// Logs returns the sandbox's log (lifecycle events, commands and their
// outcomes), one event per line, newest last. tail > 0 keeps only the last
// tail lines; 0 returns all the server kept.
func (s *Sandbox) Logs(ctx context.Context, tail int) (string, error) {
	p := struct {
		sandboxParams
		Tail int `json:"tail,omitempty"`
	}{s.params(), tail}
	var res struct {
		Lines []string `json:"lines"`
	}
	if err := s.c.Call(ctx, "sandbox.logs", p, &res); err != nil {
		return "", err
	}
	if len(res.Lines) == 0 {
		return "", nil
	}
	return strings.Join(res.Lines, "\n") + "\n", nil
}
