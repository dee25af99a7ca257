package backend

import (
	"context"
	"errors"
	"fmt"
	"math"
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
// whole sandbox is stopped, and Exec returns ErrAgentUnresponsive with a
// result that says the command timed out (TimedOut, killed by SIGKILL). An
// OOM kill is read from the cgroup's counter: a command killed by SIGKILL
// while the counter rose.
func Exec(ctx context.Context, sb Sandbox, req *wire.ExecRequest, onOutput func(stream string, data []byte)) (ExecResult, error) {
	if req.TimeoutMs < 0 {
		// The agent would take it as no timeout at all.
		return ExecResult{}, fmt.Errorf("timeout %d ms: negative", req.TimeoutMs)
	}
	before, _ := sb.OOMKills()
	callCtx := ctx
	var hostDeadline bool
	// A timeout so long that its deadline would overflow has none on the host.
	if req.TimeoutMs > 0 && req.TimeoutMs <= (math.MaxInt64-int64(hostGrace))/int64(time.Millisecond) {
		var cancel context.CancelFunc
		callCtx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutMs)*time.Millisecond+hostGrace)
		defer cancel()
		hostDeadline = true
	}
	start := time.Now()
	st, err := sb.Agent().Exec(callCtx, req, onOutput)
	if err != nil {
		if hostDeadline && ctx.Err() == nil && errors.Is(callCtx.Err(), context.DeadlineExceeded) {
			// Stopping the sandbox kills the command with everything else.
			timedOut := ExecResult{ExitStatus: wire.ExitStatus{Code: 128 + 9, Signal: "SIGKILL", TimedOut: true}}
			stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			serr := sb.Stop(stopCtx)
			timedOut.DurationMs = float64(time.Since(start).Microseconds()) / 1000
			if serr != nil {
				return timedOut, fmt.Errorf("%w (stop: %w)", ErrAgentUnresponsive, serr)
			}
			return timedOut, ErrAgentUnresponsive
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
