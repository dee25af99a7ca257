package backend

import (
	"strings"
	"testing"
)

// TestParsePort: microsandbox's forms of a published port, "HOST:GUEST"
// and "PORT", and nothing else.
func TestParsePort(t *testing.T) {
	ok := map[string]PortMapping{
		"8080:80":    {8080, 80},
		"8080":       {8080, 8080},
		"8080:8080":  {8080, 8080},
		"1:65535":    {1, 65535},
		"00080:0443": {80, 443},
	}
	for s, want := range ok {
		if got, err := ParsePort(s); err != nil || got != want {
			t.Errorf("%q: %+v %v, want %+v", s, got, err, want)
		}
	}
	for _, s := range []string{"", ":", ":80", "80:", "0", "0:80", "80:0", "65536", "65536:80", "80/tcp", "8080:80/tcp",
		"a:80", "+80", "-80", " 80", "80:80:80", "127.0.0.1:80:80", "0x50", "800000"} {
		if p, err := ParsePort(s); err == nil || !strings.Contains(err.Error(), "HOST:GUEST") {
			t.Errorf("%q: %+v %v, want an error showing the form", s, p, err)
		}
	}
}

// FuzzParsePort: parsing never panics, and an accepted port round-trips
// through its string form.
func FuzzParsePort(f *testing.F) {
	for _, s := range []string{"8080:80", "80", "0:1", "65535:65536", "1:2:3", "99999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePort(s)
		if err != nil {
			return
		}
		if p.Host == 0 || p.Guest == 0 {
			t.Fatalf("%q: accepted port 0: %+v", s, p)
		}
		if q, err := ParsePort(p.String()); err != nil || q != p {
			t.Fatalf("%q: %s does not round-trip: %+v %v", s, p, q, err)
		}
	})
}

// TestPortsNeedANetwork: published ports are checked, and refused without
// the sandbox network (dropping them would be silent).
func TestPortsNeedANetwork(t *testing.T) {
	for _, network := range []string{"", "none"} {
		c := Config{Network: network, Ports: []PortMapping{{8080, 80}}}
		err := c.CheckSettings()
		if err == nil || !strings.Contains(err.Error(), "8080:80") || !strings.Contains(err.Error(), "network") {
			t.Errorf("network %q with a port: %v, want a refusal naming the port and the network", network, err)
		}
	}
	if err := (&Config{Network: NetworkEgress, Ports: []PortMapping{{8080, 80}}}).CheckSettings(); err != nil {
		t.Errorf("network egress with a port: %v", err)
	}
	if err := (&Config{Network: "none"}).CheckSettings(); err != nil {
		t.Errorf("no ports: %v", err)
	}
	many := make([]PortMapping, MaxPorts+1)
	for i := range many {
		many[i] = PortMapping{uint16(1000 + i), 80}
	}
	for name, ps := range map[string][]PortMapping{
		"too many":     many,
		"host twice":   {{8080, 80}, {8080, 81}},
		"port 0":       {{0, 80}},
		"guest port 0": {{80, 0}},
	} {
		err := ValidatePorts(ps)
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if e2 := (&Config{Network: NetworkEgress, Ports: ps}).CheckSettings(); e2 == nil || !strings.Contains(e2.Error(), err.Error()) {
			t.Errorf("%s: CheckSettings says %v, want %v", name, e2, err)
		}
	}
	if err := ValidatePorts([]PortMapping{{8080, 80}, {8081, 80}}); err != nil {
		t.Errorf("two host ports to one guest port: %v", err)
	}
}
