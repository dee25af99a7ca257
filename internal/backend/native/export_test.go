package native

// ForcePoolMigration makes b move pooled agents into new cgroups at start,
// as it does on cgroup v2, on a host that could rename them.
func ForcePoolMigration(b *Backend) { b.poolMigrates = true }
