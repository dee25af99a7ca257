package rpc

import (
	"context"
	"time"

	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/errdefs"
)

// A sandbox's egress rules and connection log (docs/network.md).

// maxEgressLog bounds one sandbox.egress.log answer.
const maxEgressLog = 1000

type egressRules struct {
	Rules []string `json:"rules"`
}

func (s *Server) egressGet(_ context.Context, c *call, p *sandboxRef) (any, error) {
	ns, name, err := c.resolveRef(*p)
	if err != nil {
		return nil, err
	}
	rules, err := s.mgr.Egress(ns, name)
	if err != nil {
		return nil, err
	}
	return egressRules{Rules: rules}, nil
}

type egressSetParams struct {
	sandboxRef
	Rules *[]string `json:"rules"`
}

func (s *Server) egressSet(ctx context.Context, c *call, p *egressSetParams) (any, error) {
	ns, name, err := c.resolveRef(p.sandboxRef)
	if err != nil {
		return nil, err
	}
	if p.Rules == nil {
		return nil, errdefs.Errorf(errInvalidParams, "\"rules\" is missing (an empty list lets nothing out)")
	}
	rules, err := s.mgr.SetEgress(ctx, ns, name, *p.Rules)
	if err != nil {
		return nil, err
	}
	return egressRules{Rules: rules}, nil
}

type egressLogParams struct {
	sandboxRef
	Since uint64 `json:"since"`
	Limit int    `json:"limit"`
}

type egressLog struct {
	Records []EgressRecord `json:"records"`
}

// EgressRecord is one entry of a sandbox's connection log (egress.Record)
// as the API shows it, and as 'warren egress log' reads it.
type EgressRecord struct {
	Seq       uint64    `json:"seq"`
	Time      time.Time `json:"time"`
	Kind      string    `json:"kind"`
	Namespace string    `json:"namespace"`
	Sandbox   string    `json:"sandbox"`
	Name      string    `json:"name,omitempty"`
	Addr      string    `json:"addr,omitempty"`
	Port      uint16    `json:"port,omitempty"`
	Verdict   string    `json:"verdict"`
	Rule      string    `json:"rule,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	Rules     []string  `json:"rules,omitempty"`
	BytesOut  int64     `json:"bytes_out,omitempty"`
	BytesIn   int64     `json:"bytes_in,omitempty"`
	Duration  float64   `json:"duration_ms,omitempty"`
}

func toEgressRecord(r egress.Record) EgressRecord {
	return EgressRecord{Seq: r.Seq, Time: r.Time.UTC(), Kind: r.Kind, Namespace: r.Namespace, Sandbox: r.Sandbox, Name: r.Name,
		Addr: r.Addr, Port: r.Port, Verdict: r.Verdict, Rule: r.Rule, Reason: r.Reason, Rules: r.Rules,
		BytesOut: r.BytesOut, BytesIn: r.BytesIn, Duration: r.Duration}
}

func (s *Server) egressLog(_ context.Context, c *call, p *egressLogParams) (any, error) {
	ns, name, err := c.resolveRef(p.sandboxRef)
	if err != nil {
		return nil, err
	}
	if p.Limit < 0 {
		return nil, errdefs.Errorf(errInvalidParams, "limit %d: want 1-%d, or 0 for %d", p.Limit, maxEgressLog, maxEgressLog)
	}
	limit := p.Limit
	if limit == 0 || limit > maxEgressLog {
		limit = maxEgressLog
	}
	recs, err := s.mgr.EgressLog(ns, name, p.Since, limit)
	if err != nil {
		return nil, err
	}
	out := egressLog{Records: make([]EgressRecord, len(recs))}
	for i, r := range recs {
		out.Records[i] = toEgressRecord(r)
	}
	return out, nil
}
