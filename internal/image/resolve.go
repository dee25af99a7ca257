package image

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/warren-sandbox/warren/internal/errdefs"
)

// Resolver turns the image names of sandbox starts into images: the
// language names into the images configured for them, "host" into the host
// image, anything else into the store's image of that name (or id). With
// OnDemand set, Pull fetches what the store lacks.
type Resolver struct {
	Host  func() (*Image, error)
	Store *Store
	// Python and Node are the images of the language names; HostName
	// gives the host image's language view (Language).
	Python, Node string
	// OnDemand, when set, pulls images the store lacks; nil refuses them.
	OnDemand *OnDemand
}

// languageOf names the language of a language name, "" for other names.
func languageOf(name string) string {
	switch name {
	case "python", "python3", "microsandbox/python":
		return "python"
	case "node", "nodejs", "javascript", "microsandbox/node":
		return "node"
	}
	return ""
}

// target is the image name resolves to: a store name or id, or HostName;
// lang is the language of a language name.
func (r *Resolver) target(name string) (target, lang string) {
	switch lang = languageOf(name); lang {
	case "python":
		name = r.Python
	case "node":
		name = r.Node
	}
	// A pull by digest stores "repo@sha256:…" as "repo:sha256:…".
	return strings.ReplaceAll(name, "@", ":"), lang
}

// viewSep joins the host image's name and a language in the name (and pin,
// Image.Pin) of a language view: "host+python".
const viewSep = "+"

// Resolve returns the image name stands for. An image the store lacks is
// ErrNotFound. Besides the names above it takes the pins of host images
// (Image.Pin): "host+python" is the host image's python view, whatever the
// language name python is configured to.
func (r *Resolver) Resolve(_ context.Context, name string) (*Image, error) {
	if base, lang, ok := strings.Cut(name, viewSep); ok && base == HostName {
		img, err := r.Host()
		if err != nil {
			return nil, err
		}
		return Language(img, lang)
	}
	t, lang := r.target(name)
	if t != HostName {
		return r.Store.Get(t)
	}
	img, err := r.Host()
	if err != nil || lang == "" {
		return img, err
	}
	return Language(img, lang)
}

// Pull fetches the image name stands for into the store, for a sandbox of
// namespace ns, writing progress with logf. It fails with a message for the
// user when on-demand pulls are off, the reference is not allowed, or the
// pull fails; the store then holds no image of that name.
func (r *Resolver) Pull(ctx context.Context, ns, name string, logf func(format string, args ...any)) error {
	t, lang := r.target(name)
	if lang != "" {
		// The operator's choice, never fetched on a client's behalf
		// (the name is looked up on Docker Hub otherwise).
		flag := "--" + lang + "-image"
		return errdefs.Errorf(errdefs.ErrInvalid, "image %q, which this server runs for %q (warren serve %s), is not in its store: build or pull it there", t, name, flag)
	}
	if r.OnDemand == nil {
		return errdefs.Errorf(errdefs.ErrInvalid, "image %q is not in this server's store, and this server does not pull images when sandboxes start: pull it first (warren image pull, or the image.pull method)", t)
	}
	if t == HostName || IsID(t) {
		return fmt.Errorf("image %s: %w", t, ErrNotFound) // nothing a registry has
	}
	return r.OnDemand.pull(ctx, r.Store, ns, t, logf)
}

// Default bounds of on-demand pulls.
const (
	DefaultPullMaxBytes = 8 << 30 // uncompressed bytes
	DefaultPullTimeout  = 10 * time.Minute
	DefaultPulls        = 4 // different images pulled at once
)

// OnDemand pulls images the store lacks when a sandbox starts with one.
// Every client that can start a sandbox can make the server fetch from any
// registry it names, so a pull is bounded in size and time, runs with no
// credentials (the operator's registry logins are not lent to clients:
// private images are pulled ahead with warren image pull), only from public
// addresses, a few images at once, and concurrent starts of one reference
// share one pull.
type OnDemand struct {
	// MaxBytes bounds the uncompressed bytes of one pull (default
	// DefaultPullMaxBytes); Timeout its duration (default
	// DefaultPullTimeout).
	MaxBytes int64
	Timeout  time.Duration
	// MaxPulls bounds the different images pulled at once (default
	// DefaultPulls); a start that would begin one more is refused.
	MaxPulls int
	// Allow, when set, is consulted before every pull with the namespace
	// of the sandbox and the reference; an error refuses the pull (and is
	// the client's answer, of kind forbidden unless it has a kind). The
	// namespaces' image policy plugs in here.
	Allow func(ctx context.Context, ns, ref string) error
	// Private allows registries on loopback and private addresses
	// (tests; a registry beside the server), which are refused otherwise.
	Private bool
	Logger  *slog.Logger

	mu      sync.Mutex
	flights map[string]*flight // by image name
}

// flight is one on-demand pull, shared by the starts that wait for it.
type flight struct {
	done chan struct{}
	err  error
}

func (o *OnDemand) pull(ctx context.Context, st *Store, ns, ref string, logf func(string, ...any)) error {
	if err := ValidateName(ref); err != nil {
		return err
	}
	if o.Allow != nil {
		if err := o.Allow(ctx, ns, ref); err != nil {
			if errdefs.Kind(err) == errdefs.Internal {
				err = errdefs.Errorf(errdefs.ErrForbidden, "image %s may not be pulled for namespace %q: %w", ref, ns, err)
			}
			return err
		}
	}
	o.mu.Lock()
	if o.flights == nil {
		o.flights = map[string]*flight{}
	}
	f, waiting := o.flights[ref]
	if !waiting {
		if n := len(o.flights); n >= cmp.Or(o.MaxPulls, DefaultPulls) {
			o.mu.Unlock()
			return errdefs.Errorf(errdefs.ErrLimit, "%d images are being pulled, this server's maximum at once: try again when one is done", n)
		}
		f = &flight{done: make(chan struct{})}
		o.flights[ref] = f
	}
	o.mu.Unlock()
	if waiting {
		logf("waiting for the pull of image %s another start began", ref)
		select {
		case <-f.done:
			return f.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f.err = o.run(ctx, st, ns, ref, logf)
	o.mu.Lock()
	delete(o.flights, ref)
	o.mu.Unlock()
	close(f.done)
	return f.err
}

// run pulls ref once, unless the store got it meanwhile (a flight that
// ended between the caller's lookup and its own). The pull runs to its own
// deadline: a client that gives up does not fail the starts waiting on it.
func (o *OnDemand) run(ctx context.Context, st *Store, ns, ref string, logf func(string, ...any)) error {
	if _, err := st.Get(ref); err == nil {
		return nil
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("ref", ref, "namespace", ns)
	timeout, maxBytes := o.Timeout, o.MaxBytes
	if timeout <= 0 {
		timeout = DefaultPullTimeout
	}
	if maxBytes <= 0 {
		maxBytes = DefaultPullMaxBytes
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	t0 := time.Now()
	logf("pulling image %s (not in the store)", ref)
	log.Info("pulling image on demand")
	var tr http.RoundTripper
	if !o.Private {
		pt := publicTransport()
		defer pt.CloseIdleConnections() // a transport per pull: no idle connections outlive it
		tr = pt
	}
	rec, err := st.Pull(ctx, ref, ref, PullOptions{
		Keychain: authn.NewMultiKeychain(), MaxBytes: maxBytes, Transport: tr,
		Progress: func(p Progress) {
			if p.Finished {
				logf("pulled layer %d of %d (%s, %.1f MiB)", p.LayersDone, p.LayersTotal, p.Layer, float64(p.Total)/(1<<20))
			}
		},
	})
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = errdefs.Errorf(errdefs.ErrTimeout, "pull of image %s took longer than %s (warren serve --pull-timeout): %w", ref, timeout, err)
		} else {
			err = PullFailed(ref, err)
		}
		log.Warn("on-demand pull failed", "err", err)
		return err
	}
	logf("pulled image %s (%s, %d layers, %.1f MiB) in %.1fs", ref, rec.ID, len(rec.Layers), float64(rec.Size)/(1<<20), time.Since(t0).Seconds())
	log.Info("pulled image on demand", "id", rec.ID, "bytes", rec.Size, "seconds", time.Since(t0).Seconds())
	return nil
}

// ErrNotPublic refuses an on-demand pull's connection to an address that is
// not on the public internet.
var ErrNotPublic = errdefs.Errorf(errdefs.ErrForbidden, "registry address is not public")

// publicTransport is the transport of on-demand pulls: it connects only to
// public addresses, checked on the address dialed (after name resolution,
// so a name cannot lead there either), so that a client cannot make the
// server query its own loopback services, its network's or a cloud's
// metadata address. An HTTP proxy from the environment is the operator's
// choice and is dialed whatever its address; what it fetches is its
// policy's business.
func publicTransport() *http.Transport {
	t := remote.DefaultTransport.(*http.Transport).Clone()
	var proxies sync.Map // "host:port" of the proxies used
	t.Proxy = func(req *http.Request) (*url.URL, error) {
		u, err := http.ProxyFromEnvironment(req)
		if u != nil {
			port := u.Port()
			if port == "" {
				port = map[string]string{"http": "80", "https": "443", "socks5": "1080"}[u.Scheme]
			}
			proxies.Store(net.JoinHostPort(u.Hostname(), port), true)
		}
		return u, err
	}
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: func(_, address string, _ syscall.RawConn) error {
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			return err
		}
		if ip, err := netip.ParseAddr(host); err != nil || !publicAddr(ip.Unmap()) {
			return fmt.Errorf("%w: %s (on-demand pulls reach public registries only; pull it ahead with warren image pull)", ErrNotPublic, host)
		}
		return nil
	}}
	var direct net.Dialer
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if _, ok := proxies.Load(addr); ok {
			return direct.DialContext(ctx, network, addr)
		}
		return d.DialContext(ctx, network, addr)
	}
	return t
}

// cgnat is the shared address space of carrier-grade NAT (RFC 6598).
var cgnat = netip.MustParsePrefix("100.64.0.0/10")

func publicAddr(ip netip.Addr) bool {
	return ip.IsGlobalUnicast() && !ip.IsPrivate() && !cgnat.Contains(ip)
}
