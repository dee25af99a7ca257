package cgroup

// Spawn is SpawnInto for c from this process, as the tests use it.
func (c *Cgroup) Spawn(start func(cgroupFD int) error) error {
	t, err := c.OpenSpawnTarget()
	if err != nil {
		return err
	}
	defer t.Close()
	fds := make([]int, len(t.Files))
	for i, f := range t.Files {
		fds[i] = int(f.Fd())
	}
	return SpawnInto(t.V2, fds, start)
}
