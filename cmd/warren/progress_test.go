package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/guest/service"
	"github.com/warren-sandbox/warren/internal/image"
)

func TestIsTerminal(t *testing.T) {
	master, slave, err := service.OpenPTY()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = master.Close() }()
	defer func() { _ = slave.Close() }()
	if !isTerminal(slave) {
		t.Error("a pty slave is not a terminal")
	}
	f, err := os.CreateTemp(t.TempDir(), "plain")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	if isTerminal(f) {
		t.Error("a regular file is a terminal")
	}
}

// feed sends a two-layer pull's progress: many small reads, then each
// layer finishing.
func feed(d *pullDisplay) {
	for i := int64(1); i <= 50; i++ {
		d.update(image.Progress{Layer: "sha256:aaaaaaaaaaaaaaaaaaaaaaaa", Done: i << 20, Total: 50 << 20, LayersTotal: 2})
	}
	d.update(image.Progress{Layer: "sha256:aaaaaaaaaaaaaaaaaaaaaaaa", Done: 50 << 20, Total: 50 << 20, LayersDone: 1, LayersTotal: 2, Finished: true})
	d.update(image.Progress{Layer: "sha256:bbbbbbbbbbbbbbbbbbbbbbbb", Done: 10 << 20, Total: 10 << 20, LayersDone: 2, LayersTotal: 2, Finished: true})
	d.finish(nil)
}

func TestPullDisplayTerminal(t *testing.T) {
	var buf bytes.Buffer
	feed(newPullDisplay(&buf, true, time.Now().Add(-time.Second)))
	out := buf.String()
	// One status line rewritten in place: throttled (not one draw per
	// read), every finished layer drawn, cleared before the summary.
	if draws := strings.Count(out, "\r\033[K"); draws < 3 || draws > 10 {
		t.Errorf("%d redraws, want the first read, both finished layers and the clear: %q", draws, out)
	}
	if !strings.Contains(out, "layers 2/2  60.0/60.0 MiB") {
		t.Errorf("no final status line: %q", out)
	}
	if i := strings.LastIndex(out, "\r\033[K"); strings.Count(out, "\n") != 1 ||
		!strings.HasPrefix(out[i:], "\r\033[Kfetched 2/2 layers, 60.0 MiB at ") {
		t.Errorf("summary: %q", out)
	}
}

func TestPullDisplayPlain(t *testing.T) {
	var buf bytes.Buffer
	feed(newPullDisplay(&buf, false, time.Now()))
	out := buf.String()
	if strings.Contains(out, "\r") || strings.Contains(out, "\033") {
		t.Errorf("control characters off a terminal: %q", out)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "layer sha256:aaaaaaaaaaaa done (50.0 MiB) [1/2]") ||
		!strings.HasPrefix(lines[1], "layer sha256:bbbbbbbbbbbb done (10.0 MiB) [2/2]") ||
		!strings.HasPrefix(lines[2], "fetched 2/2 layers, 60.0 MiB at ") {
		t.Errorf("plain progress: %q", lines)
	}
}
