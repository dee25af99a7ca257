package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

// TestPullAtFirstStart: an image the resolver lacks is handed to Pull at a
// sandbox's first start, with the sandbox's namespace and log, then
// resolved again; the sandbox's later starts use the image it pinned and
// pull nothing. A failed pull refuses the start, whatever its kind, and
// leaves nothing behind.
func TestPullAtFirstStart(t *testing.T) {
	e := newEnv(t, sandbox.Options{})
	var (
		mu     sync.Mutex
		have   bool
		pulls  []string
		failed = errors.New("registry down")
	)
	resolveBase := e.opts.Images
	e.opts.Images = func(ctx context.Context, name string) (*image.Image, error) {
		mu.Lock()
		defer mu.Unlock()
		if name == "pulled" && have {
			return resolveBase(ctx, "base")
		}
		return resolveBase(ctx, name)
	}
	e.opts.Pull = func(_ context.Context, ns, name string, logf func(string, ...any)) error {
		mu.Lock()
		defer mu.Unlock()
		pulls = append(pulls, ns+"/"+name)
		if name == "broken" {
			return failed
		}
		logf("pulling image %s", name)
		have = true
		return nil
	}
	m := e.manager(t)

	_, err := m.Start(t.Context(), "ns", "x", sandbox.Spec{Image: "broken", MemoryMiB: 512, CPUs: 1}, false)
	if !errors.Is(err, failed) {
		t.Fatalf("start with an image whose pull fails: %v", err)
	}
	if !gone(m, "x") || e.rows(t) != 0 {
		t.Fatalf("a failed pull left a record (rows %d)", e.rows(t))
	}
	if ids, _ := e.be.IDs(); len(ids) != 0 {
		t.Fatalf("a failed pull left %v on the host", ids)
	}

	s := sandbox.Spec{Image: "pulled", MemoryMiB: 512, CPUs: 1}
	mustStart(t, m, "a", s)
	logHas(t, m, "a", "pulling image pulled")
	logHas(t, m, "a", "started (image pulled")
	if err := m.Stop(t.Context(), "ns", "a"); err != nil {
		t.Fatal(err)
	}
	mustStart(t, m, "a", s)
	if got := fmt.Sprint(pulls); got != "[ns/broken ns/pulled]" {
		t.Errorf("pulls %s, want one per image", got)
	}
	lines, _ := m.Logs("ns", "a", 0)
	if i, j := index(lines, "pulling image"), index(lines, "started (image"); i < 0 || j < i {
		t.Errorf("the pull is not logged before the start:\n%s", strings.Join(lines, "\n"))
	}
}

func index(lines []string, sub string) int {
	for i, l := range lines {
		if strings.Contains(l, sub) {
			return i
		}
	}
	return -1
}
