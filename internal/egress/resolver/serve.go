package resolver

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// ServeUDP answers the queries arriving on pc until pc fails or the server
// is closed (then it returns nil). Each query is answered on its own
// goroutine, at most MaxInFlight at once.
func (s *Server) ServeUDP(pc net.PacketConn) error {
	if !s.track(pc) {
		return net.ErrClosed
	}
	defer s.untrack(pc)
	buf := make([]byte, 2048)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if s.isClosed() {
				return nil
			}
			return err
		}
		src := addrOf(from)
		sb := s.cfg.Lookup(src)
		if sb == nil {
			s.n.unknown.Add(1)
			continue
		}
		s.n.queries.Add(1)
		if !s.limits.admit(src, sb, s.cfg.Now()) {
			s.n.rateLimited.Add(1)
			if out := refusal(buf[:n]); out != nil {
				_, _ = pc.WriteTo(out, from)
			}
			continue
		}
		select {
		case s.inflight <- struct{}{}:
		default:
			s.n.overload.Add(1)
			s.limits.release(src)
			continue
		}
		msg := append([]byte(nil), buf[:n]...)
		ok := s.spawn(func() {
			out := s.handle(s.ctx, sb, msg)
			// Released before the answer leaves: a client that asks again
			// once answered finds its slot free.
			<-s.inflight
			s.limits.release(src)
			if out != nil {
				_, _ = pc.WriteTo(out, from)
			}
		})
		if !ok {
			<-s.inflight
			s.limits.release(src)
			return nil
		}
	}
}

// ServeTCP answers queries on the connections ln accepts until ln fails
// or the server is closed (then it returns nil): at most TCPQueries
// queries per connection, each within TCPIdle.
func (s *Server) ServeTCP(ln net.Listener) error {
	if !s.track(ln) {
		return net.ErrClosed
	}
	defer s.untrack(ln)
	for {
		c, err := ln.Accept()
		if err != nil {
			if s.isClosed() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Out of descriptors and the like: wait, as net/http does.
			time.Sleep(50 * time.Millisecond)
			continue
		}
		src := addrOf(c.RemoteAddr())
		sb := s.cfg.Lookup(src)
		if sb == nil {
			s.n.unknown.Add(1)
			_ = c.Close()
			continue
		}
		select {
		case s.tcpConns <- struct{}{}:
		default:
			s.n.overload.Add(1)
			_ = c.Close()
			continue
		}
		if !s.limits.tcpOpen(src, s.cfg.Now()) {
			<-s.tcpConns
			s.n.rateLimited.Add(1)
			_ = c.Close()
			continue
		}
		ok := s.spawn(func() {
			defer func() { <-s.tcpConns; s.limits.tcpClose(src) }()
			s.serveConn(c, src, sb)
		})
		if !ok {
			_ = c.Close()
			return nil
		}
	}
}

// serveConn answers the length-prefixed queries of one TCP connection, in
// turn, then closes it.
func (s *Server) serveConn(c net.Conn, src netip.Addr, sb Sandbox) {
	defer func() { _ = c.Close() }()
	if !s.track(c) {
		return
	}
	defer s.untrack(c)
	buf := make([]byte, 2+MaxQuery)
	for range s.cfg.TCPQueries {
		_ = c.SetDeadline(s.cfg.Now().Add(s.cfg.TCPIdle))
		if _, err := io.ReadFull(c, buf[:2]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(buf[:2]))
		if n > MaxQuery {
			s.n.malformed.Add(1)
			return
		}
		if _, err := io.ReadFull(c, buf[2:2+n]); err != nil {
			return
		}
		s.n.queries.Add(1)
		var out []byte
		if s.limits.admit(src, sb, s.cfg.Now()) {
			out = s.handle(s.ctx, sb, buf[2:2+n])
			s.limits.release(src)
		} else {
			s.n.rateLimited.Add(1)
			out = refusal(buf[2 : 2+n])
		}
		if out == nil {
			return
		}
		m := make([]byte, 2+len(out))
		binary.BigEndian.PutUint16(m, uint16(len(out))) //nolint:gosec // G115: answers are at most 512 bytes
		copy(m[2:], out)
		if _, err := c.Write(m); err != nil {
			return
		}
	}
}

// refusal is the REFUSED answer to a query over its sandbox's limits:
// cheap, no log record of its own (the limiter counts them).
func refusal(msg []byte) []byte {
	if len(msg) > MaxQuery {
		return nil
	}
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil || h.Response {
		return nil
	}
	var qp *dnsmessage.Question
	if q, err := p.Question(); err == nil {
		qp = &q
	}
	return reply(h, qp, dnsmessage.RCodeRefused, false, nil, 0)
}

// spawn runs f on a goroutine Close waits for; false once closed.
func (s *Server) spawn(f func()) bool {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return false
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		f()
	}()
	return true
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}
