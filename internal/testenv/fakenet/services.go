package fakenet

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/ipv4"
)

// conns tracks the open connections of the hand-written TCP services, so
// Close ends them.
type conns struct {
	mu     sync.Mutex
	set    map[net.Conn]bool
	closed bool
}

func (c *conns) add(n net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	if c.set == nil {
		c.set = map[net.Conn]bool{}
	}
	c.set[n] = true
	return true
}

func (c *conns) remove(n net.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.set, n)
}

func (c *conns) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for n := range c.set {
		_ = n.Close()
	}
	return nil
}

// maxBody bounds /bytes/N.
const maxBody = 64 << 20

// serve starts a goroutine per listener; Close ends them all.
func (in *Internet) serve(ls listeners, tlsConf *tls.Config, index *index) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { in.handle(w, r, index) })
	// Clients that fail on purpose (a name the certificate lacks) are no
	// news: the servers do not log.
	quiet := log.New(io.Discard, "", 0)
	plain := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: quiet}
	secure := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: quiet}
	open := &conns{}
	in.closers = append(in.closers, plain.Close, secure.Close, open.Close)
	in.wg.Add(7)
	go func() { defer in.wg.Done(); _ = plain.Serve(ls.http) }()
	go func() { defer in.wg.Done(); _ = secure.Serve(tls.NewListener(ls.https, tlsConf)) }()
	go func() { defer in.wg.Done(); in.acceptLoop(ls.echo, open, echo) }()
	go func() { defer in.wg.Done(); in.acceptLoop(ls.banner, open, banner) }()
	go func() { defer in.wg.Done(); in.acceptLoop(ls.dnsTCP, open, in.dnsTCP) }()
	go func() { defer in.wg.Done(); udpEcho(ls.udpEcho) }()
	go func() { defer in.wg.Done(); in.dnsUDP(ls.dnsUDP) }()
}

// handle answers with what the server saw: the Host, the path and whether
// TLS was on; pypi.test is the package index; /bytes/N sends N bytes.
func (in *Internet) handle(w http.ResponseWriter, r *http.Request, index *index) {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	in.noteRequest(host)
	if canonical(host) == "pypi.test" || host == zone["pypi.test"].String() {
		index.ServeHTTP(w, r)
		return
	}
	if r.URL.Path == "/echo" {
		// What a request carried, for the tests of what the egress proxy
		// put in it.
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"host": host, "tls": r.TLS != nil, "authorization": r.Header.Get("Authorization"),
			"query": r.URL.RawQuery, "body": string(body)})
		return
	}
	if n, ok := strings.CutPrefix(r.URL.Path, "/bytes/"); ok {
		size, err := strconv.Atoi(n)
		if err != nil || size < 0 || size > maxBody {
			http.Error(w, "bad size", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(size))
		_, _ = io.CopyN(w, zeros{}, int64(size))
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = fmt.Fprintf(w, "host=%s path=%s tls=%v\n", host, r.URL.Path, r.TLS != nil)
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

// acceptLoop serves each connection of l with serve, in a goroutine of its
// own, until l is closed.
func (in *Internet) acceptLoop(l net.Listener, open *conns, serve func(net.Conn)) {
	for {
		c, err := l.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		if !open.add(c) {
			_ = c.Close()
			return
		}
		in.wg.Add(1)
		go func() {
			defer in.wg.Done()
			defer open.remove(c)
			defer func() { _ = c.Close() }()
			_ = c.SetDeadline(time.Now().Add(time.Minute))
			serve(c)
		}()
	}
}

func echo(c net.Conn) { _, _ = io.Copy(c, c) }

func banner(c net.Conn) {
	if _, err := io.WriteString(c, Banner); err != nil {
		return
	}
	echo(c)
}

func udpEcho(pc net.PacketConn) {
	serveUDP(pc, func(b []byte) ([]byte, bool) { return b, true })
}

// serveUDP answers each datagram on pc with what answer makes of it, from
// the address the datagram was sent to: pc listens on every address, and
// a reply from another (the one the route back would choose) would not
// reach a connected client.
func serveUDP(pc net.PacketConn, answer func([]byte) ([]byte, bool)) {
	p := ipv4.NewPacketConn(pc)
	if err := p.SetControlMessage(ipv4.FlagDst, true); err != nil {
		return
	}
	buf := make([]byte, 65536)
	for {
		n, cm, from, err := p.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		out, ok := answer(buf[:n])
		if !ok {
			continue
		}
		var reply *ipv4.ControlMessage
		if cm != nil {
			reply = &ipv4.ControlMessage{Src: cm.Dst}
		}
		_, _ = p.WriteTo(out, reply, from)
	}
}
