package warren

import (
	"context"
	"time"
)

// CleanupTimeout bounds the stop and remove that [Client.RunPython] and
// [Client.RunShell] do after running, whatever the state of the caller's
// context.
const CleanupTimeout = 30 * time.Second

// RunOption adjusts [Client.RunPython] and [Client.RunShell].
type RunOption func(*runConfig)

type runConfig struct {
	spec  Spec
	image string
	exec  []ExecOption
}

// RunImage sets the image of the one-shot sandbox (default: the client's,
// see [WithDefaultImage]).
func RunImage(image string) RunOption { return func(c *runConfig) { c.image = image } }

// RunSpec sets the rest of the one-shot sandbox's [Spec] (memory, env,
// labels, ...). Its Name is ignored: one-shot sandboxes get random names.
func RunSpec(spec Spec) RunOption { return func(c *runConfig) { c.spec = spec } }

// RunExecOptions passes options to the run itself (timeout, stdin, env, ...).
func RunExecOptions(opts ...ExecOption) RunOption {
	return func(c *runConfig) { c.exec = append(c.exec, opts...) }
}

// RunPython runs Python code in a new sandbox named "py-<8 hex digits>",
// as "python3 -c code", and then stops and removes the sandbox, even when
// the run fails or ctx is cancelled.
func (c *Client) RunPython(ctx context.Context, code string, opts ...RunOption) (ExecResult, error) {
	return c.runOnce(ctx, "py-", opts, func(sb *Sandbox, exec []ExecOption) (ExecResult, error) {
		return sb.Exec(ctx, "python3", []string{"-c", code}, exec...)
	})
}

// RunShell runs script with /bin/sh -c in a new sandbox named
// "sh-<8 hex digits>", and then stops and removes the sandbox, even when the
// run fails or ctx is cancelled.
func (c *Client) RunShell(ctx context.Context, script string, opts ...RunOption) (ExecResult, error) {
	return c.runOnce(ctx, "sh-", opts, func(sb *Sandbox, exec []ExecOption) (ExecResult, error) {
		return sb.Shell(ctx, script, exec...)
	})
}

func (c *Client) runOnce(ctx context.Context, prefix string, opts []RunOption, run func(*Sandbox, []ExecOption) (ExecResult, error)) (ExecResult, error) {
	var rc runConfig
	for _, o := range opts {
		if o != nil {
			o(&rc)
		}
	}
	spec := rc.spec
	spec.Name = prefix + randomHex(4)
	switch {
	case rc.image != "":
		spec.Image = rc.image
	case spec.Image == "":
		spec.Image = c.image
	}
	sb, err := c.Create(ctx, spec)
	if err != nil {
		// Whether a failed create left a sandbox depends on how it failed
		// (a start that failed on the server keeps its record, a request
		// cut short may have gone through), so the name is cleaned up
		// anyway. Except after a conflict: the name was someone else's.
		if !IsConflict(err) {
			c.cleanup(ctx, c.Sandbox(spec.Name))
		}
		return ExecResult{}, err
	}
	defer c.cleanup(ctx, sb)
	return run(sb, rc.exec)
}

// cleanup stops and removes sb with a fresh context, so that a cancelled ctx
// still lets it run. Its errors are dropped: the run's outcome matters more,
// and the server's idle timeout reclaims what is left.
func (c *Client) cleanup(ctx context.Context, sb *Sandbox) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), CleanupTimeout)
	defer cancel()
	_ = sb.Stop(ctx)
	_ = c.Remove(ctx, sb.Name)
}
