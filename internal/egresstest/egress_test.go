package egresstest

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/testenv"
	"github.com/warren-sandbox/warren/internal/testenv/fakenet"
)

// The suite's sandboxes and their rules.
var sandboxes = map[string][]string{
	// main holds most cases: names, a wildcard, port and address rules,
	// one of the two names sharing an address, the rebinding names.
	"main": {"allowed.test", "*.wild.test", "shared-a.test", "api.allowed.test:7", "198.51.100.130:22",
		"rebind-loopback.test", "rebind-metadata.test", "rebind-private.test", "v6.test"},
	"other":  {},                // holds a listener main must not reach
	"pin":    {"allowed.test"},  // has never resolved allowed.test when the test starts
	"live":   {"allowed.test"},  // its rules change
	"tunnel": {"*.tunnel.test"}, // the burst (rate limits must not spill onto main)
	"pip":    {"pypi.test"},     // the package index
}

// TestEgress runs every case against one server and one fake internet.
// The planned server behaviour each case relies on is named in its
// comment.
func TestEgress(t *testing.T) { testEgress(t, "native") }

// TestEgressGvisor runs the same cases with the sandboxes in the gvisor
// tier: the sentry's own network stack on the same host-side link.
func TestEgressGvisor(t *testing.T) { testEgress(t, "gvisor") }

// tierFlags make tier the server's default isolation tier.
func tierFlags(t *testing.T, tier string) []string {
	if tier == "gvisor" {
		return []string{"--isolation", "gvisor", "--runsc", testenv.RunscBinary(t)}
	}
	return []string{"--isolation", tier}
}

func testEgress(t *testing.T, tier string) {
	start := time.Now()
	in := fakenet.Start(t)
	s := startServer(t, append([]string{"--dns-upstream", in.DNS.String()}, tierFlags(t, tier)...)...)
	var wg sync.WaitGroup
	errs := make(chan error, len(sandboxes))
	for name, rules := range sandboxes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if rules == nil {
				rules = []string{}
			}
			if err := s.create(name, rules); err != nil {
				errs <- fmt.Errorf("create %s with egress %q: %w", name, rules, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, sb := range []string{"main", "pin"} {
		if r, err := s.exec(sb, []string{"sh", "-c", "cat > /tmp/fakenet-ca.pem"}, string(in.CAPEM), nil, 30); err != nil || r.ExitCode != 0 {
			t.Fatalf("write the CA in %s: %v %+v", sb, err, r)
		}
	}
	t.Logf("set up in %v", time.Since(start))
	// The leftovers check at the end finds the server's links by their
	// alias: it must see the running sandboxes' links now.
	if n := len(s.leftLinks()); n < len(sandboxes) {
		t.Errorf("%d host links carry the server's prefix %s, want one per sandbox (%d)", n, s.instancePrefix(), len(sandboxes))
	}

	// The agent writes the gateway as the sandbox's nameserver.
	t.Run("resolv.conf", func(t *testing.T) {
		mustAllow(t, s, "main", `nameserver() == gateway() or (nameserver(), gateway())`, "true")
	})
	t.Run("allowed", func(t *testing.T) { testAllowed(t, s) })
	t.Run("denied", func(t *testing.T) {
		// The resolver answers NXDOMAIN itself: the upstream never hears
		// of a name no rule allows.
		o := checks(t, s, "main", deny(`resolve("denied.test")`), deny(`http("denied.test", "denied.test")`))
		if !strings.Contains(o[0].Error, "[Errno -2]") {
			t.Errorf("denied.test: %s, want NXDOMAIN (EAI_NONAME)", o[0].Error)
		}
		if slices.Contains(in.Queries(), "denied.test") {
			t.Error("the upstream was asked for denied.test")
		}
		if r, err := s.exec("main", []string{"curl", "-sS", "--max-time", "10", "http://denied.test/"}, "", nil, 30); err != nil || r.ExitCode != 6 {
			t.Errorf("curl http://denied.test/: %v, exit %d (want 6, could not resolve), %s", err, r.ExitCode, r.Stderr)
		}
	})
	t.Run("wildcard", func(t *testing.T) {
		checks(t, s, "main",
			allow(`http("a.wild.test", "a.wild.test", "/w")`, "host=a.wild.test path=/w"),
			allow(`http("b.c.wild.test", "b.c.wild.test", "/w", tls=True)`, "host=b.c.wild.test path=/w tls=true"),
			deny(`resolve("wild.test")`)) // a suffix rule does not cover its apex
	})
	t.Run("ports", func(t *testing.T) {
		checks(t, s, "main",
			allow(`exchange("api.allowed.test", 7, b"ping\n", 5)`, "ping"),
			deny(`http("api.allowed.test", "api.allowed.test")`), // its rule names port 7 only
			deny(`exchange("allowed.test", 7, b"ping\n", 5)`),    // no port = 80 and 443
			// An address rule; a server-first protocol: the banner comes
			// through without the client sending anything.
			allow(`exchange("198.51.100.130", 22)`, "SSH-2.0-fakenet"),
			deny(`exchange("198.51.100.130", 7, b"ping\n")`))
	})
	t.Run("ip-literal", func(t *testing.T) {
		// Pins: an address is usable only once this sandbox resolved an
		// allowed name to it.
		before := in.Requests("allowed.test")
		a := in.Addr("allowed.test").String()
		checks(t, s, "pin", deny(`http(`+py(a)+`, "allowed.test", "/lit")`),
			deny(`http(`+py(in.Addr("denied.test").String())+`, "denied.test", "/lit")`))
		if n := in.Requests("allowed.test"); n != before {
			t.Errorf("the fake internet got %d requests for allowed.test by its literal", n-before)
		}
		mustAllow(t, s, "pin", `(resolve("allowed.test"), http(`+py(a)+`, "allowed.test", "/lit"))[1]`, "host=allowed.test path=/lit")
		// What no answer opened is refused at connect (the host's gate),
		// not accepted and reset: a port scan sees nothing open.
		d := in.Addr("denied.test").String()
		o := checks(t, s, "pin", deny(`socket.create_connection((`+py(d)+`, 443), timeout=5).close()`),
			deny(`socket.create_connection(("198.51.100.131", 2222), timeout=5).close()`))
		for _, o := range o {
			if !strings.Contains(o.Error, "ConnectionRefusedError") {
				t.Errorf("connect to an address nothing opened: %s, want ConnectionRefusedError", o.Error)
			}
		}
		// The kernel reports refusals as they happen; allow it a moment.
		found := false
		for deadline := time.Now().Add(3 * time.Second); !found && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			for _, r := range egressLog(t, s, "pin", 0) {
				if r.Kind == "tcp" && r.Verdict == "deny" && r.Addr == d && r.Port == 443 && strings.HasPrefix(r.Reason, "refused at connect: ") {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("the log has no refused-at-connect record for %s:443", d)
		}
	})
	t.Run("shared-address", func(t *testing.T) {
		// SNI and Host are checked on the wire against the pinned name.
		checks(t, s, "main",
			allow(`(resolve("shared-a.test"), http("shared-a.test", "shared-a.test", "/s", tls=True))[1]`, "host=shared-a.test"),
			deny(`http(resolve("shared-a.test")[0], "shared-b.test", "/s", tls=True)`),
			deny(`http(resolve("shared-a.test")[0], "shared-b.test", "/s")`),
			deny(`http(resolve("allowed.test")[0], "denied.test", "/s", tls=True)`),
			deny(`http(resolve("allowed.test")[0], "denied.test", "/s")`),
			// No name on the wire at all: nothing to check, so no.
			deny(`http(resolve("allowed.test")[0], "allowed.test", "/s", tls=True, nosni=True)`),
			deny(`http(resolve("allowed.test")[0], None, "/s")`))
		for _, h := range []string{"shared-b.test", "denied.test"} {
			if n := in.Requests(h); n != 0 {
				t.Errorf("the fake internet got %d requests for %s", n, h)
			}
		}
	})
	t.Run("rebinding", func(t *testing.T) {
		// Answers in special ranges are refused though a rule names the
		// name.
		names := []string{"rebind-loopback.test", "rebind-metadata.test", "rebind-private.test"}
		codes := []string{`http("169.254.169.254", "rebind-metadata.test")`}
		for _, name := range names {
			codes = append(codes, `resolve(`+py(name)+`)`)
		}
		outs, err := tryProbes(s, "main", codes...)
		if err != nil {
			t.Fatal(err)
		}
		if o := outs[0]; o.OK || !o.OSError || o.Elapsed > fastDenial.Seconds() {
			t.Errorf("the metadata address: %v, want a fast denial", o)
		}
		for i, name := range names {
			o := outs[i+1]
			if o.OK && strings.Contains(string(o.Result), in.Addr(name).String()) {
				t.Errorf("%s resolved to %s", name, o.Result)
			}
			if o.Elapsed > fastDenial.Seconds() {
				t.Errorf("%s took %.2fs", name, o.Elapsed)
			}
			t.Logf("%s: %v", name, o)
		}
	})
	t.Run("other-resolver", func(t *testing.T) {
		// UDP and TCP to port 53 anywhere are redirected to Warren's
		// resolver.
		var cs []check
		for _, srv := range []string{in.DNS.Addr().String(), "8.8.8.8"} {
			cs = append(cs, allow(`dns_udp(`+py(srv)+`, "denied.test")`, `"rcode": 3`),
				allow(`dns_udp(`+py(srv)+`, "allowed.test")`, in.Addr("allowed.test").String()))
		}
		// A DoH server by its address: never resolved, so never pinned.
		cs = append(cs, deny(`http(`+py(in.DNS.Addr().String())+`, "ns.test", "/dns-query", tls=True)`))
		checks(t, s, "main", cs...)
		if slices.Contains(in.Queries(), "denied.test") {
			t.Error("a query for denied.test reached the upstream")
		}
	})
	t.Run("dns-tcp", func(t *testing.T) {
		checks(t, s, "main", allow(`dns_tcp(nameserver(), "allowed.test")`, in.Addr("allowed.test").String()),
			allow(`dns_tcp(`+py(in.DNS.Addr().String())+`, "denied.test")`, `"rcode": 3`))
	})
	t.Run("tunnel-burst", func(t *testing.T) { testTunnel(t, s, in) })
	t.Run("ipv6", func(t *testing.T) {
		// IPv6 is off in the sandbox (or policed): the fake internet
		// answers on IPv6 to the host, so a leak would connect.
		checks(t, s, "main", deny(`exchange(`+py(in.Addr6("v6.test").String())+`, 80, b"GET / HTTP/1.0\r\n\r\n")`),
			deny(`resolve("v6.test", socket.AF_INET6)`)) // an allowed name gets no IPv6 address
	})
	t.Run("udp", func(t *testing.T) {
		// UDP other than DNS is rejected with an ICMP error: a connected
		// socket sees it, rather than silence until a timeout.
		o := mustDeny(t, s, "main", `
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2.5)
    s.connect((resolve("allowed.test")[0], 7))
    s.send(b"datagram")
    return s.recv(100).decode()
run(udp)
`)
		// gVisor's network stack passes a socket only the ICMP errors
		// host and port unreachable and fragmentation needed: the
		// host's admin-prohibited reaches no gvisor socket, which sees
		// the datagram denied by its timeout.
		if strings.Contains(o.Error, "timed out") && tier != "gvisor" {
			t.Errorf("UDP was dropped silently (%s), want a rejection", o.Error)
		}
	})
	t.Run("icmp", func(t *testing.T) { testICMP(t, s, in) })
	t.Run("host", func(t *testing.T) { testHost(t, s) })
	t.Run("other-sandbox", func(t *testing.T) { testOtherSandbox(t, s) })
	t.Run("live", func(t *testing.T) { testLive(t, s) })
	t.Run("log", func(t *testing.T) { testLog(t, s, in, start) })
	t.Run("pip", func(t *testing.T) { testPip(t, s, in) })
	t.Logf("the suite took %v", time.Since(start))
}

// testAllowed: an allowed name works over HTTP and HTTPS with Python's
// urllib, curl and Node's fetch (the resolver forwards; the proxy splices).
func testAllowed(t *testing.T, s *server) {
	checks(t, s, "main",
		allow(`urllib.request.urlopen("http://allowed.test/u", timeout=5).read().decode()`, "host=allowed.test path=/u tls=false"),
		allow(`urllib.request.urlopen("https://allowed.test/u", timeout=5, context=ssl.create_default_context(cafile=CA)).read().decode()`,
			"host=allowed.test path=/u tls=true"))
	if _, err := os.Stat("/usr/bin/curl"); err == nil {
		r, err := s.exec("main", []string{"curl", "-sS", "--max-time", "10", "--cacert", "/tmp/fakenet-ca.pem", "https://a.wild.test/curl"}, "", nil, 30)
		if err != nil || r.ExitCode != 0 || r.Stdout != "host=a.wild.test path=/curl tls=true\n" {
			t.Errorf("curl: %v, exit %d, %q %q", err, r.ExitCode, r.Stdout, r.Stderr)
		}
	}
	js := `fetch("https://b.c.wild.test/node").then(r => r.text()).then(t => process.stdout.write(t)).catch(e => { console.error(String(e.cause || e)); process.exit(1) })`
	r, err := s.exec("main", []string{"node", "-e", js}, "", []string{"NODE_EXTRA_CA_CERTS=/tmp/fakenet-ca.pem"}, 30)
	if err != nil || r.ExitCode != 0 || r.Stdout != "host=b.c.wild.test path=/node tls=true\n" {
		t.Errorf("node fetch: %v, exit %d, %q %q", err, r.ExitCode, r.Stdout, r.Stderr)
	}
}

// testTunnel: a burst of 1000 long random names under an allowed suffix is
// rate limited (the upstream sees part of it at most) and logged; the
// record types tunnels carry data in (TXT) are not forwarded.
func testTunnel(t *testing.T, s *server, in *fakenet.Internet) {
	mustAllow(t, s, "tunnel", `dns_udp(nameserver(), "first.tunnel.test")`, in.Addr(fakenet.TunnelSuffix).String())
	o := probe(t, s, "tunnel", `dns_udp(nameserver(), "data.tunnel.test", 16)`)
	if slices.Contains(in.Queries(), "data.tunnel.test") {
		t.Errorf("a TXT query reached the upstream (%v)", o)
	}
	o = probe(t, s, "tunnel", `
def burst():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    ns = nameserver()
    sent = 0
    abc = "abcdefghijklmnopqrstuvwxyz0123456789"
    for i in range(1000):
        name = ".".join("".join(random.choice(abc) for _ in range(60)) for _ in range(3)) + ".tunnel.test"
        try:
            s.sendto(dns_query(name)[1], (ns, 53))
            sent += 1
        except BlockingIOError:
            time.sleep(0.001)
    rcodes = {}
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        r, _, _ = select.select([s], [], [], 0.1)
        if r:
            rc = str(s.recv(4096)[3] & 0xF)
            rcodes[rc] = rcodes.get(rc, 0) + 1
    return {"sent": sent, "rcodes": rcodes}
run(burst)
`)
	if !o.OK {
		t.Fatalf("burst: %v", o)
	}
	var res struct {
		Sent   int            `json:"sent"`
		RCodes map[string]int `json:"rcodes"`
	}
	if err := json.Unmarshal(o.Result, &res); err != nil {
		t.Fatal(err)
	}
	upstream := 0
	for _, q := range in.Queries() {
		if strings.HasSuffix(q, "."+fakenet.TunnelSuffix) && len(q) > 180 {
			upstream++
		}
	}
	t.Logf("burst: sent %d, answers by rcode %v, the upstream saw %d", res.Sent, res.RCodes, upstream)
	if res.Sent < 900 {
		t.Errorf("the burst sent only %d queries", res.Sent)
	}
	if res.RCodes["0"] >= res.Sent || upstream >= res.Sent {
		t.Errorf("no rate limit: %d of %d answered, %d reached the upstream", res.RCodes["0"], res.Sent, upstream)
	}
	recs := egressLog(t, s, "tunnel", 0)
	denied := 0
	for _, r := range recs {
		if r.Kind == "dns" && r.Verdict == "deny" && r.Reason != "" {
			denied++
		}
	}
	if denied == 0 {
		t.Errorf("the log shows no denied query (%d records)", len(recs))
	}
}

// testICMP: ICMP does not leave (ping if the host image has it; a
// Python ICMP datagram socket).
func testICMP(t *testing.T, s *server, in *fakenet.Internet) {
	a := in.Addr("allowed.test").String()
	if r, err := s.exec("main", []string{"sh", "-c", "command -v ping"}, "", nil, 30); err == nil && r.ExitCode == 0 {
		ping := strings.TrimSpace(r.Stdout)
		begin := time.Now()
		r, err := s.exec("main", []string{ping, "-c", "1", "-W", "2", a}, "", nil, 30)
		if err != nil || r.ExitCode == 0 {
			t.Errorf("ping %s: %v, exit %d, %s", a, err, r.ExitCode, r.Stdout)
		}
		if d := time.Since(begin); d > fastDenial+time.Second {
			t.Errorf("ping took %v", d)
		}
	}
	mustDeny(t, s, "main", `
def icmp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
    s.settimeout(2)
    s.sendto(struct.pack(">BBHHH", 8, 0, 0, 0, 1) + b"fakenet", (`+py(a)+`, 0))
    return repr(s.recvfrom(100))
run(icmp)
`)
}

// testHost: the host's services (on the gateway, on the host's other
// addresses, Warren's own API) are unreachable; the sandbox's loopback is
// its own.
func testHost(t *testing.T, s *server) {
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			_, _ = c.Write([]byte("host service\n"))
			_ = c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	_, apiPort, _ := net.SplitHostPort(s.addr)
	var cs []check
	for _, target := range []string{"gateway()", `"198.51.100.1"`, `"127.0.0.1"`} {
		cs = append(cs, deny(fmt.Sprintf(`exchange(%s, %d)`, target, port)),
			deny(fmt.Sprintf(`http(%s, "localhost", "/api/v1/health", port=%s)`, target, apiPort)))
	}
	checks(t, s, "main", cs...)
	if n := accepted.Load(); n != 0 {
		t.Errorf("the host's listener accepted %d connections from the sandbox", n)
	}
}

// testOtherSandbox: main cannot reach a listener in another sandbox.
func testOtherSandbox(t *testing.T, s *server) {
	addr := probe(t, s, "other", `my_addr()`)
	if !addr.OK {
		t.Fatalf("other's address: %v", addr)
	}
	const port = 8080
	type result struct {
		o   outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		outs, err := tryProbes(s, "other", fmt.Sprintf(`
def serve():
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("0.0.0.0", %d))
    l.listen(8)
    l.settimeout(30)
    c, peer = l.accept()
    return peer[0]
run(serve)
`, port))
		var o outcome
		if err == nil {
			o = outs[0]
		}
		done <- result{o, err}
	}()
	// Wait until other listens (reading /proc/net/tcp, which would not
	// take the connection the listener waits for).
	deadline := time.Now().Add(10 * time.Second)
	for {
		o := probe(t, s, "other", fmt.Sprintf(`any(l.split()[1].endswith(":%04X") and l.split()[3] == "0A" for l in open("/proc/net/tcp").readlines()[1:])`, port))
		if o.OK && string(o.Result) == "true" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the listener in other did not come up: %v", o)
		}
		time.Sleep(100 * time.Millisecond)
	}
	mustDeny(t, s, "main", fmt.Sprintf(`exchange(%s, %d, b"hi")`, string(addr.Result), port))
	// The listener reports its first connection's peer: other's own
	// from loopback, made now, unless main's came through before it.
	probe(t, s, "other", fmt.Sprintf(`socket.create_connection(("127.0.0.1", %d), timeout=5).close()`, port))
	if r := <-done; r.err != nil || !r.o.OK || r.o.text() != "127.0.0.1" {
		t.Errorf("the listener in other: %v %v, want its own connection first", r.o, r.err)
	}
}

// testLive: sandbox.egress.get/set on a running sandbox; new connections
// follow the new rules at once; a bad rule is refused, naming it.
func testLive(t *testing.T, s *server) {
	checks(t, s, "live", allow(`http("allowed.test", "allowed.test", "/before")`, "host=allowed.test"), deny(`resolve("denied.test")`))
	if got := egressGet(t, s, "live"); !slices.Equal(got, []string{"allowed.test"}) {
		t.Errorf("egress.get: %q", got)
	}
	if err := s.call(s.key, "sandbox.egress.set", map[string]any{"sandbox": "live", "namespace": ns, "rules": []string{"denied.test"}}, nil); err != nil {
		t.Fatalf("egress.set: %v", err)
	}
	if got := egressGet(t, s, "live"); !slices.Equal(got, []string{"denied.test"}) {
		t.Errorf("egress.get after set: %q", got)
	}
	checks(t, s, "live", allow(`http("denied.test", "denied.test", "/after")`, "host=denied.test path=/after"),
		deny(`resolve("allowed.test")`),
		// The address pinned before the change no longer opens anything.
		deny(`http("203.0.113.10", "allowed.test", "/after")`))

	err := s.call(s.key, "sandbox.egress.set", map[string]any{"sandbox": "live", "namespace": ns, "rules": []string{"ok.test", "http://bad.test"}}, nil)
	var re *rpcError
	if !asRPC(err, &re) || re.Kind != "invalid_params" || !strings.Contains(re.Message, "http://bad.test") {
		t.Errorf("egress.set with a bad rule: %v, want invalid_params naming it", err)
	}
	if got := egressGet(t, s, "live"); !slices.Equal(got, []string{"denied.test"}) {
		t.Errorf("egress.get after a refused set: %q", got)
	}
	policy := 0
	for _, r := range egressLog(t, s, "live", 0) {
		if r.Kind == "policy" {
			policy++
		}
	}
	if policy == 0 {
		t.Error("the log shows no rule change")
	}
}

// testLog: main's connection log holds what the cases above did, its
// fields filled in.
func testLog(t *testing.T, s *server, in *fakenet.Internet, since time.Time) {
	mustAllow(t, s, "main", `len(http("allowed.test", "allowed.test", "/bytes/100000"))`, "100000")
	recs := egressLog(t, s, "main", 0)
	if len(recs) == 0 {
		t.Fatal("main's log is empty")
	}
	var bulk, dnsAllow, dnsDeny, sniDeny, portDeny bool
	for i, r := range recs {
		if r.Namespace != ns || r.Sandbox != "main" || r.Time.Before(since.Add(-time.Minute)) || r.Time.After(time.Now().Add(time.Minute)) {
			t.Errorf("record %d: %+v", i, r)
		}
		if i > 0 && r.Seq <= recs[i-1].Seq {
			t.Errorf("record %d: seq %d after %d", i, r.Seq, recs[i-1].Seq)
		}
		if r.Verdict != "allow" && r.Verdict != "deny" && (r.Kind != "policy" || r.Verdict != "set") {
			t.Errorf("record %d: verdict %q", i, r.Verdict)
		}
		switch {
		case r.Kind == "tcp" && r.Verdict == "allow" && r.Name == "allowed.test" && r.BytesIn >= 100000:
			bulk = true
			if r.Addr != in.Addr("allowed.test").String() || r.Port != 80 || r.Rule != "allowed.test" || r.BytesOut <= 0 || r.Duration <= 0 {
				t.Errorf("the bulk transfer's record: %+v", r)
			}
		case r.Kind == "dns" && r.Verdict == "allow" && r.Name == "allowed.test" && r.Rule == "allowed.test" &&
			strings.Contains(r.Addr, in.Addr("allowed.test").String()):
			dnsAllow = true
		case r.Kind == "dns" && r.Verdict == "deny" && r.Name == "denied.test":
			dnsDeny = true
		case r.Kind == "tcp" && r.Verdict == "deny" && r.Name == "shared-b.test":
			sniDeny = true
			if r.Reason == "" || r.Addr != in.Addr("shared-b.test").String() {
				t.Errorf("the SNI denial's record: %+v", r)
			}
		case r.Kind == "tcp" && r.Verdict == "deny" && r.Port == 7 && r.Addr == in.Addr("allowed.test").String():
			portDeny = true
		}
	}
	for what, ok := range map[string]bool{"the bulk transfer": bulk, "an allowed query": dnsAllow, "the denied query": dnsDeny, "the SNI denial": sniDeny, "the port denial": portDeny} {
		if !ok {
			t.Errorf("no record of %s among %d", what, len(recs))
		}
	}
	if got := egressLog(t, s, "main", 2); len(got) != 2 || got[0].Seq != recs[0].Seq {
		t.Errorf("limit 2: %d records, want the 2 oldest", len(got))
	}
	mid := recs[len(recs)/2].Seq
	var later struct {
		Records []egress.Record `json:"records"`
	}
	if err := s.call(s.key, "sandbox.egress.log", map[string]any{"sandbox": "main", "namespace": ns, "since": mid, "limit": 1000}, &later); err != nil {
		t.Fatal(err)
	}
	if len(later.Records) == 0 || later.Records[0].Seq <= mid {
		t.Errorf("since %d: %d records, the first %+v", mid, len(later.Records), later.Records)
	}
}

// testPip: pip installs from the fake index with the rule, and fails
// without it.
func testPip(t *testing.T, s *server, in *fakenet.Internet) {
	install := []string{"python3", "-m", "pip", "install", "--isolated", "--no-cache-dir", "--disable-pip-version-check",
		"--retries", "0", "--timeout", "5", "--target", "/tmp/pkgs", "--index-url", "http://pypi.test/simple/",
		"--trusted-host", "pypi.test", in.Package}
	r, err := s.exec("pip", install, "", nil, 60)
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("pip install with the rule: %v, exit %d\n%s\n%s", err, r.ExitCode, r.Stdout, r.Stderr)
	}
	imp := `import sys; sys.path.insert(0, "/tmp/pkgs"); import ` + in.Module + `; print(` + in.Module + `.GREETING)`
	if r, err := s.exec("pip", []string{"python3", "-c", imp}, "", nil, 30); err != nil || strings.TrimSpace(r.Stdout) != fakenet.PackageGreeting {
		t.Errorf("import the installed module: %v %q %q", err, r.Stdout, r.Stderr)
	}
	before := in.Requests("pypi.test")
	begin := time.Now()
	r, err = s.exec("main", install, "", nil, 60)
	if err != nil || r.ExitCode == 0 {
		t.Errorf("pip install without the rule: %v, exit %d", err, r.ExitCode)
	}
	if d := time.Since(begin); d > 20*time.Second {
		t.Errorf("pip's failure took %v", d)
	}
	if n := in.Requests("pypi.test"); n != before {
		t.Errorf("the index got %d requests from a sandbox without the rule", n-before)
	}
}

func egressGet(t *testing.T, s *server, sb string) []string {
	t.Helper()
	var out struct {
		Rules []string `json:"rules"`
	}
	if err := s.call(s.key, "sandbox.egress.get", map[string]any{"sandbox": sb, "namespace": ns}, &out); err != nil {
		t.Fatalf("egress.get %s: %v", sb, err)
	}
	return out.Rules
}

// egressLog reads a sandbox's log (limit 0: up to 1000 records).
func egressLog(t *testing.T, s *server, sb string, limit int) []egress.Record {
	t.Helper()
	if limit == 0 {
		limit = 1000
	}
	p := map[string]any{"sandbox": sb, "namespace": ns, "limit": limit}
	var out struct {
		Records []egress.Record `json:"records"`
	}
	if err := s.call(s.key, "sandbox.egress.log", p, &out); err != nil {
		t.Fatalf("egress.log %s: %v", sb, err)
	}
	return out.Records
}

func asRPC(err error, re **rpcError) bool {
	e, ok := err.(*rpcError) //nolint:errorlint // call returns it unwrapped
	if ok {
		*re = e
	}
	return ok
}
