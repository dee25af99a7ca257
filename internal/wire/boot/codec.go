package boot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The config travels in a compact binary form rather than as JSON: a fresh
// agent decodes it before anything else, and encoding/json's first decode
// of a type builds its reflection caches, 0.2-0.3 ms of CPU on every start
// (BenchmarkFirstConfigDecode compares the two). Both ends are the same
// warren build (the agent is embedded in it), so the form only has to be
// unambiguous and checked, not stable across versions; configMagic's last
// byte is its version all the same.
//
// The form: configMagic, then the Config's fields in declaration order.
// A string or byte slice is its length as a uvarint and its bytes; a slice
// is its length as a uvarint and its elements (no elements decodes as nil);
// a pointer is a presence byte (0 or 1) and, when 1, what it points to; a
// bool is one byte, 0 or 1; an integer is a uvarint.
var configMagic = []byte("WCF1")

// encodeConfig returns c in the binary form.
func encodeConfig(c *Config) []byte {
	e := &encoder{b: append([]byte(nil), configMagic...)}
	e.spec(c.Spec)
	e.bytes(c.SeccompFilter)
	e.strs(c.Rootfs.Lower)
	e.str(c.Rootfs.Dir)
	e.str(c.Rootfs.Upper)
	e.str(c.Rootfs.Work)
	e.bool(c.Rootfs.UserXattr)
	e.str(c.Python)
	e.str(c.Node)
	e.str(c.User)
	e.bool(c.Lifeline)
	e.str(c.Nameserver)
	e.bytes(c.TrustCA)
	e.uint(uint64(c.Procs))
	e.uint(c.TimerSlack)
	e.bool(c.Prepared)
	e.bool(c.ConnsByFD)
	return e.b
}

// decodeConfig parses the binary form. Any malformation, including bytes
// left over, is an error; nothing the input says is allocated beyond what
// the input itself holds.
func decodeConfig(b []byte) (*Config, error) {
	if !bytes.HasPrefix(b, configMagic) {
		return nil, errors.New("config: not a warren config (is the host a matching warren?)")
	}
	d := &decoder{b: b[len(configMagic):]}
	c := &Config{Spec: d.spec(), SeccompFilter: d.bytes()}
	c.Rootfs.Lower = d.strs()
	c.Rootfs.Dir = d.str()
	c.Rootfs.Upper = d.str()
	c.Rootfs.Work = d.str()
	c.Rootfs.UserXattr = d.bool()
	c.Python = d.str()
	c.Node = d.str()
	c.User = d.str()
	c.Lifeline = d.bool()
	c.Nameserver = d.str()
	c.TrustCA = d.bytes()
	c.Procs = d.uint32()
	c.TimerSlack = d.uint()
	c.Prepared = d.bool()
	c.ConnsByFD = d.bool()
	if d.err == nil && len(d.b) > 0 {
		d.fail(fmt.Sprintf("%d bytes after the end", len(d.b)))
	}
	if d.err != nil {
		return nil, d.err
	}
	return c, nil
}

type encoder struct{ b []byte }

func (e *encoder) uint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }

func (e *encoder) bool(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}

func (e *encoder) str(s string) {
	e.uint(uint64(len(s)))
	e.b = append(e.b, s...)
}

func (e *encoder) bytes(v []byte) {
	e.uint(uint64(len(v)))
	e.b = append(e.b, v...)
}

func (e *encoder) strs(v []string) {
	e.uint(uint64(len(v)))
	for _, s := range v {
		e.str(s)
	}
}

func (e *encoder) idMaps(v []specs.LinuxIDMapping) {
	e.uint(uint64(len(v)))
	for _, m := range v {
		e.uint(uint64(m.ContainerID))
		e.uint(uint64(m.HostID))
		e.uint(uint64(m.Size))
	}
}

func (e *encoder) spec(s *Spec) {
	e.bool(s != nil)
	if s == nil {
		return
	}
	e.bool(s.Root != nil)
	if s.Root != nil {
		e.str(s.Root.Path)
		e.bool(s.Root.Readonly)
	}
	e.str(s.Hostname)
	e.uint(uint64(len(s.Mounts)))
	for _, m := range s.Mounts {
		e.str(m.Destination)
		e.str(m.Type)
		e.str(m.Source)
		e.strs(m.Options)
		e.idMaps(m.UIDMappings)
		e.idMaps(m.GIDMappings)
	}
	e.bool(s.Process != nil)
	if p := s.Process; p != nil {
		e.strs(p.Env)
		e.str(p.Cwd)
		e.bool(p.Capabilities != nil)
		if c := p.Capabilities; c != nil {
			e.strs(c.Bounding)
			e.strs(c.Effective)
			e.strs(c.Inheritable)
			e.strs(c.Permitted)
			e.strs(c.Ambient)
		}
		e.uint(uint64(len(p.Rlimits)))
		for _, r := range p.Rlimits {
			e.str(r.Type)
			e.uint(r.Hard)
			e.uint(r.Soft)
		}
		e.bool(p.NoNewPrivileges)
	}
	e.bool(s.Linux != nil)
	if l := s.Linux; l != nil {
		e.uint(uint64(len(l.Namespaces)))
		for _, ns := range l.Namespaces {
			e.str(string(ns.Type))
			e.str(ns.Path)
		}
		e.strs(l.MaskedPaths)
		e.strs(l.ReadonlyPaths)
	}
}

// decoder reads the binary form; the first error sticks, and every read
// after it returns a zero value.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("config: %s", what)
	}
}

func (d *decoder) uint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("truncated or overlong integer")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) uint32() uint32 {
	v := d.uint()
	if v > math.MaxUint32 {
		d.fail("integer out of range")
		return 0
	}
	return uint32(v)
}

// count reads a length. Every element takes at least one byte, so a count
// beyond the bytes left is a lie, and refused before anything is allocated.
func (d *decoder) count() int {
	n := d.uint()
	if n > uint64(len(d.b)) {
		d.fail("length beyond the end of the data")
		return 0
	}
	return int(n) //nolint:gosec // n <= len(d.b), checked just above
}

func (d *decoder) bool() bool {
	if d.err != nil {
		return false
	}
	if len(d.b) == 0 {
		d.fail("truncated")
		return false
	}
	v := d.b[0]
	d.b = d.b[1:]
	if v > 1 {
		d.fail("bad boolean")
	}
	return v == 1
}

func (d *decoder) raw() []byte {
	n := d.count()
	if d.err != nil {
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) str() string { return string(d.raw()) }

func (d *decoder) bytes() []byte {
	if v := d.raw(); len(v) > 0 {
		return bytes.Clone(v)
	}
	return nil
}

func (d *decoder) strs() []string {
	n := d.count()
	if n == 0 {
		return nil
	}
	v := make([]string, n)
	for i := range v {
		v[i] = d.str()
	}
	return v
}

func (d *decoder) idMaps() []specs.LinuxIDMapping {
	n := d.count()
	if n == 0 {
		return nil
	}
	v := make([]specs.LinuxIDMapping, n)
	for i := range v {
		v[i] = specs.LinuxIDMapping{ContainerID: d.uint32(), HostID: d.uint32(), Size: d.uint32()}
	}
	return v
}

func (d *decoder) spec() *Spec {
	if !d.bool() {
		return nil
	}
	s := &Spec{}
	if d.bool() {
		s.Root = &specs.Root{Path: d.str(), Readonly: d.bool()}
	}
	s.Hostname = d.str()
	if n := d.count(); n > 0 {
		s.Mounts = make([]specs.Mount, n)
		for i := range s.Mounts {
			s.Mounts[i] = specs.Mount{Destination: d.str(), Type: d.str(), Source: d.str(), Options: d.strs(),
				UIDMappings: d.idMaps(), GIDMappings: d.idMaps()}
		}
	}
	if d.bool() {
		p := &Process{Env: d.strs(), Cwd: d.str()}
		if d.bool() {
			p.Capabilities = &specs.LinuxCapabilities{Bounding: d.strs(), Effective: d.strs(),
				Inheritable: d.strs(), Permitted: d.strs(), Ambient: d.strs()}
		}
		if n := d.count(); n > 0 {
			p.Rlimits = make([]specs.POSIXRlimit, n)
			for i := range p.Rlimits {
				p.Rlimits[i] = specs.POSIXRlimit{Type: d.str(), Hard: d.uint(), Soft: d.uint()}
			}
		}
		p.NoNewPrivileges = d.bool()
		s.Process = p
	}
	if d.bool() {
		l := &Linux{}
		if n := d.count(); n > 0 {
			l.Namespaces = make([]specs.LinuxNamespace, n)
			for i := range l.Namespaces {
				l.Namespaces[i] = specs.LinuxNamespace{Type: specs.LinuxNamespaceType(d.str()), Path: d.str()}
			}
		}
		l.MaskedPaths = d.strs()
		l.ReadonlyPaths = d.strs()
		s.Linux = l
	}
	if d.err != nil {
		return nil
	}
	return s
}
