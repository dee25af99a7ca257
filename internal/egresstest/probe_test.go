package egresstest

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// probeLib is the Python every probe starts with: small clients that
// report what happened as one JSON line, with how long it took (measured
// inside the sandbox, so the exec's own cost is not counted).
const probeLib = `
import json, os, random, select, socket, ssl, struct, sys, time, urllib.request

CA = "/tmp/fakenet-ca.pem"

def run(f):
    t = time.monotonic()
    try:
        r = {"ok": True, "result": f()}
    except BaseException as e:
        # OSError covers what the network says (refused, reset, NXDOMAIN,
        # TLS, timeouts); anything else is a bug of the probe.
        r = {"ok": False, "error": type(e).__name__ + ": " + str(e), "oserror": isinstance(e, OSError)}
    r["elapsed"] = time.monotonic() - t
    print(json.dumps(r))

def resolve(name, family=socket.AF_INET):
    return sorted({a[4][0] for a in socket.getaddrinfo(name, None, family, socket.SOCK_STREAM)})

def recv_all(s, limit=1 << 20):
    b = b""
    while len(b) < limit:
        d = s.recv(65536)
        if not d:
            break
        b += d
    return b

def http(addr, host, path="/", tls=False, sni=None, port=None, nosni=False):
    """GET path from addr (a name or an address) with Host host (none if
    host is None); over TLS with SNI sni (default: host; none with nosni),
    verified with the fake internet's CA."""
    port = port or (443 if tls else 80)
    s = socket.create_connection((addr, port), timeout=5)
    try:
        if tls:
            ctx = ssl.create_default_context(cafile=CA)
            if nosni:
                ctx.check_hostname = False
            s = ctx.wrap_socket(s, server_hostname=None if nosni else (sni or host))
        hosthdr = "" if host is None else "Host: %s\r\n" % host
        s.sendall(("GET %s HTTP/1.0\r\n%sConnection: close\r\n\r\n" % (path, hosthdr)).encode())
        resp = recv_all(s)
    finally:
        s.close()
    if not resp:
        raise ConnectionError("connection closed without an answer")
    head, _, body = resp.partition(b"\r\n\r\n")
    status = head.split(b"\r\n")[0].decode()
    if " 200 " not in status:
        raise ConnectionError("status: " + status)
    return body.decode(errors="replace")

def exchange(addr, port, send=b"", want=1):
    """Connect, send, and read until want bytes or EOF: a proxy that
    accepts and then resets must not pass for a connection."""
    s = socket.create_connection((addr, port), timeout=5)
    try:
        if send:
            s.sendall(send)
        b = b""
        while len(b) < want:
            d = s.recv(4096)
            if not d:
                break
            b += d
    finally:
        s.close()
    if not b:
        raise ConnectionError("connection closed without data")
    return b.decode(errors="replace")

def dns_query(name, qtype=1, qid=None):
    qid = random.randrange(65536) if qid is None else qid
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for label in name.rstrip(".").split("."):
        q += bytes([len(label)]) + label.encode()
    return qid, q + b"\0" + struct.pack(">HH", qtype, 1)

def dns_parse(resp):
    """rcode and the A records of an answer."""
    _, flags, qd, an, _, _ = struct.unpack(">HHHHHH", resp[:12])
    i = 12
    def skip_name(i):
        while True:
            l = resp[i]
            if l == 0:
                return i + 1
            if l & 0xC0 == 0xC0:
                return i + 2
            i += 1 + l
    for _ in range(qd):
        i = skip_name(i) + 4
    addrs = []
    for _ in range(an):
        i = skip_name(i)
        t, _, _, rdlen = struct.unpack(">HHIH", resp[i:i + 10])
        i += 10
        if t == 1 and rdlen == 4:
            addrs.append(socket.inet_ntoa(resp[i:i + 4]))
        i += rdlen
    return {"rcode": flags & 0xF, "addrs": addrs}

def dns_udp(server, name, qtype=1):
    qid, q = dns_query(name, qtype)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    try:
        s.sendto(q, (server, 53))
        while True:
            resp, _ = s.recvfrom(4096)
            if resp[:2] == struct.pack(">H", qid):
                return dns_parse(resp)
    finally:
        s.close()

def dns_tcp(server, name, qtype=1):
    _, q = dns_query(name, qtype)
    s = socket.create_connection((server, 53), timeout=3)
    try:
        s.sendall(struct.pack(">H", len(q)) + q)
        b = b""
        while len(b) < 2 or len(b) < 2 + struct.unpack(">H", b[:2])[0]:
            d = s.recv(4096)
            if not d:
                raise ConnectionError("closed after %d bytes" % len(b))
            b += d
        return dns_parse(b[2:])
    finally:
        s.close()

def nameserver():
    for l in open("/etc/resolv.conf"):
        f = l.split()
        if len(f) >= 2 and f[0] == "nameserver":
            return f[1]
    raise RuntimeError("no nameserver in /etc/resolv.conf")

def gateway():
    for l in open("/proc/net/route").readlines()[1:]:
        f = l.split()
        if f[1] == "00000000":
            return socket.inet_ntoa(struct.pack("<I", int(f[2], 16)))
    raise RuntimeError("no default route")

def my_addr(ifname="eth0"):
    import fcntl
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        return socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname.encode()))[20:24])
    finally:
        s.close()
`

// outcome is what one probe reported.
type outcome struct {
	OK      bool            `json:"ok"`
	Result  json.RawMessage `json:"result"`
	Error   string          `json:"error"`
	OSError bool            `json:"oserror"` // the failure is the network's, not the probe's`
	Elapsed float64         `json:"elapsed"`
}

func (o outcome) String() string {
	if o.OK {
		return fmt.Sprintf("ok in %.3fs: %s", o.Elapsed, o.Result)
	}
	return fmt.Sprintf("failed in %.3fs: %s", o.Elapsed, o.Error)
}

// text is the result as a string ("" when it is not one).
func (o outcome) text() string {
	var s string
	_ = json.Unmarshal(o.Result, &s)
	return s
}

// probe runs Python code in sandbox sb: code is one expression, run with
// run(lambda: ...), or, with a "\n", a program that calls run itself once.
func probe(t *testing.T, s *server, sb, code string) outcome {
	t.Helper()
	outs, err := tryProbes(s, sb, code)
	if err != nil {
		t.Fatal(err)
	}
	return outs[0]
}

// tryProbes runs the codes in order in one exec (one Python start: on a
// loaded host each costs more than the probe) and returns their outcomes.
// It may run in a goroutine other than the test's.
func tryProbes(s *server, sb string, codes ...string) ([]outcome, error) {
	prog := probeLib
	for _, code := range codes {
		if strings.Contains(code, "\n") {
			prog += code + "\n"
		} else {
			prog += "run(lambda: " + code + ")\n"
		}
	}
	r, err := s.exec(sb, []string{"python3", "-"}, prog, nil, 120)
	if err != nil {
		return nil, fmt.Errorf("exec in %s: %w", sb, err)
	}
	var outs []outcome
	for _, l := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		var o outcome
		if err := json.Unmarshal([]byte(l), &o); err != nil {
			break
		}
		outs = append(outs, o)
	}
	if len(outs) != len(codes) {
		return nil, fmt.Errorf("probes %q in %s: %d outcomes of %d: exit %d, stdout %q, stderr %q", codes, sb, len(outs), len(codes), r.ExitCode, r.Stdout, r.Stderr)
	}
	return outs, nil
}

// fastDenial is the bound on a refusal, measured inside the sandbox: a
// denial is a clear error at once, never a hang until a timeout.
const fastDenial = 3 * time.Second

// label names a probe in messages: the expression, or a program's
// function.
func label(code string) string {
	for _, l := range strings.Split(code, "\n") {
		if f, ok := strings.CutPrefix(l, "def "); ok {
			return f
		}
	}
	return code
}

// check is one probe and what it must do: succeed with a result that
// contains want, or (deny) fail with a network error within fastDenial.
type check struct {
	code, want string
	deny       bool
}

func allow(code, want string) check { return check{code: code, want: want} }
func deny(code string) check        { return check{code: code, deny: true} }

// checks runs cs in order in sandbox sb, in one exec, and asserts each.
func checks(t *testing.T, s *server, sb string, cs ...check) []outcome {
	t.Helper()
	codes := make([]string, len(cs))
	for i, c := range cs {
		codes[i] = c.code
	}
	outs, err := tryProbes(s, sb, codes...)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range cs {
		o, code := outs[i], label(c.code)
		switch {
		case !c.deny:
			if !o.OK || !strings.Contains(string(o.Result), c.want) {
				t.Errorf("%s in %s: %v, want a result containing %q", code, sb, o, c.want)
			}
		case o.OK:
			t.Errorf("%s in %s: %v, want a denial", code, sb, o)
		case !o.OSError:
			t.Errorf("%s in %s: the probe itself failed: %s", code, sb, o.Error)
		case time.Duration(o.Elapsed*float64(time.Second)) > fastDenial:
			t.Errorf("%s in %s: denied, but after %.2fs (bound %v): %s", code, sb, o.Elapsed, fastDenial, o.Error)
		default:
			t.Logf("%s in %s: denied in %.3fs: %s", code, sb, o.Elapsed, o.Error)
		}
	}
	return outs
}

// mustAllow: the probe worked and its text result contains want.
func mustAllow(t *testing.T, s *server, sb, code, want string) outcome {
	t.Helper()
	return checks(t, s, sb, allow(code, want))[0]
}

// mustDeny: the probe failed with a network error, fast.
func mustDeny(t *testing.T, s *server, sb, code string) outcome {
	t.Helper()
	return checks(t, s, sb, deny(code))[0]
}

// py quotes a Go string as a Python string literal.
func py(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
