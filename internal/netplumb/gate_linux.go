package netplumb

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/google/nftables"
)

// The gate: a new TCP connection of a sandbox to an address outside its
// open set is refused at its SYN (a reset, so connect() fails with
// ECONNREFUSED at once), before the proxy accepts it. The sets:
//
//	pins:   saddr . daddr, with timeouts: what the sandbox's resolver
//	        answered (egress.Gate.Open), until its pins expire
//	bypass: saddr: sandboxes whose rules name addresses, which need no pin;
//	        the proxy alone decides for them
//
// The gate is in the first prerouting chain, after the anti-spoof rule, so
// saddr is the sandbox's own. Exempt: TCP to port 53 (the resolver's, via
// the NAT), and to the host's own addresses (the input chain's rules).
// A refusal is logged (NFLOG, at most refusedRate per second per sandbox)
// when Config.Refused is set.
const (
	pinSet    = "pins"
	bypassSet = "bypass"
	rateSet   = "refusals"
)

// refusedRate bounds the refusals reported per sandbox per second (burst
// refusedBurst): a scan of every port costs the log a few records.
const (
	refusedRate  = 20
	refusedBurst = 50
)

func (h *Host) pins() *nftables.Set {
	return &nftables.Set{
		Table:         h.table(),
		Name:          pinSet,
		KeyType:       nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeIPAddr),
		Concatenation: true,
		HasTimeout:    true,
	}
}

func (h *Host) bypass() *nftables.Set {
	return &nftables.Set{Table: h.table(), Name: bypassSet, KeyType: nftables.TypeIPAddr}
}

func (h *Host) refusals() *nftables.Set {
	return &nftables.Set{Table: h.table(), Name: rateSet, KeyType: nftables.TypeIPAddr,
		Dynamic: true, HasTimeout: true, Timeout: time.Minute, Size: 65535}
}

// Gate is the Host's gate as egress.Gate.
type Gate struct{ h *Host }

// Gate returns the Host's gate.
func (h *Host) Gate() Gate { return Gate{h} }

func pinKey(src, dst netip.Addr) ([]byte, error) {
	if !src.Is4() || !dst.Unmap().Is4() {
		return nil, fmt.Errorf("netplumb: gate: %v → %v is not IPv4", src, dst)
	}
	s, d := src.As4(), dst.Unmap().As4()
	return append(s[:], d[:]...), nil
}

func pinKeys(src netip.Addr, dsts []netip.Addr) ([]nftables.SetElement, error) {
	els := make([]nftables.SetElement, 0, len(dsts))
	for _, d := range dsts {
		k, err := pinKey(src, d)
		if err != nil {
			return nil, err
		}
		els = append(els, nftables.SetElement{Key: k})
	}
	return els, nil
}

// maxBatch bounds the elements of one netlink batch.
const maxBatch = 256

// inBatches queues queue(chunk) for chunks of at most maxBatch elements,
// flushing each; what is a failure says what was asked.
func (h *Host) inBatches(els []nftables.SetElement, what string, queue func(chunk []nftables.SetElement) error) error {
	h.nftMu.Lock()
	defer h.nftMu.Unlock()
	for len(els) > 0 {
		n := min(len(els), maxBatch)
		err := queue(els[:n])
		if err == nil {
			err = h.nft.Flush()
		}
		if err != nil {
			return fmt.Errorf("netplumb: gate: %s %d address(es): %w", what, n, err)
		}
		els = els[n:]
	}
	return nil
}

// keysOnly is els without their timeouts.
func keysOnly(els []nftables.SetElement, timeout time.Duration) []nftables.SetElement {
	out := make([]nftables.SetElement, len(els))
	for i, e := range els {
		out[i] = nftables.SetElement{Key: e.Key, Timeout: timeout}
	}
	return out
}

// Open lets src's new connections to dsts through until the deadline (a
// deadline already passed opens nothing). An element already there gets
// the new deadline: add (a no-op if it exists), delete, add, in one batch.
func (g Gate) Open(src netip.Addr, dsts []netip.Addr, until time.Time) error {
	ttl := time.Until(until).Round(time.Millisecond)
	if ttl <= 0 || len(dsts) == 0 {
		return nil
	}
	els, err := pinKeys(src, dsts)
	if err != nil {
		return err
	}
	set := g.h.pins()
	return g.h.inBatches(keysOnly(els, ttl), "open for "+src.String(), func(c []nftables.SetElement) error {
		return errors.Join(g.h.nft.SetAddElements(set, c), g.h.nft.SetDeleteElements(set, keysOnly(c, 0)), g.h.nft.SetAddElements(set, c))
	})
}

// Close takes dsts away from src; what is not there (expired) is no error:
// adding first makes the delete succeed, and the batch removes them all.
func (g Gate) Close(src netip.Addr, dsts []netip.Addr) error {
	els, err := pinKeys(src, dsts)
	if err != nil {
		return err
	}
	set := g.h.pins()
	return g.h.inBatches(els, "close for "+src.String(), func(c []nftables.SetElement) error {
		return errors.Join(g.h.nft.SetAddElements(set, keysOnly(c, time.Second)), g.h.nft.SetDeleteElements(set, c))
	})
}

// Bypass lets every new connection of src through to the proxy (on), or
// puts them under the gate again.
func (g Gate) Bypass(src netip.Addr, on bool) error {
	if !src.Is4() {
		return fmt.Errorf("netplumb: gate: %v is not IPv4", src)
	}
	a := src.As4()
	el := []nftables.SetElement{{Key: a[:]}}
	h := g.h
	h.nftMu.Lock()
	defer h.nftMu.Unlock()
	set := h.bypass()
	var err error
	if on {
		err = h.nft.SetAddElements(set, el)
	} else {
		err = errors.Join(h.nft.SetAddElements(set, el), h.nft.SetDeleteElements(set, el))
	}
	if err == nil {
		err = h.nft.Flush()
	}
	if err != nil {
		return fmt.Errorf("netplumb: gate: bypass %v %v: %w", src, on, err)
	}
	return nil
}
