package native

// ForcePoolMigration makes b move pooled agents into new cgroups at start,
// as it does on cgroup v2, on a host that could rename them.
func ForcePoolMigration(b *Backend) { b.poolMigrates = true }

// AgentMountsRoots makes b's agents mount their roots themselves, as on
// kernels where the host cannot hold them (HostHoldsRoots), until the
// returned function is called.
func AgentMountsRoots(b *Backend) (restore func()) {
	b.agentMountsRoots = true
	return func() { b.agentMountsRoots = false }
}
