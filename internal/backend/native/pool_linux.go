package native

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// pool keeps agents spawned ahead of time: clone, namespaces, exec and the
// Go runtime's start are off the path of Start. A pooled agent has run no
// sandbox code and holds nothing of any sandbox; Start moves it into the
// sandbox's cgroup before sending it its config.
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
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	p := &pool{ready: make(chan *agentProc, n), stop: make(chan struct{}), dir: dir}
	b.pool = p
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		backoff := 10 * time.Millisecond
		for seq := 0; ; seq++ {
			d := filepath.Join(dir, fmt.Sprint(seq))
			var a *agentProc
			err := os.Mkdir(d, 0o700)
			if err == nil {
				a, err = b.spawnAgent(d, nil)
			}
			if err != nil {
				os.RemoveAll(d)
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
				a.kill()
				os.RemoveAll(d)
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
			if a.alive() {
				return a
			}
			a.closePipes()
			os.RemoveAll(a.dir)
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
			a.kill()
		default:
			os.RemoveAll(p.dir)
			return
		}
	}
}
