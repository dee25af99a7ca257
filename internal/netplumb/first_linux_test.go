package netplumb_test

import (
	"fmt"
	"testing"
	"time"
)

// TestFirstConnection: a sandbox's first connection right after Attach goes
// through at once. (The host side's queue is attached asynchronously; a
// first SYN answered into a queue not yet there is resent after a second.)
func TestFirstConnection(t *testing.T) {
	requireNet(t)
	svc := newServices(t)
	h := openHost(t, svc.config(""))
	go func() {
		for {
			c, err := svc.proxy.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	for i := range 20 {
		ns := newNetns(t)
		l, err := h.Attach(fmt.Sprint("f", i), ns.f)
		if err != nil {
			t.Fatal(err)
		}
		openAll(t, h, l)
		t0 := time.Now()
		ns.do(func() {
			c, err := dialTCP("203.0.113.1:80")
			if err != nil {
				t.Error(err)
				return
			}
			_ = c.Close()
		})
		if d := time.Since(t0); d > 500*time.Millisecond {
			t.Errorf("sandbox %d: first connection took %v", i, d)
		}
	}
}
