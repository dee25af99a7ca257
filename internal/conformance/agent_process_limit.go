// The ProcessLimit and ProcessLateOutput groups: the agent's table holds at
// most wire.MaxProcesses background processes, started one after another or
// all at once; and a descendant that writes after its process exited and
// was reported does not hurt the agent.

package conformance

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/agent"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/wire"
)

func (h *Harness) agentProcessLimit(t *testing.T) {
	t.Run("Sequential", func(t *testing.T) {
		s := h.newAgentSuite(t, backend.Config{})
		var ids []string
		for i := range wire.MaxProcesses {
			info, err := s.c.StartProcess(ctxFor(t, 30*time.Second), &wire.ExecRequest{Argv: []string{"sleep", "1000"}})
			if err != nil {
				t.Fatalf("start %d of %d: %s", i+1, wire.MaxProcesses, errInfo(err))
			}
			ids = append(ids, info.ID)
		}
		_, err := s.c.StartProcess(ctxFor(t, 30*time.Second), &wire.ExecRequest{Argv: []string{"sleep", "1000"}})
		wantKind(t, err, wire.ErrLimit, fmt.Sprintf("start number %d", wire.MaxProcesses+1))
		list, err := s.c.Processes(ctxFor(t, 10*time.Second))
		if err != nil || len(list) != wire.MaxProcesses {
			t.Errorf("list has %d processes (%s); want %d", len(list), errInfo(err), wire.MaxProcesses)
		}
		// Removing one makes room.
		s.remove(t, ids[0])
		info, err := s.c.StartProcess(ctxFor(t, 30*time.Second), &wire.ExecRequest{Argv: []string{"sleep", "1000"}})
		if err != nil {
			t.Fatalf("start after a remove: %s", errInfo(err))
		}
		ids = append(ids[1:], info.ID)
		// A full table of which one process has exited evicts that one.
		if err := s.c.Signal(ctxFor(t, 10*time.Second), ids[5], "KILL"); err != nil {
			t.Fatal(errInfo(err))
		}
		s.waitExit(t, ids[5])
		if _, err := s.c.StartProcess(ctxFor(t, 30*time.Second), &wire.ExecRequest{Argv: []string{"sleep", "1000"}}); err != nil {
			t.Fatalf("start with an exited process in a full table: %s", errInfo(err))
		}
		_, err = s.c.Process(ctxFor(t, 10*time.Second), ids[5])
		wantKind(t, err, wire.ErrNotFound, "get of the evicted exited process")
		for _, id := range ids {
			s.remove(t, id)
		}
		t.Run("StillHealthy", s.healthy)
	})
	t.Run("Concurrent", func(t *testing.T) {
		// The limit must hold when starts race each other.
		s := h.newAgentSuite(t, backend.Config{})
		const attempts = wire.MaxProcesses + 64
		var mu sync.Mutex
		ok, limited := 0, 0
		var other []string
		work := make(chan int)
		var wg sync.WaitGroup
		for range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range work {
					_, err := s.c.StartProcess(context.Background(), &wire.ExecRequest{Argv: []string{"sleep", "1000"}})
					mu.Lock()
					switch {
					case err == nil:
						ok++
					case agent.IsKind(err, wire.ErrLimit):
						limited++
					default:
						other = append(other, errInfo(err))
					}
					mu.Unlock()
				}
			}()
		}
		for i := range attempts {
			work <- i
		}
		close(work)
		wg.Wait()
		list, err := s.c.Processes(ctxFor(t, 10*time.Second))
		if err != nil {
			t.Fatal(errInfo(err))
		}
		if ok > wire.MaxProcesses || len(list) > wire.MaxProcesses || len(other) > 0 {
			t.Errorf("%d concurrent starts: %d succeeded, %d hit the limit, list holds %d, other errors %q; want at most %d running",
				attempts, ok, limited, len(list), other, wire.MaxProcesses)
		}
		t.Run("StillHealthy", s.healthy)
	})
}

// agentLateOutput runs a background process whose descendant writes after
// the process itself has exited and been reported.
func (h *Harness) agentLateOutput(t *testing.T) {
	s := h.newAgentSuite(t, backend.Config{})
	info := s.start(t, &wire.ExecRequest{Argv: []string{"/bin/sh", "-c", "(sleep 0.6; echo late; sleep 0.3; echo later) & echo early"}})
	ex := s.waitExit(t, info.ID)
	if ex.Exit.Code != 0 {
		t.Errorf("exit %+v", ex.Exit)
	}
	time.Sleep(1500 * time.Millisecond)
	s.healthy(t)
	if t.Failed() {
		t.Fatal("the agent died when a descendant of an exited background process wrote to the output pipe")
	}
	ch, err := s.c.Output(ctxFor(t, 10*time.Second), info.ID, wire.Stdout, 0, 0)
	if err != nil || !strings.HasPrefix(string(ch.Data), "early\n") {
		t.Errorf("output %+v (%q) %s", ch, ch.Data, errInfo(err))
	}
}
