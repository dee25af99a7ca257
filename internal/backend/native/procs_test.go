package native_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// ourAgents lists this test binary's agent processes and its spawner
// processes: warren-agent processes that are its children, or children of
// one of its spawners (which is where a spawner's agents are).
func ourAgents() (agents, spawners []int) {
	type proc struct{ pid, ppid int }
	var all []proc
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		if exe, err := os.Readlink("/proc/" + p.Name() + "/exe"); err == nil && strings.HasPrefix(filepath.Base(exe), "warren-agent") {
			all = append(all, proc{pid, testenv.ParentPID(pid)})
		}
	}
	for _, p := range all {
		if p.ppid != os.Getpid() {
			continue
		}
		if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.pid)); bytes.Contains(cmd, []byte("--spawner")) {
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
