package rpc

import (
	"context"

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
	Records []egress.Record `json:"records"`
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
	return egressLog{Records: recs}, nil
}
