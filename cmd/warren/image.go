package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

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
  warren image ls                list images
  warren image rm NAME           remove a name (the image goes with its last name)
  warren image prune             delete layers no image uses; reports bytes freed

Pulling from registries is not built yet.`

func imageCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren image", "warren image import|ls|rm|prune [flags] [args]", imageAbout)
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
	defer db.Close()
	switch sub, a := rest[0], rest[1:]; {
	case sub == "import" && len(a) == 2:
		start := time.Now()
		rec, err := st.Import(ctx, a[0], a[1])
		if err != nil {
			return err
		}
		fmt.Printf("imported %s (%s, %d layers, %.1f MiB) in %.1fs\n", rec.Name, short(rec.ID), len(rec.Layers), float64(rec.Size)/(1<<20), time.Since(start).Seconds())
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
	if err := os.MkdirAll(h.dataDir, 0o711); err != nil {
		return nil, nil, err
	}
	db, err := store.Open(filepath.Join(h.dataDir, "warren.db"))
	if err != nil {
		return nil, nil, err
	}
	st, err := image.OpenStore(filepath.Join(h.dataDir, "images", fmt.Sprintf("store-%d", shift.HostBase)), db, shift)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return st, db, nil
}
