package rpc

import (
	"context"

	"github.com/warren-sandbox/warren/internal/sandbox"
)

// Namespaces' usage against their quotas (docs/policy.md).

type namespaceUsageParams struct {
	// Namespace is one namespace, or "*" (the default for a key of every
	// namespace) for all; a key of one namespace sees only its own.
	Namespace string `json:"namespace"`
}

type namespaceUsageResult struct {
	Namespaces []namespaceUsage `json:"namespaces"`
}

// namespaceUsage is one namespace: what it holds, and its quota (0 = no
// limit beyond the server's caps).
type namespaceUsage struct {
	Namespace string `json:"namespace"`
	Sandboxes int    `json:"sandboxes"`
	Running   int    `json:"running"`
	MemoryMiB int64  `json:"memory_mib"`
	// CPUs and the disk in use, summed over its running sandboxes (disk:
	// all of them, as last measured).
	CPUs      float64        `json:"cpus"`
	DiskBytes int64          `json:"disk_bytes"`
	Quota     namespaceQuota `json:"quota"`
}

type namespaceQuota struct {
	MaxSandboxes   int      `json:"max_sandboxes"`
	TotalMemoryMiB int64    `json:"total_memory_mib"`
	TotalCPUs      float64  `json:"total_cpus"`
	MaxMemoryMiB   int64    `json:"max_memory_mib"`
	MaxCPUs        float64  `json:"max_cpus"`
	DiskBytes      int64    `json:"disk_bytes"`
	Images         []string `json:"images"`
	// Egress is null when any rule is allowed, [] when none is.
	Egress []string `json:"egress"`
}

func (s *Server) namespaceUsage(_ context.Context, c *call, p *namespaceUsageParams) (any, error) {
	ns := p.Namespace
	if ns == "" && c.claims.Namespace == "*" {
		ns = "*"
	}
	nss, err := c.namespaces(ns)
	if err != nil {
		return nil, err
	}
	us := s.mgr.NamespaceUsage(nss)
	if nss != nil && len(us) == 0 {
		// A namespace without sandboxes or a policy of its own still
		// exists for its key: it holds nothing, under the defaults.
		us = []sandbox.NamespaceUsage{{Namespace: nss[0]}}
	}
	out := namespaceUsageResult{Namespaces: make([]namespaceUsage, len(us))}
	for i, u := range us {
		q := u.Policy
		out.Namespaces[i] = namespaceUsage{Namespace: u.Namespace, Sandboxes: u.Sandboxes, Running: u.Running, MemoryMiB: u.MemoryMiB,
			CPUs: u.CPUs, DiskBytes: u.DiskBytes, Quota: namespaceQuota{MaxSandboxes: q.MaxSandboxes, TotalMemoryMiB: q.TotalMemoryMiB,
				TotalCPUs: q.TotalCPUs, MaxMemoryMiB: q.MaxMemoryMiB, MaxCPUs: q.MaxCPUs, DiskBytes: q.DiskBytes,
				Images: q.Images, Egress: q.Egress}}
		if out.Namespaces[i].Quota.Images == nil {
			out.Namespaces[i].Quota.Images = []string{}
		}
	}
	return out, nil
}
