package netplumb

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Host is one server instance's plumbing. Its methods are safe for
// concurrent use.
type Host struct {
	cfg Config
	// vethPrefix starts the name of every host-side veth of this Host (7
	// characters: "w" and 6 hex of the prefix's hash); the table matches it.
	vethPrefix string
	hostNS     *os.File // the netns the Host was opened in, where threads return

	nl *netlink.Handle // one rtnetlink socket in the host's namespace

	nftMu sync.Mutex // one batch at a time on nft
	nft   *nftables.Conn

	pending sync.WaitGroup // Detach's veth deletions

	log     *nflog // the gate's refusals (Config.Refused), or nil
	logDone chan struct{}

	mu       sync.Mutex
	delErr   error           // of the deletions behind Detach, for Wait
	attached map[string]Link // id -> link, including Attaches under way
	byName   map[string]string
	slots    map[uint32]string // pool slot -> id
	next     uint32            // where the search for a free slot starts: reuse late
	nslots   uint32
}

// candidates is how many names an id may take when its hash collides.
const candidates = 4

// Open creates or refreshes this prefix's table with cfg's ports. Safe to
// call again after a restart: sandboxes that kept running are Restored.
func Open(cfg Config) (*Host, error) {
	if !cfg.Pool.IsValid() {
		cfg.Pool = DefaultPool
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	h := &Host{
		cfg:        cfg,
		vethPrefix: VethPrefixOf(cfg.Prefix),
		attached:   map[string]Link{},
		byName:     map[string]string{},
		slots:      map[uint32]string{},
		nslots:     1 << (32 - cfg.Pool.Bits() - 2),
	}
	ns, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("netplumb: %w", err)
	}
	h.hostNS = ns
	h.nl, err = netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		_ = ns.Close()
		return nil, fmt.Errorf("netplumb: rtnetlink: %w", err)
	}
	h.nft, err = nftables.New(nftables.AsLasting())
	if err != nil {
		h.nl.Close()
		_ = ns.Close()
		return nil, fmt.Errorf("netplumb: nftables: %w", err)
	}
	if err := h.checkPool(); err != nil {
		h.close()
		return nil, err
	}
	if cfg.Refused != nil {
		if h.log, err = openNflog(cfg.Prefix); err != nil {
			h.close()
			return nil, fmt.Errorf("netplumb: %w", err)
		}
		h.logDone = make(chan struct{})
		go func() {
			defer close(h.logDone)
			h.log.serve(cfg.Refused)
		}()
	}
	h.nftMu.Lock()
	defer h.nftMu.Unlock()
	if err := h.writeTable(h.nft); err != nil {
		h.close()
		return nil, fmt.Errorf("netplumb: table %s: %w", cfg.Prefix, err)
	}
	if err := h.nft.Flush(); err != nil {
		h.close()
		return nil, fmt.Errorf("netplumb: table %s: %w", cfg.Prefix, err)
	}
	return h, nil
}

func (h *Host) close() {
	if h.log != nil {
		h.log.close()
		<-h.logDone
	}
	h.nl.Close()
	_ = h.nft.CloseLasting()
	_ = h.hostNS.Close()
}

// Close waits for Detach's deletions and releases the Host's descriptors;
// the table and the veths of attached sandboxes stay.
func (h *Host) Close() error {
	err := h.Wait()
	h.close()
	return err
}

// VethPrefixOf is how the host side of every veth of the instance of
// prefix begins.
func VethPrefixOf(prefix string) string {
	sum := sha256.Sum256([]byte(prefix))
	return "w" + hex.EncodeToString(sum[:3])
}

// TableExists reports whether the nftables table of the instance of
// prefix exists (for leak checks).
func TableExists(prefix string) (bool, error) {
	ts, err := Tables(prefix)
	return slices.Contains(ts, prefix), err
}

// VethPrefix is how the host side of every veth of this Host begins.
func (h *Host) VethPrefix() string { return h.vethPrefix }

// vethName is candidate n of id's host-side interface name (15 characters,
// the most Linux allows).
func (h *Host) vethName(id string, n int) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d", id, n))
	return h.vethPrefix + hex.EncodeToString(sum[:4])
}

func (h *Host) alias(id string) string { return h.cfg.Prefix + " " + id }

// slotLink is the Link of pool slot s.
func (h *Host) slotLink(s uint32) Link {
	base := h.cfg.Pool.Addr().As4()
	v := binary.BigEndian.Uint32(base[:]) + s*4
	var gw, sb [4]byte
	binary.BigEndian.PutUint32(gw[:], v+1)
	binary.BigEndian.PutUint32(sb[:], v+2)
	return Link{Gateway: netip.AddrFrom4(gw), Addr: netip.AddrFrom4(sb)}
}

// reserve records id as attaching with a free slot and a free name.
func (h *Host) reserve(id string) (Link, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.attached[id]; ok {
		return Link{}, fmt.Errorf("netplumb: %s is already attached", id)
	}
	var l Link
	found := false
	for i := range h.nslots {
		s := (h.next + i) % h.nslots
		if _, used := h.slots[s]; !used {
			l = h.slotLink(s)
			h.slots[s] = id
			h.next = s + 1
			found = true
			break
		}
	}
	if !found {
		return Link{}, fmt.Errorf("netplumb: address pool %v is exhausted", h.cfg.Pool)
	}
	for n := range candidates {
		if name := h.vethName(id, n); h.byName[name] == "" {
			l.HostIf = name
			break
		}
	}
	if l.HostIf == "" {
		h.releaseLocked(id, l)
		return Link{}, fmt.Errorf("netplumb: no free interface name for %s", id)
	}
	h.attached[id] = l
	h.byName[l.HostIf] = id
	return l, nil
}

func (h *Host) slotOf(a netip.Addr) (uint32, bool) {
	if !a.Is4() || !h.cfg.Pool.Contains(a) {
		return 0, false
	}
	b, p := a.As4(), h.cfg.Pool.Addr().As4()
	off := binary.BigEndian.Uint32(b[:]) - binary.BigEndian.Uint32(p[:])
	if off%4 != 2 {
		return 0, false
	}
	return off / 4, true
}

func (h *Host) release(id string, l Link) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.releaseLocked(id, l)
}

func (h *Host) releaseLocked(id string, l Link) {
	if s, ok := h.slotOf(l.Addr); ok && h.slots[s] == id {
		delete(h.slots, s)
	}
	// (A Detach's address goes back to the pool only once its veth is
	// gone: two interfaces with one gateway address would clash.)
	if l.HostIf != "" && h.byName[l.HostIf] == id {
		delete(h.byName, l.HostIf)
	}
	if cur, ok := h.attached[id]; ok && cur == l {
		delete(h.attached, id)
	}
}

// Attach gives the network namespace netns a link: a veth pair whose host
// side is named from id and whose peer, eth0 in netns, gets the sandbox's
// address and a default route via the gateway; lo comes up and IPv6 is
// disabled in netns. The anti-spoof element goes in first, so the sandbox
// is never on the link without its policy.
//
// Calls for one id (Attach, Restore, Detach) must not overlap.
func (h *Host) Attach(id string, netns *os.File) (Link, error) {
	if err := validID(id); err != nil {
		return Link{}, err
	}
	l, err := h.reserve(id)
	if err != nil {
		return Link{}, err
	}
	err = h.attach(id, &l, netns)
	for n := 1; errors.Is(err, errNameTaken) && n <= candidates; n++ {
		// Another sandbox's interface (a hash collision, or a leftover not
		// yet swept) has the name: not ours to touch. Our element for the
		// name goes, then the next candidate.
		if derr := h.elements(false, l); derr != nil && !errors.Is(derr, unix.ENOENT) {
			// The element pairs our address with that interface: the
			// address stays out of the pool (until a restart's Sweep).
			h.mu.Lock()
			delete(h.attached, id)
			delete(h.byName, l.HostIf)
			h.mu.Unlock()
			return Link{}, fmt.Errorf("netplumb: attach %s: %w (%w)", id, err, derr)
		}
		if n == candidates {
			break
		}
		if h.rename(id, &l, h.vethName(id, n)) {
			err = h.attach(id, &l, netns)
		}
	}
	if errors.Is(err, errNameTaken) {
		h.release(id, l)
		return Link{}, fmt.Errorf("netplumb: attach %s: %w", id, err)
	}
	if err != nil {
		if uerr := h.undo(l); uerr != nil {
			// The name and the address stay reserved for a Detach to finish.
			return Link{}, fmt.Errorf("netplumb: attach %s: %w (undoing: %w; Detach retries)", id, err, uerr)
		}
		h.release(id, l)
		return Link{}, fmt.Errorf("netplumb: attach %s: %w", id, err)
	}
	return l, nil
}

// errNameTaken: the host already has an interface of the name Attach chose.
var errNameTaken = errors.New("the host interface's name is taken")

// rename moves id's reservation to name, if no other id of this Host has it.
func (h *Host) rename(id string, l *Link, name string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, taken := h.byName[name]; taken {
		return false
	}
	delete(h.byName, l.HostIf)
	l.HostIf = name
	h.byName[name], h.attached[id] = id, *l
	return true
}

func (h *Host) attach(id string, l *Link, netns *os.File) error {
	if err := h.elements(true, *l); err != nil {
		return err
	}
	veth := &netlink.Veth{
		// One queue each way (a veth gets one per CPU otherwise): each is
		// objects the kernel makes and announces, a third of the create.
		LinkAttrs:     netlink.LinkAttrs{Name: l.HostIf, TxQLen: -1, NumTxQueues: 1, NumRxQueues: 1},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(netns.Fd()),
	}
	if err := h.nl.LinkAdd(veth); err != nil {
		if errors.Is(err, unix.EEXIST) {
			if _, lerr := h.nl.LinkByName(l.HostIf); lerr == nil {
				return fmt.Errorf("%s: %w", l.HostIf, errNameTaken)
			}
			return fmt.Errorf("the namespace already has an eth0: %w", err)
		}
		return fmt.Errorf("create veth %s: %w", l.HostIf, err)
	}
	// The alias names the sandbox, for Sweep after a restart (the kernel
	// ignores it in the create request).
	if err := h.nl.LinkSetAlias(veth, h.alias(id)); err != nil {
		return fmt.Errorf("alias %s: %w", l.HostIf, err)
	}
	// IPv6 off before the host side comes up, so it never gets an address.
	if err := disableIPv6(l.HostIf); err != nil {
		return err
	}
	host := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: l.HostIf, Index: veth.Index}}
	if err := h.nl.AddrAdd(host, addr(l.Gateway)); err != nil {
		return fmt.Errorf("address %s: %w", l.HostIf, err)
	}
	if err := h.nl.LinkSetUp(host); err != nil {
		return fmt.Errorf("up %s: %w", l.HostIf, err)
	}
	if err := h.inNetns(netns, func() error { return sandboxSide(*l) }); err != nil {
		return err
	}
	return h.waitUp(veth.Index)
}

// waitUp waits for the kernel to finish bringing the host side up. It came
// up while its peer was down, without a carrier, and the kernel attaches its
// queue only when its link-watch work sees the carrier, asynchronously:
// until then the interface drops what it sends (the answer to a sandbox's
// first SYN, which the sandbox then resends a second later). The work has
// run when the operational state is up.
func (h *Host) waitUp(index int) error {
	deadline := time.Now().Add(2 * time.Second)
	for {
		link, err := h.nl.LinkByIndex(index)
		if err != nil {
			return fmt.Errorf("link %d: %w", index, err)
		}
		if link.Attrs().OperState == netlink.OperUp {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is still %v", link.Attrs().Name, link.Attrs().OperState)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// sandboxSide configures the namespace the calling thread is in.
func sandboxSide(l Link) error {
	for _, dev := range []string{"all", "default"} {
		if err := disableIPv6(dev); err != nil {
			return err
		}
	}
	nh, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer nh.Close()
	eth0, err := nh.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("eth0: %w", err)
	}
	if err := nh.AddrAdd(eth0, addr(l.Addr)); err != nil {
		return fmt.Errorf("eth0 address: %w", err)
	}
	if err := nh.LinkSetUp(eth0); err != nil {
		return fmt.Errorf("eth0 up: %w", err)
	}
	// lo is interface 1 in every network namespace.
	if err := nh.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: 1}}); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	gw := net.IP(l.Gateway.AsSlice())
	if err := nh.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gw}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return nil
}

func addr(a netip.Addr) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(30, 32)}}
}

// disableIPv6 writes the interface's (or "all"'s, "default"'s) sysctl in
// the calling thread's network namespace. A kernel without IPv6 has none.
func disableIPv6(dev string) error {
	err := os.WriteFile("/proc/sys/net/ipv6/conf/"+dev+"/disable_ipv6", []byte("1"), 0)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("disable IPv6 on %s: %w", dev, err)
	}
	return nil
}

// inNetns runs fn on a thread of its own moved into netns. The thread
// returns to the Host's namespace afterwards; if it cannot, it stays locked
// and dies with its goroutine, so no other code ever runs in netns.
func (h *Host) inNetns(netns *os.File, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(netns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns: %w", err)
			return
		}
		err := fn()
		if unix.Setns(int(h.hostNS.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// elements adds or deletes l's anti-spoof element.
func (h *Host) elements(add bool, l Link) error {
	h.nftMu.Lock()
	defer h.nftMu.Unlock()
	el := []nftables.SetElement{{Key: spoofKey(l.HostIf, l.Addr)}}
	var err error
	if add {
		err = h.nft.SetAddElements(h.spoof(), el)
	} else {
		err = h.nft.SetDeleteElements(h.spoof(), el)
	}
	if err == nil {
		err = h.nft.Flush()
	}
	if err != nil {
		return fmt.Errorf("nftables element %s %s: %w", l.HostIf, l.Addr, err)
	}
	return nil
}

// dropConns deletes the interface's connection-counting element, if its
// traffic made one (the kernel does not collect it by itself).
func (h *Host) dropConns(ifname string) error {
	h.nftMu.Lock()
	defer h.nftMu.Unlock()
	key := make([]byte, ifNameSize)
	copy(key, ifname)
	err := h.nft.SetDeleteElements(h.conns(), []nftables.SetElement{{Key: key}})
	if err == nil {
		err = h.nft.Flush()
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("nftables element %s: %w", ifname, err)
	}
	return nil
}

// undo removes what an Attach or a Detach may have left: the veth (its peer
// goes with it) and the element. Missing pieces are fine.
func (h *Host) undo(l Link) error {
	var errs []error
	if err := h.delLink(l.HostIf); err != nil {
		errs = append(errs, err)
	}
	if err := h.elements(false, l); err != nil && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, err)
	}
	if err := h.dropConns(l.HostIf); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// delLink deletes the named interface if it exists. (A veth goes away by
// itself when its peer's namespace dies.)
//
// On a socket of its own: the handle's socket is held for the whole request,
// and a deletion's takes long enough (RCU grace periods) to stall an Attach.
func (h *Host) delLink(name string) error {
	link, err := netlink.LinkByName(name)
	if notFound(err) {
		return nil
	}
	if err == nil {
		err = netlink.LinkDel(link)
	}
	if err != nil && !notFound(err) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

func notFound(err error) bool {
	var lnf netlink.LinkNotFoundError
	return errors.As(err, &lnf) || errors.Is(err, unix.ENODEV)
}

// Restore takes back a sandbox that kept running across a server restart:
// its address is reserved and its anti-spoof element re-added (Open
// dropped them). Its host interface must still exist.
func (h *Host) Restore(id string, l Link) error {
	if err := validID(id); err != nil {
		return err
	}
	s, ok := h.slotOf(l.Addr)
	if !ok || h.slotLink(s).Gateway != l.Gateway || !strings.HasPrefix(l.HostIf, h.vethPrefix) || len(l.HostIf) > 15 {
		return fmt.Errorf("netplumb: restore %s: link %+v is not of this pool or prefix", id, l)
	}
	link, err := h.nl.LinkByName(l.HostIf)
	if err != nil {
		return fmt.Errorf("netplumb: restore %s: %w", id, err)
	}
	if link.Attrs().Alias != h.alias(id) {
		return fmt.Errorf("netplumb: restore %s: %s belongs to %q", id, l.HostIf, link.Attrs().Alias)
	}
	h.mu.Lock()
	if other, used := h.slots[s]; used && other != id {
		h.mu.Unlock()
		return fmt.Errorf("netplumb: restore %s: %s is in use by %s", id, l.Addr, other)
	}
	h.slots[s], h.attached[id], h.byName[l.HostIf] = id, l, id
	h.mu.Unlock()
	if err := h.elements(true, l); err != nil && !errors.Is(err, unix.EEXIST) {
		h.release(id, l)
		return fmt.Errorf("netplumb: restore %s: %w", id, err)
	}
	return nil
}

// Rename gives the link attached as from to the sandbox to, for a warm
// pool: a pooled namespace is attached ahead of time and handed to a
// sandbox by a rename (one netlink call: the interface's alias). The
// interface keeps its name (derived from from), so after a restart the
// sandbox is Restored with its Link, or swept.
func (h *Host) Rename(from, to string) error {
	if err := validID(to); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	l, ok := h.attached[from]
	if !ok {
		return fmt.Errorf("netplumb: rename %s: not attached", from)
	}
	if _, taken := h.attached[to]; taken {
		return fmt.Errorf("netplumb: rename %s: %s is already attached", from, to)
	}
	if err := h.nl.LinkSetAlias(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: l.HostIf}}, h.alias(to)); err != nil {
		return fmt.Errorf("netplumb: rename %s: %w", from, err)
	}
	delete(h.attached, from)
	h.attached[to], h.byName[l.HostIf] = l, to
	if s, ok := h.slotOf(l.Addr); ok {
		h.slots[s] = to
	}
	return nil
}

// Detach deletes id's veth (and with it the peer in the sandbox), its
// element and its address. Detaching what is not attached is no error.
func (h *Host) Detach(id string) error {
	h.mu.Lock()
	l, ok := h.attached[id]
	h.mu.Unlock()
	if !ok {
		// Not known to this Host (a restart without Restore): find it by
		// its names and alias.
		for n := range candidates {
			name := h.vethName(id, n)
			h.mu.Lock()
			_, busy := h.byName[name]
			h.mu.Unlock()
			if busy {
				continue // another id's, or being deleted
			}
			link, err := h.nl.LinkByName(name)
			if err != nil || link.Attrs().Alias != h.alias(id) {
				continue
			}
			l = Link{HostIf: name}
			if addrs, err := consistent(func() ([]netlink.Addr, error) { return h.nl.AddrList(link, unix.AF_INET) }); err == nil && len(addrs) == 1 {
				gw, _ := netip.AddrFromSlice(addrs[0].IP.To4())
				l.Gateway, l.Addr = gw, gw.Next()
			}
			break
		}
		if l.HostIf == "" {
			return nil
		}
	}
	// The element first: from then on the interface's packets are dropped
	// (its name still matches the table). Deleting a veth costs the kernel
	// an RCU grace period or two (~15 ms here, 10x the rest of a sandbox's
	// network), so that runs behind Detach; the name and the address stay
	// reserved until it is done, and Wait, Close and Remove wait for it.
	if err := h.elements(false, l); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("netplumb: detach %s: %w", id, err)
	}
	h.mu.Lock()
	if cur, ok := h.attached[id]; ok && cur == l {
		delete(h.attached, id)
	}
	h.mu.Unlock()
	h.pending.Add(1)
	go func() {
		defer h.pending.Done()
		err := errors.Join(h.delLink(l.HostIf), h.dropConns(l.HostIf))
		if err != nil {
			h.mu.Lock()
			h.delErr = errors.Join(h.delErr, err)
			h.mu.Unlock()
		}
		h.release(id, l)
	}()
	return nil
}

// Wait waits for the veth deletions Detach started and reports their
// errors since the last Wait.
func (h *Host) Wait() error {
	h.pending.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	err := h.delErr
	h.delErr = nil
	return err
}

// Sweep removes this prefix's veths and elements whose sandbox keep does
// not keep: what a crash left. It returns the ids removed. Run it before
// Attaching (an Attach under way is left alone).
func (h *Host) Sweep(keep func(id string) bool) ([]string, error) {
	links, err := consistent(h.nl.LinkList)
	if err != nil {
		return nil, fmt.Errorf("netplumb: sweep: %w", err)
	}
	var removed []string
	var errs []error
	live := map[string]bool{}
	for _, link := range links {
		a := link.Attrs()
		id, ours := strings.CutPrefix(a.Alias, h.cfg.Prefix+" ")
		if !strings.HasPrefix(a.Name, h.vethPrefix) || !ours {
			continue
		}
		h.mu.Lock()
		_, attached := h.attached[id]
		h.mu.Unlock()
		if attached || keep(id) {
			live[a.Name] = true
			continue
		}
		if err := netlink.LinkDel(link); err != nil && !notFound(err) {
			errs = append(errs, fmt.Errorf("delete %s: %w", a.Name, err))
			continue
		}
		if err := h.dropConns(a.Name); err != nil {
			errs = append(errs, err)
		}
		removed = append(removed, id)
	}
	els, err := h.setElements()
	if err != nil {
		errs = append(errs, err)
	}
	for _, l := range els {
		h.mu.Lock()
		_, busy := h.byName[l.HostIf]
		h.mu.Unlock()
		if live[l.HostIf] || busy {
			continue
		}
		if err := h.elements(false, l); err != nil {
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}

// setElements lists the anti-spoof elements as Links (no gateway).
func (h *Host) setElements() ([]Link, error) {
	h.nftMu.Lock()
	defer h.nftMu.Unlock()
	els, err := h.nft.GetSetElements(h.spoof())
	if err != nil {
		return nil, fmt.Errorf("nftables elements: %w", err)
	}
	var out []Link
	for _, e := range els {
		if len(e.Key) != ifNameSize+4 {
			continue
		}
		a, _ := netip.AddrFromSlice(e.Key[ifNameSize:])
		out = append(out, Link{HostIf: strings.TrimRight(string(e.Key[:ifNameSize]), "\x00"), Addr: a})
	}
	return out, nil
}

// Remove deletes the table and every veth of this prefix, then closes the
// Host: for tests and uninstalling.
func (h *Host) Remove() error {
	var errs []error
	if err := h.Wait(); err != nil {
		errs = append(errs, err)
	}
	if _, err := h.Sweep(func(string) bool { return false }); err != nil {
		errs = append(errs, err)
	}
	h.mu.Lock()
	ls := make([]Link, 0, len(h.attached))
	for _, l := range h.attached {
		ls = append(ls, l)
	}
	h.mu.Unlock()
	for _, l := range ls {
		if err := h.delLink(l.HostIf); err != nil {
			errs = append(errs, err)
		}
	}
	h.nftMu.Lock()
	h.nft.DelTable(h.table())
	if err := h.nft.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("delete table %s: %w", h.cfg.Prefix, err))
	}
	h.nftMu.Unlock()
	h.close()
	return errors.Join(errs...)
}

// Prefix is the Host's Config.Prefix, the nftables table's name.
func (h *Host) Prefix() string { return h.cfg.Prefix }

// Pool is where this instance's sandboxes' addresses come from.
func (h *Host) Pool() netip.Prefix { return h.cfg.Pool }

// ErrPoolInUse is Open's error when an interface that is not this
// instance's holds an address of its pool.
var ErrPoolInUse = errors.New("pool in use")

// checkPool refuses a pool that addresses of the host's other interfaces
// fall in (another server instance's pool, a LAN): routes would clash.
func (h *Host) checkPool() error {
	addrs, err := consistent(func() ([]netlink.Addr, error) { return h.nl.AddrList(nil, unix.AF_INET) })
	if err != nil {
		return fmt.Errorf("netplumb: list addresses: %w", err)
	}
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.IP.To4())
		if !h.cfg.Pool.Contains(ip) {
			continue
		}
		link, err := h.nl.LinkByIndex(a.LinkIndex)
		if err == nil && strings.HasPrefix(link.Attrs().Name, h.vethPrefix) {
			continue
		}
		name := fmt.Sprint(a.LinkIndex)
		if err == nil {
			name = link.Attrs().Name
		}
		return fmt.Errorf("netplumb: pool %v holds %v of interface %s (another server's pool? give each its own): %w", h.cfg.Pool, ip, name, ErrPoolInUse)
	}
	return nil
}

// consistent retries a dump that links or addresses changing meanwhile
// interrupted (other sandboxes come and go): its results may lack some.
func consistent[T any](dump func() ([]T, error)) ([]T, error) {
	var err error
	for range 20 {
		var out []T
		if out, err = dump(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return out, err
		}
	}
	return nil, err
}
