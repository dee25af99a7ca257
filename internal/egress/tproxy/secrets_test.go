package tproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/secrets"
)

const secretValue = "sk-live-THE-REAL-VALUE"

// seen is what the test's web server got of a request.
type seen struct {
	Host, Auth, Query, Body, TE, Trailer string
	Length                               int64
	TLS                                  bool
}

// webServer answers every request with what it saw, as JSON; with cert,
// over TLS.
func webServer(t *testing.T, cert *tls.Certificate) net.Listener {
	t.Helper()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		_ = json.NewEncoder(w).Encode(seen{Host: r.Host, Auth: r.Header.Get("Authorization"), Query: r.URL.RawQuery, Body: string(body),
			TE: strings.Join(r.TransferEncoding, ","), Trailer: r.Trailer.Get("X-Sig"), Length: r.ContentLength, TLS: r.TLS != nil})
	}), ReadHeaderTimeout: 5 * time.Second, ErrorLog: log.New(io.Discard, "", 0)} // handshakes fail on purpose
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if cert != nil {
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{*cert}})
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln
}

// secretSandbox is a sandbox allowed allowed.test and evil.test at
// 203.0.113.9, with one proxy-mode secret granted for allowed.test.
func secretSandbox(t *testing.T) (*fakeSandbox, string) {
	t.Helper()
	st, err := secrets.NewStore(map[string]secrets.Provider{"env": &secrets.Env{Prefix: "T_", Lookup: func(string) (string, bool) { return secretValue, true }}},
		map[string][]secrets.Grant{"ns": {{Name: "api", Provider: "env", Hosts: []string{"allowed.test"}}}})
	if err != nil {
		t.Fatal(err)
	}
	d, err := st.Resolve(context.Background(), "ns", "t", []string{"api"})
	if err != nil {
		t.Fatal(err)
	}
	sb := newSandbox([]string{"203.0.113.9"}, "allowed.test", "evil.test")
	sb.sec = d.Proxy
	_, ph, _ := strings.Cut(d.Env[0], "=")
	return sb, ph
}

// exchange writes raw requests on c and reads n answers.
func exchange(t *testing.T, c net.Conn, raw string, n int) []seen {
	t.Helper()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	var out []seen
	for range n {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer %d: %v", len(out)+1, err)
		}
		var s seen
		err = json.NewDecoder(resp.Body).Decode(&s)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

func TestKeepAliveEveryHost(t *testing.T) {
	sb := newSandbox([]string{"203.0.113.9"}, "allowed.test", "other.test")
	h := newHarness(t, Config{}, map[netip.Addr]*fakeSandbox{sandboxA: sb})
	h.host("203.0.113.9:80", webServer(t, nil))
	// Allowed hosts, pipelined on one connection: each request answered.
	c := h.connect(sandboxA, "203.0.113.9:80")
	got := exchange(t, c, "GET /1 HTTP/1.1\r\nHost: allowed.test\r\n\r\nGET /2 HTTP/1.1\r\nHost: other.test\r\n\r\n", 2)
	if got[0].Host != "allowed.test" || got[1].Host != "other.test" {
		t.Fatalf("answers %+v", got)
	}
	_ = c.Close()
	if r := sb.record(t); r.Verdict != "allow" {
		t.Fatalf("record %+v", r)
	}
	// A later request naming a denied host: the first is answered, then
	// the connection is reset and the second never reaches the server.
	for _, second := range []string{
		"GET /2 HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"GET http://evil.test/2 HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"GET /2 HTTP/1.1\r\nHost: allowed.test\r\nHost: evil.test\r\n\r\n",
		"GET /2 HTTP/1.1\r\nHost: allowed.test\r\n" + strings.Repeat("X-Pad: "+strings.Repeat("p", 1000)+"\r\n", MaxPeek/1000+2) + "\r\n",
	} {
		c := h.connect(sandboxA, "203.0.113.9:80")
		if _, err := io.WriteString(c, "GET /1 HTTP/1.1\r\nHost: allowed.test\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		got := exchange(t, c, "", 1)
		if got[0].Host != "allowed.test" {
			t.Fatalf("first answer %+v", got)
		}
		if _, err := io.WriteString(c, second); err != nil {
			t.Fatal(err)
		}
		r := sb.record(t)
		refused(t, c)
		if r.Verdict != "deny" || !strings.Contains(r.Reason, "request 2") {
			t.Fatalf("%q: record %+v", second, r)
		}
	}
}

func TestSecretsPlainHTTP(t *testing.T) {
	sb, ph := secretSandbox(t)
	h := newHarness(t, Config{}, map[netip.Addr]*fakeSandbox{sandboxA: sb})
	h.host("203.0.113.9:80", webServer(t, nil))
	c := h.connect(sandboxA, "203.0.113.9:80")
	body := `{"key":"` + ph + `"}`
	chunked := fmt.Sprintf("%x\r\n%s\r\n%x\r\n%s\r\n0\r\nX-Sig: %s\r\n\r\n", 5, "data=", len(ph), ph, ph)
	raw := "GET /v1?key=" + ph + "&x=1 HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: Bearer " + ph + "\r\n\r\n" +
		"POST /v1 HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: " + fmt.Sprint(len(body)) + "\r\n\r\n" + body +
		"POST /v1 HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sig\r\n\r\n" + chunked +
		// Allowed, not granted: the placeholder goes as it is.
		"GET /v1?key=" + ph + " HTTP/1.1\r\nHost: evil.test\r\nAuthorization: Bearer " + ph + "\r\nContent-Length: " + fmt.Sprint(len(body)) + "\r\n\r\n" + body
	got := exchange(t, c, raw, 4)
	if g := got[0]; g.Auth != "Bearer "+secretValue || g.Query != "key="+secretValue+"&x=1" {
		t.Errorf("header and query: %+v", g)
	}
	if g := got[1]; g.Body != `{"key":"`+secretValue+`"}` || g.Length != int64(len(g.Body)) {
		t.Errorf("body: %+v", g)
	}
	if g := got[2]; g.Body != "data="+secretValue || g.TE != "chunked" || g.Trailer != secretValue {
		t.Errorf("chunked body: %+v", g)
	}
	if g := got[3]; g.Host != "evil.test" || g.Auth != "Bearer "+ph || g.Query != "key="+ph || g.Body != body {
		t.Errorf("another host got: %+v", g)
	}
	_ = c.Close()
	r := sb.record(t)
	if r.Verdict != "allow" || !strings.Contains(r.Reason, "secret api sent") || strings.Contains(fmt.Sprintf("%+v", r), secretValue) {
		t.Fatalf("record %+v", r)
	}
}

func TestSecretsHTTPS(t *testing.T) {
	sb, ph := secretSandbox(t)
	upCert, upRoots := testCert(t)
	h := newHarness(t, Config{UpstreamRoots: upRoots}, map[netip.Addr]*fakeSandbox{sandboxA: sb})
	h.host("203.0.113.9:443", webServer(t, &upCert))
	sandboxRoots := x509.NewCertPool()
	sandboxRoots.AppendCertsFromPEM(sb.sec.CA().PEM())
	get := func(name string, roots *x509.CertPool) (seen, error) {
		cl := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: roots},
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return h.connect(sandboxA, "203.0.113.9:443"), nil
			},
		}}
		defer cl.CloseIdleConnections()
		req, _ := http.NewRequest("POST", "https://"+name+"/v1?k="+ph, strings.NewReader("b="+ph))
		req.Header.Set("Authorization", "Bearer "+ph)
		resp, err := cl.Do(req)
		if err != nil {
			return seen{}, err
		}
		defer func() { _ = resp.Body.Close() }()
		var s seen
		return s, json.NewDecoder(resp.Body).Decode(&s)
	}
	// The granted host: intercepted with the sandbox's CA, secrets put in.
	g, err := get("allowed.test", sandboxRoots)
	if err != nil {
		t.Fatal(err)
	}
	if !g.TLS || g.Auth != "Bearer "+secretValue || g.Query != "k="+secretValue || g.Body != "b="+secretValue {
		t.Errorf("granted host got %+v", g)
	}
	if r := sb.record(t); r.Verdict != "allow" || !strings.Contains(r.Reason, "intercepted") || !strings.Contains(r.Reason, "secret api sent") {
		t.Errorf("record %+v", r)
	}
	// Another allowed host: spliced, the destination's own certificate,
	// the placeholder as it is.
	if _, err := get("evil.test", sandboxRoots); err == nil {
		t.Error("the sandbox's CA vouched for a host no grant names")
	}
	sb.record(t)
	g, err = get("evil.test", upRoots)
	if err != nil {
		t.Fatal(err)
	}
	if g.Auth != "Bearer "+ph || g.Body != "b="+ph {
		t.Errorf("another host got %+v", g)
	}
	sb.record(t)
	// A destination that fails verification: the sandbox is reset, its
	// request never sent.
	h2 := newHarness(t, Config{}, map[netip.Addr]*fakeSandbox{sandboxA: sb})
	h2.host("203.0.113.9:443", webServer(t, &upCert))
	c := h2.connect(sandboxA, "203.0.113.9:443")
	tc := tls.Client(c, &tls.Config{ServerName: "allowed.test", RootCAs: sandboxRoots})
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err == nil {
		t.Fatal("handshake completed with an unverified destination")
	}
	if r := sb.record(t); r.Verdict != "deny" || !strings.Contains(r.Reason, "TLS to the destination") {
		t.Errorf("record %+v", r)
	}
}

func TestUpgradeTunnel(t *testing.T) {
	sb := newSandbox([]string{"203.0.113.9"}, "allowed.test")
	h := newHarness(t, Config{}, map[netip.Addr]*fakeSandbox{sandboxA: sb})
	// A server that switches protocols, then echoes.
	h.host("203.0.113.9:80", serve(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil || req.Header.Get("Upgrade") != "echo" {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
		_, _ = io.Copy(c, br)
	}))
	c := h.connect(sandboxA, "203.0.113.9:80")
	// The tunnel's first bytes come with the request, in one write.
	if _, err := io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n\x00\x01not http\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	_ = resp.Body.Close() // a 101 has none: the tunnel's bytes stay in br
	want := "\x00\x01not http\r\n\r\n"
	got := make([]byte, len(want))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != want {
		t.Fatalf("tunnel: %q %v", got, err)
	}
	if _, err := io.WriteString(c, "more raw bytes"); err != nil {
		t.Fatal(err)
	}
	got = make([]byte, len("more raw bytes"))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != "more raw bytes" {
		t.Fatalf("tunnel: %q %v", got, err)
	}
	_ = c.CloseWrite()
	if r := sb.record(t); r.Verdict != "allow" {
		t.Fatalf("record %+v", r)
	}
}
