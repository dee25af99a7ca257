package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/errdefs"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

// method is one JSON-RPC method: it decodes its own params struct and runs.
type method struct {
	// lenient: unknown params are ignored (the microsandbox methods, whose
	// clients of every version send what they send); every other method
	// refuses them.
	lenient bool
	run     func(ctx context.Context, c *call) (any, error)
}

// strict makes a method whose params decode into a P and may hold no
// field P lacks: a field meant for another method is a mistake the caller
// should hear about.
func strict[P any](f func(context.Context, *call, *P) (any, error)) method {
	return method{run: decoded(f, true)}
}

// lenient makes a microsandbox method: params decode into a P, other
// fields are ignored.
func lenient[P any](f func(context.Context, *call, *P) (any, error)) method {
	return method{lenient: true, run: decoded(f, false)}
}

func decoded[P any](f func(context.Context, *call, *P) (any, error), strict bool) func(context.Context, *call) (any, error) {
	return func(ctx context.Context, c *call) (any, error) {
		var p P
		if err := c.decode(&p, strict); err != nil {
			return nil, err
		}
		if r, ok := any(&p).(resumer); ok && r.resumes() {
			ctx = context.WithValue(ctx, resumeKey{}, true)
		}
		return f(ctx, c, &p)
	}
}

func (s *Server) methodTable() map[string]method {
	return map[string]method{
		// microsandbox (PROTOCOL.md §4)
		"sandbox.start":       lenient(s.sandboxStart),
		"sandbox.stop":        lenient(s.sandboxStop),
		"sandbox.repl.run":    lenient(s.sandboxRepl),
		"sandbox.command.run": lenient(s.sandboxCommand),
		"sandbox.metrics.get": lenient(s.sandboxMetrics),
		// Warren (docs/api.md)
		"sandbox.create":         strict(s.sandboxCreate),
		"sandbox.get":            strict(s.sandboxGet),
		"sandbox.list":           strict(s.sandboxList),
		"sandbox.remove":         strict(s.sandboxRemove),
		"sandbox.logs":           strict(s.sandboxLogs),
		"sandbox.egress.get":     strict(s.egressGet),
		"sandbox.pause":          strict(s.sandboxPause),
		"sandbox.resume":         strict(s.sandboxResume),
		"sandbox.checkpoint":     strict(s.sandboxCheckpoint),
		"sandbox.restore":        strict(s.sandboxRestore),
		"sandbox.fork":           strict(s.sandboxFork),
		"snapshot.list":          strict(s.snapshotList),
		"snapshot.get":           strict(s.snapshotGet),
		"snapshot.remove":        strict(s.snapshotRemove),
		"workspace.create":       strict(s.workspaceCreate),
		"workspace.list":         strict(s.workspaceList),
		"workspace.get":          strict(s.workspaceGet),
		"workspace.remove":       strict(s.workspaceRemove),
		"workspace.sync":         strict(s.workspaceSync),
		"sandbox.egress.set":     strict(s.egressSet),
		"sandbox.egress.log":     strict(s.egressLog),
		"sandbox.port.expose":    strict(s.portExpose),
		"sandbox.port.list":      strict(s.portList),
		"sandbox.port.unexpose":  strict(s.portUnexpose),
		"sandbox.exec":           strict(s.sandboxExec),
		"sandbox.shell":          strict(s.sandboxShell),
		"sandbox.process.start":  strict(s.processStart),
		"sandbox.process.list":   strict(s.processList),
		"sandbox.process.get":    strict(s.processGet),
		"sandbox.process.output": strict(s.processOutput),
		"sandbox.process.wait":   strict(s.processWait),
		"sandbox.process.signal": strict(s.processSignal),
		"sandbox.process.stdin":  strict(s.processStdin),
		"sandbox.process.resize": strict(s.processResize),
		"sandbox.process.remove": strict(s.processRemove),
		"sandbox.file.read":      strict(s.fileRead),
		"sandbox.file.write":     strict(s.fileWrite),
		"sandbox.file.list":      strict(s.fileList),
		"sandbox.file.stat":      strict(s.fileStat),
		"sandbox.file.mkdir":     strict(s.fileMkdir),
		"sandbox.file.remove":    strict(s.fileRemove),
		"sandbox.file.move":      strict(s.fileMove),
		"namespace.usage":        strict(s.namespaceUsage),
		"image.list":             strict(s.imageList),
		"image.pull":             strict(s.imagePull),
		"key.create":             strict(s.keyCreate),
		"key.list":               strict(s.keyList),
		"key.revoke":             strict(s.keyRevoke),
	}
}

// MethodNames lists the JSON-RPC methods a server serves, sorted: the
// table itself, so a test that must exercise every method (the secrets
// scan, the params fuzz target) learns of a new one.
func MethodNames() []string {
	t := (&Server{}).methodTable() // method values only: nothing runs
	names := make([]string, 0, len(t))
	for n := range t {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// call is one method invocation.
type call struct {
	s      *Server
	claims auth.Claims
	params json.RawMessage
	method string
	// bulk is the caller's access to the bulk gate (fair.go).
	bulk bulk
	// ns and sandbox are what the call resolved, and labels the
	// sandbox's labels then, for its audit record (audit.go).
	ns, sandbox string
	labels      map[string]string
}

// decode reads params into v; strict decoding refuses unknown fields.
// Large params are decoded in a bulk turn (fair.go), which ends the bulk
// of the request's body: what the method does next, perhaps for long, it
// does without holding up its tenant's next bulk request.
func (c *call) decode(v any, strict bool) error {
	if len(c.params) < bulkBytes {
		return c.decodeNow(v, strict)
	}
	defer c.bulk.done()
	var err error
	if berr := c.bulk.do(func() error { err = c.decodeNow(v, strict); return nil }); berr != nil {
		return berr
	}
	return err
}

func (c *call) decodeNow(v any, strict bool) error {
	d := json.NewDecoder(bytes.NewReader(c.params))
	if strict {
		d.DisallowUnknownFields()
	}
	if err := d.Decode(v); errors.Is(err, errdefs.ErrTooLarge) {
		return err // a param that refused a value over its limit (stdinParam)
	} else if err != nil {
		return errdefs.Errorf(errInvalidParams, "%s params: %s", c.method, jsonMessage(err))
	}
	// Decode reads one value: bytes after it (which the HTTP envelope
	// never lets through, but a caller of Call may pass) are not params.
	if _, err := d.Token(); err != io.EOF {
		return errdefs.Errorf(errInvalidParams, "%s params: data after the object", c.method)
	}
	if strict {
		if err := exactKeys(c.params, reflect.TypeOf(v).Elem()); err != nil {
			return errdefs.Errorf(errInvalidParams, "%s params: %s", c.method, err)
		}
	}
	return nil
}

// exactKeys refuses a top-level key that names a field of t only when case
// is ignored ("Path" for "path"): encoding/json matches names without
// regard to case, and a strict method takes its fields as documented.
func exactKeys(params json.RawMessage, t reflect.Type) error {
	var keys map[string]skipped
	if json.Unmarshal(params, &keys) != nil || len(keys) == 0 {
		return nil //nolint:nilerr // not an object (Decode has judged it) or nothing to check
	}
	names := fieldNames(t)
	for k := range keys {
		if !names[k] {
			return fmt.Errorf("unknown field %q", k)
		}
	}
	return nil
}

// skipped takes a JSON value without keeping it: exactKeys reads only the
// keys, and a file.write's data may be tens of MiB.
type skipped struct{}

func (*skipped) UnmarshalJSON([]byte) error { return nil }

// fieldNames is the set of JSON names of t's fields, embedded structs'
// included.
func fieldNames(t reflect.Type) map[string]bool {
	if v, ok := fieldNameCache.Load(t); ok {
		return v.(map[string]bool)
	}
	names := map[string]bool{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		if t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return
		}
		for f := range t.Fields() {
			tag := f.Tag.Get("json")
			name, _, _ := strings.Cut(tag, ",")
			switch {
			case name == "-" && tag == "-":
			case f.Anonymous && name == "":
				walk(f.Type)
			case !f.IsExported():
			case name != "":
				names[name] = true
			default:
				names[f.Name] = true
			}
		}
	}
	walk(t)
	fieldNameCache.Store(t, names)
	return names
}

var fieldNameCache sync.Map // reflect.Type -> map[string]bool

// noParams are the params of a method that takes none.
type noParams struct{}

// sandboxRef names a sandbox: the params every sandbox method has.
type sandboxRef struct {
	Sandbox   string `json:"sandbox"`
	Namespace string `json:"namespace"`
}

// agentRef names a sandbox for a method that needs its agent running. A
// paused sandbox makes such a method a conflict naming sandbox.resume,
// unless Resume asks to resume it first.
type agentRef struct {
	sandboxRef
	Resume bool `json:"resume,omitempty"`
}

// resumer is params that may ask to resume a paused sandbox.
type resumer interface{ resumes() bool }

func (r *agentRef) resumes() bool { return r.Resume }

// resumeKey marks a request's context when its params say "resume": true
// (or its URL resume=true, for the HTTP routes).
type resumeKey struct{}

// withResumeQuery is ctx marked when r's query says resume=true (or 1).
func withResumeQuery(ctx context.Context, r *http.Request) context.Context {
	if v, err := strconv.ParseBool(r.URL.Query().Get("resume")); err == nil && v {
		return context.WithValue(ctx, resumeKey{}, true)
	}
	return ctx
}

// lease leases the running sandbox ns/name, resuming it first if it is
// paused and ctx says so.
func (s *Server) lease(ctx context.Context, ns, name string) (*sandbox.Lease, error) {
	if v, _ := ctx.Value(resumeKey{}).(bool); v {
		return s.mgr.LeaseResume(ctx, ns, name)
	}
	return s.mgr.Lease(ns, name)
}

// resolveRef checks ref and the caller's right to its namespace.
func (c *call) resolveRef(ref sandboxRef) (ns, name string, err error) {
	return c.resolve(ref.Namespace, ref.Sandbox)
}

func (c *call) resolve(ns, name string) (string, string, error) {
	if err := sandboxName(name); err != nil {
		return "", "", err
	}
	ns, err := c.namespace(ns)
	if err == nil && c.s.opts.Audit != nil {
		c.sandbox, c.labels = name, c.s.mgr.Labels(ns, name)
	}
	return ns, name, err
}

// namespace resolves a request's namespace and checks the caller may touch
// it. Absent, it is the key's namespace when the key is for one namespace
// (the only one it may touch), and "default" for a key for every
// namespace and in dev mode, as microsandbox clients that send none expect.
func (c *call) namespace(ns string) (string, error) {
	if ns == "" {
		ns = c.defaultNamespace()
	}
	if !sandbox.ValidName(ns) {
		return "", errdefs.Errorf(errInvalidParams, "namespace %.70q: want 1-63 of [A-Za-z0-9_-] starting with a letter or digit", ns)
	}
	c.ns = ns // the namespace asked for, allowed or not
	if !c.claims.Allows(ns) {
		return "", errdefs.Errorf(errdefs.ErrForbidden, "this API key is for namespace %q, not %q", c.claims.Namespace, ns)
	}
	return ns, nil
}

// defaultNamespace is the namespace of a request that names none.
func (c *call) defaultNamespace() string {
	if k := c.claims.Namespace; k != "" && k != "*" {
		return k
	}
	return DefaultNamespace
}

// namespaces resolves a namespace filter that may be "*": nil means all.
func (c *call) namespaces(ns string) ([]string, error) {
	if ns == "*" {
		if c.claims.Namespace != "*" {
			return nil, errdefs.Errorf(errdefs.ErrForbidden, "this API key is for namespace %q and cannot list all namespaces", c.claims.Namespace)
		}
		return nil, nil
	}
	ns, err := c.namespace(ns)
	if err != nil {
		return nil, err
	}
	return []string{ns}, nil
}

// requireAdmin checks the caller holds a key for every namespace.
func (c *call) requireAdmin() error {
	if c.claims.Namespace != "*" {
		return errdefs.Errorf(errdefs.ErrForbidden, "%s needs an API key with namespace \"*\"", c.method)
	}
	return nil
}

func sandboxName(name string) error {
	if name == "" {
		return errdefs.Errorf(errInvalidParams, "\"sandbox\" (the sandbox's name) is missing")
	}
	if !sandbox.ValidName(name) {
		return errdefs.Errorf(errInvalidParams, "sandbox name %.70q: want 1-63 of [A-Za-z0-9_-] starting with a letter or digit", name)
	}
	return nil
}

// agentCall runs f with a lease on the running sandbox ns/name; an error
// that a stop caused says so.
func (s *Server) agentCall(ctx context.Context, ns, name string, f func(l *sandbox.Lease) (any, error)) (any, error) {
	l, err := s.lease(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	defer l.Release()
	res, err := f(l)
	if err != nil {
		return nil, l.Explain(ctx, "the request ran", err)
	}
	return res, nil
}

// onSandbox runs f with a lease on the sandbox ref names.
func (s *Server) onSandbox(ctx context.Context, c *call, ref sandboxRef, f func(l *sandbox.Lease) (any, error)) (any, error) {
	ns, name, err := c.resolveRef(ref)
	if err != nil {
		return nil, err
	}
	return s.agentCall(ctx, ns, name, f)
}

// seconds converts a duration given in seconds (a timeout, a wait, a
// lifetime) to a time.Duration bounded by max. The bound is checked on the
// float, before any conversion: converting a value past the range of
// time.Duration gives an arbitrary (on amd64, negative) duration, which
// would slip past a check made after it. A positive value under a
// millisecond counts as one millisecond, the unit timeouts travel in, so
// it never turns into 0 (no timeout). NaN and infinities cannot come from
// JSON, but are refused all the same.
func seconds(what string, v float64, max time.Duration) (time.Duration, error) {
	if math.IsNaN(v) || v < 0 || v > max.Seconds() {
		return 0, errdefs.Errorf(errInvalidParams, "%s %g: want a number of seconds from 0 up to %g", what, v, max.Seconds())
	}
	d := time.Duration(v * float64(time.Second))
	if v > 0 && d < time.Millisecond {
		d = time.Millisecond
	}
	return d, nil
}

// maxTimeout bounds every command and code timeout.
const maxTimeout = 24 * time.Hour

// limitSeconds is the timeout of a microsandbox method (sandbox.command.run,
// sandbox.repl.run): any non-negative JSON number, integer or not, however
// large, as microsandbox takes it. The Go SDK sends its HTTP client's
// timeout in nanoseconds there (60 s arrives as 6e10 "seconds"), so a value
// past maxTimeout is held to maxTimeout instead of refused; a negative
// number or anything but a number is still invalid_params. Warren's own
// methods keep refusing a timeout past their bound (seconds).
type limitSeconds float64

// UnmarshalJSON reads any JSON number, also one past the range of a
// float64 (1e400), which stands for "longer than the bound" like any other
// huge value; null leaves the value as it is (absent: no timeout).
func (l *limitSeconds) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	if len(b) == 0 || (b[0] != '-' && (b[0] < '0' || b[0] > '9')) {
		return fmt.Errorf("\"timeout\" must be a number of seconds, not %.20s", b)
	}
	v, err := strconv.ParseFloat(string(b), 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return fmt.Errorf("\"timeout\" must be a number of seconds, not %.20s", b)
	}
	// On ErrRange v is ±Inf (too large) or ±0 (too small); both are
	// judged below like any other value.
	*l = limitSeconds(v)
	return nil
}

// duration is l as a time.Duration, held to max; a negative l is refused.
func (l limitSeconds) duration(what string, max time.Duration) (time.Duration, error) {
	v := float64(l)
	if math.IsNaN(v) || v < 0 {
		return 0, errdefs.Errorf(errInvalidParams, "%s %g: want a number of seconds, 0 or more (more than %g counts as %g)", what, v, max.Seconds(), max.Seconds())
	}
	return seconds(what, min(v, max.Seconds()), max) // +Inf included
}
