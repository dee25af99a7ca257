package backend

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// PortMapping publishes a port of the sandbox on the host: connections to
// Host on the host reach Guest inside the sandbox.
type PortMapping struct {
	Host  uint16 `json:"host"`
	Guest uint16 `json:"guest"`
}

// MaxPorts bounds a sandbox's published ports.
const MaxPorts = 64

// ParsePort reads microsandbox's (and Docker's short) form of a published
// port: "HOST:GUEST", or "PORT" for the same number on both sides. Ports
// are 1-65535 in decimal; microsandbox takes no protocol suffix, nor does
// this.
func ParsePort(s string) (PortMapping, error) {
	host, guest, pair := strings.Cut(s, ":")
	if !pair {
		guest = host
	}
	h, herr := portNumber(host)
	g, gerr := portNumber(guest)
	if herr != nil || gerr != nil {
		return PortMapping{}, fmt.Errorf("port %.40q: want HOST:GUEST or PORT, each 1-65535 (like \"8080:80\")", s)
	}
	return PortMapping{Host: h, Guest: g}, nil
}

func portNumber(s string) (uint16, error) {
	if s == "" || len(s) > 5 || strings.Trim(s, "0123456789") != "" {
		return 0, errors.New("not a port number")
	}
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, errors.New("not a port number")
	}
	return uint16(n), nil
}

// String is the HOST:GUEST form.
func (p PortMapping) String() string { return fmt.Sprintf("%d:%d", p.Host, p.Guest) }

// ValidatePorts checks a sandbox's published ports together: at most
// MaxPorts, none 0, no host port twice.
func ValidatePorts(ps []PortMapping) error {
	if len(ps) > MaxPorts {
		return fmt.Errorf("ports: %d, at most %d", len(ps), MaxPorts)
	}
	seen := map[uint16]bool{}
	for _, p := range ps {
		if p.Host == 0 || p.Guest == 0 {
			return fmt.Errorf("port %s: ports are 1-65535", p)
		}
		if seen[p.Host] {
			return fmt.Errorf("port %s: host port %d given twice", p, p.Host)
		}
		seen[p.Host] = true
	}
	return nil
}
