package gvisor_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/wire"
)

// BenchmarkCycle: create, start, exec /bin/true, remove.
func BenchmarkCycle(b *testing.B) {
	h := harness(b)
	ctx := context.Background()
	for i := range b.N {
		sb, err := h.Backend.Create(ctx, backend.Config{ID: fmt.Sprintf("bench-%d-%d", os.Getpid(), i), Image: h.Image})
		if err != nil {
			b.Fatal(err)
		}
		if err := sb.Start(ctx); err != nil {
			b.Fatal(err)
		}
		if st, err := sb.Agent().Exec(ctx, &wire.ExecRequest{Argv: []string{"/bin/true"}}, nil); err != nil || st.Code != 0 {
			b.Fatal(st, err)
		}
		if err := sb.Remove(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExec: exec /bin/true in a running sandbox, on a pooled
// connection.
func BenchmarkExec(b *testing.B) {
	sb := harness(b).Sandbox(b, backend.Config{})
	ctx := context.Background()
	for b.Loop() {
		if st, err := sb.Agent().Exec(ctx, &wire.ExecRequest{Argv: []string{"/bin/true"}}, nil); err != nil || st.Code != 0 {
			b.Fatal(st, err)
		}
	}
}

// BenchmarkAgentChannel weighs the agent channel: a health request on a
// pooled connection, and on a new one (a socket pair whose end goes to
// the agent as a descriptor) each time.
func BenchmarkAgentChannel(b *testing.B) {
	sb := harness(b).Sandbox(b, backend.Config{})
	ctx := context.Background()
	c := sb.Agent()
	for _, fresh := range []bool{false, true} {
		b.Run(map[bool]string{false: "pooled", true: "new-connection"}[fresh], func(b *testing.B) {
			for b.Loop() {
				if fresh {
					c.Close()
				}
				if _, err := c.Health(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPauseResume: pause a running sandbox (runsc pause and the
// freezer) and resume it.
func BenchmarkPauseResume(b *testing.B) {
	sb := harness(b).Sandbox(b, backend.Config{})
	p := sb.(backend.Pauser)
	ctx := context.Background()
	for b.Loop() {
		if err := p.Pause(ctx); err != nil {
			b.Fatal(err)
		}
		if err := p.Resume(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
