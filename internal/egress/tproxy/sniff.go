package tproxy

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// The parsers below read the first bytes a sandbox sends on a connection:
// bytes it chose, so they are read as hostile. Each is bounded by the
// buffer it is given (the proxy gives at most MaxPeek bytes), allocates
// nothing but the name it returns, and never trusts a length field beyond
// the bytes that are there. A result is one of: more bytes are needed
// (the bytes so far are a valid prefix), a name, or an error saying what is
// wrong; a malformed ClientHello or request is refused, never forwarded
// unchecked, since a parser that gives up is a parser an attacker can
// steer around.

const (
	kindTLS  = "tls"
	kindHTTP = "http"

	// maxNameLen bounds a DNS name (RFC 1035: 253 characters in text).
	maxNameLen = 253
)

var (
	errNeedMore = errors.New("need more bytes")
	// errNotHTTP: the first line is not an HTTP/1.x request line, so the
	// bytes are some other protocol that begins with a method's word
	// (a Redis inline "GET key"); a server cannot read a Host from them.
	errNotHTTP = errors.New("not HTTP/1.x")
)

// tlsSNI reads a TLS ClientHello from the start of b (one or more
// handshake records) and returns its server_name ("" when it has none).
// need > 0 says the bytes so far are a valid prefix and at least need
// bytes in all are wanted before it is worth calling again.
func tlsSNI(b []byte) (sni string, need int, err error) {
	// Reassemble the handshake message from the records' fragments: a
	// ClientHello may be split over several records, each over several
	// TCP segments.
	var hs []byte
	msgLen := -1
	off := 0
	for {
		if len(b)-off < 5 {
			return "", off + 5, nil
		}
		typ, major, rlen := b[off], b[off+1], int(b[off+3])<<8|int(b[off+4])
		if typ != 22 {
			if off == 0 {
				return "", 0, errors.New("not a TLS handshake")
			}
			return "", 0, fmt.Errorf("TLS record type %d inside the ClientHello", typ)
		}
		if major != 3 {
			return "", 0, fmt.Errorf("TLS record version %d.%d", major, b[off+2])
		}
		if rlen == 0 || rlen > 1<<14 {
			return "", 0, fmt.Errorf("TLS record length %d", rlen)
		}
		if len(b)-off-5 < rlen {
			return "", off + 5 + rlen, nil
		}
		hs = append(hs, b[off+5:off+5+rlen]...)
		off += 5 + rlen
		if msgLen < 0 && len(hs) >= 4 {
			if hs[0] != 1 {
				return "", 0, fmt.Errorf("TLS handshake type %d, not a ClientHello", hs[0])
			}
			msgLen = int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3])
			if msgLen > MaxPeek {
				return "", 0, fmt.Errorf("ClientHello of %d bytes", msgLen)
			}
		}
		if msgLen >= 0 && len(hs) >= 4+msgLen {
			return clientHelloSNI(hs[4 : 4+msgLen])
		}
	}
}

// clientHelloSNI reads a ClientHello body (RFC 8446 4.1.2; RFC 5246 for
// the older versions, which have the same layout).
func clientHelloSNI(body []byte) (string, int, error) {
	r := reader{b: body}
	r.skip(2 + 32) // legacy_version, random
	r.skip(int(r.u8()))
	suites := r.u16()
	if suites == 0 || suites%2 != 0 {
		return "", 0, errors.New("malformed ClientHello: cipher suites")
	}
	r.skip(suites)
	if n := int(r.u8()); n == 0 {
		return "", 0, errors.New("malformed ClientHello: compression methods")
	} else {
		r.skip(n)
	}
	if r.bad {
		return "", 0, errors.New("malformed ClientHello: truncated")
	}
	if r.len() == 0 {
		return "", 0, nil // no extensions, so no server_name
	}
	ext := reader{b: r.bytes(r.u16())}
	if r.bad || r.len() != 0 {
		return "", 0, errors.New("malformed ClientHello: extensions length")
	}
	sni, seen := "", false
	for ext.len() > 0 {
		typ, data := ext.u16(), ext.bytes(ext.u16())
		if ext.bad {
			return "", 0, errors.New("malformed ClientHello: extension length")
		}
		if typ != 0 {
			continue
		}
		if seen {
			return "", 0, errors.New("malformed ClientHello: two server_name extensions")
		}
		seen = true
		name, err := serverName(data)
		if err != nil {
			return "", 0, err
		}
		sni = name
	}
	return sni, 0, nil
}

// serverName reads the server_name extension (RFC 6066 3): a list with at
// most one host_name.
func serverName(data []byte) (string, error) {
	r := reader{b: data}
	list := reader{b: r.bytes(r.u16())}
	if r.bad || r.len() != 0 || list.len() == 0 {
		return "", errors.New("malformed server_name")
	}
	name := ""
	for list.len() > 0 {
		typ, v := list.u8(), list.bytes(list.u16())
		if list.bad {
			return "", errors.New("malformed server_name")
		}
		if typ != 0 {
			continue // not a host_name: nothing a server routes on
		}
		if name != "" {
			return "", errors.New("two names in server_name")
		}
		if len(v) == 0 {
			return "", errors.New("empty server_name")
		}
		n, err := hostName(v)
		if err != nil {
			return "", fmt.Errorf("server_name: %w", err)
		}
		name = n
	}
	return name, nil
}

// hostName checks a name from the wire, lower-cased: ASCII letters,
// digits, '-', '_' and '.', at most maxNameLen bytes. Anything else (a
// NUL, a space, a byte over 0x7f) is not a name a rule can have allowed,
// and is refused rather than passed on for a comparison to misread.
func hostName(v []byte) (string, error) {
	if len(v) > maxNameLen+1 { // +1: a trailing dot
		return "", fmt.Errorf("name of %d bytes", len(v))
	}
	for _, c := range v {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_') {
			return "", fmt.Errorf("byte %#02x in name", c)
		}
	}
	return strings.ToLower(string(v)), nil
}

// reader reads big-endian fields; reading past the end sets bad and
// yields zeros, so a parser checks once after a group of reads.
type reader struct {
	b   []byte
	bad bool
}

func (r *reader) len() int { return len(r.b) }

func (r *reader) bytes(n int) []byte {
	if n > len(r.b) {
		r.bad, r.b = true, nil
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) skip(n int) { r.bytes(n) }

func (r *reader) u8() int {
	v := r.bytes(1)
	if v == nil {
		return 0
	}
	return int(v[0])
}

func (r *reader) u16() int {
	v := r.bytes(2)
	if v == nil {
		return 0
	}
	return int(v[0])<<8 | int(v[1])
}

// httpMethods are the request methods recognised as HTTP/1.x (RFC 9110
// 9.3, and PATCH). A request with another method is not recognised as HTTP
// and is judged as unnamed bytes.
var httpMethods = []string{"GET ", "HEAD ", "POST ", "PUT ", "DELETE ", "CONNECT ", "OPTIONS ", "TRACE ", "PATCH "}

// httpPrefix says whether b starts with an HTTP method and its space
// (method), or could still become one with more bytes (maybe).
func httpPrefix(b []byte) (method, maybe bool) {
	for _, m := range httpMethods {
		n := min(len(b), len(m))
		if string(b[:n]) == m[:n] {
			if n == len(m) {
				return true, false
			}
			maybe = true
		}
	}
	return false, maybe
}

// headerEnd is the length of the request's head in b (request line and
// header fields up to the empty line), or -1 when it is not all there.
// Lines end in CRLF or a bare LF, as servers accept both.
func headerEnd(b []byte) int {
	for i := 0; ; {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return -1
		}
		i += j + 1
		if i < len(b) && b[i] == '\n' {
			return i + 1
		}
		if i+1 < len(b) && b[i] == '\r' && b[i+1] == '\n' {
			return i + 2
		}
	}
}

// httpHost reads an HTTP/1.x request head from the start of b and
// returns the host it is for, without port, lower-cased: from an
// absolute-form target (which a server takes over the Host field, RFC
// 9112 3.2.2) or CONNECT's authority, else from the Host field; "" when
// there is none (HTTP/1.0). errNeedMore: the head is not complete yet;
// errNotHTTP: the first line does not end in an HTTP/1.x version. A line
// that does and is malformed otherwise is an error, as is every malformed
// header field: a server may read them differently.
func httpHost(b []byte) (string, error) {
	nl := bytes.IndexByte(b, '\n')
	if nl < 0 {
		return "", errNeedMore
	}
	first := strings.TrimSuffix(string(b[:nl]), "\r")
	if v := len(first) - len(" HTTP/1.1"); v < 0 || first[v:v+len(" HTTP/1.")] != " HTTP/1." || first[v+len(" HTTP/1.")] < '0' || first[v+len(" HTTP/1.")] > '9' {
		return "", errNotHTTP
	}
	end := headerEnd(b)
	if end < 0 {
		return "", errNeedMore
	}
	lines := strings.Split(string(b[:end]), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSuffix(l, "\r")
	}
	parts := strings.Split(lines[0], " ")
	if len(parts) != 3 {
		return "", errors.New("malformed HTTP request line")
	}
	method, target := parts[0], parts[1]
	uriHost, hasURIHost := "", false
	switch {
	case method == "CONNECT":
		h, err := authorityHost(target)
		if err != nil {
			return "", fmt.Errorf("CONNECT target: %w", err)
		}
		uriHost, hasURIHost = h, true
	case strings.HasPrefix(target, "/") || target == "*":
	default:
		scheme, rest, ok := strings.Cut(target, "://")
		if !ok || scheme == "" || strings.ContainsAny(scheme, "/?#") {
			return "", errors.New("malformed HTTP request target")
		}
		auth := rest
		if i := strings.IndexAny(rest, "/?#"); i >= 0 {
			auth = rest[:i]
		}
		h, err := authorityHost(auth)
		if err != nil {
			return "", fmt.Errorf("request target: %w", err)
		}
		uriHost, hasURIHost = h, true
	}
	host, hasHost := "", false
	for _, l := range lines[1:] {
		if l == "" {
			break
		}
		if l[0] == ' ' || l[0] == '\t' {
			return "", errors.New("folded HTTP header line")
		}
		name, value, ok := strings.Cut(l, ":")
		if !ok || name == "" || strings.ContainsAny(name, " \t") {
			return "", errors.New("malformed HTTP header line")
		}
		if !strings.EqualFold(name, "host") {
			continue
		}
		if hasHost {
			return "", errors.New("two Host header fields")
		}
		h, err := authorityHost(strings.Trim(value, " \t"))
		if err != nil {
			return "", fmt.Errorf("host header: %w", err)
		}
		host, hasHost = h, true
	}
	if hasURIHost {
		// A server uses the target's host; a Host field naming another
		// is how one request is made to look like two.
		if hasHost && host != uriHost {
			return "", errors.New("the Host header and the request target name different hosts")
		}
		return uriHost, nil
	}
	return host, nil
}

// authorityHost is the host of an authority (host[:port], [v6][:port]),
// lower-cased, without port. Userinfo is refused: "allowed.example@evil"
// names evil.
func authorityHost(a string) (string, error) {
	if a == "" {
		return "", nil
	}
	if strings.Contains(a, "@") {
		return "", errors.New("userinfo in authority")
	}
	host := a
	if strings.HasPrefix(a, "[") {
		end := strings.IndexByte(a, ']')
		if end < 0 {
			return "", errors.New("unclosed [ in authority")
		}
		ip, err := netip.ParseAddr(a[1:end])
		if err != nil || !ip.Is6() || ip.Zone() != "" {
			return "", errors.New("bad IPv6 literal")
		}
		if err := checkPort(a[end+1:]); err != nil {
			return "", err
		}
		return ip.String(), nil
	}
	if i := strings.IndexByte(a, ':'); i >= 0 {
		if err := checkPort(a[i:]); err != nil {
			return "", err
		}
		host = a[:i]
	}
	if host == "" {
		return "", errors.New("empty host")
	}
	return hostName([]byte(host))
}

// checkPort accepts "" or ":" followed by up to five digits.
func checkPort(p string) error {
	if p == "" {
		return nil
	}
	if p[0] != ':' || len(p) > 6 {
		return errors.New("bad port in authority")
	}
	for _, c := range p[1:] {
		if c < '0' || c > '9' {
			return errors.New("bad port in authority")
		}
	}
	return nil
}
