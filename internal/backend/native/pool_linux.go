package native

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/cgroup"
)

// pool keeps agents spawned ahead of time: clone, namespaces, exec and the
// Go runtime's start are off the path of Start. A pooled agent has run no
// sandbox code and holds nothing of any sandbox. Each is born in a cgroup of
// its own, which Start renames to the sandbox's and sets the limits of: no
// process migration (a grace-period wait on cgroup v1) on the start path.
type pool struct {
	ready chan *agentProc
	stop  chan struct{}
	wg    sync.WaitGroup
	dir   string
}

// startPool keeps n agents ready, under runDir/.pool.
func (b *Backend) startPool(n int) error {
	dir := filepath.Join(b.opts.RunDir, ".pool")
	// Agents pooled by a process that is gone exit on their own (their
	// config pipe reports EOF); their directories are what is left.
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	// Searchable by sandbox root: pooled agents mount their staging
	// (setup.Stage) on its stage directory, each in its own namespace.
	if err := mkdirAllMode(filepath.Join(dir, poolStageDir), 0o711); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o711); err != nil { //nolint:gosec // 0711: pooled agents, as sandbox root, must traverse the pool dir to their stage dirs
		return err
	}
	b.reapPoolCgroups()
	p := &pool{ready: make(chan *agentProc, n), stop: make(chan struct{}), dir: dir}
	b.pool = p
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		backoff := 10 * time.Millisecond
		for seq := 0; ; seq++ {
			d := filepath.Join(dir, strconv.Itoa(seq))
			a, err := b.spawnPooled(d, fmt.Sprintf("%s%d-%d", poolCgroupPrefix, os.Getpid(), seq))
			if err != nil {
				b.log.Warn("warm pool: spawn agent", "err", err.Error())
				select {
				case <-p.stop:
					return
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, 5*time.Second)
				continue
			}
			backoff = 10 * time.Millisecond
			select {
			case p.ready <- a:
			case <-p.stop:
				a.discard()
				return
			}
		}
	}()
	return nil
}

// take returns a live pooled agent, or nil when none is ready.
func (p *pool) take() *agentProc {
	if p == nil {
		return nil
	}
	for {
		select {
		case a := <-p.ready:
			if !a.proc.exited() {
				return a
			}
			a.discard()
		default:
			return nil
		}
	}
}

// close stops refilling and kills the pooled agents.
func (p *pool) close() {
	if p == nil {
		return
	}
	close(p.stop)
	p.wg.Wait()
	for {
		select {
		case a := <-p.ready:
			a.discard()
		default:
			_ = os.RemoveAll(p.dir)
			return
		}
	}
}

// poolStageDir, in the pool's directory, is where pooled agents stage.
const poolStageDir = "stage"

// poolCgroupPrefix starts the names of pooled agents' cgroups:
// .pool-<pid of the owning process>-<sequence>.
const poolCgroupPrefix = ".pool-"

// spawnPooled spawns an agent for the pool, into a new cgroup of its own.
func (b *Backend) spawnPooled(dir, cgName string) (*agentProc, error) {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	// Split like a sandbox's (its limits come at start): the agent is
	// born in its own leaf.
	cg, err := b.cgroups.Create(cgName, cgroup.Limits{AgentPids: backend.AgentPids})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	// Idle class while it waits: the agent's start and staging then
	// take no CPU from running sandboxes or the server. Without cpu.idle
	// it competes like any process.
	idle := cg.SetIdle(true) == nil
	a, err := b.spawnAgent(dir, cg, filepath.Join(filepath.Dir(dir), poolStageDir))
	if err != nil {
		_ = cg.Destroy()
		_ = os.RemoveAll(dir)
		return nil, err
	}
	a.cg, a.idle = cg, idle
	return a, nil
}

// discard kills a pooled agent and removes its cgroup and directory.
func (a *agentProc) discard() {
	a.kill()
	if a.cg != nil {
		_ = a.cg.Destroy()
	}
	_ = os.RemoveAll(a.dir)
}

// reapPoolCgroups removes pool cgroups of processes that are gone.
func (b *Backend) reapPoolCgroups() {
	names, _ := b.cgroups.List()
	for _, n := range names {
		rest, ok := strings.CutPrefix(n, poolCgroupPrefix)
		if !ok {
			continue
		}
		pidStr, _, _ := strings.Cut(rest, "-")
		if pid, err := strconv.Atoi(pidStr); err == nil && pid != os.Getpid() && procStartTime(pid) != 0 {
			continue // another live process's pool
		}
		// Whole or in only some hierarchies (its owner killed mid-create
		// or mid-rename).
		_ = b.cgroups.Destroy(n)
	}
}
