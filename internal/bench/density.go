package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/warren-sandbox/warren/sdk/warren"
)

// DensityOptions are a density run's: idle sandboxes started on a server
// in steps up to each count, and measured at each.
type DensityOptions struct {
	URL, Key, Namespace string
	// Counts are the steps, ascending (e.g. 10, 100, 250, 500, 1000).
	Counts []int
	// MemoryMiB and CPUs of each sandbox: small, as an operator packing
	// many idle sandboxes on a host would ask (the server's admission
	// control sums them against the host).
	MemoryMiB int
	CPUs      float64
	Image     string
	// Execs is how many `true` commands are timed at each step, each in a
	// sandbox chosen at random among those running.
	Execs int
	// Parallel starts at once (default 4).
	Parallel int
	// ServerPid is the server's process (for its resident memory) and
	// CgroupDirs lists the server's sandbox cgroup directories (their
	// memory controller's usage is what every sandbox holds, kernel
	// objects charged to them included; they may appear with the first
	// sandbox).
	ServerPid  int
	CgroupDirs func() []string
	Log        io.Writer
}

// DensityStep is what was measured with Count sandboxes running idle.
type DensityStep struct {
	Count int
	// Per sandbox, in bytes: the sandboxes' memory cgroups (agents'
	// memory and the kernel memory charged to them), the server's
	// resident memory, and the host's used memory (MemTotal -
	// MemAvailable; anything else on the machine moves it too), each as
	// the growth since before the first sandbox, divided by Count.
	CgroupPer, ServerPer, HostPer int64
	// Starts of the sandboxes that brought the count to this step, and
	// execs at this step.
	StartP50, StartP99 time.Duration
	ExecP50, ExecP99   time.Duration
}

// DensityReport is a density run's result.
type DensityReport struct {
	Steps []DensityStep
}

// Density starts sandboxes in steps and measures each step; every
// sandbox it started is removed before it returns, whatever happened.
func Density(ctx context.Context, o DensityOptions) (_ *DensityReport, err error) {
	if len(o.Counts) == 0 {
		return nil, errors.New("no counts")
	}
	for i, c := range o.Counts {
		if c <= 0 || (i > 0 && c <= o.Counts[i-1]) {
			return nil, fmt.Errorf("counts must be positive and ascending: %v", o.Counts)
		}
	}
	o.Parallel = max(o.Parallel, 1)
	o.Execs = max(o.Execs, 1)
	logf := func(format string, args ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, format+"\n", args...)
		}
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.Parallel + 2}}
	defer hc.CloseIdleConnections()
	sdk := warren.New(warren.WithServerURL(o.URL), warren.WithAPIKey(o.Key), warren.WithNamespace(o.Namespace), warren.WithHTTPClient(hc))
	if err := sdk.Health(ctx); err != nil {
		return nil, err
	}
	cg0, srv0, host0 := cgroupMemory(o.CgroupDirs()), ProcSample(o.ServerPid).RSS, hostUsed()

	var names []string
	defer func() {
		// Removal is not measured; it runs with the starts' parallelism
		// and on a context of its own, so an interrupted run cleans up.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
		defer cancel()
		if rerr := parallel(o.Parallel, len(names), func(i int) error { return sdk.Remove(rctx, names[i]) }); rerr != nil && err == nil {
			err = fmt.Errorf("removing the sandboxes: %w", rerr)
		}
	}()
	rep := &DensityReport{}
	var mu sync.Mutex
	for _, count := range o.Counts {
		from := len(names)
		batch := make([]string, count-from)
		starts := make([]time.Duration, len(batch))
		for i := range batch {
			batch[i] = fmt.Sprintf("d%d-%d", os.Getpid(), from+i)
		}
		serr := parallel(o.Parallel, len(batch), func(i int) error {
			t := time.Now()
			_, err := sdk.Create(ctx, warren.Spec{Name: batch[i], Image: o.Image, MemoryMiB: o.MemoryMiB, CPUs: o.CPUs, IdleTimeout: 24 * time.Hour})
			starts[i] = time.Since(t)
			mu.Lock()
			names = append(names, batch[i]) // a failed start may leave a record: removed too
			mu.Unlock()
			return err
		})
		if serr != nil {
			return rep, fmt.Errorf("starting sandbox %d..%d: %w", from+1, count, serr)
		}
		// Idle: the starts' garbage collected, the agents settled.
		time.Sleep(2 * time.Second)
		st := DensityStep{
			Count:     count,
			CgroupPer: (cgroupMemory(o.CgroupDirs()) - cg0) / int64(count),
			ServerPer: (ProcSample(o.ServerPid).RSS - srv0) / int64(count),
			HostPer:   (hostUsed() - host0) / int64(count),
		}
		st.StartP50, st.StartP99 = Median(starts), Percentile(starts, 99)
		execs := make([]time.Duration, o.Execs)
		for i := range execs {
			name := names[rand.IntN(len(names))] //nolint:gosec // which sandbox, not a secret
			t := time.Now()
			var r struct {
				ExitCode int `json:"exit_code"`
			}
			if err := sdk.Call(ctx, "sandbox.command.run", map[string]any{"sandbox": name, "namespace": o.Namespace, "command": "true"}, &r); err != nil {
				return rep, fmt.Errorf("exec at %d sandboxes: %w", count, err)
			}
			execs[i] = time.Since(t)
			if r.ExitCode != 0 {
				return rep, fmt.Errorf("true exited %d in %s", r.ExitCode, name)
			}
		}
		st.ExecP50, st.ExecP99 = Median(execs), Percentile(execs, 99)
		rep.Steps = append(rep.Steps, st)
		logf("%5d sandboxes: %s per sandbox in cgroups, server +%s, host +%s; start p50 %v; exec p50 %v p99 %v",
			count, mib(st.CgroupPer), mib(st.ServerPer), mib(st.HostPer), st.StartP50.Round(10*time.Microsecond), st.ExecP50.Round(10*time.Microsecond), st.ExecP99.Round(10*time.Microsecond))
	}
	return rep, nil
}

// Write prints the report as a table, with exec latency as a ratio to
// the first step's.
func (r *DensityReport) Write(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "sandboxes\tcgroups/sandbox\tserver/sandbox\thost/sandbox\tstart p50\tstart p99\texec p50\texec p99\texec p50 × first\t")
	for _, s := range r.Steps {
		ratio := float64(s.ExecP50) / float64(r.Steps[0].ExecP50)
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%v\t%v\t%v\t%v\t%.2f\t\n", s.Count, mib(s.CgroupPer), mib(s.ServerPer), mib(s.HostPer),
			s.StartP50.Round(10*time.Microsecond), s.StartP99.Round(10*time.Microsecond), s.ExecP50.Round(10*time.Microsecond), s.ExecP99.Round(10*time.Microsecond), ratio)
	}
	_ = tw.Flush()
}

// parallel runs f(0..n-1) on at most k goroutines and returns the first
// error (the others still run: each started sandbox must be known).
func parallel(k, n int, f func(i int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  = make(chan int)
	)
	for range min(k, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

// cgroupMemory is the memory the cgroups in dirs hold (the memory
// controller's, v1 or v2); 0 when none has it.
func cgroupMemory(dirs []string) int64 {
	for _, d := range dirs {
		for _, f := range []string{"memory.usage_in_bytes", "memory.current"} {
			if b, err := os.ReadFile(filepath.Join(d, f)); err == nil { //nolint:gosec // G304: the server's cgroup files, named here
				if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
					return v
				}
			}
		}
	}
	return 0
}

// hostUsed is MemTotal - MemAvailable, in bytes.
func hostUsed() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	var total, avail int64
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "MemTotal:":
			total = v << 10
		case "MemAvailable:":
			avail = v << 10
		}
	}
	return total - avail
}
