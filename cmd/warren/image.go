package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	sub, err := subcommand(fs, fs.Args(), "import", "pull", "build-base", "ls", "inspect", "rm", "prune")
	if err != nil {
		return err
	}
	// Every flag and argument is checked before the store is opened (a
	// data directory made for nothing, a help that needs a database).
	args = fs.Args()[1:]
	var run func(st *image.Store) error
	switch sub {
	case "import":
		run, err = imageImport(fs, args)
	case "pull":
		run, err = pullCmd(ctx, fs, args)
	case "build-base":
		run, err = buildBaseCmd(ctx, fs, args)
	case "ls":
		run, err = imageList(fs, args)
	case "inspect", "rm":
		run, err = imageRef(fs, sub, args)
	case "prune":
		sfs := subFlagSet(fs, sub, "warren image prune [flags]", "Deletes images without a name or a sandbox, and layers no image uses, and\nreports the bytes freed.")
		if err = parseFlags(sfs, args); err == nil {
			err = wantArgs(sfs, sfs.Args())
		}
		run = func(st *image.Store) error {
			freed, err := st.Prune()
			if err != nil {
				return err
			}
			fmt.Printf("freed %.1f MiB\n", float64(freed)/(1<<20))
			return nil
		}
	}
	if err != nil {
		return err
	}
	st, db, err := hf.imageStore()
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }()
	return run(st)
}

const imageImportAbout = `
Imports a docker-save tarball, an OCI layout (directory or tarball) or a
plain root file system (directory or tarball, gzip allowed) under NAME.
Without NAME, a docker-save tarball's image takes its first name (its
RepoTags, as 'docker save' wrote them).`

func imageImport(parent *flag.FlagSet, args []string) (func(*image.Store) error, error) {
	fs := subFlagSet(parent, "import", "warren image import [flags] SRC [NAME]", imageImportAbout)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return nil, err
	}
	if err := wantArgs(fs, pos, "SRC (a tarball or directory)", "NAME..."); err != nil {
		return nil, err
	}
	if len(pos) > 2 {
		return nil, wantArgs(fs, pos, "SRC", "NAME")
	}
	return func(st *image.Store) error {
		name := ""
		if len(pos) == 2 {
			name = pos[1]
		}
		start := time.Now()
		rec, err := st.Import(context.Background(), pos[0], name)
		if err != nil {
			return err
		}
		fmt.Printf("imported %s (%s, %d layers, %.1f MiB) in %.1fs\n", rec.Name, short(rec.ID), len(rec.Layers), float64(rec.Size)/(1<<20), time.Since(start).Seconds())
		return nil
	}, nil
}

// imageRow is a row of 'warren image ls' (its --json and --format
// fields).
type imageRow struct {
	Name    string    `json:"name"`
	ID      string    `json:"id"`
	Layers  int       `json:"layers"`
	Size    int64     `json:"size"`
	Created time.Time `json:"created"`
}

func imageList(parent *flag.FlagSet, args []string) (func(*image.Store) error, error) {
	fs := subFlagSet(parent, "ls", "warren image ls [flags]", "Lists the images of the local store by name: an image with several names is\nlisted under each. -q prints the names.")
	var lf listFlags
	lf.register(fs, "names")
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	if err := wantArgs(fs, fs.Args()); err != nil {
		return nil, err
	}
	return func(st *image.Store) error {
		recs, err := st.List()
		if err != nil {
			return err
		}
		rows := make([]imageRow, len(recs))
		for i, r := range recs {
			rows[i] = imageRow{r.Name, r.ID, len(r.Layers), r.Size, r.Created.UTC()}
		}
		return printList(&lf, rows, func(r imageRow) string { return r.Name }, "NAME\tID\tLAYERS\tSIZE\tCREATED",
			func(r imageRow) string {
				return fmt.Sprintf("%s\t%s\t%d\t%.1f MiB\t%s", r.Name, short(r.ID), r.Layers, float64(r.Size)/(1<<20), r.Created.Format(time.RFC3339))
			})
	}, nil
}

// imageRef runs 'image inspect' or 'image rm' on a name, an id, or an id
// as 'image ls' shortens it.
func imageRef(parent *flag.FlagSet, sub string, args []string) (func(*image.Store) error, error) {
	about := "Prints an image's details as JSON: names, layers, config, and the sandboxes\nstarted from it. REF is a name, an id, or an id as 'warren image ls' shortens it."
	if sub == "rm" {
		about = "Removes a name; the image goes with its last name. Refused while a sandbox\nuses the image. REF is a name, or an id (short as 'warren image ls' prints it)\nof an image with one name."
	}
	fs := subFlagSet(parent, sub, "warren image "+sub+" [flags] REF", about)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return nil, err
	}
	if err := wantArgs(fs, pos, "REF (an image name or id)"); err != nil {
		return nil, err
	}
	ref := pos[0]
	return func(st *image.Store) error {
		d, err := st.Inspect(ref)
		if errors.Is(err, image.ErrNotFound) || errors.Is(err, image.ErrInvalidName) {
			id, idErr := st.ResolveID(ref)
			if idErr == nil {
				d, err = st.Inspect(id)
			} else if !errors.Is(idErr, image.ErrNotFound) && strings.Count(ref, ":") < 2 && strings.Trim(strings.TrimPrefix(ref, "sha256:"), "0123456789abcdef") == "" {
				err = idErr // a hex prefix several images share
			}
		}
		if err != nil {
			return err
		}
		if sub == "inspect" {
			return printInspect(os.Stdout, d)
		}
		name := ref
		if !slices.Contains(d.Names, ref) {
			switch len(d.Names) {
			case 0:
				return fmt.Errorf("image %s has no name left to remove ('warren image prune' deletes it once no sandbox uses it)", short(d.ID))
			case 1:
				name = d.Names[0]
			default:
				return fmt.Errorf("image %s has %d names (%s): remove them by name", short(d.ID), len(d.Names), strings.Join(d.Names, ", "))
			}
		}
		if err := st.Remove(name); err != nil {
			return err
		}
		fmt.Printf("removed %s\n", name)
		if len(d.Names) == 1 {
			fmt.Printf("image %s has no name left; 'warren image prune' frees its layers\n", short(d.ID))
		}
		return nil
	}, nil
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

const pullAbout = `
Pulls REF (host/repo:tag or host/repo@sha256:...) from an OCI / Docker v2
registry under NAME (default REF). Credentials come from the Docker config
and its credential helpers; plain HTTP only to loopback or with --insecure.`

// pullCmd parses "warren image pull [--platform P] [--insecure] REF
// [NAME]"; the pull shows progress on stderr.
func pullCmd(ctx context.Context, parent *flag.FlagSet, args []string) (func(*image.Store) error, error) {
	fs := subFlagSet(parent, "pull", "warren image pull [--platform OS/ARCH[/VARIANT]] [--insecure] [flags] REF [NAME]", pullAbout)
	platform := fs.String("platform", "", "platform to pull from a multi-arch image (default: this host's)")
	insecure := fs.Bool("insecure", false, "allow plain HTTP to a registry that is not on loopback")
	a, err := parseInterspersed(fs, args)
	if err != nil {
		return nil, err
	}
	if err := wantArgs(fs, a, "REF (what to pull)", "NAME..."); err != nil {
		return nil, err
	}
	if len(a) > 2 {
		return nil, wantArgs(fs, a, "REF", "NAME")
	}
	return func(st *image.Store) error {
		return pull(ctx, st, a, *platform, *insecure)
	}, nil
}

func pull(ctx context.Context, st *image.Store, a []string, platform string, insecure bool) error {
	ref, name := a[0], ""
	if len(a) == 2 {
		name = a[1]
	}
	start := time.Now()
	pd := newPullDisplay(os.Stderr, isTerminal(os.Stderr), start)
	rec, err := st.Pull(ctx, ref, name, image.PullOptions{Platform: platform, Insecure: insecure, Progress: pd.update})
	pd.finish(err)
	if err != nil {
		return err
	}
	fmt.Printf("pulled %s (%s, %d layers, %.1f MiB) in %.1fs\n", rec.Name, short(rec.ID), len(rec.Layers), float64(rec.Size)/(1<<20), time.Since(start).Seconds())
	return nil
}

const buildBaseAbout = `
Builds a small Debian image (default bookworm) with python3 or nodejs
using mmdebstrap, from Debian's mirror (no registry needed), named
warren/python:SUITE or warren/node:SUITE; then serve with it:
warren serve --python-image NAME`

// buildBaseCmd parses "warren image build-base [--suite S] [--mirror URL]
// [--name NAME] python|node"; the build shows mmdebstrap's output on
// stderr as progress.
func buildBaseCmd(ctx context.Context, parent *flag.FlagSet, args []string) (func(*image.Store) error, error) {
	fs := subFlagSet(parent, "build-base", "warren image build-base [--suite S] [--mirror URL] [--name NAME] [flags] python|node", buildBaseAbout)
	suite := fs.String("suite", image.DefaultBaseSuite, "Debian suite: bookworm, trixie, stable, ...")
	mirror := fs.String("mirror", "", "http(s) URL of a Debian mirror, used alone (default: deb.debian.org with the suite's updates and security archives)")
	name := fs.String("name", "", "image name (default warren/LANG:SUITE)")
	a, err := parseInterspersed(fs, args)
	if err != nil {
		return nil, err
	}
	if err := wantArgs(fs, a, "the language (python or node)"); err != nil {
		return nil, err
	}
	return func(st *image.Store) error {
		return buildBase(ctx, st, a[0], image.BaseOptions{Suite: *suite, Mirror: *mirror, Name: *name, Log: os.Stderr})
	}, nil
}

func buildBase(ctx context.Context, st *image.Store, lang string, opt image.BaseOptions) error {
	start := time.Now()
	rec, err := st.BuildBase(ctx, lang, opt)
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

// finish ends the display with a summary line, or none for a pull that
// failed (err): its error says what happened, and "fetched 0/0 layers"
// would read like a success.
func (d *pullDisplay) finish(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.tty && d.any {
		fmt.Fprint(d.w, "\r\033[K")
	}
	if err != nil {
		return
	}
	if d.last.LayersTotal == 0 {
		fmt.Fprintln(d.w, "every layer already in the store")
		return
	}
	done, _ := d.totals()
	fmt.Fprintf(d.w, "fetched %d/%d layers, %.1f MiB at %.1f MB/s\n", d.last.LayersDone, d.last.LayersTotal, float64(done)/(1<<20), d.rate(done))
}
