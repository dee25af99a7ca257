package netplumb

import (
	"fmt"
	"os"
	"runtime"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Feature is one kernel feature the plumbing needs, and why it is not
// usable (nil: it is).
type Feature struct {
	Name string
	Err  error
}

// Probe tries, for real and leaving nothing behind, what Open and Attach
// use: a network namespace with a veth, an nftables table, and the table's
// REDIRECT, conntrack and reject expressions (each alone, so that a missing
// one is named).
func Probe() []Feature {
	base := probeNFT(nil)
	fs := []Feature{
		{"netns + veth", probeVeth()},
		{"nftables (a table)", base},
	}
	for _, p := range []struct {
		name string
		nat  bool
		e    []expr.Any
	}{
		{"nftables REDIRECT", true, redirect(1)},
		{"nftables conntrack (ct state, ct status)", false, append(ctState(expr.CtStateBitESTABLISHED), ctStatus(ipsDstNAT)...)},
		{"nftables connlimit (per-sandbox flow bound)", false, []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
			&expr.Dynset{SrcRegKey: reg1, SetName: "probe", Operation: unix.NFT_DYNSET_OP_ADD,
				Exprs: []expr.Any{&expr.Connlimit{Count: 1, Flags: expr.NFT_CONNLIMIT_F_INV}}},
		}},
		{"nftables reject", false, []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}}},
	} {
		err := base
		if err == nil {
			err = probeNFT(func(c *nftables.Conn, t *nftables.Table) {
				ch := &nftables.Chain{Name: "probe", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityFilter}
				if p.nat {
					ch.Type, ch.Priority = nftables.ChainTypeNAT, nftables.ChainPriorityNATDest
				}
				set := &nftables.Set{Table: t, Name: "probe", KeyType: nftables.TypeIFName, Dynamic: true, Size: 16}
				if err := c.AddSet(set, nil); err != nil {
					return
				}
				rule(c, c.AddChain(ch), l4(unix.IPPROTO_TCP), p.e)
			})
		}
		fs = append(fs, Feature{p.name, err})
	}
	return fs
}

// probeNFT creates a table (with what fill adds) and deletes it.
func probeNFT(fill func(*nftables.Conn, *nftables.Table)) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: fmt.Sprintf("warren-probe-%d", os.Getpid())}
	c.AddTable(t)
	if fill != nil {
		fill(c, t)
	}
	if err := c.Flush(); err != nil {
		return err
	}
	c.DelTable(t)
	return c.Flush()
}

// probeVeth makes a veth pair in a new network namespace, on a thread that
// then dies with the namespace and the pair.
func probeVeth() error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("new network namespace: %w", err)
			return
		}
		err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "probe0"}, PeerName: "probe1"})
		if err != nil {
			err = fmt.Errorf("veth: %w", err)
		}
		errc <- err
	}()
	return <-errc
}
