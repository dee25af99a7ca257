package image

import "sync"

// pullProgress turns byte counts from the transport and finished layers
// from the store into serialised Progress events.
type pullProgress struct {
	fn func(Progress)

	mu         sync.Mutex
	layers     map[string]*layerProgress // by compressed digest
	byDiffID   map[string]*layerProgress
	layersDone int
}

type layerProgress struct {
	digest      string
	done, total int64
	finished    bool
}

func newPullProgress(fn func(Progress)) *pullProgress {
	return &pullProgress{fn: fn, layers: map[string]*layerProgress{}, byDiffID: map[string]*layerProgress{}}
}

// expect registers a layer to be fetched.
func (p *pullProgress) expect(diffID, digest string, size int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := &layerProgress{digest: digest, total: size}
	p.layers[digest] = l
	p.byDiffID[diffID] = l
}

func (p *pullProgress) event(l *layerProgress) Progress {
	return Progress{Layer: l.digest, Done: l.done, Total: l.total, LayersDone: p.layersDone, LayersTotal: len(p.layers), Finished: l.finished}
}

// read counts n bytes of the blob digest.
func (p *pullProgress) read(digest string, n int) {
	if p.fn == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.layers[digest]
	if l == nil || l.finished {
		return // the config, or a layer not announced
	}
	l.done += int64(n)
	p.fn(p.event(l))
}

// finished marks the layer with diffID as stored.
func (p *pullProgress) finished(diffID string) {
	if p.fn == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.byDiffID[diffID]
	if l == nil || l.finished {
		return // was in the store already
	}
	l.finished = true
	p.layersDone++
	p.fn(p.event(l))
}
