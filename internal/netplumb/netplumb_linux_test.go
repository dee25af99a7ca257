package netplumb_test

import (
	"net"
	"os"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/netplumb"
)

// TestAttachDetach: the link exists as described, and Detach leaves nothing.
func TestAttachDetach(t *testing.T) {
	requireNet(t)
	svc := newServices(t)
	h := openHost(t, svc.config(""))
	ns := newNetns(t)
	l, err := h.Attach("sb-1", ns.f)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	if !strings.HasPrefix(l.HostIf, h.VethPrefix()) || len(l.HostIf) != 15 || l.Addr != l.Gateway.Next() {
		t.Fatalf("link %+v", l)
	}
	if _, err := h.Attach("sb-1", ns.f); err == nil {
		t.Fatal("second Attach of one id succeeded")
	}
	ns.do(func() {
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			t.Errorf("eth0: %v", err)
			return
		}
		if eth0.Attrs().Flags&net.FlagUp == 0 {
			t.Error("eth0 is down")
		}
		addrs, _ := netlink.AddrList(eth0, unix.AF_UNSPEC)
		if len(addrs) != 1 || addrs[0].IP.String() != l.Addr.String() {
			t.Errorf("eth0 addresses %v, want only %v", addrs, l.Addr)
		}
		for _, f := range []string{"all", "default", "eth0"} {
			if b, _ := os.ReadFile("/proc/sys/net/ipv6/conf/" + f + "/disable_ipv6"); strings.TrimSpace(string(b)) != "1" {
				t.Errorf("%s disable_ipv6 = %q", f, b)
			}
		}
		routes, _ := netlink.RouteList(nil, unix.AF_INET)
		var def bool
		for _, r := range routes {
			if (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.Gw.String() == l.Gateway.String() {
				def = true
			}
		}
		if !def {
			t.Errorf("no default route via %v: %v", l.Gateway, routes)
		}
	})
	if hl, err := netlink.LinkByName(l.HostIf); err != nil {
		t.Error(err)
	} else if a6, _ := netlink.AddrList(hl, unix.AF_INET6); len(a6) != 0 {
		t.Errorf("host side has IPv6 addresses %v", a6)
	}
	for _, bad := range []string{"", strings.Repeat("x", 129), "a\x00b"} {
		if _, err := h.Attach(bad, ns.f); err == nil {
			t.Errorf("Attach(%q) succeeded", bad)
		}
	}
	if els := elements(t, h.Prefix()); len(els) != 1 || els[0] != l.HostIf+" "+l.Addr.String() {
		t.Fatalf("elements %v", els)
	}
	if err := h.Detach("sb-1"); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	if els := elements(t, h.Prefix()); len(els) != 0 {
		t.Errorf("elements right after Detach: %v", els)
	}
	if err := h.Detach("sb-1"); err != nil {
		t.Fatalf("second Detach: %v", err)
	}
	if err := h.Wait(); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if v := vethsOf(t, h.VethPrefix()); len(v) != 0 {
		t.Errorf("veths after Detach: %v", v)
	}
	if els := elements(t, h.Prefix()); len(els) != 0 {
		t.Errorf("elements after Detach: %v", els)
	}
	ns.do(func() {
		if _, err := netlink.LinkByName("eth0"); err == nil {
			t.Error("eth0 still in the namespace")
		}
	})
	// The address is free again: the pool hands it out later, not at once.
	l2, err := h.Attach("sb-2", ns.f)
	if err != nil {
		t.Fatalf("Attach after Detach: %v", err)
	}
	if l2.Addr == l.Addr {
		t.Errorf("address %v reused at once", l.Addr)
	}
}

// TestNameTaken: when the host already has an interface of the name an id
// hashes to (another sandbox's), Attach leaves it alone and takes the next
// candidate.
func TestNameTaken(t *testing.T) {
	requireNet(t)
	svc := newServices(t)
	h := openHost(t, svc.config(""))
	name := netplumb.VethName(h, "col", 0)
	other := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name[:7] + "peer"}
	if err := netlink.LinkAdd(other); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = netlink.LinkDel(other) }()
	l, err := h.Attach("col", newNetns(t).f)
	if err != nil {
		t.Fatal(err)
	}
	if l.HostIf != netplumb.VethName(h, "col", 1) {
		t.Errorf("host side %s, want the second candidate", l.HostIf)
	}
	if _, err := netlink.LinkByName(name); err != nil {
		t.Errorf("the other interface is gone: %v", err)
	}
	if els := elements(t, h.Prefix()); len(els) != 1 || els[0] != l.HostIf+" "+l.Addr.String() {
		t.Errorf("elements %v", els)
	}
	if err := h.Detach("col"); err != nil {
		t.Fatal(err)
	}
	if err := h.Wait(); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(name); err != nil {
		t.Errorf("Detach removed the other interface: %v", err)
	}
}
