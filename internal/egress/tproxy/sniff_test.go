package tproxy

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// clientHello is the first record crypto/tls sends with cfg.
func clientHello(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer func() { _ = a.Close(); _ = b.Close() }()
	go func() { _ = tls.Client(a, cfg).Handshake() }()
	_ = b.SetReadDeadline(time.Now().Add(5 * time.Second))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(b, body); err != nil {
		t.Fatal(err)
	}
	return append(hdr, body...)
}

// reframe splits the handshake in the records of hello into records of
// at most n bytes each.
func reframe(hello []byte, n int) []byte {
	hs := hello[5:]
	var out []byte
	for len(hs) > 0 {
		k := min(n, len(hs))
		out = append(out, 22, 3, 1, byte(k>>8), byte(k))
		out = append(out, hs[:k]...)
		hs = hs[k:]
	}
	return out
}

// helloWith builds a ClientHello record whose extensions block is exts.
func helloWith(exts []byte) []byte {
	body := []byte{3, 3}
	body = append(body, make([]byte, 32)...) // random
	body = append(body, 0)                   // session id
	body = append(body, 0, 2, 0x13, 0x01)    // one cipher suite
	body = append(body, 1, 0)                // null compression
	body = append(body, byte(len(exts)>>8), byte(len(exts)))
	body = append(body, exts...)
	hs := append([]byte{1, byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}, body...)
	return append([]byte{22, 3, 1, byte(len(hs) >> 8), byte(len(hs))}, hs...)
}

// sniExt is a server_name extension holding entries (type, name).
func sniExt(entries ...any) []byte {
	var list []byte
	for i := 0; i < len(entries); i += 2 {
		name := entries[i+1].(string)
		list = append(list, byte(entries[i].(int)), byte(len(name)>>8), byte(len(name)))
		list = append(list, name...)
	}
	data := append([]byte{byte(len(list) >> 8), byte(len(list))}, list...)
	return append([]byte{0, 0, byte(len(data) >> 8), byte(len(data))}, data...)
}

func TestTLSSNI(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  *tls.Config
		sni  string
	}{
		{"TLS 1.3", &tls.Config{ServerName: "pypi.org"}, "pypi.org"},
		{"TLS 1.2", &tls.Config{ServerName: "files.pythonhosted.org", MaxVersion: tls.VersionTLS12}, "files.pythonhosted.org"},
		{"no SNI", &tls.Config{InsecureSkipVerify: true}, ""}, // #nosec G402 -- only its ClientHello is used
	} {
		t.Run(tc.name, func(t *testing.T) {
			hello := clientHello(t, tc.cfg)
			for _, h := range [][]byte{hello, reframe(hello, 1), reframe(hello, 7), reframe(hello, 300)} {
				// Every prefix is "more, please", asking for more than it has.
				for i := range len(h) {
					if len(h) > 4000 && i%13 != 0 && i < len(h)-30 {
						continue // 1-byte records: a sample, as each call reads them all
					}
					sni, need, err := tlsSNI(h[:i])
					if err != nil || need <= i || sni != "" {
						t.Fatalf("prefix %d of %d: %q, %d, %v", i, len(h), sni, need, err)
					}
				}
				sni, need, err := tlsSNI(append(h, 23, 3, 3)) // with what follows
				if err != nil || need != 0 || sni != tc.sni {
					t.Fatalf("%q, %d, %v; want %q", sni, need, err, tc.sni)
				}
			}
		})
	}

	for _, tc := range []struct {
		name  string
		hello []byte
		sni   string // "" and err "": no error, no name
		err   string
	}{
		{"upper case", helloWith(sniExt(0, "PyPI.org")), "pypi.org", ""},
		{"other name type skipped", helloWith(sniExt(1, "x", 0, "a.test")), "a.test", ""},
		{"empty extensions", helloWith(nil), "", ""},
		{"two server_name extensions", helloWith(append(sniExt(0, "a.test"), sniExt(0, "b.test")...)), "", "two server_name"},
		{"two host names", helloWith(sniExt(0, "a.test", 0, "b.test")), "", "two names"},
		{"empty name", helloWith(sniExt(0, "")), "", "empty"},
		{"NUL in name", helloWith(sniExt(0, "a.test\x00.evil")), "", "byte 0x00"},
		{"non-ASCII name", helloWith(sniExt(0, "bücher.test")), "", "byte 0xc3"},
		{"long name", helloWith(sniExt(0, strings.Repeat("a", 300))), "", "name of 300 bytes"},
		{"extension overruns", helloWith([]byte{0, 0, 0, 9, 0}), "", "extension length"},
		{"server_name list overruns", helloWith([]byte{0, 0, 0, 2, 0, 9}), "", "malformed server_name"},
		{"not a handshake", []byte{23, 3, 3, 0, 1, 0}, "", "not a TLS handshake"},
		{"alert inside", append(reframe(helloWith(sniExt(0, "a.test")), 10)[:15], 21, 3, 3, 0, 2, 2, 40), "", "record type 21"},
		{"server hello", []byte{22, 3, 3, 0, 4, 2, 0, 0, 0}, "", "not a ClientHello"},
		{"huge handshake", []byte{22, 3, 3, 0, 4, 1, 0xff, 0xff, 0xff}, "", "ClientHello of"},
		{"empty record", []byte{22, 3, 3, 0, 0}, "", "record length 0"},
		{"record too long", []byte{22, 3, 3, 0x48, 1}, "", "record length"},
		{"SSL 2 version", []byte{22, 2, 0, 0, 1, 1}, "", "record version"},
		{"odd cipher suites", []byte{22, 3, 1, 0, 43, 1, 0, 0, 39, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0}, "", "cipher suites"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sni, need, err := tlsSNI(tc.hello)
			if need != 0 || sni != tc.sni || (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("%q, %d, %v; want %q, error %q", sni, need, err, tc.sni, tc.err)
			}
		})
	}
}

func TestHTTPHost(t *testing.T) {
	for _, tc := range []struct {
		req, host, err string
	}{
		{"GET / HTTP/1.1\r\nHost: PyPI.org\r\n\r\n", "pypi.org", ""},
		{"GET / HTTP/1.1\r\nhOsT:pypi.org:8080 \r\nAccept: */*\r\n\r\nbody", "pypi.org", ""},
		{"GET / HTTP/1.1\nHost: pypi.org\n\n", "pypi.org", ""},
		{"GET / HTTP/1.0\r\n\r\n", "", ""},
		{"GET / HTTP/1.1\r\nHost: [2001:DB8::1]:80\r\n\r\n", "2001:db8::1", ""},
		{"GET http://PyPI.org:80/simple/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "pypi.org", ""},
		{"GET https://pypi.org?x HTTP/1.1\r\n\r\n", "pypi.org", ""},
		{"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n", "pypi.org", ""},
		{"OPTIONS * HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "pypi.org", ""},
		{"GET / HTTP/1.1\r\nHost: pypi.org\r\n", "", "need more"},
		{"GET / HTTP/1.1\r\n", "", "need more"},
		{"GET http://evil.test/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "", "different hosts"},
		{"GET http://pypi.org@evil.test/ HTTP/1.1\r\n\r\n", "", "userinfo"},
		{"GET / HTTP/1.1\r\nHost: pypi.org\r\nHost: evil.test\r\n\r\n", "", "two Host"},
		{"GET / HTTP/1.1\r\nHost : evil.test\r\n\r\n", "", "malformed HTTP header"},
		{"GET / HTTP/1.1\r\nX: y\r\n Host: evil.test\r\n\r\n", "", "folded"},
		{"GET / HTTP/1.1\r\nHost: evil.test\x00.pypi.org\r\n\r\n", "", "byte 0x00"},
		{"GET / HTTP/1.1\r\nHost: pypi.org:80x\r\n\r\n", "", "bad port"},
		{"GET / HTTP/1.1\r\nHost: [fe80::1%eth0]\r\n\r\n", "", "IPv6"},
		{"GET /  HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "", "request line"},
		{"GET / HTTP/2.0\r\n\r\n", "", "not HTTP"},
		{"GET key\r\n", "", "not HTTP"},
		{"GET / HTTP/1.\r\n\r\n", "", "not HTTP"},
		{"GET /x\r\n", "", "not HTTP"},
		{"GET pypi.org HTTP/1.1\r\n\r\n", "", "request target"},
		{"CONNECT :443 HTTP/1.1\r\n\r\n", "", "empty host"},
	} {
		host, err := httpHost([]byte(tc.req))
		if host != tc.host || (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%q: %q, %v; want %q, error %q", tc.req, host, err, tc.host, tc.err)
		}
	}
	for _, tc := range []struct {
		b             string
		method, maybe bool
	}{
		{"", false, true}, {"G", false, true}, {"GE", false, true}, {"GET", false, true}, {"GET ", true, false},
		{"GET/", false, false}, {"P", false, true}, {"PATCH /", true, false}, {"get ", false, false}, {"SSH-", false, false},
	} {
		if m, maybe := httpPrefix([]byte(tc.b)); m != tc.method || maybe != tc.maybe {
			t.Errorf("httpPrefix(%q) = %v, %v", tc.b, m, maybe)
		}
	}
}

func FuzzSNI(f *testing.F) {
	hello := clientHello(f, &tls.Config{ServerName: "pypi.org"})
	f.Add(hello)
	f.Add(reframe(hello, 5))
	f.Add(hello[:40])
	f.Add(helloWith(sniExt(0, "a.test", 1, "b")))
	f.Add(helloWith(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		sni, need, err := tlsSNI(b)
		if need > 0 && (err != nil || need <= len(b) || sni != "") {
			t.Fatalf("need %d with %d bytes: %q, %v", need, len(b), sni, err)
		}
		if need > len(b)+5+1<<14 {
			t.Fatalf("need %d with %d bytes: beyond the next record", need, len(b))
		}
		if err != nil && sni != "" {
			t.Fatalf("a name (%q) with an error (%v)", sni, err)
		}
		checkName(t, sni)
		if need == 0 && err == nil {
			// A decision does not change with the bytes that follow.
			sni2, need2, err2 := tlsSNI(append(b[:len(b):len(b)], 22, 3, 3, 0, 1, 1))
			if sni2 != sni || need2 != 0 || err2 != nil {
				t.Fatalf("%q then %q, %d, %v with more bytes", sni, sni2, need2, err2)
			}
		}
	})
}

func FuzzHost(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
		"GET http://a.test:80/x HTTP/1.1\r\nHost: a.test\r\n\r\n",
		"CONNECT [::1]:443 HTTP/1.1\r\n\r\n",
		"POST /x HTTP/1.0\nContent-Length: 0\n\n",
		"GET / HTTP/1.1\r\nHost: a\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		host, err := httpHost(b)
		if errors.Is(err, errNeedMore) && headerEnd(b) >= 0 || err == nil && headerEnd(b) < 0 {
			t.Fatalf("need more: %v, head end %d", err, headerEnd(b))
		}
		if err != nil && host != "" {
			t.Fatalf("a host (%q) with an error (%v)", host, err)
		}
		if strings.Contains(host, ":") { // an IPv6 literal, brackets gone
			if ip, err := netip.ParseAddr(host); err != nil || !ip.Is6() || ip.Zone() != "" || ip.String() != host {
				t.Fatalf("host %q", host)
			}
			return
		}
		checkName(t, host)
	})
}

// checkName: what a parser returns as a name is one a rule could match.
func checkName(t *testing.T, n string) {
	t.Helper()
	if len(n) > maxNameLen+1 || n != strings.ToLower(n) {
		t.Fatalf("name %q", n)
	}
	for _, c := range []byte(n) {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_') {
			t.Fatalf("name %q", n)
		}
	}
}
