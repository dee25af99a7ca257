package resolver

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/warren-sandbox/warren/internal/egress"
)

// handle answers one query from sandbox sb: the answer to send back, or
// nil when the query gets none (not a query at all). The answer is at
// most 512 bytes whatever the query. The caller has admitted the query
// under sb's limits.
func (s *Server) handle(ctx context.Context, sb Sandbox, msg []byte) []byte {
	start := s.cfg.Now()
	if len(msg) > MaxQuery {
		s.n.malformed.Add(1)
		return nil
	}
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil || h.Response {
		// Too short to answer, or an answer: replying to answers is how
		// two resolvers end up bouncing packets forever.
		s.n.malformed.Add(1)
		return nil
	}
	lg := logEntry{s: s, sb: sb, start: start}
	if n := binary.BigEndian.Uint16(msg[4:6]); n != 1 {
		s.n.malformed.Add(1)
		lg.deny(fmt.Sprintf("malformed: %d questions", n))
		return reply(h, nil, dnsmessage.RCodeFormatError, false, nil, 0)
	}
	q, err := p.Question()
	if err != nil {
		s.n.malformed.Add(1)
		lg.deny("malformed: " + err.Error())
		return reply(h, nil, dnsmessage.RCodeFormatError, false, nil, 0)
	}
	lg.name = printable(q.Name)
	edns, err := hasEDNS(&p)
	if err != nil {
		s.n.malformed.Add(1)
		lg.deny("malformed: " + err.Error())
		return reply(h, &q, dnsmessage.RCodeFormatError, false, nil, 0)
	}
	if h.OpCode != 0 {
		s.n.refused.Add(1)
		lg.deny(fmt.Sprintf("opcode %d not served", h.OpCode))
		return reply(h, &q, dnsmessage.RCodeNotImplemented, edns, nil, 0)
	}
	name, labels, why := canonical(q.Name)
	if why != "" {
		s.n.refused.Add(1)
		lg.deny("invalid name: " + why)
		return reply(h, &q, dnsmessage.RCodeRefused, edns, nil, 0)
	}
	lg.name = name
	if len(name) > longName || labels > manyLabels {
		s.n.longNames.Add(1)
		lg.note = fmt.Sprintf("long name (%d bytes, %d labels)", len(name), labels)
	}
	if q.Class != dnsmessage.ClassINET {
		s.n.refused.Add(1)
		lg.deny(fmt.Sprintf("class %d not served", q.Class))
		return reply(h, &q, dnsmessage.RCodeRefused, edns, nil, 0)
	}
	if q.Type != dnsmessage.TypeA && q.Type != dnsmessage.TypeAAAA {
		// TXT, NULL, MX, ANY...: what DNS tunnels carry data in, and
		// nothing a sandbox needs to open a connection.
		s.n.refused.Add(1)
		lg.deny("type " + typeName(q.Type) + " not served")
		return reply(h, &q, dnsmessage.RCodeRefused, edns, nil, 0)
	}
	rule, ok := sb.AllowName(name)
	if !ok {
		s.n.denied.Add(1)
		lg.deny("name not allowed")
		return reply(h, &q, dnsmessage.RCodeNameError, edns, nil, 0)
	}
	lg.rule = rule
	if q.Type == dnsmessage.TypeAAAA {
		s.n.allowed.Add(1)
		lg.allow("AAAA: no IPv6 out of a sandbox, empty answer", nil)
		return reply(h, &q, dnsmessage.RCodeSuccess, edns, nil, 0)
	}

	a, err := s.lookup(ctx, name, start)
	if err != nil {
		s.n.servFail.Add(1)
		lg.allow("SERVFAIL: "+err.Error(), nil)
		return reply(h, &q, dnsmessage.RCodeServerFailure, edns, nil, 0)
	}
	if a.nx {
		s.n.allowed.Add(1)
		lg.allow("NXDOMAIN upstream", nil)
		return reply(h, &q, dnsmessage.RCodeNameError, edns, nil, 0)
	}
	ttl := clampTTL(a.expires.Sub(start).Truncate(time.Second))
	var given []netip.Addr
	var refused []string
	dropped := 0
	for _, ad := range a.addrs {
		if why, bad := sb.Rebinding(name, ad); bad {
			if dropped++; len(refused) < MaxAnswers {
				if !strings.Contains(why, ad.String()) { // the record names the address
					why = ad.String() + " " + why
				}
				refused = append(refused, why)
			}
			continue
		}
		if len(given) < MaxAnswers {
			given = append(given, ad)
		}
	}
	if err := sb.Pin(name, given, ttl); err != nil {
		// The host's gate would refuse connections to these addresses:
		// an answer would only mislead.
		s.n.servFail.Add(1)
		lg.allow("SERVFAIL: the host's gate did not open: "+err.Error(), nil)
		return reply(h, &q, dnsmessage.RCodeServerFailure, edns, nil, 0)
	}
	if dropped > len(refused) {
		refused = append(refused, fmt.Sprintf("%d more", dropped-len(refused)))
	}
	switch {
	case dropped > 0 && len(given) == 0:
		s.n.rebinding.Add(1)
		lg.deny("rebinding: " + strings.Join(refused, ", "))
	case dropped > 0:
		s.n.rebinding.Add(1)
		s.n.allowed.Add(1)
		lg.allow("rebinding, dropped: "+strings.Join(refused, ", "), given)
	case len(given) == 0:
		s.n.allowed.Add(1)
		lg.allow("no address upstream", nil)
	default:
		s.n.allowed.Add(1)
		lg.allow("", given)
	}
	return reply(h, &q, dnsmessage.RCodeSuccess, edns, given, ttl)
}

// logEntry builds the one log record of a query.
type logEntry struct {
	s     *Server
	sb    Sandbox
	start time.Time
	name  string
	rule  string
	note  string // appended to the reason (a long name)
}

func (l *logEntry) deny(reason string) { l.verdict("deny", reason, nil) }

func (l *logEntry) allow(reason string, addrs []netip.Addr) { l.verdict("allow", reason, addrs) }

func (l *logEntry) verdict(v, reason string, addrs []netip.Addr) {
	if l.note != "" {
		if reason != "" {
			reason += "; "
		}
		reason += l.note
	}
	as := make([]string, len(addrs))
	for i, a := range addrs {
		as[i] = a.String()
	}
	r := egress.Record{
		Time: l.start, Kind: "dns", Name: l.name, Addr: strings.Join(as, ","),
		Verdict: v, Reason: reason, Duration: float64(l.s.cfg.Now().Sub(l.start).Microseconds()) / 1000,
	}
	if v == "allow" {
		r.Rule = l.rule
	}
	l.sb.Record(r)
}

// hasEDNS reads the rest of a query after its question and reports whether
// it carries an EDNS0 OPT record (whose answer must carry one too).
func hasEDNS(p *dnsmessage.Parser) (bool, error) {
	if err := p.SkipAllQuestions(); err != nil {
		return false, err
	}
	if err := p.SkipAllAnswers(); err != nil {
		return false, err
	}
	if err := p.SkipAllAuthorities(); err != nil {
		return false, err
	}
	edns := false
	for {
		rh, err := p.AdditionalHeader()
		if errors.Is(err, dnsmessage.ErrSectionDone) {
			return edns, nil
		}
		if err != nil {
			return false, err
		}
		if rh.Type == dnsmessage.TypeOPT {
			edns = true
		}
		if err := p.SkipAdditional(); err != nil {
			return false, err
		}
	}
}

// canonical returns a question's name lowercased without its trailing
// dot, and its label count; or why it is not a host name.
func canonical(n dnsmessage.Name) (string, int, string) {
	d := n.Data[:n.Length]
	if len(d) <= 1 {
		return "", 0, "root"
	}
	d = d[:len(d)-1] // dnsmessage ends every name with a dot
	if len(d) > 253 {
		return "", 0, fmt.Sprintf("%d bytes, more than 253", len(d))
	}
	b := make([]byte, len(d))
	labels, ll := 1, 0
	for i, c := range d {
		switch {
		case c == '.':
			if ll == 0 {
				return "", 0, "empty label"
			}
			labels, ll = labels+1, 0
			b[i] = c
			continue
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '_':
		default:
			return "", 0, fmt.Sprintf("byte 0x%02x in a label", c)
		}
		if ll++; ll > 63 {
			return "", 0, "label longer than 63 bytes"
		}
		b[i] = c
	}
	if ll == 0 {
		return "", 0, "empty label"
	}
	return string(b), labels, ""
}

// printable is a name for the log whatever bytes it holds: bytes outside
// host-name characters escaped, at most 300 bytes.
func printable(n dnsmessage.Name) string {
	var sb strings.Builder
	for _, c := range n.Data[:n.Length] {
		if sb.Len() >= 300 {
			sb.WriteString("...")
			break
		}
		if c > ' ' && c < 0x7f && c != '\\' {
			sb.WriteByte(c)
		} else {
			fmt.Fprintf(&sb, "\\x%02x", c)
		}
	}
	return sb.String()
}

func typeName(t dnsmessage.Type) string {
	s := t.String()
	return strings.TrimPrefix(s, "Type")
}

// reply builds an answer to a query with header h and question q (nil when
// the question could not be read). An OPT record is added when the query
// had one. A question that cannot be packed again (an invalid name) is
// left out.
func reply(h dnsmessage.Header, q *dnsmessage.Question, rc dnsmessage.RCode, edns bool, addrs []netip.Addr, ttl time.Duration) []byte {
	rh := dnsmessage.Header{
		ID: h.ID, Response: true, OpCode: h.OpCode, RCode: rc,
		RecursionDesired: h.RecursionDesired, RecursionAvailable: true,
		// Warren is the authority on what a sandbox may resolve.
		Authoritative: rc == dnsmessage.RCodeNameError,
	}
	if q != nil {
		if out, err := build(rh, q, edns, addrs, ttl); err == nil {
			return out
		}
	}
	out, err := build(rh, nil, false, nil, 0)
	if err != nil {
		return nil // a header alone always packs
	}
	return out
}

func build(h dnsmessage.Header, q *dnsmessage.Question, edns bool, addrs []netip.Addr, ttl time.Duration) ([]byte, error) {
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), h)
	b.EnableCompression()
	if q != nil {
		if err := b.StartQuestions(); err != nil {
			return nil, err
		}
		if err := b.Question(*q); err != nil {
			return nil, err
		}
	}
	if len(addrs) > 0 {
		if err := b.StartAnswers(); err != nil {
			return nil, err
		}
		for _, a := range addrs {
			rh := dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: uint32(ttl / time.Second)} //nolint:gosec // G115: ttl is at most MaxTTL
			if err := b.AResource(rh, dnsmessage.AResource{A: a.As4()}); err != nil {
				return nil, err
			}
		}
	}
	if edns {
		if err := addEDNS(&b); err != nil {
			return nil, err
		}
	}
	return b.Finish()
}

// addEDNS ends b with an OPT record announcing ednsSize.
func addEDNS(b *dnsmessage.Builder) error {
	if err := b.StartAdditionals(); err != nil {
		return err
	}
	var rh dnsmessage.ResourceHeader
	if err := rh.SetEDNS0(ednsSize, dnsmessage.RCodeSuccess, false); err != nil {
		return err
	}
	return b.OPTResource(rh, dnsmessage.OPTResource{})
}
