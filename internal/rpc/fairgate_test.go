package rpc

import (
	"context"
	"errors"
	"runtime"
	"testing"
)

// TestBulkGate: pieces of bulk work of all tenants together take at most
// the gate's slots; a tenant's bulk request holds up that tenant's other
// bulk work only; a wait ends with its context.
func TestBulkGate(t *testing.T) {
	g := newBulkGate(1)
	ctx := t.Context()
	a := bulk{g: g, ctx: ctx, tenant: "a", leave: new(func())}
	a2 := bulk{g: g, ctx: ctx, tenant: "a", leave: new(func())}
	b := bulk{g: g, ctx: ctx, tenant: "b", leave: new(func())}

	// A holds the only slot: B's piece waits for it, and runs once it
	// is free.
	inA, freeA := make(chan struct{}), make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		aDone <- a.do(func() error { close(inA); <-freeA; return nil })
	}()
	<-inA
	bRan := make(chan struct{})
	bDone := make(chan error, 1)
	go func() { bDone <- b.do(func() error { close(bRan); return nil }) }()
	for g.waiting("b") != 1 {
		// B has entered its tenant's turn and queues for the slot.
		select {
		case <-bRan:
			t.Fatal("B's piece ran while A held the only slot")
		default:
		}
		runtime.Gosched()
	}
	select {
	case <-bRan:
		t.Fatal("B's piece ran while A held the only slot")
	default:
	}
	close(freeA)
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}

	// A's bulk request (hold) keeps A's other bulk work waiting, not B's.
	if err := a.hold(); err != nil {
		t.Fatal(err)
	}
	if err := b.do(func() error { return nil }); err != nil {
		t.Fatalf("B waited for A's bulk request: %v", err)
	}
	if err := a.do(func() error { return nil }); err != nil {
		t.Fatalf("A's bulk request waited for itself: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	a2.ctx = cctx
	a2Done := make(chan error, 1)
	go func() { a2Done <- a2.do(func() error { return nil }) }()
	for g.waiting("a") != 2 {
		runtime.Gosched()
	}
	cancel()
	if err := <-a2Done; !errors.Is(err, context.Canceled) {
		t.Fatalf("A's second request, its client gone: %v, want %v", err, context.Canceled)
	}
	a.done()
	if n := g.waiting("a") + g.waiting("b"); n != 0 {
		t.Fatalf("%d turns left", n)
	}
}
