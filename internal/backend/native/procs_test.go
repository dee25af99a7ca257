package native_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// ourAgents lists this test binary's spawner processes and their agents,
// and the agents that became this process's children when their spawner
// died (it is a child subreaper).
func ourAgents() (agents, spawners []int) {
	type proc struct {
		pid, ppid int
		name      string
	}
	var all []proc
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink("/proc/" + p.Name() + "/exe")
		if name := filepath.Base(exe); err == nil && (strings.HasPrefix(name, "warren-agent") || strings.HasPrefix(name, "warren-spawner")) {
			all = append(all, proc{pid, testenv.ParentPID(pid), name})
		}
	}
	for _, p := range all {
		if p.ppid != os.Getpid() {
			continue
		}
		if strings.HasPrefix(p.name, "warren-spawner") {
			spawners = append(spawners, p.pid)
		} else {
			agents = append(agents, p.pid)
		}
	}
	for _, p := range all {
		for _, s := range spawners {
			if p.ppid == s {
				agents = append(agents, p.pid)
			}
		}
	}
	return agents, spawners
}
