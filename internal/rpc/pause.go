package rpc

import (
	"context"
)

// pauseParams name the sandbox to pause or resume, as sandbox.stop's do.
type pauseParams = sandboxRef

func (s *Server) sandboxPause(ctx context.Context, c *call, p *pauseParams) (any, error) {
	return s.pauseOp(ctx, c, p, s.mgr.Pause)
}

func (s *Server) sandboxResume(ctx context.Context, c *call, p *pauseParams) (any, error) {
	return s.pauseOp(ctx, c, p, s.mgr.Resume)
}

// pauseOp runs op on the sandbox p names and answers its info.
func (s *Server) pauseOp(ctx context.Context, c *call, p *pauseParams, op func(ctx context.Context, ns, name string) error) (any, error) {
	ns, name, err := c.resolveRef(*p)
	if err != nil {
		return nil, err
	}
	if err := op(ctx, ns, name); err != nil {
		return nil, err
	}
	info, err := s.mgr.Get(ns, name)
	if err != nil {
		return nil, err
	}
	return toInfo(info), nil
}
