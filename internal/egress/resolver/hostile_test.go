package resolver

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// raw is a DNS message from its header fields and the bytes after them.
func raw(id, flags, qd, an, ns, ar uint16, body ...[]byte) []byte {
	m := make([]byte, 12)
	for i, v := range []uint16{id, flags, qd, an, ns, ar} {
		binary.BigEndian.PutUint16(m[2*i:], v)
	}
	for _, b := range body {
		m = append(m, b...)
	}
	return m
}

// wireName is a name in wire form from its labels (no compression).
func wireName(labels ...string) []byte {
	var b []byte
	for _, l := range labels {
		b = append(b, byte(len(l)))
		b = append(b, l...)
	}
	return append(b, 0)
}

var (
	typeA   = []byte{0, 1, 0, 1} // QTYPE A, QCLASS IN
	classCH = []byte{0, 1, 0, 3}
	rd      = uint16(0x0100)
)

// hostile are queries a sandbox can send, and the answer each gets (-1:
// none).
var hostile = []struct {
	name string
	msg  []byte
	rc   int
	why  string // in the log record's reason; "" when none is written
}{
	{"empty", nil, -1, ""},
	{"short header", []byte{1, 2, 3, 4, 5}, -1, ""},
	{"an answer", raw(7, 0x8000, 1, 0, 0, 0, wireName("allowed", "test"), typeA), -1, ""},
	{"oversized", raw(7, rd, 1, 0, 0, 0, wireName("allowed", "test"), typeA, make([]byte, MaxQuery)), -1, ""},
	{"no question", raw(7, rd, 0, 0, 0, 0), int(dnsmessage.RCodeFormatError), "0 questions"},
	{"two questions", raw(7, rd, 2, 0, 0, 0, wireName("allowed", "test"), typeA, wireName("allowed", "test"), typeA), int(dnsmessage.RCodeFormatError), "2 questions"},
	{"question missing", raw(7, rd, 1, 0, 0, 0), int(dnsmessage.RCodeFormatError), "malformed"},
	{"question cut short", raw(7, rd, 1, 0, 0, 0, wireName("allowed", "test")[:5]), int(dnsmessage.RCodeFormatError), "malformed"},
	{"compression loop", raw(7, rd, 1, 0, 0, 0, []byte{0xc0, 12}, typeA), int(dnsmessage.RCodeFormatError), "malformed"},
	{"pointer out of the message", raw(7, rd, 1, 0, 0, 0, []byte{0xc1, 0xff}, typeA), int(dnsmessage.RCodeFormatError), "malformed"},
	{"reserved label type", raw(7, rd, 1, 0, 0, 0, []byte{0x40, 0}, typeA), int(dnsmessage.RCodeFormatError), "malformed"},
	{"name over 255 bytes", raw(7, rd, 1, 0, 0, 0, wireName(strings.Repeat("a", 63), strings.Repeat("b", 63), strings.Repeat("c", 63), strings.Repeat("d", 63)), typeA), int(dnsmessage.RCodeFormatError), "malformed"},
	{"name over 253 bytes", raw(7, rd, 1, 0, 0, 0, wireName(strings.Repeat("a", 63), strings.Repeat("b", 63), strings.Repeat("c", 63), strings.Repeat("d", 62)), typeA), int(dnsmessage.RCodeFormatError), "malformed"},
	{"name of 253 bytes", raw(7, rd, 1, 0, 0, 0, wireName(strings.Repeat("a", 63), strings.Repeat("b", 63), strings.Repeat("c", 63), strings.Repeat("d", 61)), typeA), int(dnsmessage.RCodeNameError), "long name (253 bytes, 4 labels)"},
	{"NUL in a label", raw(7, rd, 1, 0, 0, 0, wireName("allowed\x00", "test"), typeA), int(dnsmessage.RCodeRefused), "invalid name: byte 0x00"},
	{"binary label", raw(7, rd, 1, 0, 0, 0, wireName("\xff\xfe\x01", "allowed", "test"), typeA), int(dnsmessage.RCodeRefused), "invalid name: byte 0xff"},
	{"wildcard label", raw(7, rd, 1, 0, 0, 0, wireName("*", "test"), typeA), int(dnsmessage.RCodeRefused), "invalid name: byte 0x2a"},
	{"root", raw(7, rd, 1, 0, 0, 0, wireName(), typeA), int(dnsmessage.RCodeRefused), "invalid name: root"},
	{"class CH", raw(7, rd, 1, 0, 0, 0, wireName("allowed", "test"), classCH), int(dnsmessage.RCodeRefused), "class 3"},
	{"opcode STATUS", raw(7, rd|2<<11, 1, 0, 0, 0, wireName("allowed", "test"), typeA), int(dnsmessage.RCodeNotImplemented), "opcode 2"},
	{"additional cut short", raw(7, rd, 1, 0, 0, 1, wireName("allowed", "test"), typeA, []byte{0, 0, 41}), int(dnsmessage.RCodeFormatError), "malformed"},
	{"counts beyond the message", raw(7, rd, 1, 0xffff, 0xffff, 0xffff, wireName("allowed", "test"), typeA), int(dnsmessage.RCodeFormatError), "malformed"},
	{"well formed", raw(7, rd, 1, 0, 0, 0, wireName("ALLOWED", "test"), typeA), int(dnsmessage.RCodeSuccess), ""},
}

func TestHostileQueries(t *testing.T) {
	s, _, sb := setup(t, Config{})
	for _, c := range hostile {
		t.Run(c.name, func(t *testing.T) {
			before := len(sb.records())
			m, err := exchangeUDP(t, s.udp, sbAddr, c.msg, 300*time.Millisecond)
			if c.rc < 0 {
				if !errors.Is(err, errNoAnswer) {
					t.Fatalf("answered: % x", m)
				}
				if len(sb.records()) != before {
					t.Fatalf("logged %+v", sb.records()[before:])
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(m) > 512 {
				t.Fatalf("answer of %d bytes", len(m))
			}
			var p dnsmessage.Parser
			h, err := p.Start(m)
			if err != nil || h.ID != 7 || !h.Response || int(h.RCode) != c.rc {
				t.Fatalf("answer %+v %v, want rcode %d", h, err, c.rc)
			}
			rs := sb.records()
			if len(rs) != before+1 {
				t.Fatalf("%d log records", len(rs)-before)
			}
			if r := rs[before]; c.why != "" && (r.Verdict != "deny" || !strings.Contains(r.Reason, c.why)) {
				t.Fatalf("record %+v, want reason %q", r, c.why)
			}
		})
	}
	// Nothing got near a name the sandbox may not have.
	if pins := sb.pinned(); len(pins) != 2 {
		t.Fatalf("pins %+v", pins)
	}
}

// FuzzQuery: whatever a sandbox sends, the handler does not panic, and
// answers with at most 512 bytes that parse and answer that query, or not
// at all.
func FuzzQuery(f *testing.F) {
	for _, c := range hostile {
		f.Add(c.msg)
	}
	f.Add(query(f, 1, "allowed.test.", dnsmessage.TypeA, true))
	f.Add(query(f, 1, "allowed.test.", dnsmessage.TypeAAAA, false))
	f.Add(query(f, 1, "allowed.test.", dnsmessage.TypeTXT, false))
	f.Add(query(f, 1, "denied.test.", dnsmessage.TypeA, false))
	now := time.Unix(1e9, 0)
	s, err := New(Config{
		Lookup:    func(netip.Addr) Sandbox { return nil },
		Upstreams: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:9")},
		Now:       func() time.Time { return now },
	})
	if err != nil {
		f.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	// The one allowed name is cached: fuzzing never leaves the process.
	s.cache.put("allowed.test", &answer{
		addrs:   []netip.Addr{netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("127.0.0.1")},
		expires: now.Add(time.Hour),
	}, now)
	sb := &sandbox{allow: []string{"allowed.test"}}
	f.Fuzz(func(t *testing.T, msg []byte) {
		sb.mu.Lock()
		sb.log, sb.pins = sb.log[:0], sb.pins[:0]
		sb.mu.Unlock()
		out := s.handle(t.Context(), sb, msg)
		if out == nil {
			return
		}
		if len(out) > 512 {
			t.Fatalf("answer of %d bytes", len(out))
		}
		var p dnsmessage.Parser
		h, err := p.Start(out)
		if err != nil || !h.Response || h.ID != binary.BigEndian.Uint16(msg) {
			t.Fatalf("answer %+v %v", h, err)
		}
		if len(sb.records()) != 1 {
			t.Fatalf("%d log records", len(sb.records()))
		}
		for _, pn := range sb.pinned() {
			if pn.name != "allowed.test" || pn.addr != netip.MustParseAddr("203.0.113.1") {
				t.Fatalf("pinned %+v", pn)
			}
		}
	})
}
