package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/backend/native"
	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/image/layer"
	"github.com/warren-sandbox/warren/internal/store"
)

const imageAbout = `
Manages the local image store. Layers are stored once by digest and shared
by every image that uses them.

  warren image import SRC NAME   import a docker-save tarball, an OCI layout
                                 (directory or tarball), or a plain rootfs
                                 (directory or tarball) under NAME
  warren image pull [--platform OS/ARCH[/VARIANT]] [--insecure] REF [NAME]
                                 pull REF (host/repo:tag or host/repo@sha256:...)
                                 from an OCI / Docker v2 registry under NAME
                                 (default REF); credentials come from the
                                 Docker config and its credential helpers;
                                 plain HTTP only to loopback or with --insecure
  warren image build-base [--suite S] [--mirror URL] [--name NAME] python|node
                                 build a small Debian image (default
                                 bookworm) with python3 or nodejs using
                                 mmdebstrap, from Debian's mirror (no
                                 registry needed), named warren/python:S or
                                 warren/node:S; then serve with it:
                                 warren serve --python-image NAME
  warren image ls                list images
  warren image inspect NAME|ID   print an image's details as JSON: names,
                                 layers, config, sandboxes started from it
  warren image rm NAME           remove a name (the image goes with its last
                                 name); refused while a sandbox uses the image
  warren image prune             delete images without a name or a sandbox,
                                 and layers no image uses; reports bytes freed`

func imageCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren image", "warren image import|pull|build-base|ls|inspect|rm|prune [flags] [args]", imageAbout)
	var hf hostFlags
	hf.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return exitError{2}
	}
	st, db, err := hf.imageStore()
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }()
	switch sub, a := rest[0], rest[1:]; {
	case sub == "import" && len(a) == 2:
		start := time.Now()
		rec, err := st.Import(ctx, a[0], a[1])
		if err != nil {
			return err
		}
		fmt.Printf("imported %s (%s, %d layers, %.1f MiB) in %.1fs\n", rec.Name, short(rec.ID), len(rec.Layers), float64(rec.Size)/(1<<20), time.Since(start).Seconds())
	case sub == "pull":
		return pullCmd(ctx, st, a)
	case sub == "build-base":
		return buildBaseCmd(ctx, st, a)
	case sub == "ls" && len(a) == 0:
		recs, err := st.List()
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tID\tLAYERS\tSIZE\tCREATED")
		for _, r := range recs {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.1f MiB\t%s\n", r.Name, short(r.ID), len(r.Layers), float64(r.Size)/(1<<20), r.Created.Format(time.RFC3339))
		}
		return tw.Flush()
	case sub == "inspect" && len(a) == 1:
		d, err := st.Inspect(a[0])
		if err != nil {
			return err
		}
		return printInspect(os.Stdout, d)
	case sub == "rm" && len(a) == 1:
		return st.Remove(a[0])
	case sub == "prune" && len(a) == 0:
		freed, err := st.Prune()
		if err != nil {
			return err
		}
		fmt.Printf("freed %.1f MiB\n", float64(freed)/(1<<20))
	default:
		fs.Usage()
		return exitError{2}
	}
	return nil
}

// printInspect writes d as indented JSON.
func printInspect(w io.Writer, d *image.Details) error {
	type layer struct {
		DiffID string `json:"diff_id"`
		Size   int64  `json:"size"`
	}
	out := struct {
		ID         string    `json:"id"`
		Names      []string  `json:"names"`
		Created    time.Time `json:"created"`
		Size       int64     `json:"size"`
		Layers     []layer   `json:"layers"`
		Env        []string  `json:"env"`
		WorkingDir string    `json:"working_dir"`
		User       string    `json:"user"`
		Entrypoint []string  `json:"entrypoint"`
		Cmd        []string  `json:"cmd"`
		UsedBy     []string  `json:"used_by"`
	}{ID: d.ID, Names: d.Names, Created: d.Created.UTC(), Size: d.Size, Env: d.Env, WorkingDir: d.WorkingDir,
		User: d.User, Entrypoint: d.Entrypoint, Cmd: d.Cmd, UsedBy: d.UsedBy, Layers: []layer{}}
	for i, l := range d.Layers {
		out.Layers = append(out.Layers, layer{l, d.LayerSizes[i]})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func short(id string) string {
	if len(id) > 19 {
		return id[:19]
	}
	return id
}

// imageStore opens the image store. Layers are unpacked owned by the uid
// range sandbox root maps to, so the store is per range: a host without
// user namespaces gets its own.
func (h *hostFlags) imageStore() (*image.Store, *store.Store, error) {
	shift := layer.IDMap{}
	if h.userNS != native.UserNSOff && native.ProbeUserNS() == nil {
		shift = layer.IDMap{HostBase: native.DefaultUIDBase, Size: 65536}
	}
	if err := os.MkdirAll(h.dataDir, 0o700); err != nil { // the backend sets the mode and group the sandboxes need (native.New)
		return nil, nil, err
	}
	db, err := store.Open(filepath.Join(h.dataDir, "warren.db"))
	if err != nil {
		return nil, nil, err
	}
	st, err := image.OpenStore(filepath.Join(h.dataDir, "images", fmt.Sprintf("store-%d", shift.HostBase)), db, shift)
	if err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	return st, db, nil
}

// pullCmd runs "warren image pull [--platform P] [--insecure] REF [NAME]",
// with progress on stderr.
func pullCmd(ctx context.Context, st *image.Store, args []string) error {
	fs := newFlagSet("warren image pull", "warren image pull [--platform OS/ARCH[/VARIANT]] [--insecure] REF [NAME]", imageAbout)
	platform := fs.String("platform", "", "platform to pull from a multi-arch image (default: this host's)")
	insecure := fs.Bool("insecure", false, "allow plain HTTP to a registry that is not on loopback")
	if err := fs.Parse(args); err != nil {
		return err
	}
	a := fs.Args()
	if len(a) != 1 && len(a) != 2 {
		fs.Usage()
		return exitError{2}
	}
	ref, name := a[0], ""
	if len(a) == 2 {
		name = a[1]
	}
	start := time.Now()
	pd := newPullDisplay(os.Stderr, isTerminal(os.Stderr), start)
	rec, err := st.Pull(ctx, ref, name, image.PullOptions{Platform: *platform, Insecure: *insecure, Progress: pd.update})
	pd.finish()
	if err != nil {
		return err
	}
	fmt.Printf("pulled %s (%s, %d layers, %.1f MiB) in %.1fs\n", rec.Name, short(rec.ID), len(rec.Layers), float64(rec.Size)/(1<<20), time.Since(start).Seconds())
	return nil
}

// buildBaseCmd runs "warren image build-base [--suite S] [--mirror URL]
// [--name NAME] python|node", with mmdebstrap's output on stderr as
// progress.
func buildBaseCmd(ctx context.Context, st *image.Store, args []string) error {
	fs := newFlagSet("warren image build-base", "warren image build-base [--suite S] [--mirror URL] [--name NAME] python|node", imageAbout)
	suite := fs.String("suite", image.DefaultBaseSuite, "Debian suite: bookworm, trixie, stable, ...")
	mirror := fs.String("mirror", "", "http(s) URL of a Debian mirror, used alone (default: deb.debian.org with the suite's updates and security archives)")
	name := fs.String("name", "", "image name (default warren/LANG:SUITE)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	a := fs.Args()
	if len(a) != 1 {
		fs.Usage()
		return exitError{2}
	}
	lang := a[0]
	start := time.Now()
	rec, err := st.BuildBase(ctx, lang, image.BaseOptions{Suite: *suite, Mirror: *mirror, Name: *name, Log: os.Stderr})
	if err != nil {
		return err
	}
	fmt.Printf("built %s (%s, %d layers, %.1f MiB) in %.1fs\n", rec.Name, short(rec.ID), len(rec.Layers), float64(rec.Size)/(1<<20), time.Since(start).Seconds())
	fmt.Printf("use it: warren serve --%s-image %s\n", lang, rec.Name)
	return nil
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// pullDisplay renders pull progress: on a terminal one line rewritten at
// most ten times a second; otherwise a line per finished layer.
type pullDisplay struct {
	w     io.Writer
	tty   bool
	start time.Time

	mu     sync.Mutex
	layers map[string][2]int64 // done, total
	last   image.Progress
	drawn  time.Time
	any    bool
}

func newPullDisplay(w io.Writer, tty bool, start time.Time) *pullDisplay {
	return &pullDisplay{w: w, tty: tty, start: start, layers: map[string][2]int64{}}
}

func (d *pullDisplay) totals() (done, total int64) {
	for _, l := range d.layers {
		done += l[0]
		total += l[1]
	}
	return done, total
}

func (d *pullDisplay) rate(done int64) float64 {
	if s := time.Since(d.start).Seconds(); s > 0 {
		return float64(done) / 1e6 / s
	}
	return 0
}

func (d *pullDisplay) update(p image.Progress) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.layers[p.Layer] = [2]int64{p.Done, p.Total}
	d.last, d.any = p, true
	done, total := d.totals()
	if !d.tty {
		if p.Finished {
			fmt.Fprintf(d.w, "layer %s done (%.1f MiB) [%d/%d]\n", short(p.Layer), float64(p.Total)/(1<<20), p.LayersDone, p.LayersTotal)
		}
		return
	}
	if !p.Finished && time.Since(d.drawn) < 100*time.Millisecond {
		return
	}
	d.drawn = time.Now()
	fmt.Fprintf(d.w, "\r\033[Klayers %d/%d  %.1f/%.1f MiB  %.1f MB/s", p.LayersDone, p.LayersTotal,
		float64(done)/(1<<20), float64(total)/(1<<20), d.rate(done))
}

// finish ends the display with a summary line.
func (d *pullDisplay) finish() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.tty && d.any {
		fmt.Fprint(d.w, "\r\033[K")
	}
	done, _ := d.totals()
	fmt.Fprintf(d.w, "fetched %d/%d layers, %.1f MiB at %.1f MB/s\n", d.last.LayersDone, d.last.LayersTotal, float64(done)/(1<<20), d.rate(done))
}
