package workspace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/warren-sandbox/warren/internal/confined"
	"github.com/warren-sandbox/warren/internal/s3"
)

// The object store: a snapshot bridge (docs/policy.md "Workspaces").
// Workspace ns/name is the objects <Prefix><ns>/<name>/<path>, one per
// regular file; its directory on this host is a cache that sandboxes
// mount. Pull and Push compare both sides with what the last sync saw (a
// manifest per workspace: each file's ETag in the store and size and
// mtime here), so that each side's changes since then are told apart:
//   - changed on one side only: copied to the other (a deletion too);
//   - changed on both (or created on both): a conflict, neither side is
//     overwritten, the file is named in SyncStats.Conflicts;
//   - symlinks, empty directories and special files are not carried,
//     nor modes (files arrive 0644).

// S3Options configure an S3 store.
type S3Options struct {
	// Endpoint is the server's URL: http://host:port or https://host.
	Endpoint string
	Bucket   string
	Region   string
	// Prefix is put before every key ("" or ending in "/").
	Prefix string
	// AccessKeyEnv and SecretKeyEnv name the server's environment
	// variables that hold the credentials (never logged, never stored).
	AccessKeyEnv, SecretKeyEnv string
	// Cache is the directory of the workspaces' local copies and
	// manifests (<data dir>/workspaces/.s3/<store name>).
	Cache string
}

// maxObjects bounds the objects of one workspace a sync reads.
const maxObjects = 1_000_000

// S3 is a store on an S3-compatible object store.
type S3 struct {
	c      *s3.Client
	bucket string
	prefix string
	cache  string
}

// NewS3 connects to the store and creates its bucket if missing.
func NewS3(ctx context.Context, o S3Options) (*S3, error) {
	if o.Bucket == "" || o.Cache == "" {
		return nil, errors.New("s3 store: bucket and cache directory are required")
	}
	if o.Prefix != "" && !strings.HasSuffix(o.Prefix, "/") {
		return nil, fmt.Errorf("s3 prefix %q: want one ending in /", o.Prefix)
	}
	ak, sk := os.Getenv(o.AccessKeyEnv), os.Getenv(o.SecretKeyEnv)
	if o.AccessKeyEnv == "" || o.SecretKeyEnv == "" || ak == "" || sk == "" {
		return nil, fmt.Errorf("s3 store: the credentials' environment variables (%q, %q) are not both set", o.AccessKeyEnv, o.SecretKeyEnv)
	}
	c, err := s3.New(o.Endpoint, o.Region, ak, sk)
	if err != nil {
		return nil, err
	}
	ok, err := c.BucketExists(ctx, o.Bucket)
	if err != nil {
		return nil, fmt.Errorf("s3 store %s: bucket %q: %w", o.Endpoint, o.Bucket, err)
	}
	if !ok {
		if err := c.MakeBucket(ctx, o.Bucket); err != nil {
			return nil, fmt.Errorf("s3 store %s: create bucket %q: %w", o.Endpoint, o.Bucket, err)
		}
	}
	if err := os.MkdirAll(filepath.Join(o.Cache, ".sync"), 0o700); err != nil {
		return nil, err
	}
	return &S3{c: c, bucket: o.Bucket, prefix: o.Prefix, cache: o.Cache}, nil
}

// Kind is "s3".
func (s *S3) Kind() string { return "s3" }

// Dir is the workspace's cache: <Cache>/<ns>/<name>.
func (s *S3) Dir(ns, name string) string { return filepath.Join(s.cache, ns, name) }

func (s *S3) keyPrefix(ns, name string) string { return s.prefix + ns + "/" + name + "/" }

// synced is what the last sync saw of one file.
type synced struct {
	ETag  string `json:"etag"`
	Size  int64  `json:"size"`
	MTime int64  `json:"mtime"` // unix nanoseconds, here
}

type manifest map[string]synced

func (s *S3) manifestPath(ns, name string) string {
	return filepath.Join(s.cache, ".sync", ns, name+".json")
}

func (s *S3) loadManifest(ns, name string) (manifest, error) {
	b, err := os.ReadFile(s.manifestPath(ns, name))
	if errors.Is(err, fs.ErrNotExist) {
		return manifest{}, nil
	}
	if err != nil {
		return nil, err
	}
	m := manifest{}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("sync manifest of %s/%s: %w", ns, name, err)
	}
	return m, nil
}

func (s *S3) saveManifest(ns, name string, m manifest) error {
	p := s.manifestPath(ns, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := os.WriteFile(p+".tmp", b, 0o600); err != nil {
		return err
	}
	return os.Rename(p+".tmp", p)
}

// local lists the regular files under root, by slash path.
func local(root *confined.Root) (map[string]synced, error) {
	out := map[string]synced{}
	var walk func(dir string, depth int) error
	walk = func(dir string, depth int) error {
		if depth > maxUsageDepth {
			return fmt.Errorf("directories nested deeper than %d", maxUsageDepth)
		}
		fis, err := root.List(dir, maxObjects)
		if err != nil {
			if confined.Kind(err) == "not_found" {
				return nil // removed meanwhile
			}
			return err
		}
		for _, fi := range fis {
			p := path.Join(dir, fi.Name)
			switch fi.Type {
			case "file":
				if len(out) >= maxObjects {
					return fmt.Errorf("more than %d files", maxObjects)
				}
				out[strings.TrimPrefix(p, "/")] = synced{Size: fi.Size, MTime: fi.ModTime.UnixNano()}
			case "dir":
				if err := walk(p, depth+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return out, walk("/", 0)
}

// remote lists the workspace's objects, by path below its prefix.
func (s *S3) remote(ctx context.Context, ns, name string) (map[string]synced, error) {
	pre := s.keyPrefix(ns, name)
	out := map[string]synced{}
	err := s.c.ListObjects(ctx, s.bucket, pre, maxObjects, func(o s3.Object) error {
		if p, ok := strings.CutPrefix(o.Key, pre); ok && validPath(p) {
			out[p] = synced{ETag: o.ETag, Size: o.Size}
		} // else not one this bridge writes: left alone
		return nil
	})
	return out, err
}

// validPath reports whether an object's path is one a file can have: no
// empty, "." or ".." component, no NUL, no leading or trailing slash.
func validPath(p string) bool {
	if p == "" || len(p) > 4096 || strings.ContainsRune(p, 0) {
		return false
	}
	for _, c := range strings.Split(p, "/") {
		if c == "" || c == "." || c == ".." || len(c) > 255 {
			return false
		}
	}
	return true
}

func (s *S3) state(ctx context.Context, ns, name string, root *confined.Root) (manifest, map[string]synced, map[string]synced, error) {
	man, err := s.loadManifest(ns, name)
	if err != nil {
		return nil, nil, nil, err
	}
	loc, err := local(root)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("list the workspace's files: %w", err)
	}
	rem, err := s.remote(ctx, ns, name)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("list the workspace's objects: %w", err)
	}
	return man, loc, rem, nil
}

// changedHere reports whether a local file differs from what the last sync
// left.
func changedHere(l synced, m synced, inM bool) bool {
	return !inM || l.Size != m.Size || l.MTime != m.MTime
}

// Push uploads files changed here since the last sync and deletes the
// objects of files deleted here, unless the store changed them too.
func (s *S3) Push(ctx context.Context, ns, name string, root *confined.Root) (SyncStats, error) {
	man, loc, rem, err := s.state(ctx, ns, name, root)
	if err != nil {
		return SyncStats{}, err
	}
	var st SyncStats
	defer func() { _ = s.saveManifest(ns, name, man) }()
	for p, l := range loc {
		m, inM := man[p]
		if !changedHere(l, m, inM) {
			st.Unchanged++
			continue
		}
		if r, inR := rem[p]; inR && (!inM || r.ETag != m.ETag) {
			st.Conflicts = append(st.Conflicts, p)
			continue
		}
		f, fi, err := root.Open(p)
		if err != nil {
			if confined.Kind(err) == "not_found" {
				continue
			}
			return st, err
		}
		etag, err := s.c.PutObject(ctx, s.bucket, s.keyPrefix(ns, name)+p, f, fi.Size, "application/octet-stream")
		_ = f.Close()
		if err != nil {
			return st, fmt.Errorf("upload %s: %w", p, err)
		}
		man[p] = synced{ETag: etag, Size: fi.Size, MTime: fi.ModTime.UnixNano()}
		st.Sent++
	}
	for p, m := range man {
		if _, inL := loc[p]; inL {
			continue
		}
		r, inR := rem[p]
		switch {
		case !inR:
		case r.ETag == m.ETag:
			if err := s.c.RemoveObject(ctx, s.bucket, s.keyPrefix(ns, name)+p); err != nil {
				return st, fmt.Errorf("delete %s: %w", p, err)
			}
			st.Deleted++
		default:
			// Deleted here, changed there: the next pull brings it back.
			st.Conflicts = append(st.Conflicts, p)
		}
		delete(man, p)
	}
	return st, nil
}

// Pull downloads objects changed in the store since the last sync and
// deletes the files of objects deleted there, unless changed here too.
func (s *S3) Pull(ctx context.Context, ns, name string, root *confined.Root) (SyncStats, error) {
	man, loc, rem, err := s.state(ctx, ns, name, root)
	if err != nil {
		return SyncStats{}, err
	}
	var st SyncStats
	defer func() { _ = s.saveManifest(ns, name, man) }()
	for p, r := range rem {
		m, inM := man[p]
		l, inL := loc[p]
		if inM && m.ETag == r.ETag && inL {
			st.Unchanged++
			continue
		}
		// Missing here but unchanged there: a cache lost on this host
		// (a deletion here is pushed before any pull, which removes
		// the object and this entry), restored.
		if inL && changedHere(l, m, inM) {
			st.Conflicts = append(st.Conflicts, p)
			continue
		}
		if dir := path.Dir(p); dir != "." {
			if err := root.Mkdir(dir, true, 0o755); err != nil {
				return st, fmt.Errorf("download %s: %w", p, err)
			}
		}
		obj, err := s.c.GetObject(ctx, s.bucket, s.keyPrefix(ns, name)+p)
		if err != nil {
			return st, fmt.Errorf("download %s: %w", p, err)
		}
		// At most the listed size: an object replaced meanwhile by a
		// bigger one fails rather than passes the quota's check.
		_, err = root.WriteFile(p, obj, 0o644, max(r.Size, 1))
		_ = obj.Close()
		if err != nil {
			return st, fmt.Errorf("download %s: %w", p, err)
		}
		fi, err := root.Stat(p)
		if err != nil {
			return st, err
		}
		man[p] = synced{ETag: r.ETag, Size: fi.Size, MTime: fi.ModTime.UnixNano()}
		st.Received++
	}
	for p, m := range man {
		if _, inR := rem[p]; inR {
			continue
		}
		if l, inL := loc[p]; inL && !changedHere(l, m, true) {
			if err := root.Remove(p, false); err != nil && confined.Kind(err) != "not_found" {
				return st, fmt.Errorf("delete %s: %w", p, err)
			}
			st.Deleted++
		}
		// Changed here, deleted there: kept, and the next push sends it.
		delete(man, p)
	}
	return st, nil
}

// Delete removes the workspace's objects and manifest.
func (s *S3) Delete(ctx context.Context, ns, name string) error {
	rem, err := s.remote(ctx, ns, name)
	if err != nil {
		return err
	}
	for p := range rem {
		if err := s.c.RemoveObject(ctx, s.bucket, s.keyPrefix(ns, name)+p); err != nil {
			return fmt.Errorf("delete %s: %w", p, err)
		}
	}
	if err := os.Remove(s.manifestPath(ns, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
