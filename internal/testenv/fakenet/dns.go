package fakenet

import (
	"encoding/binary"
	"io"
	"net"
	"strings"

	"golang.org/x/net/dns/dnsmessage"
)

// answer is the authoritative answer to one query message: for the zone
// "test.", the name's records of the asked type (NXDOMAIN for a name the
// zone lacks; an empty answer for a type the name lacks); REFUSED outside
// the zone; FORMERR for what does not parse.
func (in *Internet) answer(query []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil, false
	}
	q, err := p.Question()
	resp := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired}
	if err != nil {
		resp.RCode = dnsmessage.RCodeFormatError
		b := dnsmessage.NewBuilder(nil, resp)
		out, err := b.Finish()
		return out, err == nil
	}
	name := canonical(q.Name.String())
	in.noteQuery(name)
	var answers []dnsmessage.Resource
	hdr := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60}
	a4, ok4 := zone[name]
	a6, ok6 := zone6[name]
	tunnel := strings.HasSuffix(name, "."+TunnelSuffix)
	switch {
	case !strings.HasSuffix(name, ".test") && name != "test":
		resp.RCode = dnsmessage.RCodeRefused
		resp.Authoritative = false
	case tunnel || ok4 || ok6 || name == "test":
		switch q.Type {
		case dnsmessage.TypeA:
			if ok4 {
				answers = append(answers, dnsmessage.Resource{Header: hdr, Body: &dnsmessage.AResource{A: a4.As4()}})
			} else if tunnel {
				answers = append(answers, dnsmessage.Resource{Header: hdr, Body: &dnsmessage.AResource{A: zone[TunnelSuffix].As4()}})
			}
		case dnsmessage.TypeAAAA:
			if ok6 {
				answers = append(answers, dnsmessage.Resource{Header: hdr, Body: &dnsmessage.AAAAResource{AAAA: a6.As16()}})
			}
		case dnsmessage.TypeTXT:
			// A tunnel's server answers with data: here the first label.
			first, _, _ := strings.Cut(name, ".")
			answers = append(answers, dnsmessage.Resource{Header: hdr, Body: &dnsmessage.TXTResource{TXT: []string{first}}})
		case dnsmessage.TypeMX:
			mx, err := dnsmessage.NewName("mail." + name + ".")
			if err == nil {
				answers = append(answers, dnsmessage.Resource{Header: hdr, Body: &dnsmessage.MXResource{Pref: 10, MX: mx}})
			}
		}
	default:
		resp.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), resp)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, false
	}
	if err := b.Question(q); err != nil {
		return nil, false
	}
	if err := b.StartAnswers(); err != nil {
		return nil, false
	}
	for _, a := range answers {
		var err error
		switch body := a.Body.(type) {
		case *dnsmessage.AResource:
			err = b.AResource(a.Header, *body)
		case *dnsmessage.AAAAResource:
			err = b.AAAAResource(a.Header, *body)
		case *dnsmessage.TXTResource:
			err = b.TXTResource(a.Header, *body)
		case *dnsmessage.MXResource:
			err = b.MXResource(a.Header, *body)
		}
		if err != nil {
			return nil, false
		}
	}
	out, err := b.Finish()
	return out, err == nil
}

func (in *Internet) dnsUDP(pc net.PacketConn) { serveUDP(pc, in.answer) }

// dnsTCP serves length-prefixed queries (RFC 1035 4.2.2) until the client
// closes.
func (in *Internet) dnsTCP(c net.Conn) {
	for {
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return
		}
		q := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, q); err != nil {
			return
		}
		out, ok := in.answer(q)
		if !ok {
			return
		}
		msg := binary.BigEndian.AppendUint16(nil, uint16(len(out))) //nolint:gosec // an answer is far below 64 KiB
		if _, err := c.Write(append(msg, out...)); err != nil {
			return
		}
	}
}
