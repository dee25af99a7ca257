package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/warren-sandbox/warren/internal/errdefs"
)

// PullOptions tunes Pull.
type PullOptions struct {
	Platform string         // "os/arch[/variant]"; default the host's
	Insecure bool           // allow plain HTTP to non-loopback registries
	Keychain authn.Keychain // default authn.DefaultKeychain (Docker config + credential helpers)
	Progress func(Progress) // optional; called from any goroutine, serialised by Pull
	Parallel int            // layers fetched at once (default 4)
	MaxBytes int64          // uncompressed bytes unpacked at most (default and cap: the store's bound)
	// Transport, when set, carries the registry requests (default
	// go-containerregistry's).
	Transport http.RoundTripper
}

// Progress reports a pull's layer transfers. Layer is the compressed
// digest of the layer concerned; Done and Total are its bytes transferred
// and expected. LayersTotal counts only the layers the store lacks.
// Finished is set once the layer is unpacked and verified.
type Progress struct {
	Layer       string
	Done, Total int64
	LayersDone  int
	LayersTotal int
	Finished    bool
}

// ErrPull marks registry failures (authentication, not found, platform).
var ErrPull = errors.New("pull failed")

// PullFailed gives a failed pull of ref its kind for a caller: what the
// registry refused (ErrPull: authentication, not found, platform) is the
// request's (invalid_params); a registry unreachable or misbehaving is
// unavailable, not the server's own failure; a kind err already has
// (a full disk, a size limit) stays.
func PullFailed(ref string, err error) error {
	switch {
	case errors.Is(err, ErrPull):
		return errdefs.Errorf(errdefs.ErrInvalid, "image %s could not be pulled: %w", ref, err)
	case errdefs.Kind(err) == errdefs.Internal:
		return errdefs.Errorf(errdefs.ErrUnavailable, "image %s could not be pulled: %w", ref, err)
	}
	return err
}

// pullCall is one pull in flight, shared by concurrent callers.
type pullCall struct {
	done chan struct{}
	rec  *Record
	err  error
}

var (
	pullsMu sync.Mutex
	pulls   = map[*Store]map[string]*pullCall{}
)

// Pull fetches ref ("host/repo:tag" or "host/repo@sha256:…") from its
// registry into the store and names it name (when empty, ref as given,
// with "@" of a digest reference made ":").
//
// From an index, the image for opt.Platform (default the host's) is
// chosen. Layers whose diff id the store holds are not fetched; the
// others are fetched opt.Parallel at once, their compressed digests
// verified by go-containerregistry and their diff ids by the store.
// Concurrent pulls of the same ref, platform and name share one transfer
// (run under the first caller's context, options and credentials).
//
// Plain HTTP is used only for loopback registries (127.0.0.0/8, ::1,
// localhost) or with opt.Insecure; any other registry go-containerregistry
// would contact over HTTP (RFC 1918 addresses, *.localhost) is refused before
// any request.
func (s *Store) Pull(ctx context.Context, ref string, name string, opt PullOptions) (*Record, error) {
	if name == "" {
		name = strings.ReplaceAll(ref, "@", ":") // a pull by digest
	}
	if err := ValidateName(name); err != nil {
		return nil, fmt.Errorf("pull %s: %w", ref, err)
	}
	key := ref + "\x00" + opt.Platform + "\x00" + name
	pullsMu.Lock()
	calls := pulls[s]
	if calls == nil {
		calls = map[string]*pullCall{}
		pulls[s] = calls
	}
	if c, ok := calls[key]; ok {
		pullsMu.Unlock()
		select {
		case <-c.done:
			return c.rec, c.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	c := &pullCall{done: make(chan struct{})}
	calls[key] = c
	pullsMu.Unlock()
	defer func() {
		pullsMu.Lock()
		delete(calls, key)
		if len(calls) == 0 {
			delete(pulls, s)
		}
		pullsMu.Unlock()
		close(c.done)
	}()
	var pinned []string
	c.rec, c.err = s.pull(ctx, ref, name, opt, &pinned)
	s.unpin(pinned)
	if c.err != nil {
		c.err = fmt.Errorf("pull %s: %w", ref, c.err)
		// A failed pull leaves no image, and none of the layers it
		// unpacked that nothing else uses.
		if err := s.dropUnused(pinned); err != nil {
			c.err = fmt.Errorf("%w (and removing its layers: %w)", c.err, err)
		}
	}
	return c.rec, c.err
}

// isLoopback reports whether a registry host (with optional port) is
// loopback by name or address; no name is resolved.
func isLoopback(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (s *Store) pull(ctx context.Context, refStr, imgName string, opt PullOptions, pinned *[]string) (*Record, error) {
	plat := hostPlatform
	if opt.Platform != "" {
		p, err := v1.ParsePlatform(opt.Platform)
		if err != nil || p.OS == "" || p.Architecture == "" {
			return nil, fmt.Errorf("%w: platform %q: want os/arch[/variant]", ErrPull, opt.Platform)
		}
		plat = *p
	}
	ref, err := name.ParseReference(refStr)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPull, err)
	}
	reg := ref.Context().Registry
	loop := isLoopback(reg.RegistryStr())
	if opt.Insecure || loop {
		if ref, err = name.ParseReference(refStr, name.Insecure); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrPull, err)
		}
	} else if ref.Context().Registry.Scheme() != "https" {
		return nil, fmt.Errorf("%w: registry %s would be contacted over plain HTTP; use --insecure (PullOptions.Insecure) if that is intended",
			ErrPull, reg.RegistryStr())
	}
	kc := opt.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	base := opt.Transport
	if base == nil {
		base = s.transport
	}
	if base == nil {
		base = remote.DefaultTransport
	}
	prog := newPullProgress(opt.Progress)
	ropts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(kc),
		remote.WithTransport(&countingTransport{base: base, onRead: prog.read}),
		remote.WithUserAgent("warren"),
	}
	desc, err := remote.Get(ref, ropts...)
	if err != nil {
		return nil, explain(err, reg.RegistryStr())
	}
	img, err := s.pickRemote(desc, plat)
	if err != nil {
		return nil, err
	}
	if !desc.MediaType.IsIndex() && opt.Platform != "" {
		// A single image: it must not contradict an explicit platform.
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, explain(err, reg.RegistryStr())
		}
		if cf.Architecture != "" && !cf.Platform().Satisfies(plat) {
			return nil, fmt.Errorf("%w: the image is for %s only, not %s", ErrPull, cf.Platform().String(), plat.String())
		}
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, explain(err, reg.RegistryStr())
	}
	if m.Config.Size > s.maxConfigBytes {
		return nil, fmt.Errorf("%w: config is %d bytes", ErrLimit, m.Config.Size)
	}
	if n := len(m.Layers); n == 0 || n > s.maxLayers {
		return nil, fmt.Errorf("%w: %d layers (1 to %d allowed)", ErrLimit, n, s.maxLayers)
	}
	if opt.MaxBytes > 0 {
		// Refused before any layer is fetched: compressed layers are
		// rarely larger than what they unpack to.
		var sum int64
		for _, l := range m.Layers {
			if l.Size < 0 || l.Size > opt.MaxBytes-sum { // no overflow
				return nil, fmt.Errorf("%w: the layers are more than the %d bytes allowed", ErrLimit, opt.MaxBytes)
			}
			sum += l.Size
		}
	}
	src, err := s.knownSource(ctx, m.Config.Digest.String())
	if err != nil {
		return nil, err
	}
	if src == nil {
		if src, err = s.fromImage(img); err != nil {
			return nil, explain(err, reg.RegistryStr())
		}
		if len(src.layers) != len(m.Layers) {
			return nil, fmt.Errorf("%w: %d layers in the manifest, %d in the config", ErrFormat, len(m.Layers), len(src.layers))
		}
		for i := range src.layers {
			src.layers[i].open = annotate(src.layers[i].open, m.Layers[i].Digest.String(), reg.RegistryStr())
		}
		// Progress for the layers the store lacks.
		seen := map[string]bool{}
		for i, ls := range src.layers {
			if seen[ls.diffID] || !validDigest(ls.diffID) {
				continue
			}
			seen[ls.diffID] = true
			if fi, err := os.Lstat(s.layerPath(ls.diffID)); err == nil && fi.IsDir() {
				continue
			}
			prog.expect(ls.diffID, m.Layers[i].Digest.String(), m.Layers[i].Size)
		}
	}
	parallel := opt.Parallel
	if parallel <= 0 {
		parallel = 4
	}
	rec, err := s.storeSource(ctx, src, imgName, pinned, parallel, opt.MaxBytes, prog.finished)
	if err != nil {
		var pe *fs.PathError
		var le *os.LinkError
		var errno syscall.Errno
		if ctx.Err() == nil && !errors.As(err, &pe) && !errors.As(err, &le) && !errors.As(err, &errno) && !errors.Is(err, ErrPull) {
			// Not the local disk: what the registry sent.
			err = fmt.Errorf("%w (corrupt or invalid layer data from %s; no image was recorded)", err, reg.RegistryStr())
		}
		return nil, explain(err, reg.RegistryStr())
	}
	return rec, nil
}

// knownSource returns the image with config digest id when the store holds
// it and all its layers, so nothing but the manifest need be fetched; nil
// otherwise.
func (s *Store) knownSource(ctx context.Context, id string) (*source, error) {
	var raw []byte
	err := s.db.QueryRowContext(ctx, `SELECT config FROM images WHERE id = ?`, id).Scan(&raw)
	if err != nil {
		return nil, nil //nolint:nilerr // not known (or unreadable): pull it whole
	}
	src := &source{id: id}
	if err := json.Unmarshal(raw, &src.config); err != nil {
		return nil, nil //nolint:nilerr // pull it whole
	}
	rows, err := s.db.QueryContext(ctx, `SELECT diff_id FROM image_layers WHERE image_id = ? ORDER BY position`, id)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var d string
		if err := rows.Scan(&d); err != nil {
			return nil, err
		}
		if fi, err := os.Lstat(s.layerPath(d)); err != nil || !fi.IsDir() {
			return nil, nil
		}
		src.layers = append(src.layers, layerSource{diffID: d, open: func() (io.ReadCloser, error) {
			return nil, fmt.Errorf("layer %s was pruned during the pull; pull again", d)
		}})
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(src.layers) == 0 {
		return nil, nil
	}
	return src, nil
}

// pickRemote returns the image a descriptor names: itself, or from an
// index the one for plat.
func (s *Store) pickRemote(desc *remote.Descriptor, plat v1.Platform) (v1.Image, error) {
	if !desc.MediaType.IsIndex() {
		if desc.Size > s.maxConfigBytes {
			return nil, fmt.Errorf("%w: manifest is %d bytes", ErrLimit, desc.Size)
		}
		return desc.Image()
	}
	idx, err := desc.ImageIndex()
	if err != nil {
		return nil, err
	}
	img, err := s.selectImage(idx, plat)
	if errors.Is(err, errNoPlatform) {
		return nil, fmt.Errorf("%w: %w (choose with --platform)", ErrPull, err)
	}
	return img, err
}

// explain adds what to do to registry errors.
func explain(err error, registry string) error {
	var te *transport.Error
	if !errors.As(err, &te) {
		return err
	}
	switch te.StatusCode {
	case http.StatusUnauthorized, http.StatusForbidden:
		return fmt.Errorf("%w: authentication required or refused by %s: log in with `docker login %s` or configure a credential helper in ~/.docker/config.json: %w",
			ErrPull, registry, registry, err)
	case http.StatusNotFound:
		return fmt.Errorf("%w: not found on %s: check the repository, tag or digest: %w", ErrPull, registry, err)
	}
	return err
}

// countingTransport reports the bytes read from blob responses, by digest.
type countingTransport struct {
	base   http.RoundTripper
	onRead func(digest string, n int)
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil || req.Method != http.MethodGet || resp.StatusCode != http.StatusOK {
		return resp, err
	}
	// A redirected blob request keeps its digest in the first URL.
	for r := req; r != nil; {
		if i := strings.LastIndex(r.URL.Path, "/blobs/"); i >= 0 {
			resp.Body = &countingBody{ReadCloser: resp.Body, digest: r.URL.Path[i+len("/blobs/"):], onRead: t.onRead}
			break
		}
		if r.Response == nil {
			break
		}
		r = r.Response.Request
	}
	return resp, nil
}

type countingBody struct {
	io.ReadCloser
	digest string
	onRead func(digest string, n int)
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.onRead(b.digest, n)
	}
	return n, err
}

// annotate makes a layer's read errors name the blob and registry.
func annotate(open func() (io.ReadCloser, error), digest, registry string) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) {
		rc, err := open()
		if err != nil {
			return nil, explain(fmt.Errorf("fetching blob %s from %s: %w", digest, registry, err), registry)
		}
		return &annotatedReader{ReadCloser: rc, prefix: "blob " + digest}, nil
	}
}

type annotatedReader struct {
	io.ReadCloser
	prefix string
}

func (r *annotatedReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("%s: %w", r.prefix, err)
	}
	return n, err
}
