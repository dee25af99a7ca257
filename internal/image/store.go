package image

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/image/layer"
	"github.com/warren-sandbox/warren/internal/store"
)

// Default bounds on what an import accepts. Everything an image says about
// itself is untrusted.
const (
	DefaultMaxLayers      = 1000
	DefaultMaxConfigBytes = 4 << 20
	DefaultMaxTotalBytes  = 64 << 30 // uncompressed layer bytes per import
)

// Errors. Those declared with errdefs.Errorf carry the kind the server
// reports them as.
var (
	ErrNotFound    = errdefs.Errorf(errdefs.ErrNotFound, "image not found")
	ErrInvalidName = errdefs.Errorf(errdefs.ErrInvalid, "invalid image name")
	ErrDigest      = errors.New("layer digest mismatch")
	ErrLimit       = errdefs.Errorf(errdefs.ErrLimit, "image limit exceeded")
	ErrFormat      = errdefs.Errorf(errdefs.ErrInvalid, "unsupported image source")
	ErrInUse       = errdefs.Errorf(errdefs.ErrConflict, "image in use")
)

// Record describes a named image.
type Record struct {
	Name       string
	ID         string   // "sha256:<hex>" of the image config
	Layers     []string // diff ids ("sha256:<hex>"), base layer first, as in the image config
	LayerSizes []int64  // bytes of each unpacked layer on disk
	Size       int64    // bytes of the unpacked layers on disk
	Created    time.Time
}

// runtimeConfig is the part of the image config a sandbox honours, stored
// as JSON in images.config.
type runtimeConfig struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"workingDir,omitempty"`
	User       string   `json:"user,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}

// Store is a content-addressed image store: unpacked layers under
// <dir>/layers/sha256/<hex>, keyed by diff id and shared between images;
// images and their names in SQLite.
//
// A layer is unpacked into a temporary directory under <dir>/tmp and renamed
// into place only once complete and verified; the database learns of it in
// the single transaction that records the image, after every layer is in
// place. A layer directory no image references (an import that failed
// after some layers, a removed image) stays until Prune.
//
// Layer directories handed out by Get must not be pruned while a sandbox
// uses them; the caller removes an image's names only once nothing runs
// on it.
type Store struct {
	dir   string
	db    *sql.DB
	shift layer.IDMap

	maxLayers      int
	maxConfigBytes int64
	maxTotalBytes  int64

	// mu serialises Prune against imports' use of layer directories:
	// pinned counts the imports using each diff id between finding (or
	// unpacking) its directory and committing their record.
	mu     sync.Mutex
	pinned map[string]int

	unpacked     atomic.Int64        // layers unpacked since OpenStore (tests)
	beforeUnpack func(diffID string) // test hook, called before each unpack
	transport    http.RoundTripper   // test hook: Pull's base transport
}

// OpenStore opens the image store rooted at dir, with records in db. shift
// is the ownership shift applied to unpacked layers (the host ids sandbox
// ids map to). Temporary directories left by an interrupted import are
// removed.
func OpenStore(dir string, db *store.Store, shift layer.IDMap) (*Store, error) {
	s := &Store{
		dir: dir, db: db.DB(), shift: shift,
		maxLayers:      DefaultMaxLayers,
		maxConfigBytes: DefaultMaxConfigBytes,
		maxTotalBytes:  DefaultMaxTotalBytes,
		pinned:         map[string]int{},
	}
	for _, d := range []string{dir, filepath.Join(dir, "layers"), s.layersDir()} {
		if err := os.MkdirAll(d, 0o711); err != nil { //nolint:gosec // 0711: image layers below are lower dirs of sandboxes, so the sandboxes' uid range must traverse
			return nil, fmt.Errorf("image store: %w", err)
		}
	}
	// Each process works in tmp/<pid>: a server and a `warren image
	// import` beside it share the store, and neither may delete what the
	// other is unpacking. What a process that is gone left is removed, and
	// so is this process's own (from a store it opened before).
	root := filepath.Dir(s.tmpDir())
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid != os.Getpid() && pidAlive(pid) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
			return nil, fmt.Errorf("image store: clean %s: %w", root, err)
		}
	}
	if err := os.Mkdir(s.tmpDir(), 0o700); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	return s, nil
}

// pidAlive reports whether a process with this pid exists (or may: a
// reused pid keeps a dead process's scratch directory a while longer).
func pidAlive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

func (s *Store) layersDir() string { return filepath.Join(s.dir, "layers", "sha256") }
func (s *Store) tmpDir() string {
	return filepath.Join(s.dir, "tmp", strconv.Itoa(os.Getpid()))
}

// layerPath is where the layer with diff id d ("sha256:<hex>") lives.
func (s *Store) layerPath(d string) string {
	return filepath.Join(s.layersDir(), strings.TrimPrefix(d, "sha256:"))
}

// Compiled on first use, not at package initialisation, which every warren
// command pays (docs/performance.md).
var nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9._/:-]*$`) })

// ValidateName checks an image name: lower-case letters, digits and
// ". _ / : -", starting with a letter or digit, at most 255 bytes, no ".."
// and not the built-in "host".
func ValidateName(name string) error {
	switch {
	case len(name) == 0 || len(name) > 255 || !nameRE().MatchString(name) || strings.Contains(name, ".."):
		return fmt.Errorf("%w %q: want [a-z0-9][a-z0-9._/:-]*, at most 255 bytes", ErrInvalidName, name)
	case name == HostName:
		return fmt.Errorf("%w %q: reserved for the host image", ErrInvalidName, name)
	case IsID(name):
		return fmt.Errorf("%w %q: has the form of an image id", ErrInvalidName, name)
	}
	return nil
}

// Compiled on first use, not at package initialisation, which every warren
// command pays (docs/performance.md).
var hexRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9a-f]{64}$`) })

func validDigest(d string) bool {
	return strings.HasPrefix(d, "sha256:") && hexRE().MatchString(d[len("sha256:"):])
}

// pin marks diff id d as in use by an import, so Prune leaves it.
func (s *Store) pin(d string) {
	s.mu.Lock()
	s.pinned[d]++
	s.mu.Unlock()
}

func (s *Store) unpin(ds []string) {
	s.mu.Lock()
	for _, d := range ds {
		if s.pinned[d]--; s.pinned[d] <= 0 {
			delete(s.pinned, d)
		}
	}
	s.mu.Unlock()
}

// layerSource is one layer to import: its declared diff id and a way to
// read its uncompressed tar.
type layerSource struct {
	diffID string
	open   func() (io.ReadCloser, error)
}

// source is an image to import, whatever its format.
type source struct {
	id     string
	config runtimeConfig
	layers []layerSource // base first
	// names are the names the source gives the image (a docker-save
	// tarball's RepoTags), for an import given none.
	names []string
}

// budget is the uncompressed bytes an import may still read, shared by
// the layers it unpacks concurrently (left is accessed atomically).
type budget struct{ left int64 }

// countingReader enforces the budget and the context on every read.
type countingReader struct {
	ctx context.Context
	r   io.Reader
	b   *budget
}

func (c *countingReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	left := atomic.LoadInt64(&c.b.left)
	if left <= 0 {
		// Probe for one more byte: a stream ending exactly at the
		// budget is fine.
		var one [1]byte
		n, err := c.r.Read(one[:])
		if n > 0 {
			return 0, fmt.Errorf("%w: more than the total uncompressed size allowed", ErrLimit)
		}
		return 0, err
	}
	if int64(len(p)) > left {
		p = p[:left]
	}
	n, err := c.r.Read(p)
	atomic.AddInt64(&c.b.left, -int64(n))
	return n, err
}

// ensureLayer makes sure the layer is unpacked under its diff id, which the
// caller has validated and pinned. It returns the bytes the layer takes on disk.
func (s *Store) ensureLayer(ctx context.Context, ls layerSource, b *budget) (int64, error) {
	final := s.layerPath(ls.diffID)
	if fi, err := os.Lstat(final); err == nil && fi.IsDir() {
		return s.layerSize(ls.diffID)
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	if s.beforeUnpack != nil {
		s.beforeUnpack(ls.diffID)
	}
	tmp, err := os.MkdirTemp(s.tmpDir(), "layer-")
	if err != nil {
		return 0, err
	}
	defer func() { _ = os.RemoveAll(tmp) }() // a no-op once renamed
	if err := s.prepareRoot(tmp); err != nil {
		return 0, err
	}
	rc, err := ls.open()
	if err != nil {
		return 0, fmt.Errorf("layer %s: %w", ls.diffID, err)
	}
	defer func() { _ = rc.Close() }()
	h := sha256.New()
	r := io.TeeReader(&countingReader{ctx: ctx, r: rc, b: b}, h)
	// Sandboxes with a user namespace mount their overlay with userxattr,
	// which reads opaque directories from user.overlay.* only.
	if _, err := layer.Unpack(r, tmp, layer.Options{IDShift: s.shift, MaxBytes: atomic.LoadInt64(&b.left), UserXattr: s.shift.Size > 0}); err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return 0, ctxErr
		}
		return 0, fmt.Errorf("layer %s: %w", ls.diffID, err)
	}
	// The tar's end-of-archive blocks and padding count towards the digest.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return 0, fmt.Errorf("layer %s: %w", ls.diffID, err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != ls.diffID {
		return 0, fmt.Errorf("%w: layer declared %s, content is %s", ErrDigest, ls.diffID, got)
	}
	s.unpacked.Add(1)
	if err := os.Rename(tmp, final); err != nil {
		// Another import placed the same layer meanwhile: same content.
		if fi, serr := os.Lstat(final); serr != nil || !fi.IsDir() {
			return 0, err
		}
	}
	return s.layerSize(ls.diffID)
}

// prepareRoot gives a layer's top directory the metadata of an image's /
// (a layer tar may set it with a "./" entry).
func (s *Store) prepareRoot(dir string) error {
	if err := os.Chmod(dir, 0o755); err != nil { //nolint:gosec // 0755: the layer's top dir becomes the image's /, which the sandbox's processes must read
		return err
	}
	if os.Geteuid() == 0 && s.shift.Size > 0 {
		return os.Lchown(dir, int(s.shift.HostBase), int(s.shift.HostBase))
	}
	return nil
}

// layerSize is the recorded size of a layer, or its disk usage when it is
// not recorded yet.
func (s *Store) layerSize(d string) (int64, error) {
	var n int64
	err := s.db.QueryRow(`SELECT size FROM layers WHERE diff_id = ?`, d).Scan(&n)
	if err == nil {
		return n, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return 0, err
	}
	return diskUsage(s.layerPath(d))
}

// diskUsage sums the allocated size of everything under root.
func diskUsage(root string) (int64, error) {
	var total int64
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		total += st.Blocks * 512
		return nil
	})
	return total, err
}

// Import imports the image at src under name, replacing what name pointed
// at. src is a docker-save tarball, an OCI image layout (directory or
// tarball), or a root filesystem (directory or tarball, gzip allowed).
// Without a name, the image takes the first name a docker-save tarball
// gives it (RepoTags); a source that gives none is refused.
func (s *Store) Import(ctx context.Context, src, name string) (*Record, error) {
	if name != "" {
		if err := ValidateName(name); err != nil {
			return nil, err
		}
	}
	var pinned []string
	defer func() { s.unpin(pinned) }()
	rec, err := s.importSource(ctx, src, name, &pinned)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", src, err)
	}
	return rec, nil
}

func (s *Store) importSource(ctx context.Context, src, name string, pinned *[]string) (*Record, error) {
	scratch, err := os.MkdirTemp(s.tmpDir(), "import-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(scratch) }()
	srcImg, err := s.open(ctx, src, scratch)
	if err != nil {
		return nil, err
	}
	if name == "" {
		if len(srcImg.names) == 0 {
			return nil, fmt.Errorf("%w: it names no image (no RepoTags): give a name", ErrInvalidName)
		}
		name = srcImg.names[0]
		if err := ValidateName(name); err != nil {
			return nil, fmt.Errorf("its RepoTags name %q: %w", name, err)
		}
	}
	return s.storeSource(ctx, srcImg, name, pinned, 1, 0, nil)
}

// storeSource unpacks the layers of src that are not in the store yet, at
// most parallel at once, then records src under name. It pins every layer
// in *pinned (the caller unpins once done). maxBytes, when positive and
// below the store's bound, bounds the uncompressed bytes unpacked.
// layerDone, when set, is called (from any goroutine) after each distinct
// layer is in place.
func (s *Store) storeSource(ctx context.Context, src *source, name string, pinned *[]string, parallel int, maxBytes int64, layerDone func(diffID string)) (*Record, error) {
	if n := len(src.layers); n == 0 || n > s.maxLayers {
		return nil, fmt.Errorf("%w: %d layers (1 to %d allowed)", ErrLimit, n, s.maxLayers)
	}
	first := map[string]int{} // diff id -> index of its first use
	var unique []int
	for i, ls := range src.layers {
		if !validDigest(ls.diffID) {
			return nil, fmt.Errorf("%w: diff id %q", ErrFormat, ls.diffID)
		}
		// Pinned until the record is committed (the caller unpins), so
		// a concurrent Prune leaves the layer directory alone.
		s.pin(ls.diffID)
		*pinned = append(*pinned, ls.diffID)
		if _, ok := first[ls.diffID]; !ok {
			first[ls.diffID] = i
			unique = append(unique, i)
		}
	}
	b := &budget{left: s.maxTotalBytes}
	if maxBytes > 0 && maxBytes < b.left {
		b.left = maxBytes
	}
	sizes := make([]int64, len(src.layers))
	before := s.unpacked.Load()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
		sem      = make(chan struct{}, max(parallel, 1))
	)
	for _, i := range unique {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			n, err := s.ensureLayer(ctx, src.layers[i], b)
			if err != nil {
				errOnce.Do(func() { firstErr = err; cancel() })
				return
			}
			sizes[i] = n
			if layerDone != nil {
				layerDone(src.layers[i].diffID)
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for i, ls := range src.layers {
		sizes[i] = sizes[first[ls.diffID]]
	}
	if s.unpacked.Load() != before {
		// The layers must be on disk before the record that names them.
		if err := syncFS(s.layersDir()); err != nil {
			return nil, err
		}
	}
	return s.record(ctx, name, src, sizes)
}

func syncFS(dir string) error {
	f, err := os.Open(dir) //nolint:gosec // dir is a directory of the store, opened only to fsync it
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	return unix.Syncfs(int(f.Fd()))
}

// record writes the image, its layers and its name in one transaction.
func (s *Store) record(ctx context.Context, name string, src *source, sizes []int64) (_ *Record, err error) {
	cfg, err := json.Marshal(src.config)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	for i, ls := range src.layers {
		if _, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO layers (diff_id, size, created) VALUES (?, ?, ?)`,
			ls.diffID, sizes[i], now.UnixNano()); err != nil {
			return nil, err
		}
	}
	res, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO images (id, config, created) VALUES (?, ?, ?)`,
		src.id, cfg, now.UnixNano())
	if err != nil {
		return nil, err
	}
	if n, _ := res.RowsAffected(); n == 1 {
		for i, ls := range src.layers {
			if _, err := tx.ExecContext(ctx, `INSERT INTO image_layers (image_id, position, diff_id) VALUES (?, ?, ?)`,
				src.id, i, ls.diffID); err != nil {
				return nil, err
			}
		}
	}
	var old string
	switch err := tx.QueryRowContext(ctx, `SELECT image_id FROM image_names WHERE name = ?`, name).Scan(&old); {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO image_names (name, image_id, created) VALUES (?, ?, ?)
		ON CONFLICT (name) DO UPDATE SET image_id = excluded.image_id, created = excluded.created`,
		name, src.id, now.UnixNano()); err != nil {
		return nil, err
	}
	if old != "" && old != src.id {
		if err := deleteIfUnnamed(ctx, tx, old); err != nil {
			return nil, err
		}
	}
	rec, err := getRecord(ctx, tx, name)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	return rec, nil
}

// deleteIfUnnamed deletes image id once no name and no sandbox refers to
// it. A sandbox keeps the image it was started from (sandboxes.image_id)
// until the sandbox is removed; Prune collects it then.
func deleteIfUnnamed(ctx context.Context, tx *sql.Tx, id string) error {
	_, err := tx.ExecContext(ctx, `DELETE FROM images WHERE id = ?
		AND NOT EXISTS (SELECT 1 FROM image_names WHERE image_id = ?)
		AND NOT EXISTS (SELECT 1 FROM sandboxes WHERE image_id = ?)`, id, id, id)
	return err
}

// usersOf lists the sandboxes ("namespace/name") started from image id.
func usersOf(ctx context.Context, q rowQuerier, id string) ([]string, error) {
	rows, err := q.QueryContext(ctx, `SELECT namespace, name FROM sandboxes WHERE image_id = ? ORDER BY namespace, name`, id)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rows.Close() }()
	var out []string
	for rows.Next() {
		var ns, name string
		if err := rows.Scan(&ns, &name); err != nil {
			return nil, err
		}
		out = append(out, ns+"/"+name)
	}
	return out, rows.Err()
}

type rowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// getRecord reads the record of name.
func getRecord(ctx context.Context, q rowQuerier, name string) (*Record, error) {
	rec := &Record{Name: name}
	var created int64
	err := q.QueryRowContext(ctx, `SELECT i.id, i.created FROM image_names n JOIN images i ON i.id = n.image_id WHERE n.name = ?`, name).
		Scan(&rec.ID, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	if err != nil {
		return nil, err
	}
	rec.Created = time.Unix(0, created)
	return rec, fillLayers(ctx, q, rec)
}

// getRecordByID reads the record of image id; its Name is the id.
func getRecordByID(ctx context.Context, q rowQuerier, id string) (*Record, error) {
	rec := &Record{Name: id, ID: id}
	var created int64
	err := q.QueryRowContext(ctx, `SELECT created FROM images WHERE id = ?`, id).Scan(&created)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, err
	}
	rec.Created = time.Unix(0, created)
	return rec, fillLayers(ctx, q, rec)
}

// fillLayers reads rec's layers and size.
func fillLayers(ctx context.Context, q rowQuerier, rec *Record) error {
	rows, err := q.QueryContext(ctx, `SELECT il.diff_id, l.size FROM image_layers il JOIN layers l ON l.diff_id = il.diff_id
		WHERE il.image_id = ? ORDER BY il.position`, rec.ID)
	if err != nil {
		return err
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var d string
		var size int64
		if err := rows.Scan(&d, &size); err != nil {
			return err
		}
		rec.Layers = append(rec.Layers, d)
		rec.LayerSizes = append(rec.LayerSizes, size)
		rec.Size += size
	}
	return rows.Err()
}

// IsID reports whether ref is an image id ("sha256:<hex>") rather than a
// name. Names cannot take this form.
func IsID(ref string) bool { return validDigest(ref) }

// Get returns the image named ref, or with id ref, ready for a backend:
// its layer directories top-most first and its runtime defaults. An image
// is found by id while a name or a sandbox refers to it.
func (s *Store) Get(ref string) (*Image, error) {
	ctx := context.Background()
	var rec *Record
	var err error
	if IsID(ref) {
		rec, err = getRecordByID(ctx, s.db, ref)
	} else {
		rec, err = getRecord(ctx, s.db, ref)
	}
	if err != nil {
		return nil, err
	}
	var raw []byte
	if err := s.db.QueryRowContext(ctx, `SELECT config FROM images WHERE id = ?`, rec.ID).Scan(&raw); err != nil {
		return nil, err
	}
	var cfg runtimeConfig
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return nil, fmt.Errorf("image %s: stored config: %w", ref, err)
	}
	img := &Image{
		Name: ref, ID: rec.ID, Env: cfg.Env, WorkingDir: cfg.WorkingDir, User: cfg.User,
		Entrypoint: cfg.Entrypoint, Cmd: cfg.Cmd,
	}
	for i := len(rec.Layers) - 1; i >= 0; i-- {
		p := s.layerPath(rec.Layers[i])
		if fi, err := os.Lstat(p); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("image %s: layer %s missing from %s", ref, rec.Layers[i], p)
		}
		img.Layers = append(img.Layers, p)
	}
	return img, nil
}

// List returns a record per image name, sorted by name.
func (s *Store) List() ([]Record, error) {
	ctx := context.Background()
	rows, err := s.db.QueryContext(ctx, `SELECT name FROM image_names ORDER BY name`)
	if err != nil {
		return nil, err
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			_ = rows.Close()
			return nil, err
		}
		names = append(names, n)
	}
	_ = rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	recs := make([]Record, 0, len(names))
	for _, n := range names {
		rec, err := getRecord(ctx, s.db, n)
		if errors.Is(err, ErrNotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		recs = append(recs, *rec)
	}
	return recs, nil
}

// Remove removes name, and the image it names when no other name is left.
// It refuses (ErrInUse) to remove the last name of an image a sandbox was
// started from: remove the sandboxes first. The image's layers stay on
// disk until Prune.
func (s *Store) Remove(name string) (err error) {
	ctx := context.Background()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	var id string
	err = tx.QueryRowContext(ctx, `DELETE FROM image_names WHERE name = ? RETURNING image_id`, name).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	if err != nil {
		return err
	}
	var others int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM image_names WHERE image_id = ?`, id).Scan(&others); err != nil {
		return err
	}
	if others == 0 {
		users, err := usersOf(ctx, tx, id)
		if err != nil {
			return err
		}
		held, err := s.holds()
		if err != nil {
			return err
		}
		if len(held[id]) > 0 {
			users = append(users, "a warren run")
		}
		if len(users) > 0 {
			return fmt.Errorf("%w: %s (%s) is used by %d sandbox(es): %s; remove them first",
				ErrInUse, name, id, len(users), strings.Join(users, ", "))
		}
	}
	if err := deleteIfUnnamed(ctx, tx, id); err != nil {
		return err
	}
	return tx.Commit()
}

// Prune deletes the images neither a name nor a sandbox refers to, then
// the layers no image references, on disk and in the database, and returns
// the bytes freed. Layers an import in progress uses are kept.
func (s *Store) Prune() (freed int64, err error) {
	ctx := context.Background()
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.db.ExecContext(ctx, `DELETE FROM images
		WHERE id NOT IN (SELECT image_id FROM image_names)
		AND id NOT IN (SELECT image_id FROM sandboxes)`); err != nil {
		return 0, err
	}
	keep := map[string]bool{}
	for d := range s.pinned {
		keep[d] = true
	}
	held, err := s.holds()
	if err != nil {
		return 0, err
	}
	for _, layers := range held {
		for _, d := range layers {
			keep[d] = true
		}
	}
	rows, err := s.db.QueryContext(ctx, `SELECT DISTINCT diff_id FROM image_layers`)
	if err != nil {
		return 0, err
	}
	for rows.Next() {
		var d string
		if err := rows.Scan(&d); err != nil {
			_ = rows.Close()
			return 0, err
		}
		keep[d] = true
	}
	_ = rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	ents, err := os.ReadDir(s.layersDir())
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		d := "sha256:" + e.Name()
		if keep[d] {
			continue
		}
		size, err := s.deleteLayer(d)
		freed += size
		if err != nil {
			return freed, err
		}
	}
	// Records of unreferenced layers (on disk or already gone).
	if _, err := s.db.ExecContext(ctx, `DELETE FROM layers WHERE diff_id NOT IN (SELECT diff_id FROM image_layers)`); err != nil {
		return freed, err
	}
	return freed, nil
}

// deleteLayer deletes the directory of layer d and returns the bytes it
// took. Holds s.mu.
func (s *Store) deleteLayer(d string) (int64, error) {
	p := s.layerPath(d)
	size, err := diskUsage(p)
	if err != nil {
		return 0, err
	}
	// Rename out of the store first: a crash mid-delete leaves debris in
	// tmp (cleaned at open), never a partial layer under a valid name.
	trash, err := os.MkdirTemp(s.tmpDir(), "prune-")
	if err != nil {
		return 0, err
	}
	if err := os.Rename(p, filepath.Join(trash, "layer")); err != nil {
		return 0, err
	}
	return size, os.RemoveAll(trash)
}

// dropUnused deletes those of the layers ds that no image, import or hold
// uses: what a failed pull unpacked before it failed.
func (s *Store) dropUnused(ds []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	held, err := s.holds()
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, layers := range held {
		for _, d := range layers {
			keep[d] = true
		}
	}
	for _, d := range ds {
		if keep[d] || s.pinned[d] > 0 || !validDigest(d) {
			continue
		}
		var used bool
		if err := s.db.QueryRow(`SELECT EXISTS (SELECT 1 FROM image_layers WHERE diff_id = ?)`, d).Scan(&used); err != nil {
			return err
		}
		if fi, err := os.Lstat(s.layerPath(d)); used || err != nil || !fi.IsDir() {
			continue
		}
		if _, err := s.deleteLayer(d); err != nil {
			return err
		}
	}
	return nil
}

// hashWriter is a sha256 that reports its digest in OCI form.
type hashWriter struct{ hash.Hash }

func newHashWriter() hashWriter { return hashWriter{sha256.New()} }

func (h hashWriter) digest() string { return "sha256:" + hex.EncodeToString(h.Sum(nil)) }

// Details is everything the store knows about one image.
type Details struct {
	Record
	Names      []string // every name of the image, sorted
	Env        []string
	WorkingDir string
	User       string
	Entrypoint []string
	Cmd        []string
	UsedBy     []string // sandboxes ("namespace/name") started from it
}

// ResolveID returns the id of the one image whose id starts with prefix,
// an id as 'warren image ls' shortens it ("sha256:" and at least 4 hex
// digits; the "sha256:" may be left out). It is ErrNotFound when no image
// has such an id, and ErrInvalidName for a prefix that is not one or that
// several ids share.
func (s *Store) ResolveID(prefix string) (string, error) {
	hex := strings.TrimPrefix(prefix, "sha256:")
	if len(hex) < 4 || len(hex) > 64 || strings.Trim(hex, "0123456789abcdef") != "" {
		return "", fmt.Errorf("%w %.80q: want an image id, sha256: and 4 to 64 hex digits", ErrInvalidName, prefix)
	}
	rows, err := s.db.QueryContext(context.Background(), `SELECT id FROM images WHERE substr(id, 1, ?) = ? LIMIT 2`, len("sha256:"+hex), "sha256:"+hex)
	if err != nil {
		return "", err
	}
	defer func() { _ = rows.Close() }()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return "", err
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	switch len(ids) {
	case 0:
		return "", fmt.Errorf("%w: %s", ErrNotFound, prefix)
	case 1:
		return ids[0], nil
	}
	return "", fmt.Errorf("%w %q: several images have ids starting so; give more digits", ErrInvalidName, prefix)
}

// Inspect returns the details of the image named (or with id) ref.
func (s *Store) Inspect(ref string) (*Details, error) {
	ctx := context.Background()
	img, err := s.Get(ref)
	if err != nil {
		return nil, err
	}
	rec, err := getRecordByID(ctx, s.db, img.ID)
	if err != nil {
		return nil, err
	}
	rec.Name = ref
	d := &Details{Record: *rec, Env: img.Env, WorkingDir: img.WorkingDir, User: img.User,
		Entrypoint: img.Entrypoint, Cmd: img.Cmd}
	rows, err := s.db.QueryContext(ctx, `SELECT name FROM image_names WHERE image_id = ? ORDER BY name`, img.ID)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			_ = rows.Close()
			return nil, err
		}
		d.Names = append(d.Names, n)
	}
	_ = rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if d.UsedBy, err = usersOf(ctx, s.db, img.ID); err != nil {
		return nil, err
	}
	return d, nil
}
