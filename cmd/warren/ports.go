package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"

	"github.com/warren-sandbox/warren/internal/backend"
)

const portsAbout = `
Lists, publishes and unpublishes the TCP ports of a server's sandbox on the
server's host (docs/network.md). A published port is kept with the sandbox:
every start publishes it again on the same host port, until unexposed.

  warren ports NAME                         its ports: host address and port,
                                            sandbox port, origin, published
  warren ports expose NAME [HOST:]GUEST     publish sandbox port GUEST on host
                                            port HOST (none: any free one);
                                            the sandbox must run
  warren ports unexpose NAME PORT           unpublish host port PORT for good
                                            (running or stopped)

The sandbox's program must listen on 0.0.0.0, not 127.0.0.1. Ports go on
the server's --publish-address (127.0.0.1 by default); --address chooses
loopback or that address.`

type portInfo struct {
	HostAddress string `json:"host_address"`
	HostPort    int    `json:"host_port"`
	GuestPort   int    `json:"guest_port"`
	Origin      string `json:"origin"`
	Published   bool   `json:"published"`
}

func portsCmd(ctx context.Context, args []string) error {
	name, synopsis, sub := "warren ports", "warren ports [expose|unexpose] [flags] NAME [PORT]", "list"
	want := []string{"NAME (the sandbox)"}
	if len(args) > 0 && (args[0] == "expose" || args[0] == "unexpose") {
		sub, args = args[0], args[1:]
		name = "warren ports " + sub
		synopsis = name + " [flags] NAME " + map[string]string{"expose": "[HOST:]GUEST", "unexpose": "PORT"}[sub]
		want = append(want, map[string]string{"expose": "[HOST:]GUEST (the port to publish)", "unexpose": "PORT (the host port)"}[sub])
	}
	fs := newFlagSet(name, synopsis, portsAbout)
	c, ns := clientFlags(fs)
	address := fs.String("address", "", "expose, unexpose: the host address (default: the server's publish address; unexpose: every address)")
	var lf listFlags
	lf.register(fs, "host ports")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, want...); err != nil {
		return err
	}
	ref := map[string]any{"namespace": *ns, "sandbox": pos[0]}
	if *address != "" {
		ref["address"] = *address
	}
	var list struct {
		Ports []portInfo `json:"ports"`
	}
	switch sub {
	case "list":
		if err := c.call(ctx, "sandbox.port.list", ref, &list); err != nil {
			return err
		}
	case "expose":
		host, guest, err := exposeArg(pos[1])
		if err != nil {
			return err
		}
		ref["host"], ref["guest"] = host, guest
		var p portInfo
		if err := c.call(ctx, "sandbox.port.expose", ref, &p); err != nil {
			return err
		}
		list.Ports = []portInfo{p}
	case "unexpose":
		n, err := strconv.Atoi(pos[1])
		if err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("host port %.20q: want 1-65535", pos[1])
		}
		ref["host"] = n
		if err := c.call(ctx, "sandbox.port.unexpose", ref, &list); err != nil {
			return err
		}
	}
	return printList(&lf, list.Ports, func(p portInfo) string { return strconv.Itoa(p.HostPort) }, "ADDRESS\tHOST\tGUEST\tORIGIN\tPUBLISHED",
		func(p portInfo) string {
			published := "yes"
			if !p.Published {
				published = "no"
			}
			return fmt.Sprintf("%s\t%d\t%d\t%s\t%s", p.HostAddress, p.HostPort, p.GuestPort, p.Origin, published)
		})
}

// exposeArg reads [HOST:]GUEST; no HOST is 0, any free port (unlike a
// start's "PORT", which is the same port on both sides).
func exposeArg(s string) (host, guest uint16, err error) {
	p, err := backend.ParsePort(s)
	if err != nil {
		return 0, 0, fmt.Errorf("port %.40q: want [HOST:]GUEST, each 1-65535 (like 8080:80, or 80 for any free host port)", s)
	}
	if _, err := strconv.Atoi(s); err == nil {
		p.Host = 0
	}
	return p.Host, p.Guest, nil
}

// parseInterspersed parses fs's flags wherever they are among args, as
// `warren ports expose web 8080:80 --address 0.0.0.0` writes them, and
// returns the rest (no sandbox name or port starts with "-").
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos, args = append(pos, args[0]), args[1:]
	}
}
