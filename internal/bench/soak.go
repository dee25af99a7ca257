package bench

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/sdk/warren"
)

// The soak: many clients at once over the server's whole API for a while,
// each owning its sandboxes (at most two alive, recycled), while the
// server's resident memory, open files and goroutines are sampled every
// second. It fails on any error a client did not provoke on purpose, on a
// resource that trends upward under steady load, on goroutines or open
// files that do not come back once the clients are gone, and on sandboxes
// left behind.

// SoakOptions say what to soak and how hard.
type SoakOptions struct {
	// URL of the server; Key a key for Namespace (or for '*').
	URL, Key string
	// AdminKey reads /metrics whole (a '*' key: the goroutine count has no
	// namespace label); empty: Key.
	AdminKey string
	// Namespace the clients' sandboxes live in (default "soak").
	Namespace string
	// Clients run at once (default 64).
	Clients int
	// Duration of the load, of which the first Warmup (default a third,
	// at most one minute) is not judged for trends.
	Duration, Warmup time.Duration
	// Think is a client's mean pause between two operations (uniform in
	// [0, 2*Think]): a client that also does its own work, not a loop
	// that only measures how the server queues.
	Think time.Duration
	// Sample reads the server's resources; nil: goroutines from /metrics
	// only.
	Sample func() Reading
	// Slack is how much a resource may grow; zero fields get defaults.
	Slack Slack
	// Log receives progress lines; nil: none.
	Log io.Writer
}

// Reading is one reading of the server's resources; -1 when unknown.
type Reading struct {
	At         time.Duration // since the load began (negative: before)
	RSS        int64         // bytes
	FDs        int
	Goroutines int
}

// Slack bounds the growth the trend and return checks allow.
type Slack struct {
	// Under load, median of the last third over the first third after
	// the warm-up: goroutines and fds by a count (default 2 per client
	// and 1 per client: in-flight requests come and go), RSS by
	// RSSFraction (default 0.25) or RSSBytes (default 64 MiB),
	// whichever is larger.
	Goroutines, FDs int
	RSSFraction     float64
	RSSBytes        int64
	// Once every client is gone: goroutines and fds at most this many
	// above their reading before the load (default 20: the store keeps
	// up to 8 SQLite connections, two files each, once load opened them).
	Settle int
}

func (s *Slack) defaults(clients int) {
	if s.Goroutines == 0 {
		s.Goroutines = 2 * clients
	}
	if s.FDs == 0 {
		s.FDs = clients
	}
	if s.RSSFraction == 0 {
		s.RSSFraction = 0.25
	}
	if s.RSSBytes == 0 {
		s.RSSBytes = 64 << 20
	}
	if s.Settle == 0 {
		s.Settle = 20
	}
}

// SoakReport is what a soak saw.
type SoakReport struct {
	Clients  int
	Duration time.Duration // of the load, as it ran
	Warmup   time.Duration
	Methods  map[string]*MethodStats
	// Failures are the unexpected errors, "method: error" (sandbox names
	// masked, so one cause is one entry), with how often each came.
	Failures map[string]int
	Samples  []Reading
	Before   Reading // before the load
	After    Reading // once the clients were gone and the server settled
	Left     []string
	Slack    Slack
}

// MethodStats are one method's calls.
type MethodStats struct {
	Calls      int
	Expected   int // errors provoked on purpose, as they should be
	Unexpected int
	lat        []time.Duration
}

// maxFailures bounds the distinct failures kept; more are counted under
// one entry.
const maxFailures = 50

// clientSandbox matches the names the clients give their sandboxes.
// Compiled on first use, not at package initialisation, which every warren
// command pays (docs/performance.md).
var clientSandbox = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`"c[0-9]+-[0-9]+"`) })

type recorder struct {
	mu  sync.Mutex
	rep *SoakReport
}

func (r *recorder) add(method string, d time.Duration, expected bool, fail error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.rep.Methods[method]
	if m == nil {
		m = &MethodStats{}
		r.rep.Methods[method] = m
	}
	m.Calls++
	m.lat = append(m.lat, d)
	switch {
	case fail != nil:
		m.Unexpected++
		key := method + ": " + clientSandbox().ReplaceAllString(fail.Error(), `"cN-N"`)
		if _, ok := r.rep.Failures[key]; !ok && len(r.rep.Failures) >= maxFailures {
			key = "(more distinct errors)"
		}
		r.rep.Failures[key]++
	case expected:
		m.Expected++
	}
}

// Soak runs the load and the checks after it; the report's Problems say
// whether it passed. An error is returned only when it could not run.
func Soak(ctx context.Context, o SoakOptions) (*SoakReport, error) {
	if o.Namespace == "" {
		o.Namespace = "soak"
	}
	if o.Clients <= 0 {
		o.Clients = 64
	}
	if o.Warmup == 0 {
		o.Warmup = min(o.Duration/3, time.Minute)
	}
	if o.AdminKey == "" {
		o.AdminKey = o.Key
	}
	o.Slack.defaults(o.Clients)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.Clients + 2, IdleConnTimeout: time.Minute}}
	defer hc.CloseIdleConnections()
	sdk := warren.New(warren.WithServerURL(o.URL), warren.WithAPIKey(o.Key), warren.WithNamespace(o.Namespace), warren.WithHTTPClient(hc))
	// The sampler's own connection, closed before the settled reading.
	mc := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	defer mc.CloseIdleConnections()
	goroutines := func() int { return scrapeGoroutines(ctx, mc, o.URL, o.AdminKey) }
	sample := func() Reading {
		s := Reading{RSS: -1, FDs: -1}
		if o.Sample != nil {
			s = o.Sample()
		}
		s.Goroutines = goroutines()
		return s
	}
	logf := func(format string, args ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, format+"\n", args...)
		}
	}
	if err := sdk.Health(ctx); err != nil {
		return nil, err
	}
	rep := &SoakReport{Clients: o.Clients, Warmup: o.Warmup, Methods: map[string]*MethodStats{}, Failures: map[string]int{}, Slack: o.Slack}
	rec := &recorder{rep: rep}
	rep.Before = sample()
	rep.Before.At = 0

	start := time.Now()
	deadline := start.Add(o.Duration)
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-t.C:
				s := sample()
				s.At = time.Since(start)
				rec.mu.Lock()
				rep.Samples = append(rep.Samples, s)
				calls := 0
				for _, m := range rep.Methods {
					calls += m.Calls
				}
				rec.mu.Unlock()
				if s.At.Round(time.Second)%(10*time.Second) == 0 {
					logf("%3.0fs  calls %d  rss %s  fds %d  goroutines %d", s.At.Seconds(), calls, mib(s.RSS), s.FDs, s.Goroutines)
				}
			}
		}
	}()
	var wg sync.WaitGroup
	for i := range o.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The clients join over the warm-up: 64 sandboxes asked for
			// in the same instant on a small host outlast the start
			// timeout (docs/performance.md, the soak).
			time.Sleep(time.Duration(i) * o.Warmup / time.Duration(o.Clients))
			c := &soakClient{id: i, think: o.Think, sdk: sdk, rec: rec, ns: o.Namespace, rng: rand.New(rand.NewPCG(uint64(i), uint64(start.UnixNano())))} //nolint:gosec // the mix of operations, not a secret
			c.run(ctx, deadline)
		}()
	}
	wg.Wait()
	rep.Duration = time.Since(start)
	close(stopSampling)
	<-sampled

	// Nothing of the clients' is left in the namespace.
	if left, err := sdk.List(ctx, warren.ListOptions{}); err != nil {
		rep.Left = append(rep.Left, "sandbox.list: "+err.Error())
	} else {
		for _, s := range left {
			rep.Left = append(rep.Left, fmt.Sprintf("sandbox %s/%s (%s)", s.Namespace, s.Name, s.State))
		}
	}
	// The clients' connections close; the server's goroutines and files
	// come back within a while (stopped agents are reaped, removed
	// sandboxes' files deleted in the background).
	hc.CloseIdleConnections()
	settleBy := time.Now().Add(30 * time.Second)
	for {
		mc.CloseIdleConnections()
		rep.After = sample()
		rep.After.At = time.Since(start)
		if rep.settled() || time.Now().After(settleBy) || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Second)
	}
	return rep, ctx.Err()
}

func (r *SoakReport) settled() bool {
	ok := func(before, after int) bool { return before < 0 || after < 0 || after <= before+r.Slack.Settle }
	return ok(r.Before.Goroutines, r.After.Goroutines) && ok(r.Before.FDs, r.After.FDs)
}

// scrapeGoroutines reads go_goroutines from the server's /metrics; -1
// when it is not there.
func scrapeGoroutines(ctx context.Context, hc *http.Client, url, key string) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return -1
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := hc.Do(req)
	if err != nil {
		return -1
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "go_goroutines "); ok {
			var n float64
			if _, err := fmt.Sscan(v, &n); err == nil {
				return int(n)
			}
		}
	}
	return -1
}

// soakClient is one client: it owns at most one long-lived sandbox (main)
// and now and then a short-lived second one.
type soakClient struct {
	id    int
	think time.Duration
	sdk   *warren.Client
	rec   *recorder
	ns    string
	rng   *rand.Rand
	seq   int
	main  string // "" when it has none running
}

// soakOps is the mix, by weight. Each op needs a running main sandbox
// (started first when there is none). About one op in twenty starts a
// sandbox: starts cost the host most, and a client recycles its sandbox
// now and then, not at every turn.
var soakOps = []struct {
	weight int
	name   string
	run    func(*soakClient, context.Context)
}{
	{14, "command", (*soakClient).command},
	{12, "exec", (*soakClient).exec},
	{8, "shell", (*soakClient).shell},
	{10, "repl", (*soakClient).repl},
	{10, "files", (*soakClient).files},
	{6, "tar", (*soakClient).tar},
	{6, "process", (*soakClient).process},
	{4, "kill", (*soakClient).kill},
	{5, "metrics", (*soakClient).metrics},
	{4, "provoked", (*soakClient).provoked},
	{2, "second", (*soakClient).second},
	{2, "restart", (*soakClient).restart},
	{2, "recycle", (*soakClient).recycle},
}

func (c *soakClient) run(ctx context.Context, deadline time.Time) {
	total := 0
	for _, op := range soakOps {
		total += op.weight
	}
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if c.main == "" && !c.startMain(ctx) {
			time.Sleep(time.Second) // counted; try again, not at once
			continue
		}
		time.Sleep(time.Duration(c.rng.Float64() * 2 * float64(c.think)))
		n := c.rng.IntN(total)
		for _, op := range soakOps {
			if n -= op.weight; n < 0 {
				op.run(c, ctx)
				break
			}
		}
	}
	if c.main != "" {
		c.call("sandbox.remove", "", func(ctx context.Context) error { return c.sdk.Remove(ctx, c.main) })
	}
}

// callTimeout bounds one call; the soak's work is small, so reaching it is
// a failure.
const callTimeout = 2 * time.Minute

// call times f as one call of method. want is the error kind the call was
// made to provoke ("" = none): getting it is expected, anything else (or
// success) is a failure. It reports whether f succeeded.
func (c *soakClient) call(method, want string, f func(context.Context) error) bool {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	t0 := time.Now()
	err := f(ctx)
	d := time.Since(t0)
	var fail error
	switch {
	case want == "" && err != nil:
		fail = err
	case want != "" && err == nil:
		fail = fmt.Errorf("succeeded; want error %s", want)
	case want != "" && warren.KindOf(err) != want:
		fail = fmt.Errorf("want error %s, got: %w", want, err)
	}
	c.rec.add(method, d, want != "" && fail == nil, fail)
	return err == nil
}

// check turns a wrong answer into an error.
func check(ok bool, format string, args ...any) error {
	if ok {
		return nil
	}
	return fmt.Errorf(format, args...)
}

func (c *soakClient) name() string {
	c.seq++
	return fmt.Sprintf("c%d-%d", c.id, c.seq)
}

// Small sandboxes: 64 of them must fit a small host.
type startConfig struct {
	Memory int     `json:"memory"`
	CPUs   float64 `json:"cpus"`
	Image  string  `json:"image"`
}

type startParams struct {
	Sandbox   string       `json:"sandbox"`
	Namespace string       `json:"namespace"`
	Config    *startConfig `json:"config,omitempty"`
}

// startMain starts the client's main sandbox, alternately through
// microsandbox's sandbox.start and through sandbox.create.
func (c *soakClient) startMain(ctx context.Context) bool {
	name := c.name()
	var ok bool
	if c.seq%2 == 0 {
		ok = c.call("sandbox.start", "", func(ctx context.Context) error {
			return c.sdk.Call(ctx, "sandbox.start", startParams{name, c.ns, &startConfig{Memory: 128, CPUs: 0.5, Image: "python"}}, nil)
		})
	} else {
		ok = c.call("sandbox.create", "", func(ctx context.Context) error {
			_, err := c.sdk.Create(ctx, warren.Spec{Name: name, Image: "python", MemoryMiB: 128, CPUs: 0.5})
			return err
		})
	}
	if ok {
		c.main = name
	} else {
		// A failed start may leave a record in state error.
		c.call("sandbox.remove", "", func(ctx context.Context) error { return c.sdk.Remove(ctx, name) })
	}
	return ok
}

func (c *soakClient) sb() *warren.Sandbox { return c.sdk.Sandbox(c.main) }

type output struct {
	Output []struct {
		Stream string `json:"stream"`
		Text   string `json:"text"`
	} `json:"output"`
}

func (o output) text(stream string) string {
	var b strings.Builder
	for _, l := range o.Output {
		if l.Stream == stream {
			b.WriteString(l.Text)
		}
	}
	return b.String()
}

func (c *soakClient) command(context.Context) {
	word := fmt.Sprintf("w%d", c.rng.IntN(1e6))
	c.call("sandbox.command.run", "", func(ctx context.Context) error {
		var r struct {
			output
			ExitCode int `json:"exit_code"`
		}
		err := c.sdk.Call(ctx, "sandbox.command.run", map[string]any{"sandbox": c.main, "namespace": c.ns, "command": "echo", "args": []string{word}}, &r)
		if err != nil {
			return err
		}
		return check(r.ExitCode == 0 && strings.TrimSpace(r.text("stdout")) == word, "echo %s: exit %d, stdout %q", word, r.ExitCode, r.text("stdout"))
	})
}

func (c *soakClient) exec(context.Context) {
	c.call("sandbox.exec", "", func(ctx context.Context) error {
		r, err := c.sb().Exec(ctx, "/bin/sh", []string{"-c", "cat; echo done >&2"}, warren.ExecStdin("in"))
		if err != nil {
			return err
		}
		return check(r.ExitCode == 0 && r.Stdout == "in" && r.Stderr == "done\n", "exec: %+v", r)
	})
}

func (c *soakClient) shell(context.Context) {
	c.call("sandbox.shell", "", func(ctx context.Context) error {
		r, err := c.sb().Shell(ctx, "echo $((6*7)); exit 3")
		if err != nil {
			return err
		}
		return check(r.ExitCode == 3 && r.Stdout == "42\n", "shell: %+v", r)
	})
}

func (c *soakClient) repl(context.Context) {
	n := c.rng.IntN(1000)
	c.call("sandbox.repl.run", "", func(ctx context.Context) error {
		var r struct {
			Result   *string `json:"result"`
			HasError bool    `json:"has_error"`
		}
		err := c.sdk.Call(ctx, "sandbox.repl.run", map[string]any{"sandbox": c.main, "namespace": c.ns, "language": "python", "code": fmt.Sprintf("x = %d\nx * 2", n)}, &r)
		if err != nil {
			return err
		}
		want := fmt.Sprint(n * 2)
		return check(!r.HasError && r.Result != nil && *r.Result == want, "repl: result %v, has_error %v, want %s", r.Result, r.HasError, want)
	})
}

func (c *soakClient) files(context.Context) {
	data := make([]byte, 1+c.rng.IntN(64<<10))
	for i := range data {
		data[i] = byte(c.rng.IntN(256))
	}
	path := fmt.Sprintf("/tmp/f%d", c.rng.IntN(4))
	if !c.call("sandbox.file.write", "", func(ctx context.Context) error { return c.sb().WriteFile(ctx, path, data, 0o644) }) {
		return
	}
	c.call("sandbox.file.read", "", func(ctx context.Context) error {
		got, err := c.sb().ReadFile(ctx, path)
		if err != nil {
			return err
		}
		return check(bytes.Equal(got, data), "read %s: %d bytes back, wrote %d", path, len(got), len(data))
	})
	c.call("sandbox.file.list", "", func(ctx context.Context) error {
		ents, err := c.sb().ListFiles(ctx, "/tmp")
		if err != nil {
			return err
		}
		for _, e := range ents {
			if "/tmp/"+e.Name == path {
				return nil
			}
		}
		return fmt.Errorf("list /tmp: %s missing", path)
	})
}

func (c *soakClient) tar(context.Context) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	body := bytes.Repeat([]byte("soak "), 1+c.rng.IntN(20000))
	_ = tw.WriteHeader(&tar.Header{Name: "up/data.txt", Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
	_, _ = tw.Write(body)
	_ = tw.Close()
	if !c.call("tar.upload", "", func(ctx context.Context) error { return c.sb().UploadTar(ctx, "/tmp", bytes.NewReader(buf.Bytes())) }) {
		return
	}
	c.call("tar.download", "", func(ctx context.Context) error {
		rc, err := c.sb().DownloadTar(ctx, "/tmp/up/data.txt")
		if err != nil {
			return err
		}
		defer func() { _ = rc.Close() }()
		tr := tar.NewReader(rc)
		if _, err := tr.Next(); err != nil {
			return err
		}
		got, err := io.ReadAll(tr)
		if err != nil {
			return err
		}
		return check(bytes.Equal(got, body), "download: %d bytes, uploaded %d", len(got), len(body))
	})
}

// process starts a background process that ends by itself and waits for it.
func (c *soakClient) process(context.Context) {
	var p *warren.Process
	if !c.call("sandbox.process.start", "", func(ctx context.Context) (err error) {
		p, err = c.sb().StartProcess(ctx, "/bin/sh", []string{"-c", "echo bg; exit 5"})
		return err
	}) {
		return
	}
	c.call("sandbox.process.wait", "", func(ctx context.Context) error {
		info, err := p.Wait(ctx, 30*time.Second)
		if err != nil {
			return err
		}
		return check(info.Exit != nil && info.Exit.Code == 5, "wait: %+v", info.Exit)
	})
	c.call("sandbox.process.output", "", func(ctx context.Context) error {
		out, err := p.Output(ctx, warren.Stdout, 0, 0)
		if err != nil {
			return err
		}
		return check(string(out.Data) == "bg\n", "output %q", out.Data)
	})
	c.call("sandbox.process.remove", "", func(ctx context.Context) error { return p.Remove(ctx) })
}

// kill starts a process that would run long and kills it.
func (c *soakClient) kill(context.Context) {
	var p *warren.Process
	if !c.call("sandbox.process.start", "", func(ctx context.Context) (err error) {
		p, err = c.sb().StartProcess(ctx, "/bin/sleep", []string{"600"})
		return err
	}) {
		return
	}
	c.call("sandbox.process.signal", "", func(ctx context.Context) error { return p.Signal(ctx, "KILL") })
	c.call("sandbox.process.wait", "", func(ctx context.Context) error {
		info, err := p.Wait(ctx, 30*time.Second)
		if err != nil {
			return err
		}
		return check(info.Exit != nil && info.Exit.Signal != "", "wait after SIGKILL: %+v", info.Exit)
	})
	c.call("sandbox.process.remove", "", func(ctx context.Context) error { return p.Remove(ctx) })
}

func (c *soakClient) metrics(context.Context) {
	c.call("sandbox.metrics.get", "", func(ctx context.Context) error {
		var r struct {
			Sandboxes []struct {
				Name    string `json:"name"`
				Running bool   `json:"running"`
			} `json:"sandboxes"`
		}
		if err := c.sdk.Call(ctx, "sandbox.metrics.get", map[string]any{"sandbox": c.main, "namespace": c.ns}, &r); err != nil {
			return err
		}
		return check(len(r.Sandboxes) == 1 && r.Sandboxes[0].Running, "metrics: %+v", r.Sandboxes)
	})
}

// provoked makes calls that must fail with a given kind.
func (c *soakClient) provoked(context.Context) {
	switch c.rng.IntN(3) {
	case 0:
		c.call("sandbox.file.read", warren.KindNotFound, func(ctx context.Context) error {
			_, err := c.sb().ReadFile(ctx, "/tmp/does-not-exist")
			return err
		})
	case 1:
		c.call("sandbox.exec", warren.KindNotFound, func(ctx context.Context) error {
			_, err := c.sdk.Sandbox(fmt.Sprintf("gone-%d", c.id)).Exec(ctx, "/bin/true", nil)
			return err
		})
	default:
		c.call("sandbox.create", warren.KindConflict, func(ctx context.Context) error {
			_, err := c.sdk.Create(ctx, warren.Spec{Name: c.main, MemoryMiB: 128, CPUs: 0.5})
			return err
		})
	}
}

// second runs a short-lived second sandbox: the client's two at most.
func (c *soakClient) second(context.Context) {
	name := c.name()
	if c.call("sandbox.create", "", func(ctx context.Context) error {
		_, err := c.sdk.Create(ctx, warren.Spec{Name: name, Image: "host", MemoryMiB: 64, CPUs: 0.25})
		return err
	}) {
		c.call("sandbox.exec", "", func(ctx context.Context) error {
			r, err := c.sdk.Sandbox(name).Exec(ctx, "/bin/true", nil)
			if err != nil {
				return err
			}
			return check(r.ExitCode == 0, "true: %+v", r)
		})
	}
	c.call("sandbox.remove", "", func(ctx context.Context) error { return c.sdk.Remove(ctx, name) })
}

// restart stops the main sandbox and starts it again, its files kept.
func (c *soakClient) restart(context.Context) {
	if !c.call("sandbox.file.write", "", func(ctx context.Context) error {
		return c.sb().WriteFile(ctx, "/root/kept", []byte(c.main), 0o644)
	}) {
		return
	}
	if !c.call("sandbox.stop", "", func(ctx context.Context) error { return c.sb().Stop(ctx) }) {
		c.drop()
		return
	}
	if !c.call("sandbox.start", "", func(ctx context.Context) error {
		return c.sdk.Call(ctx, "sandbox.start", startParams{Sandbox: c.main, Namespace: c.ns}, nil)
	}) {
		c.drop()
		return
	}
	c.call("sandbox.file.read", "", func(ctx context.Context) error {
		got, err := c.sb().ReadFile(ctx, "/root/kept")
		if err != nil {
			return err
		}
		return check(string(got) == c.main, "kept file: %q", got)
	})
}

// recycle stops and removes the main sandbox; the next op starts another.
func (c *soakClient) recycle(context.Context) {
	c.call("sandbox.stop", "", func(ctx context.Context) error { return c.sb().Stop(ctx) })
	c.drop()
}

// drop removes the main sandbox, whatever its state.
func (c *soakClient) drop() {
	c.call("sandbox.remove", "", func(ctx context.Context) error { return c.sdk.Remove(ctx, c.main) })
	c.main = ""
}

// Problems are the reasons the soak failed; none means it passed.
func (r *SoakReport) Problems() []string {
	var p []string
	keys := make([]string, 0, len(r.Failures))
	for k := range r.Failures {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return r.Failures[keys[i]] > r.Failures[keys[j]] })
	for _, k := range keys {
		p = append(p, fmt.Sprintf("unexpected error (%dx): %s", r.Failures[k], k))
	}
	for _, l := range r.Left {
		p = append(p, "left behind: "+l)
	}
	p = append(p, r.trendProblems()...)
	if !r.settled() {
		p = append(p, fmt.Sprintf("not back after the load (allowed +%d): goroutines %d -> %d, fds %d -> %d",
			r.Slack.Settle, r.Before.Goroutines, r.After.Goroutines, r.Before.FDs, r.After.FDs))
	}
	return p
}

// thirds are the medians of the first and last thirds of the samples after
// the warm-up, for each resource; ok is false when there are too few.
func (r *SoakReport) thirds() (first, last Reading, ok bool) {
	var s []Reading
	for _, x := range r.Samples {
		if x.At >= r.Warmup {
			s = append(s, x)
		}
	}
	n := len(s) / 3
	if n < 3 {
		return first, last, false
	}
	med := func(ss []Reading) Reading {
		pick := func(f func(Reading) int64) int64 {
			v := make([]int64, len(ss))
			for i, x := range ss {
				v[i] = f(x)
			}
			sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
			return v[len(v)/2]
		}
		return Reading{
			RSS:        pick(func(x Reading) int64 { return x.RSS }),
			FDs:        int(pick(func(x Reading) int64 { return int64(x.FDs) })),
			Goroutines: int(pick(func(x Reading) int64 { return int64(x.Goroutines) })),
		}
	}
	return med(s[:n]), med(s[len(s)-n:]), true
}

func (r *SoakReport) trendProblems() []string {
	first, last, ok := r.thirds()
	if !ok {
		return []string{fmt.Sprintf("too few samples after the %v warm-up to judge a trend (%d); run longer", r.Warmup, len(r.Samples))}
	}
	var p []string
	if first.Goroutines >= 0 && last.Goroutines > first.Goroutines+r.Slack.Goroutines {
		p = append(p, fmt.Sprintf("goroutines grew under steady load: median %d -> %d (allowed +%d)", first.Goroutines, last.Goroutines, r.Slack.Goroutines))
	}
	if first.FDs >= 0 && last.FDs > first.FDs+r.Slack.FDs {
		p = append(p, fmt.Sprintf("open files grew under steady load: median %d -> %d (allowed +%d)", first.FDs, last.FDs, r.Slack.FDs))
	}
	if first.RSS >= 0 {
		allowed := max(int64(float64(first.RSS)*r.Slack.RSSFraction), r.Slack.RSSBytes)
		if last.RSS > first.RSS+allowed {
			p = append(p, fmt.Sprintf("RSS grew under steady load: median %s -> %s (allowed +%s)", mib(first.RSS), mib(last.RSS), mib(allowed)))
		}
	}
	if first.Goroutines < 0 {
		p = append(p, "the server's goroutines could not be read (no go_goroutines in /metrics for this key)")
	}
	return p
}

// Write prints the report: per-method latencies, throughput, resources.
func (r *SoakReport) Write(w io.Writer) {
	names := make([]string, 0, len(r.Methods))
	calls := 0
	for n, m := range r.Methods {
		names = append(names, n)
		calls += m.Calls
	}
	sort.Strings(names)
	fmt.Fprintf(w, "soak: %d clients for %v (warm-up %v): %d calls, %.1f calls/s\n\n", r.Clients, r.Duration.Round(time.Second), r.Warmup, calls, float64(calls)/r.Duration.Seconds())
	fmt.Fprintf(w, "%-24s %7s %8s %6s %9s %9s %9s %9s\n", "method", "calls", "provoked", "errors", "p50 ms", "p90 ms", "p99 ms", "max ms")
	for _, n := range names {
		m := r.Methods[n]
		sort.Slice(m.lat, func(i, j int) bool { return m.lat[i] < m.lat[j] })
		q := func(p float64) string {
			return fmt.Sprintf("%.1f", float64(m.lat[min(len(m.lat)-1, int(p*float64(len(m.lat))))].Microseconds())/1000)
		}
		fmt.Fprintf(w, "%-24s %7d %8d %6d %9s %9s %9s %9s\n", n, m.Calls, m.Expected, m.Unexpected, q(0.5), q(0.9), q(0.99), q(1))
	}
	first, last, ok := r.thirds()
	peak := Reading{}
	for _, s := range r.Samples {
		peak.RSS, peak.FDs, peak.Goroutines = max(peak.RSS, s.RSS), max(peak.FDs, s.FDs), max(peak.Goroutines, s.Goroutines)
	}
	fmt.Fprintf(w, "\nserver        %12s %12s %12s %12s %12s\n", "before", "1st third", "last third", "peak", "after")
	th := func(f func(Reading) string) (string, string) {
		if !ok {
			return "-", "-"
		}
		return f(first), f(last)
	}
	a, b := th(func(s Reading) string { return mib(s.RSS) })
	fmt.Fprintf(w, "RSS           %12s %12s %12s %12s %12s\n", mib(r.Before.RSS), a, b, mib(peak.RSS), mib(r.After.RSS))
	a, b = th(func(s Reading) string { return fmt.Sprint(s.FDs) })
	fmt.Fprintf(w, "open files    %12d %12s %12s %12d %12d\n", r.Before.FDs, a, b, peak.FDs, r.After.FDs)
	a, b = th(func(s Reading) string { return fmt.Sprint(s.Goroutines) })
	fmt.Fprintf(w, "goroutines    %12d %12s %12s %12d %12d\n", r.Before.Goroutines, a, b, peak.Goroutines, r.After.Goroutines)
	fmt.Fprintf(w, "(thirds: medians of the samples after the warm-up, one a second; allowed growth: goroutines +%d, fds +%d, RSS +%.0f%% or +%s; after: +%d)\n",
		r.Slack.Goroutines, r.Slack.FDs, 100*r.Slack.RSSFraction, mib(r.Slack.RSSBytes), r.Slack.Settle)
	if p := r.Problems(); len(p) > 0 {
		fmt.Fprintf(w, "\nFAIL:\n  %s\n", strings.Join(p, "\n  "))
	} else {
		fmt.Fprintln(w, "\nPASS: no unexpected errors, resources flat under load and back after it, nothing left behind")
	}
}

func mib(b int64) string {
	if b < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}
