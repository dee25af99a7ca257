// Package egress is a sandbox's network policy: its allowlist rules, the
// addresses its resolver handed it (pins), the decision on each connection
// and the log of every query and connection. It owns no sockets: the
// resolver (internal/egress/resolver) and the transparent proxy
// (internal/egress/tproxy) ask it, and internal/netplumb steers a
// sandbox's traffic to them.
package egress

import "time"

// Verdict is the decision on one connection.
type Verdict struct {
	Allow bool
	// Name is the allowed name the decision rests on ("" for an address
	// rule or a denial without one).
	Name string
	// Rule is the rule that allowed it, as written ("" when denied).
	Rule string
	// Reason says why, for the log and for errors ("not pinned", ...).
	Reason string
}

// Record is one entry of a sandbox's connection log.
type Record struct {
	Seq       uint64    `json:"seq"`
	Time      time.Time `json:"time"`
	Kind      string    `json:"kind"` // "dns", "tcp" or "policy" (a rule change)
	Namespace string    `json:"namespace"`
	Sandbox   string    `json:"sandbox"`
	Name      string    `json:"name,omitempty"` // the queried name, SNI or Host
	Addr      string    `json:"addr,omitempty"` // the destination or answered address
	Port      uint16    `json:"port,omitempty"`
	Verdict   string    `json:"verdict"` // "allow" or "deny"; "set" for a policy record
	Rule      string    `json:"rule,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	BytesOut  int64     `json:"bytes_out,omitempty"` // sandbox → remote
	BytesIn   int64     `json:"bytes_in,omitempty"`
	Duration  float64   `json:"duration_ms,omitempty"`
	// Rules are the new rules of a "policy" record, in canonical form.
	Rules []string `json:"rules,omitempty"`
}
