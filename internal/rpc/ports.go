package rpc

import (
	"context"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

// A sandbox's published ports (docs/network.md): the methods, and the
// HTTP route that proxies to a sandbox port.

// portInfo is one published port as the API shows it.
type portInfo struct {
	HostAddress string `json:"host_address"`
	HostPort    uint16 `json:"host_port"`
	GuestPort   uint16 `json:"guest_port"`
	// Origin is "config" (the ports of sandbox.start's config or of
	// sandbox.create) or "expose" (sandbox.port.expose); both are
	// published at every start, until unexposed.
	Origin string `json:"origin"`
	// Published: served now (false: the sandbox does not run; its next
	// start publishes it).
	Published bool `json:"published"`
}

type portList struct {
	Ports []portInfo `json:"ports"`
}

func toPortInfo(p sandbox.PublishedPort) portInfo {
	origin := "expose"
	if p.FromSpec {
		origin = "config"
	}
	return portInfo{HostAddress: p.Address.String(), HostPort: p.Host, GuestPort: p.Guest, Origin: origin, Published: p.Published}
}

func toPortList(ps []sandbox.PublishedPort) portList {
	out := portList{Ports: make([]portInfo, len(ps))}
	for i, p := range ps {
		out.Ports[i] = toPortInfo(p)
	}
	return out
}

type portExposeParams struct {
	sandboxRef
	Guest   int    `json:"guest"`
	Host    int    `json:"host"`
	Address string `json:"address"`
}

// portParam checks a port number from params; zero is allowed where
// zeroOK (any free port).
func portParam(what string, n int, zeroOK bool) (uint16, error) {
	if n < 0 || n > 65535 || (n == 0 && !zeroOK) {
		want := "1-65535"
		if zeroOK {
			want = "0 (any free port) or 1-65535"
		}
		return 0, errdefs.Errorf(errInvalidParams, "%q %d: want %s", what, n, want)
	}
	return uint16(n), nil //nolint:gosec // checked above
}

func addressParam(s string) (netip.Addr, error) {
	if s == "" {
		return netip.Addr{}, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, errdefs.Errorf(errInvalidParams, "\"address\" %.64q: want an IP address like 127.0.0.1", s)
	}
	return a.Unmap(), nil
}

func (s *Server) portExpose(ctx context.Context, c *call, p *portExposeParams) (any, error) {
	ns, name, err := c.resolveRef(p.sandboxRef)
	if err != nil {
		return nil, err
	}
	guest, err := portParam("guest", p.Guest, false)
	if err != nil {
		return nil, err
	}
	host, err := portParam("host", p.Host, true)
	if err != nil {
		return nil, err
	}
	addr, err := addressParam(p.Address)
	if err != nil {
		return nil, err
	}
	pp, err := s.mgr.ExposePort(ctx, ns, name, guest, host, addr)
	if err != nil {
		return nil, err
	}
	return toPortInfo(pp), nil
}

func (s *Server) portList(_ context.Context, c *call, p *sandboxRef) (any, error) {
	ns, name, err := c.resolveRef(*p)
	if err != nil {
		return nil, err
	}
	ps, err := s.mgr.Ports(ns, name)
	if err != nil {
		return nil, err
	}
	return toPortList(ps), nil
}

type portUnexposeParams struct {
	sandboxRef
	Host    int    `json:"host"`
	Address string `json:"address"`
}

func (s *Server) portUnexpose(ctx context.Context, c *call, p *portUnexposeParams) (any, error) {
	ns, name, err := c.resolveRef(p.sandboxRef)
	if err != nil {
		return nil, err
	}
	host, err := portParam("host", p.Host, false)
	if err != nil {
		return nil, err
	}
	addr, err := addressParam(p.Address)
	if err != nil {
		return nil, err
	}
	ps, err := s.mgr.UnexposePort(ctx, ns, name, host, addr)
	if err != nil {
		return nil, err
	}
	return toPortList(ps), nil
}

// The HTTP route's bounds. The request's own (its header's size, the time
// to read it) are the HTTP server's.
const (
	proxyDialTimeout   = 10 * time.Second
	proxyHeaderTimeout = 60 * time.Second
	proxyMaxHeader     = 64 << 10
)

// servePortProxy proxies HTTP (WebSocket upgrades included) to a port of a
// running sandbox: /api/v1/sandboxes/{namespace}/{name}/ports/{port}/REST
// goes to the sandbox's address and port as /REST, with the query. The
// caller's key must cover the namespace, as for any other route; it never
// reaches the sandbox.
func (s *Server) servePortProxy(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if s.closing.Load() {
		s.writeError(w, ctx, nil, errdefs.Errorf(errdefs.ErrUnavailable, "the server is shutting down"), 0)
		return
	}
	claims, err := s.authenticate(r)
	if err != nil {
		s.writeError(w, ctx, nil, err, 0)
		return
	}
	c := &call{s: s, claims: claims, method: "port proxy"}
	_ = auditHTTP(ctx, c)
	ns := r.PathValue("namespace")
	if ns == defaultNamespaceSegment {
		ns = ""
	}
	ns, name, err := c.resolve(ns, r.PathValue("name"))
	if err != nil {
		s.writeError(w, ctx, nil, err, 0)
		return
	}
	n, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || n < 1 || n > 65535 {
		s.writeError(w, ctx, nil, errdefs.Errorf(errInvalidParams, "port %.20q: want 1-65535", r.PathValue("port")), 0)
		return
	}
	port := uint16(n) //nolint:gosec // checked above
	// The path after {port}, as the client escaped it.
	parts := strings.SplitN(r.URL.EscapedPath(), "/", 9)
	prefix := strings.Join(parts[:min(len(parts), 8)], "/")
	rest := "/"
	if len(parts) == 9 {
		rest += parts[8]
	}
	restPath, err := url.PathUnescape(rest)
	if err != nil {
		s.writeError(w, ctx, nil, errdefs.Errorf(errInvalidRequest, "path %.100q: %v", rest, err), 0)
		return
	}
	l, err := s.mgr.Lease(ns, name)
	if err != nil {
		s.writeError(w, ctx, nil, err, 0)
		return
	}
	defer l.Release()
	// A transport per request: its connections are the sandbox's own
	// (closed when it stops), never pooled for another sandbox or run.
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			ctx, cancel := context.WithTimeout(ctx, proxyDialTimeout)
			defer cancel()
			return s.mgr.DialPort(ctx, ns, name, port)
		},
		DisableKeepAlives:      true,
		ResponseHeaderTimeout:  proxyHeaderTimeout,
		MaxResponseHeaderBytes: proxyMaxHeader,
		DisableCompression:     true,
	}
	defer tr.CloseIdleConnections()
	target := &url.URL{Scheme: "http", Host: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), port).String()}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = target.Scheme, target.Host
			pr.Out.URL.Path, pr.Out.URL.RawPath = restPath, rest
			pr.Out.Host = r.Host
			// The caller's key is for Warren, never for the sandbox.
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Del("Proxy-Authorization")
			pr.SetXForwarded()
			pr.Out.Header.Set("X-Forwarded-Prefix", prefix)
		},
		Transport:     tr,
		FlushInterval: -1, // stream (server-sent events, notebooks' long polls)
		// Whatever went wrong on the way to the sandbox (nothing listens,
		// it stopped, its answer was out of bounds) is a bad gateway.
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errdefs.Kind(err) == errdefs.Internal {
				err = errdefs.Errorf(errdefs.ErrUnavailable, "port %d of sandbox %q: %w", port, name, err)
			}
			s.writeError(w, r.Context(), nil, err, http.StatusBadGateway)
		},
	}
	rp.ServeHTTP(w, r)
}
