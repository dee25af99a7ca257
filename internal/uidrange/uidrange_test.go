package uidrange

import (
	"errors"
	"os"
	"os/exec"
	"testing"
)

func TestTakeIsUniqueAndFreedByClose(t *testing.T) {
	a, err := New(t.TempDir(), 0x60000000, 3)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint32]bool{}
	var rs []*Range
	for range 3 {
		r, err := a.Take()
		if err != nil {
			t.Fatal(err)
		}
		if seen[r.Host] || r.Host < a.Base()+Size || r.Host != a.Base()+uint32(r.Index)*Size {
			t.Fatalf("range %d at %d: taken twice or in the storage range", r.Index, r.Host)
		}
		seen[r.Host] = true
		rs = append(rs, r)
	}
	if _, err := a.Take(); !errors.Is(err, ErrExhausted) {
		t.Fatalf("a fourth of three ranges: %v", err)
	}
	if err := rs[1].Close(); err != nil {
		t.Fatal(err)
	}
	if inUse, _ := a.InUse(rs[1].Index); inUse {
		t.Error("a closed range is still in use")
	}
	r, err := a.Take()
	if err != nil || r.Index != rs[1].Index {
		t.Fatalf("after a close: %v, %v", r, err)
	}
}

// TestAnotherProcessHoldsTheRange: a range whose descriptor another process
// inherited stays taken after the taker lets go, and is free once that
// process exits: how an agent keeps its sandbox's range through a crash of
// the server.
func TestAnotherProcessHoldsTheRange(t *testing.T) {
	a, err := New(t.TempDir(), 0x60000000, 2)
	if err != nil {
		t.Fatal(err)
	}
	r, err := a.Take()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "60")
	cmd.ExtraFiles = []*os.File{r.Lock()}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = r.Close()
	if inUse, err := a.InUse(r.Index); !inUse || err != nil {
		t.Fatalf("held by a child: in use %v, %v", inUse, err)
	}
	other, err := New(a.dir, a.base, 2) // another server on the host
	if err != nil {
		t.Fatal(err)
	}
	r2, err := other.Take()
	if err != nil || r2.Index == r.Index {
		t.Fatalf("another allocator took %v, %v", r2, err)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if inUse, _ := a.InUse(r.Index); inUse {
		t.Error("still in use after its holder exited")
	}
}

func TestNewRefusesRangesPast32Bits(t *testing.T) {
	if _, err := New(t.TempDir(), 0xF0000000, 4096); err == nil {
		t.Error("4096 ranges above 0xF0000000: no error")
	}
	if _, err := New(t.TempDir(), 0x60000000, -1); err == nil {
		t.Error("a negative count: no error")
	}
}
