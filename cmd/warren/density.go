package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/warren-sandbox/warren/internal/bench"
)

const densityAbout = `
Starts idle sandboxes on a server of its own (this binary, a temporary
data and run directory, loopback) in steps up to each count, and at each
step measures, per sandbox: the memory the sandboxes' cgroups hold (their
agents and the kernel memory charged to them), the server's resident
memory, and the host's used memory (MemTotal - MemAvailable: anything
else running on the machine moves it too); the starts' latency; and the
latency of 'true' run in sandboxes chosen at random, as a ratio to the
first step's. Every sandbox is removed at the end.

The sandboxes are small (--memory, --cpus), and the server is set up as
an operator packing many idle sandboxes would set it: few pids and open
files per sandbox, a high CPU overcommit, room for the largest count.`

func densityCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren bench density", "warren bench density [flags]", densityAbout)
	counts := fs.String("counts", "10,100,250,500,1000", "the steps: sandboxes running at each, ascending")
	memory := fs.Int("memory", 16, "memory limit of each sandbox, MiB")
	cpus := fs.Float64("cpus", 0.1, "CPU limit of each sandbox")
	image := fs.String("image", "host", "image of the sandboxes")
	execs := fs.Int("execs", 200, "commands timed at each step")
	par := fs.Int("parallel", 4, "starts at once")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var steps []int
	for _, c := range strings.Split(*counts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n < 1 || n > 10000 {
			return usageError{fs.Name(), fmt.Sprintf("--counts %.60q: want counts of 1..10000, comma-separated", *counts)}
		}
		steps = append(steps, n)
	}
	top := steps[len(steps)-1]
	self, err := os.Executable()
	if err != nil {
		return err
	}
	srv, err := bench.StartSoakServer(ctx, self, nil, 0,
		"--max-running", strconv.Itoa(top), "--max-sandboxes", strconv.Itoa(top),
		"--pids", "32", "--open-files", "64", "--cpu-overcommit", strconv.Itoa(max(40, top)),
		"--idle-timeout", "24h")
	if err != nil {
		return err
	}
	defer srv.Close()
	fmt.Fprintf(os.Stderr, "warren serve (pid %d) on %s; up to %d sandboxes of %d MiB\n", srv.Pid, srv.URL, top, *memory)
	rep, err := bench.Density(ctx, bench.DensityOptions{
		URL: srv.URL, Key: srv.Key, Namespace: "soak", Counts: steps,
		MemoryMiB: *memory, CPUs: *cpus, Image: *image, Execs: *execs, Parallel: *par,
		ServerPid: srv.Pid, CgroupDirs: srv.CgroupDirs, Log: os.Stderr,
	})
	if serr := srv.Stop(); err == nil {
		err = serr
	}
	if rep != nil {
		rep.Write(os.Stdout)
	}
	return err
}
