package resolver

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

var (
	errBusy     = errors.New("too many upstream queries in flight")
	errMismatch = errors.New("not the answer to the query")
)

// maxUpstreamRecords bounds the answer records of an upstream answer that
// are looked at.
const maxUpstreamRecords = 64

// flight is one upstream resolution that queries for the same name, from
// any sandbox, wait for instead of asking again.
type flight struct {
	done chan struct{}
	a    *answer
	err  error
}

// lookup returns name's answer from the cache, or from the upstreams,
// once for all the queries that miss the cache at the same time.
func (s *Server) lookup(ctx context.Context, name string, now time.Time) (*answer, error) {
	if a := s.cache.get(name, now); a != nil {
		s.n.cacheHits.Add(1)
		return a, nil
	}
	s.n.cacheMisses.Add(1)
	s.flightMu.Lock()
	if f := s.flights[name]; f != nil {
		s.flightMu.Unlock()
		select {
		case <-f.done:
			return f.a, f.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f := &flight{done: make(chan struct{})}
	s.flights[name] = f // at most one per query in flight: bounded by MaxInFlight
	s.flightMu.Unlock()

	f.a, f.err = s.resolve(ctx, name)
	if f.err == nil {
		s.cache.put(name, f.a, now)
	}
	s.flightMu.Lock()
	delete(s.flights, name)
	s.flightMu.Unlock()
	close(f.done)
	return f.a, f.err
}

// resolve asks the upstreams, in turn, for name's A records.
func (s *Server) resolve(ctx context.Context, name string) (*answer, error) {
	select {
	case s.upstream <- struct{}{}:
	default:
		return nil, errBusy
	}
	defer func() { <-s.upstream }()

	var idb [2]byte
	_, _ = rand.Read(idb[:]) // never fails (crypto/rand panics instead)
	id := binary.BigEndian.Uint16(idb[:])
	q, err := upstreamQuery(id, name)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, u := range s.upstreams {
		a, err := s.exchange(ctx, u, q, id, name)
		if err == nil {
			return a, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", u, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

func upstreamQuery(id uint16, name string) ([]byte, error) {
	n, err := dnsmessage.NewName(name + ".")
	if err != nil {
		return nil, err
	}
	b := dnsmessage.NewBuilder(make([]byte, 0, 300), dnsmessage.Header{ID: id, RecursionDesired: true})
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(dnsmessage.Question{Name: n, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}); err != nil {
		return nil, err
	}
	if err := addEDNS(&b); err != nil {
		return nil, err
	}
	return b.Finish()
}

// exchange asks one upstream over UDP, and over TCP when the UDP answer
// was truncated, within UpstreamTimeout.
func (s *Server) exchange(ctx context.Context, u netip.AddrPort, q []byte, id uint16, name string) (*answer, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.UpstreamTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp", u.String())
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.Close() }()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := c.Write(q); err != nil {
		return nil, err
	}
	buf := make([]byte, 4096)
	for {
		// A connected socket only takes datagrams from the upstream; the
		// ID and the question weed out stale or forged ones.
		n, err := c.Read(buf)
		if err != nil {
			return nil, err
		}
		a, tc, err := s.parseAnswer(buf[:n], id, name)
		if errors.Is(err, errMismatch) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if !tc {
			return a, nil
		}
		return s.exchangeTCP(ctx, u, q, id, name)
	}
}

func (s *Server) exchangeTCP(ctx context.Context, u netip.AddrPort, q []byte, id uint16, name string) (*answer, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", u.String())
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.Close() }()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	m := make([]byte, 2+len(q))
	binary.BigEndian.PutUint16(m, uint16(len(q))) //nolint:gosec // G115: a query for one name is under 300 bytes
	copy(m[2:], q)
	if _, err := c.Write(m); err != nil {
		return nil, err
	}
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		return nil, err
	}
	buf := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(c, buf); err != nil {
		return nil, err
	}
	a, tc, err := s.parseAnswer(buf, id, name)
	if err == nil && tc {
		err = errors.New("truncated answer over TCP")
	}
	return a, err
}

// parseAnswer reads an upstream's answer to the A query for name: the
// addresses at the end of its CNAME chain, or NXDOMAIN; tc when it was
// truncated. errMismatch: the message does not answer the query.
func (s *Server) parseAnswer(msg []byte, id uint16, name string) (a *answer, tc bool, err error) {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil || h.ID != id || !h.Response {
		return nil, false, errMismatch
	}
	q, err := p.Question()
	if err != nil || q.Type != dnsmessage.TypeA || q.Class != dnsmessage.ClassINET || lowerName(q.Name) != name+"." {
		return nil, false, errMismatch
	}
	if h.Truncated {
		return nil, true, nil
	}
	now := s.cfg.Now()
	switch h.RCode {
	case dnsmessage.RCodeSuccess:
	case dnsmessage.RCodeNameError:
		return &answer{nx: true, expires: now.Add(MinTTL)}, false, nil
	default:
		return nil, false, fmt.Errorf("answer %s", h.RCode)
	}
	if err := p.SkipAllQuestions(); err != nil {
		return nil, false, err
	}
	type cname struct {
		target string
		ttl    uint32
	}
	cnames := make(map[string]cname)
	type addr struct {
		a   netip.Addr
		ttl uint32
	}
	addrs := make(map[string][]addr)
	for i := 0; ; i++ {
		rh, err := p.AnswerHeader()
		if errors.Is(err, dnsmessage.ErrSectionDone) || i == maxUpstreamRecords {
			break
		}
		if err != nil {
			return nil, false, err
		}
		owner := lowerName(rh.Name)
		switch {
		case rh.Class != dnsmessage.ClassINET:
			err = p.SkipAnswer()
		case rh.Type == dnsmessage.TypeCNAME:
			var r dnsmessage.CNAMEResource
			if r, err = p.CNAMEResource(); err == nil {
				cnames[owner] = cname{lowerName(r.CNAME), rh.TTL}
			}
		case rh.Type == dnsmessage.TypeA:
			var r dnsmessage.AResource
			if r, err = p.AResource(); err == nil {
				addrs[owner] = append(addrs[owner], addr{netip.AddrFrom4(r.A), rh.TTL})
			}
		default:
			err = p.SkipAnswer()
		}
		if err != nil {
			return nil, false, err
		}
	}
	// Follow the chain from the queried name; its smallest TTL is the
	// answer's, so nothing is handed out for longer than upstream said.
	at, ttl := name+".", uint32(MaxTTL/time.Second)
	for range maxChain {
		c, ok := cnames[at]
		if !ok {
			break
		}
		at, ttl = c.target, min(ttl, c.ttl)
	}
	if _, ok := cnames[at]; ok {
		return nil, false, fmt.Errorf("CNAME chain longer than %d", maxChain)
	}
	out := &answer{}
	seen := make(map[netip.Addr]bool)
	for _, r := range addrs[at] {
		if !seen[r.a] {
			seen[r.a] = true
			out.addrs = append(out.addrs, r.a)
			ttl = min(ttl, r.ttl)
		}
	}
	if len(out.addrs) == 0 {
		ttl = 0 // no address: asked again soon
	}
	out.expires = now.Add(clampTTL(time.Duration(ttl) * time.Second))
	return out, false, nil
}

// lowerName is a name's text, ASCII-lowercased.
func lowerName(n dnsmessage.Name) string {
	b := []byte(n.Data[:n.Length])
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// readResolvConf returns the nameservers of a resolv.conf file, on port 53.
func readResolvConf(path string) ([]netip.AddrPort, error) {
	f, err := os.Open(path) //nolint:gosec // the host's resolver configuration, chosen by the operator
	if err != nil {
		return nil, fmt.Errorf("resolver: upstreams: %w", err)
	}
	defer func() { _ = f.Close() }()
	var out []netip.AddrPort
	sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 2 || fs[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(fs[1])
		if err != nil {
			continue
		}
		out = append(out, netip.AddrPortFrom(a.Unmap(), 53))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("resolver: read %s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("resolver: no nameserver in %s", path)
	}
	return out, nil
}
