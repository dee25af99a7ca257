package rpc

import (
	"context"
	"io"
	"runtime"
	"sync"
)

// Bulk work and the tenants who did not ask for it.
//
// Most of the server's CPU goes to bulk: decoding a body of tens of MiB,
// taking in and escaping tens of MiB of output (a control byte takes six
// in JSON), copying it. One tenant's few huge requests, each on a CPU of
// its own, took both CPUs of a 2-CPU host, and every other tenant's small
// exec waited its turn: the victims' p99 in the hostile suite went from
// ~23 ms to 200-360 ms. Go has no priorities for goroutines, so the
// server admits bulk work instead:
//
//   - Bulk is done in turns, each a bounded piece of CPU work (decoding
//     one large body, taking in one chunk of output, escaping one piece
//     of an answer) that never waits on the network or a sandbox.
//   - All tenants together run at most bulkSlots turns at once: the
//     host's CPUs less one, so one CPU is always left to small requests.
//   - A tenant (the namespace of its API key; "*" for a key for every
//     namespace) has one bulk request at a time: its others wait for it,
//     one request's big output streaming in and being written out before
//     the next one's starts. The agent client decodes a run's output
//     outside the turns, and this is what keeps one tenant's decoding to
//     one stream.
//   - Small requests (a body or an output under bulkBytes) never take a
//     turn, so they never wait behind bulk.
//
// A request waits to be its tenant's bulk request before it queues for a
// slot: a tenant's queued requests never hold a slot another tenant could
// use. A tenant's bulk request may wait on I/O (a slow client, a sandbox
// that trickles): then only that tenant's other bulk requests wait.

// bulkBytes is the size from which a body or an output is bulk.
const bulkBytes = 1 << 20

// bulkSlots is how many turns run at once: all CPUs but one.
func bulkSlots() int { return max(1, runtime.GOMAXPROCS(0)-1) }

// bulkGate hands out turns.
type bulkGate struct {
	slots chan struct{}
	mu    sync.Mutex
	by    map[string]*tenantTurn
}

// tenantTurn is a tenant's bulk request (a channel of one) and how many of
// its requests are or wait to be it; it is dropped when none do.
type tenantTurn struct {
	turn  chan struct{}
	users int
}

func newBulkGate(slots int) *bulkGate {
	return &bulkGate{slots: make(chan struct{}, slots), by: map[string]*tenantTurn{}}
}

// hold waits to be tenant's bulk request; leave lets the next one be.
// It gives up, with ctx's error, when ctx ends first (the client went
// away).
func (g *bulkGate) hold(ctx context.Context, tenant string) (leave func(), err error) {
	g.mu.Lock()
	t := g.by[tenant]
	if t == nil {
		t = &tenantTurn{turn: make(chan struct{}, 1)}
		g.by[tenant] = t
	}
	t.users++
	g.mu.Unlock()
	drop := func() {
		g.mu.Lock()
		if t.users--; t.users == 0 {
			delete(g.by, tenant)
		}
		g.mu.Unlock()
	}
	select {
	case t.turn <- struct{}{}:
		return func() { <-t.turn; drop() }, nil
	case <-ctx.Done():
		drop()
		return nil, ctx.Err()
	}
}

// slot waits for one of the slots; leave frees it.
func (g *bulkGate) slot(ctx context.Context) (leave func(), err error) {
	select {
	case g.slots <- struct{}{}:
		return func() { <-g.slots }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// waiting is how many of tenant's requests are or wait to be its bulk
// request.
func (g *bulkGate) waiting(tenant string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if t := g.by[tenant]; t != nil {
		return t.users
	}
	return 0
}

// bulk is one request's access to the gate. Its zero value takes no turns
// (answers written outside a request: WebSocket, tests). Not safe for
// concurrent use: a request does its bulk work one piece after another.
type bulk struct {
	g      *bulkGate
	ctx    context.Context
	tenant string
	// leave, while the request is its tenant's bulk request (hold),
	// ends that.
	leave *func()
}

func (s *Server) newBulk(ctx context.Context, tenant string) bulk {
	return bulk{g: s.bulk, ctx: ctx, tenant: tenant, leave: new(func())}
}

// do runs f, a piece of bulk work, in a turn: as the tenant's bulk
// request (for f only, unless the request already is it) and in a slot.
func (b bulk) do(f func() error) error {
	if b.g == nil {
		return f()
	}
	if *b.leave == nil {
		leave, err := b.g.hold(b.ctx, b.tenant)
		if err != nil {
			return err
		}
		defer leave()
	}
	leave, err := b.g.slot(b.ctx)
	if err != nil {
		return err
	}
	defer leave()
	return f()
}

// hold makes the request its tenant's bulk request until done.
func (b bulk) hold() error {
	if b.g == nil || *b.leave != nil {
		return nil
	}
	leave, err := b.g.hold(b.ctx, b.tenant)
	if err != nil {
		return err
	}
	*b.leave = leave
	return nil
}

// done ends the request's bulk work: its tenant's next bulk request may
// run.
func (b bulk) done() {
	if b.g != nil && *b.leave != nil {
		(*b.leave)()
		*b.leave = nil
	}
}

// output wraps onOutput, which takes in a run's output: once the output
// has reached bulkBytes, the request becomes its tenant's bulk request
// (until done, when its answer is written) and each further chunk is
// taken in in a turn. While it waits to be, the run's output is not read,
// and the sandbox waits.
func (b bulk) output(onOutput func(stream string, data []byte)) func(string, []byte) {
	seen := 0
	return func(stream string, data []byte) {
		seen += len(data)
		if seen < bulkBytes {
			onOutput(stream, data)
			return
		}
		err := b.hold()
		if err == nil {
			err = b.do(func() error { onOutput(stream, data); return nil })
		}
		if err != nil {
			onOutput(stream, data) // the client went away: the run ends anyway
		}
	}
}

// blocks holds bulk bytes (a body of unknown length, a run's output) in
// blocks of blockSize, so that holding tens of MiB never means moving them
// at once: a bytes.Buffer growing to 64 MiB copies 32 MiB in one go into
// fresh memory, a copy the Go scheduler cannot interrupt, which held a
// CPU for most of a second here, page fault by page fault.
type blocks struct {
	bs [][]byte
	n  int
}

const blockSize = 1 << 20

// room is the free space at the end of the last block, made when there is
// none: a new block, or the last one grown (to twice its size, up to
// blockSize: small outputs stay small).
func (b *blocks) room() []byte {
	if len(b.bs) == 0 || len(b.bs[len(b.bs)-1]) == blockSize {
		b.bs = append(b.bs, make([]byte, 0, 4<<10))
	}
	last := &b.bs[len(b.bs)-1]
	if len(*last) == cap(*last) {
		*last = append(make([]byte, 0, min(blockSize, 2*cap(*last))), *last...)
	}
	return (*last)[len(*last):cap(*last)]
}

// grew counts k bytes written into room.
func (b *blocks) grew(k int) {
	last := &b.bs[len(b.bs)-1]
	*last = (*last)[:len(*last)+k]
	b.n += k
}

// Write appends p.
func (b *blocks) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := copy(b.room(), p)
		b.grew(k)
		p = p[k:]
	}
	return n, nil
}

// ReadFrom appends what r has, a block at most per read.
func (b *blocks) ReadFrom(r io.Reader) (int64, error) {
	var total int64
	for {
		k, err := r.Read(b.room())
		b.grew(k)
		total += int64(k)
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// Len is how many bytes b holds.
func (b *blocks) Len() int { return b.n }

// Bytes is b's bytes in one slice, copied a block at a time.
func (b *blocks) Bytes() []byte {
	switch len(b.bs) {
	case 0:
		return nil
	case 1:
		return b.bs[0]
	}
	out := make([]byte, 0, b.n)
	for _, bl := range b.bs {
		out = append(out, bl...)
	}
	return out
}
