package backend

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/warren-sandbox/warren/internal/wire"
)

// ExecResult is how a command ended, as the host saw it.
type ExecResult struct {
	wire.ExitStatus
	// OOMKilled is set when the sandbox's memory limit killed a process
	// while the command ran (measured on the host, in the cgroup).
	OOMKilled bool
}

// hostGrace is how long past a command's own timeout the host waits for the
// agent before it stops trusting it.
const hostGrace = 2 * time.Second

// ErrAgentUnresponsive means the agent missed the host's deadline; the
// sandbox was stopped because the host can no longer trust it.
var ErrAgentUnresponsive = errors.New("the sandbox's agent did not answer in time; the sandbox was stopped")

// Exec runs req in sb through its agent, enforcing the timeout on the host
// too: if the agent has not answered by the timeout plus a grace period, the
// whole sandbox is stopped. An OOM kill is read from the cgroup's counter:
// a command killed by SIGKILL while the counter rose.
func Exec(ctx context.Context, sb Sandbox, req *wire.ExecRequest, onOutput func(stream string, data []byte)) (ExecResult, error) {
	before, _ := sb.OOMKills()
	callCtx := ctx
	var hostDeadline bool
	if req.TimeoutMs > 0 {
		var cancel context.CancelFunc
		callCtx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutMs)*time.Millisecond+hostGrace)
		defer cancel()
		hostDeadline = true
	}
	st, err := sb.Agent().Exec(callCtx, req, onOutput)
	if err != nil {
		if hostDeadline && ctx.Err() == nil && errors.Is(callCtx.Err(), context.DeadlineExceeded) {
			stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if serr := sb.Stop(stopCtx); serr != nil {
				return ExecResult{}, fmt.Errorf("%w (stop: %w)", ErrAgentUnresponsive, serr)
			}
			return ExecResult{}, ErrAgentUnresponsive
		}
		select {
		case <-sb.Done():
			return ExecResult{}, fmt.Errorf("sandbox %s stopped while the command ran: %w", sb.ID(), err)
		default:
		}
		return ExecResult{}, err
	}
	res := ExecResult{ExitStatus: st}
	// The OOM killer sends SIGKILL; only then is the counter worth reading.
	if st.Signal == "SIGKILL" {
		if after, err := sb.OOMKills(); err == nil && after > before {
			res.OOMKilled = true
		}
	}
	return res, nil
}
