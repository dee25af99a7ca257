package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/warren-sandbox/warren/internal/rpc"
)

const egressAbout = `
Shows and changes what a sandbox of a running server may reach on the
network (docs/network.md), and prints its connection log.

  warren egress get NAME              its rules, one per line
  warren egress set NAME [RULE...]    replace them (none: nothing leaves);
                                      new connections follow at once
  warren egress log NAME              every DNS query and connection, with
                                      its verdict and the rule that decided

A rule is a host name (pypi.org), a suffix wildcard (*.githubusercontent.com),
or an address or CIDR (203.0.113.7, 10.0.0.0/8), each with an optional
:PORT (none = 80 and 443; :* = any port).`

func egressCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren egress", "warren egress get|set|log [flags] NAME [RULE...]", egressAbout)
	c, ns := clientFlags(fs)
	since := fs.Uint64("since", 0, "log: only records after this sequence number")
	limit := fs.Int("limit", 0, "log: at most this many records (0 = up to 1000)")
	var lf listFlags
	lf.register(fs, "rules (log: sequence numbers)")
	sub, err := subcommand(fs, args, "get", "set", "log")
	if err != nil {
		return err
	}
	want := []string{"NAME (the sandbox)"}
	if sub == "set" {
		want = append(want, "RULE...")
	}
	fs = subFlagSet(fs, sub, "warren egress "+sub+" [flags] "+strings.Join(want, " "), egressAbout)
	pos, err := parseInterspersed(fs, args[1:]) // flags after NAME too: egress log web --json
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, want...); err != nil {
		return err
	}
	ref := map[string]any{"namespace": *ns, "sandbox": pos[0]}
	var rules struct {
		Rules []string `json:"rules"`
	}
	switch sub {
	case "get":
		if err := c.call(ctx, "sandbox.egress.get", ref, &rules); err != nil {
			return err
		}
	case "set":
		ref["rules"] = append([]string{}, pos[1:]...)
		if err := c.call(ctx, "sandbox.egress.set", ref, &rules); err != nil {
			return err
		}
	case "log":
		ref["since"], ref["limit"] = *since, *limit
		var out struct {
			Records []rpc.EgressRecord `json:"records"`
		}
		if err := c.call(ctx, "sandbox.egress.log", ref, &out); err != nil {
			return err
		}
		return printList(&lf, out.Records, func(r rpc.EgressRecord) string { return strconv.FormatUint(r.Seq, 10) },
			"SEQ\tTIME\tKIND\tNAME\tADDRESS\tVERDICT\tRULE/REASON\tOUT\tIN\tMS",
			func(r rpc.EgressRecord) string {
				addr := r.Addr
				if r.Port != 0 {
					addr = fmt.Sprintf("%s:%d", r.Addr, r.Port)
				}
				why := r.Rule
				if r.Reason != "" {
					why = strings.TrimSpace(why + " " + r.Reason)
				}
				return fmt.Sprintf("%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%.1f", r.Seq, r.Time.Local().Format("15:04:05.000"),
					r.Kind, dash(r.Name), dash(addr), r.Verdict, dash(why), r.BytesOut, r.BytesIn, r.Duration)
			})
	}
	// The rules, one per line; --format's dot is the rule.
	rule := func(r string) string { return r }
	return printList(&lf, rules.Rules, rule, "", rule)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
