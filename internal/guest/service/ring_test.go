//go:build linux

package service

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// TestHoldingRingLosesNothing: a holding ring takes no more once keep
// bytes are unread (its writer waits), gives a slow reader every byte in
// order with nothing dropped, and releases a waiting writer when closed.
func TestHoldingRingLosesNothing(t *testing.T) {
	const keep, total = 64 << 10, 1 << 20
	r := newRing(keep, true)
	want := make([]byte, total)
	for i := range want {
		want[i] = byte(i % 251)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for off := 0; off < total; off += 4096 {
			_, _ = r.Write(want[off : off+4096])
		}
		r.close()
	}()
	// Unread stays under keep plus one write while the reader stalls.
	time.Sleep(50 * time.Millisecond)
	r.mu.Lock()
	unread := r.start + int64(len(r.buf)) - r.acked
	r.mu.Unlock()
	if unread > keep+4096 || unread < keep {
		t.Fatalf("with the reader stalled, %d bytes unread; want the writer held at %d", unread, keep)
	}
	var got []byte
	var off int64
	for {
		ch := r.read(context.Background(), off, 8192, time.Second)
		if ch.Dropped != 0 {
			t.Fatalf("dropped %d at %d", ch.Dropped, off)
		}
		got = append(got, ch.Data...)
		off = ch.NextOffset
		if ch.EOF {
			break
		}
	}
	<-done
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, not what was written (%d)", len(got), total)
	}

	// A writer waiting on a full ring is let go by close.
	r2 := newRing(keep, true)
	_, _ = r2.Write(make([]byte, keep))
	blocked := make(chan struct{})
	go func() { _, _ = r2.Write([]byte("x")); close(blocked) }()
	select {
	case <-blocked:
		t.Fatal("a write to a full holding ring did not wait")
	case <-time.After(20 * time.Millisecond):
	}
	r2.close()
	<-blocked
}
