package crashtest

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/testenv"
)

// The suite's size. `make test` runs the defaults; `make test-crash` runs
// 500 operations over 6 restarts. A failure prints the seed; -crash.seed
// replays it (the interleaving of clients and the kill moments differ from
// run to run, the operations and their order per client do not).
var (
	flagSeed     = flag.Uint64("crash.seed", 0, "seed of the operation stream (0 = from the clock)")
	flagOps      = flag.Int("crash.ops", 120, "operations in all")
	flagRestarts = flag.Int("crash.restarts", 3, "server kills (SIGKILL) and restarts")
	flagClients  = flag.Int("crash.clients", 3, "concurrent clients")
)

const ns = "crash"

// tri is what a client knows of something a request may or may not have
// done: yes or no when the server acknowledged it, maybe when the answer
// was lost to a kill.
type tri int

const (
	no tri = iota
	yes
	maybe
)

// box is one sandbox as its client knows it. Each client drives its own
// sandboxes one request at a time, so what it knows is exact but for the
// requests a kill cut short.
type box struct {
	name    string
	exists  tri
	running tri
	files   map[string]string // acknowledged uploads: path -> content
	ids     []string          // ids it has had (each removal ends one)
}

// client is one of the concurrent clients.
type client struct {
	n     int
	rng   *rand.Rand
	boxes []*box
	seq   int
}

// stats counts what the run did, for its report.
type stats struct {
	mu       sync.Mutex
	byOp     map[string]int
	cut      int // requests a kill cut short
	refused  map[string]int
	imported []string // images whose import was acknowledged
}

func (st *stats) add(op string, err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.byOp[op]++
	switch k := kindOf(err); {
	case err == nil:
	case k == "":
		st.cut++
	default:
		st.refused[op+":"+k]++
	}
}

// TestCrashRecovery kills the server with SIGKILL at random moments of a
// seeded random stream of mixed operations from concurrent clients, and
// after every restart and at the end checks what recovery promises:
// sandboxes acknowledged as created, stopped or removed are so; every
// sandbox is running and answers, or is stopped and starts; acknowledged
// uploads are there; the database is intact and agrees with the host
// (directories, cgroups, processes, mounts); removed sandboxes leave
// nothing; and after the last removal and shutdown nothing is left at all.
// TestMain removes the warren binary the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.RemoveBuilt()
	os.Exit(code)
}

func TestCrashRecovery(t *testing.T) {
	seed := *flagSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: go test ./internal/crashtest -run TestCrashRecovery -args -crash.seed=%d -crash.ops=%d -crash.restarts=%d)",
		seed, seed, *flagOps, *flagRestarts)
	s := newServer(t, "")
	rng := rand.New(rand.NewPCG(seed, 1))
	clients := make([]*client, *flagClients)
	for i := range clients {
		c := &client{n: i, rng: rand.New(rand.NewPCG(seed, uint64(i)+2))}
		for k := range 3 {
			c.boxes = append(c.boxes, &box{name: fmt.Sprintf("c%d-%d", i, k), files: map[string]string{}})
		}
		clients[i] = c
	}
	st := &stats{byOp: map[string]int{}, refused: map[string]int{}}
	var bad badList
	epochs := *flagRestarts + 1
	done := 0
	for epoch := range epochs {
		s.start(true)
		if epoch > 0 {
			check(t, s, clients, st)
			if t.Failed() {
				t.Fatalf("seed %d: recovery check failed after restart %d", seed, epoch)
			}
		}
		quota := (*flagOps - done) / (epochs - epoch)
		last := epoch == epochs-1
		var issued atomic.Int64
		var killed sync.WaitGroup
		if !last {
			// The kill lands after a random share of the epoch's
			// operations were sent, plus a random delay: mostly in
			// the middle of requests.
			at := int64(quota/2 + rng.IntN(quota/2+1))
			delay := time.Duration(rng.IntN(400)) * time.Millisecond
			killed.Add(1)
			go func() {
				defer killed.Done()
				for issued.Load() < at && !s.isDown() {
					time.Sleep(5 * time.Millisecond)
				}
				time.Sleep(delay)
				s.kill()
			}()
		}
		var wg sync.WaitGroup
		for _, c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !s.isDown() && issued.Add(1) <= int64(quota) {
					c.step(t, s, st, &bad)
				}
			}()
		}
		wg.Wait()
		killed.Wait()
		done += int(min(issued.Load(), int64(quota)))
		if !last && rng.IntN(3) == 0 {
			// A kill while the next server recovers.
			s.start(false)
			time.Sleep(time.Duration(rng.IntN(600)) * time.Millisecond)
			s.kill()
		}
	}
	check(t, s, clients, st)
	bad.report(t)
	st.mu.Lock()
	t.Logf("seed %d: %d operations over %d restarts: %v; %d cut short by a kill; refused: %v; images imported: %d",
		seed, done, *flagRestarts, st.byOp, st.cut, st.refused, len(st.imported))
	st.mu.Unlock()
	finalCleanup(t, s, clients)
	if t.Failed() {
		t.Logf("seed %d failed", seed)
	}
}

// badList collects answers no client should get.
type badList struct {
	mu   sync.Mutex
	errs []string
}

func (b *badList) add(format string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.errs = append(b.errs, fmt.Sprintf(format, args...))
}

func (b *badList) report(t *testing.T) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, e := range b.errs {
		t.Error(e)
	}
}

// ops and their weights.
var ops = []struct {
	name   string
	weight int
}{
	{"start", 18}, {"exec", 20}, {"process", 10}, {"file", 12}, {"tar", 8},
	{"stop", 10}, {"remove", 8}, {"import", 4},
}

func (c *client) pick() string {
	total := 0
	for _, o := range ops {
		total += o.weight
	}
	n := c.rng.IntN(total)
	for _, o := range ops {
		if n < o.weight {
			return o.name
		}
		n -= o.weight
	}
	return ops[0].name
}

// step sends one operation and updates what the client knows from the
// answer. An answer that no state of the sandbox explains is recorded
// in bad.
func (c *client) step(t *testing.T, s *server, st *stats, bad *badList) {
	b := c.boxes[c.rng.IntN(len(c.boxes))]
	op := c.pick()
	if b.exists == no && op != "import" && c.rng.IntN(4) != 0 {
		op = "start"
	}
	c.seq++
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	p := map[string]any{"namespace": ns, "sandbox": b.name}
	var err error
	switch op {
	case "start":
		err = s.call(ctx, "sandbox.start", p, nil)
		switch {
		case err == nil:
			b.exists, b.running = yes, yes
		case kindOf(err) == "":
			if b.exists == no {
				b.exists = maybe
			}
			b.running = maybe
		}
	case "exec":
		want := fmt.Sprintf("c%d-%d", c.n, c.seq)
		var out string
		out, err = s.execOut(ctx, ns, b.name, "echo", want)
		if err == nil && out != want+"\n" {
			bad.add("%s: exec echo %s printed %q", b.name, want, out)
		}
	case "process":
		err = s.call(ctx, "sandbox.process.start", map[string]any{"namespace": ns, "sandbox": b.name, "argv": []string{"sleep", "600"}}, nil)
	case "file":
		path := fmt.Sprintf("/tmp/f-%d-%d", c.n, c.seq)
		content := fmt.Sprintf("file %d of client %d %x", c.seq, c.n, c.rng.Uint64())
		p["path"], p["data"] = path, base64.StdEncoding.EncodeToString([]byte(content))
		err = s.call(ctx, "sandbox.file.write", p, nil)
		if err == nil {
			b.files[path] = content
		}
	case "tar":
		dir := fmt.Sprintf("/tmp/t-%d-%d", c.n, c.seq)
		files := map[string]string{}
		for i := range 1 + c.rng.IntN(4) {
			files[fmt.Sprintf("%s/f%d", dir, i)] = strings.Repeat(fmt.Sprintf("%x", c.rng.Uint64()), 1+c.rng.IntN(2000))
		}
		err = s.putTar(ctx, ns, b.name, "/", tarOf(files))
		if err == nil {
			for p, content := range files {
				b.files[p] = content
			}
		}
	case "stop":
		err = s.call(ctx, "sandbox.stop", p, nil)
		switch {
		case err == nil:
			b.running = no
		case kindOf(err) == "":
			b.running = maybe
		}
	case "remove":
		err = s.call(ctx, "sandbox.remove", p, nil)
		switch {
		case err == nil:
			b.exists, b.running, b.files = no, no, map[string]string{}
		case kindOf(err) == "":
			b.exists, b.running, b.files = maybe, maybe, map[string]string{}
		}
	case "import":
		err = c.importImage(ctx, s, st)
	}
	st.add(op, err)
	if err == nil {
		return
	}
	k := kindOf(err)
	switch {
	case k == "" && s.isDown():
		// Cut short by the kill.
	case k == "":
		bad.add("%s %s: no answer from a server that was not killed: %v", op, b.name, err)
	case k == "not_found" && b.exists != yes, k == "conflict" && b.running != yes:
		// A sandbox that does not exist or is not running.
	default:
		bad.add("%s %s (exists %d, running %d): %v", op, b.name, b.exists, b.running, err)
	}
}

// importImage imports a small random root file system with `warren image
// import`, beside the server, as an operator would; one in four is
// killed midway.
func (c *client) importImage(ctx context.Context, s *server, st *stats) error {
	src, err := os.MkdirTemp("", "warren-crash-rootfs-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(src) }()
	for i := range 3 + c.rng.IntN(20) {
		d := filepath.Join(src, fmt.Sprintf("d%d", i%4))
		_ = os.MkdirAll(d, 0o755)
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%d", i)), bytes.Repeat([]byte{byte(c.rng.Uint32())}, c.rng.IntN(64<<10)), 0o644); err != nil {
			return err
		}
	}
	name := fmt.Sprintf("crash/img-%d-%d:1", c.n, c.seq)
	cmd := s.warren("image", "import", src, name)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return err
	}
	if c.rng.IntN(4) == 0 {
		time.AfterFunc(time.Duration(c.rng.IntN(100))*time.Millisecond, func() { _ = cmd.Process.Signal(syscall.SIGKILL) })
	}
	err = cmd.Wait()
	if err != nil {
		var ee interface{ Sys() any }
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				return nil // killed on purpose
			}
		}
		return &rpcError{Kind: "import-failed", Message: fmt.Sprintf("warren image import: %v: %s", err, out.String())}
	}
	st.mu.Lock()
	st.imported = append(st.imported, name)
	st.mu.Unlock()
	return nil
}

func tarOf(files map[string]string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, p := range paths {
		_ = tw.WriteHeader(&tar.Header{Name: strings.TrimPrefix(p, "/"), Mode: 0o644, Size: int64(len(files[p])), Typeflag: tar.TypeReg})
		_, _ = tw.Write([]byte(files[p]))
	}
	_ = tw.Close()
	return buf.Bytes()
}

// check runs the invariants on a server that has just (re)started, with
// no client running.
func check(t *testing.T, s *server, clients []*client, st *stats) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	list, err := s.list(ctx, ns)
	if err != nil {
		t.Fatalf("sandbox.list after restart: %v", err)
	}
	byName := map[string]sandboxInfo{}
	for _, in := range list {
		byName[in.Name] = in
	}
	rows, err := s.readDB(t)
	if err != nil {
		t.Fatal(err)
	}
	idOf := map[string]string{}
	for _, r := range rows {
		if r.Namespace == ns {
			idOf[r.Name] = r.ID
		}
	}
	for _, c := range clients {
		for _, b := range c.boxes {
			in, ok := byName[b.name]
			switch {
			case b.exists == yes && !ok:
				t.Errorf("%s: created (acknowledged) but gone after the restart", b.name)
			case b.exists == no && ok:
				t.Errorf("%s: removed (acknowledged) but back after the restart: %+v", b.name, in)
			case b.running == yes && ok && in.State != "running":
				t.Errorf("%s: running before the kill, %q after the restart (%s)", b.name, in.State, in.Error)
			case b.running == no && ok && in.State != "stopped":
				t.Errorf("%s: stopped (acknowledged) but %q after the restart (%s)", b.name, in.State, in.Error)
			}
			if !ok {
				b.exists, b.running, b.files = no, no, map[string]string{}
				continue
			}
			b.exists = yes
			if id := idOf[b.name]; id != "" && (len(b.ids) == 0 || b.ids[len(b.ids)-1] != id) {
				b.ids = append(b.ids, id)
			}
		}
	}
	// Every sandbox runs and answers, or starts again.
	for _, in := range list {
		switch in.State {
		case "running":
		case "stopped", "error":
			if err := s.call(ctx, "sandbox.start", map[string]any{"namespace": ns, "sandbox": in.Name}, nil); err != nil {
				t.Errorf("%s (%s %s) does not start after the restart: %v", in.Name, in.State, in.Error, err)
				continue
			}
		default:
			t.Errorf("%s is %q after the restart: recovery leaves no sandbox half-way", in.Name, in.State)
			continue
		}
		if out, err := s.execOut(ctx, ns, in.Name, "echo", "alive"); err != nil || out != "alive\n" {
			t.Errorf("%s (%s) does not answer an exec after the restart: %q %v", in.Name, in.State, out, err)
		}
	}
	for _, c := range clients {
		for _, b := range c.boxes {
			if b.exists != yes {
				continue
			}
			b.running = yes
			for path, want := range b.files {
				var r struct {
					Data string `json:"data"`
				}
				err := s.call(ctx, "sandbox.file.read", map[string]any{"namespace": ns, "sandbox": b.name, "path": path}, &r)
				got, _ := base64.StdEncoding.DecodeString(r.Data)
				if err != nil || string(got) != want {
					t.Errorf("%s: acknowledged upload %s lost after the restart: %v (%d bytes, want %d)", b.name, path, err, len(got), len(want))
				}
			}
		}
	}
	checkState(t, s, clients, st)
}

// checkState holds the database against the API's list and the host, and
// the image store's records against its files.
func checkState(t *testing.T, s *server, clients []*client, st *stats) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := eventually(15*time.Second, func() error {
		rows, err := s.readDB(t)
		if err != nil {
			return err
		}
		list, err := s.list(ctx, "*")
		if err != nil {
			return err
		}
		var errs []error
		if len(list) != len(rows) {
			errs = append(errs, fmt.Errorf("the API lists %d sandboxes, the database holds %d", len(list), len(rows)))
		}
		byName := map[string]dbRow{}
		for _, r := range rows {
			byName[r.Namespace+"/"+r.Name] = r
		}
		for _, in := range list {
			if r, ok := byName[ns+"/"+in.Name]; !ok || r.State != in.State {
				errs = append(errs, fmt.Errorf("sandbox %s: the API says %q, the database %+v", in.Name, in.State, r))
			}
		}
		for _, c := range clients {
			for _, b := range c.boxes {
				for i, id := range b.ids {
					if _, ok := rows[id]; ok && (i < len(b.ids)-1 || b.exists == no) {
						errs = append(errs, fmt.Errorf("%s: removed sandbox %s still has a database row", b.name, id))
					}
				}
			}
		}
		errs = append(errs, s.checkHost(t, rows), checkImages(s, st))
		return errors.Join(errs...)
	})
	if err != nil {
		t.Error(err)
	}
}

// checkImages holds the image store's records against its layer files:
// every layer a record names is on disk, and every acknowledged import
// has its name.
func checkImages(s *server, st *stats) error {
	db, err := openDB(s)
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }()
	stores, _ := filepath.Glob(filepath.Join(s.data, "images", "store-*", "layers", "sha256"))
	rows, err := db.Query(`SELECT diff_id FROM layers`)
	if err != nil {
		return err
	}
	var errs []error
	for rows.Next() {
		var d string
		_ = rows.Scan(&d)
		found := false
		for _, dir := range stores {
			if _, err := os.Stat(filepath.Join(dir, strings.TrimPrefix(d, "sha256:"))); err == nil {
				found = true
			}
		}
		if !found {
			errs = append(errs, fmt.Errorf("layer %s is recorded but not on disk", d))
		}
	}
	_ = rows.Close()
	st.mu.Lock()
	imported := slices.Clone(st.imported)
	st.mu.Unlock()
	for _, name := range imported {
		var n int
		if err := db.QueryRow(`SELECT COUNT(*) FROM image_names WHERE name = ?`, name).Scan(&n); err != nil {
			errs = append(errs, err)
		} else if n != 1 {
			errs = append(errs, fmt.Errorf("image %s was imported (acknowledged) but is not recorded", name))
		}
	}
	return errors.Join(errs...)
}

// finalCleanup removes every sandbox, stops the server and checks that
// nothing of any sandbox is left: no row, file, cgroup, process or mount.
func finalCleanup(t *testing.T, s *server, clients []*client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	list, err := s.list(ctx, "*")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range list {
		if err := s.call(ctx, "sandbox.remove", map[string]any{"namespace": ns, "sandbox": in.Name}, nil); err != nil {
			t.Errorf("remove %s: %v", in.Name, err)
		}
	}
	s.stop()
	rows, err := s.readDB(t)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) > 0 {
		t.Errorf("database rows left after removing everything: %v", rows)
	}
	v := s.hostView(t)
	if len(v.cgroups) > 0 || len(v.procs) > 0 || len(v.mounts) > 0 || len(v.dirs) > 0 || len(v.runs) > 0 || len(v.logs) > 0 || len(v.removing) > 0 {
		t.Errorf("left behind after removing every sandbox and stopping the server: %+v", v)
	}
	var ids []string
	for _, c := range clients {
		for _, b := range c.boxes {
			ids = append(ids, b.ids...)
		}
	}
	// No file anywhere under the data and run directories names a sandbox.
	for _, root := range []string{s.data, s.run} {
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return nil //nolint:nilerr // what cannot be read is not a leak this checks
			}
			if strings.Contains(d.Name(), "sb-") {
				t.Errorf("left behind: %s", p)
			}
			return nil
		})
	}
	t.Logf("%d sandboxes made and removed", len(ids))
}
