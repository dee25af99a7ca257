package native

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/cgroup"
)

// pool keeps agents spawned ahead of time: clone, namespaces, exec and the
// Go runtime's start are off the path of Start. A pooled agent has run no
// sandbox code and holds nothing of any sandbox. Each is born in a cgroup of
// its own, which Start renames to the sandbox's and sets the limits of: no
// process migration (a grace-period wait on cgroup v1) on the start path.
// With the host's plumbing (Options.Net), each also gets its network link
// when it is spawned, named by the pool's id for it (its cgroup's name),
// and Start hands the link to the sandbox with a rename: attaching (a
// veth, addresses, a route, 1.5-4 ms) is off the start path too.
type pool struct {
	ready chan *agentProc
	stop  chan struct{}
	wg    sync.WaitGroup
	dir   string
	// made and taken count the agents spawned and taken out (settled);
	// misses the takes that found none ready.
	made, taken, misses atomic.Int64
}

// poolSeq numbers pooled agents across the process's backends: their ids
// (cgroup names, which name their links too) are unique in the process,
// so backends sharing one netplumb.Host never collide.
var poolSeq atomic.Int64

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
		for {
			seq := poolSeq.Add(1)
			d := filepath.Join(dir, strconv.FormatInt(seq, 10))
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
			p.made.Add(1)
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
			p.taken.Add(1)
			if !a.proc.exited() {
				return a
			}
			a.discard()
		default:
			p.misses.Add(1)
			return nil
		}
	}
}

// settled reports whether the pool holds all it keeps (every slot ready
// and one more agent spawned, waiting for a slot): no refill under way.
func (p *pool) settled() bool {
	return p != nil && p.made.Load()-p.taken.Load() == int64(cap(p.ready))+1
}

// PoolSettled reports whether the warm pool is full and not refilling
// (false without a pool): a benchmark waits for it so that a pooled
// start's time is the start's alone, not shared with a refill's spawn.
func (b *Backend) PoolSettled() bool { return b.pool.settled() }

// PoolStats implements backend.Pooler (a zero PoolStats without a pool).
func (b *Backend) PoolStats() backend.PoolStats {
	p := b.pool
	if p == nil {
		return backend.PoolStats{}
	}
	return backend.PoolStats{Size: cap(p.ready), Ready: len(p.ready), Spawned: p.made.Load(), Taken: p.taken.Load(), Misses: p.misses.Load()}
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

// spawnPooled spawns an agent for the pool, into a new cgroup of its own,
// and attaches its link under the cgroup's name when the backend gives
// sandboxes a network. (Sandbox ids start with a letter or digit, never
// the pool's ".".)
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
	if b.opts.Net != nil {
		l, err := attachLink(b.opts.Net, cgName, a.proc.pid)
		if err != nil {
			a.discard()
			return nil, err
		}
		a.plumb, a.netID, a.link = b.opts.Net, cgName, l
	}
	return a, nil
}

// discard kills a pooled agent and removes its cgroup, its directory and
// its link (the pair goes with its namespace; Detach frees the address
// and the rules).
func (a *agentProc) discard() {
	a.kill()
	if a.cg != nil {
		_ = a.cg.Destroy()
	}
	if a.netID != "" {
		_ = a.plumb.Detach(a.netID)
		a.netID = ""
	}
	_ = os.RemoveAll(a.dir)
}

// isLivePoolID reports whether id is a pooled agent's (its cgroup's name),
// and whether the process that pooled it still runs: then its link is in
// the pool or being handed to a sandbox, never a leftover.
func isLivePoolID(id string) (pool, live bool) {
	rest, ok := strings.CutPrefix(id, poolCgroupPrefix)
	if !ok {
		return false, false
	}
	pidStr, _, _ := strings.Cut(rest, "-")
	pid, err := strconv.Atoi(pidStr)
	return true, err == nil && (pid == os.Getpid() || procStartTime(pid) != 0)
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
