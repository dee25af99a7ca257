// Package metrics owns Warren's Prometheus instrumentation primitives: a
// small, dependency-free registry of counters, histograms and scrape-time
// gauges, and its rendering in the Prometheus text exposition format 0.0.4
// (optionally filtered per series, so a tenant can be shown only the series
// of its own namespace).
//
// It deliberately does not depend on prometheus/client_golang. It owns the
// metric primitives and the exposition, not the server's metric names: those
// are registered by the packages that record them.
//
// # Programming errors vs. runtime input
//
// Mistakes that can only come from Warren's own code panic: invalid metric or
// label names, duplicate registration (including a histogram whose _bucket,
// _sum or _count name collides with another family), unsorted histogram
// buckets, and calling With (or a GaugeFunc emit) with the wrong number of
// label values.
//
// Values that may come from the outside never panic: label values are
// arbitrary strings (invalid UTF-8 is replaced with U+FFFD), Counter.Add
// ignores negative, NaN and infinite deltas, and Histogram.Observe ignores
// NaN.
//
// # Cardinality
//
// Each family holds at most SeriesLimit series (DefaultSeriesLimit unless
// changed with Registry.SetSeriesLimit). Once a family is full, With for a new
// label combination returns nil; the methods of a nil *Counter or *Histogram
// are no-ops, so callers need no checks. Every refused combination is counted
// in warren_metrics_dropped_series_total{metric="<family>"}. GaugeFunc
// families apply the same limit to the series emitted in one scrape.
//
// # Concurrency
//
// All methods are safe for concurrent use. Counters are lock-free; each
// histogram series has its own small mutex so a scrape always sees a
// consistent bucket/sum/count triple.
package metrics

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// DefaultLatencyBuckets are histogram upper bounds in seconds, covering
// 0.5 ms to 10 s.
var DefaultLatencyBuckets = []float64{
	.0005, .001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5, 10,
}

// DefaultSeriesLimit is the default maximum number of series per family.
const DefaultSeriesLimit = 10000

// DroppedSeriesMetric is the name of the counter, present in every Registry,
// of label combinations refused because their family was full.
const DroppedSeriesMetric = "warren_metrics_dropped_series_total"

// ContentType is the Content-Type of the text exposition format 0.0.4.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// Filter decides whether one series is written. It is called once per series
// (once per histogram series, not per bucket) with the family name and the
// series' label names and values, which are parallel slices; "le" is never
// included. The slices must not be modified or retained.
type Filter func(metric string, labelNames, labelValues []string) bool

// MatchLabel returns a Filter keeping only series that have label name with
// exactly value; series without that label are dropped. This is the usual
// tenant filter: MatchLabel("namespace", ns).
func MatchLabel(name, value string) Filter {
	return func(_ string, names, values []string) bool {
		for i, n := range names {
			if n == name {
				return values[i] == value
			}
		}
		return false
	}
}

// Registry is a set of metric families. The zero value is not usable; use
// NewRegistry.
type Registry struct {
	limit atomic.Int64

	mu       sync.RWMutex
	families []family            // sorted by name
	names    map[string]struct{} // every sample name in use
}

// family is one metric family (one # TYPE block).
type family interface {
	familyName() string
	droppedCount() uint64
	// write appends the family's text to b; it returns false when no
	// series survived the filter (then nothing is written).
	write(b *bufio.Writer, keep Filter) bool
}

// NewRegistry returns an empty registry containing only
// DroppedSeriesMetric.
func NewRegistry() *Registry {
	r := &Registry{names: map[string]struct{}{}}
	r.limit.Store(DefaultSeriesLimit)
	f := &funcFamily{
		meta:      r.newMeta(DroppedSeriesMetric, "Label combinations refused because the metric family reached its series limit.", "counter", []string{"metric"}),
		unlimited: true,
		collect: func(emit func(float64, ...string)) {
			r.mu.RLock()
			fams := slices.Clone(r.families)
			r.mu.RUnlock()
			for _, f := range fams {
				if n := f.droppedCount(); n > 0 {
					emit(float64(n), f.familyName())
				}
			}
		},
	}
	r.register(f, DroppedSeriesMetric)
	return r
}

// SetSeriesLimit sets the maximum number of series per family (n <= 0
// restores DefaultSeriesLimit). Existing series are kept; the limit applies
// to new label combinations.
func (r *Registry) SetSeriesLimit(n int) {
	if n <= 0 {
		n = DefaultSeriesLimit
	}
	r.limit.Store(int64(n))
}

// Counter registers a counter family. It panics on an invalid or duplicate
// name or invalid label names.
func (r *Registry) Counter(name, help string, labelNames ...string) *CounterVec {
	v := &CounterVec{vec: vec[Counter]{meta: r.newMeta(name, help, "counter", labelNames)}}
	v.vec.init(func([]string) *Counter { return new(Counter) })
	r.register(v, name)
	return v
}

// Histogram registers a histogram family. buckets are upper bounds, strictly
// increasing; nil or empty means DefaultLatencyBuckets, and a trailing +Inf
// is implicit (and removed if given). The label name "le" is reserved. It
// panics on invalid input and on a name collision of name, name_bucket,
// name_sum or name_count with another family.
func (r *Registry) Histogram(name, help string, buckets []float64, labelNames ...string) *HistogramVec {
	if len(buckets) == 0 {
		buckets = DefaultLatencyBuckets
	}
	upper := slices.Clone(buckets)
	if math.IsInf(upper[len(upper)-1], 1) {
		upper = upper[:len(upper)-1]
	}
	for i, u := range upper {
		if math.IsNaN(u) || math.IsInf(u, 0) || (i > 0 && u <= upper[i-1]) {
			panic(fmt.Sprintf("metrics: histogram %q: buckets must be finite and strictly increasing, got %v", name, buckets))
		}
	}
	for _, l := range labelNames {
		if l == "le" {
			panic(fmt.Sprintf("metrics: histogram %q: label name \"le\" is reserved", name))
		}
	}
	v := &HistogramVec{vec: vec[Histogram]{meta: r.newMeta(name, help, "histogram", labelNames)}, upper: upper}
	v.vec.init(func([]string) *Histogram {
		return &Histogram{upper: upper, counts: make([]uint64, len(upper)+1)}
	})
	r.register(v, name, name+"_bucket", name+"_sum", name+"_count")
	return v
}

// GaugeFunc registers a gauge family whose series are computed at scrape
// time: on every scrape, collect is called and must call emit, from its own
// goroutine, once per series with len(labelNames) label values (otherwise
// emit panics). If the
// same label values are emitted twice, the last value wins. emit must not be
// used after collect returns. collect runs without registry locks held and
// may be called concurrently by concurrent scrapes.
func (r *Registry) GaugeFunc(name, help string, labelNames []string, collect func(emit func(value float64, labelValues ...string))) {
	if collect == nil {
		panic(fmt.Sprintf("metrics: gauge %q: nil collect func", name))
	}
	r.register(&funcFamily{meta: r.newMeta(name, help, "gauge", labelNames), collect: collect}, name)
}

// CounterFunc is GaugeFunc for a counter another part of the program
// keeps: collect emits its current totals, which only ever grow.
func (r *Registry) CounterFunc(name, help string, labelNames []string, collect func(emit func(value float64, labelValues ...string))) {
	if collect == nil {
		panic(fmt.Sprintf("metrics: counter %q: nil collect func", name))
	}
	r.register(&funcFamily{meta: r.newMeta(name, help, "counter", labelNames), collect: collect}, name)
}

// WriteText writes every family in the text exposition format 0.0.4, sorted
// by name. Families without series are omitted.
func (r *Registry) WriteText(w io.Writer) error {
	return r.WriteTextFiltered(w, nil)
}

// WriteTextFiltered is WriteText writing only the series for which keep
// returns true (all series if keep is nil). Families left without series are
// omitted entirely, HELP and TYPE included.
func (r *Registry) WriteTextFiltered(w io.Writer, keep Filter) error {
	r.mu.RLock()
	fams := slices.Clone(r.families)
	r.mu.RUnlock()
	b := bufio.NewWriter(w)
	for _, f := range fams {
		f.write(b, keep)
	}
	return b.Flush()
}

// Handler serves all series with Content-Type ContentType.
func (r *Registry) Handler() http.Handler {
	return r.FilteredHandler(nil)
}

// FilteredHandler serves the series kept by the Filter that filterFor returns
// for the request (all series if filterFor or its result is nil). Only GET
// and HEAD are allowed. Authentication is the caller's business.
func (r *Registry) FilteredHandler(filterFor func(*http.Request) Filter) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		var keep Filter
		if filterFor != nil {
			keep = filterFor(req)
		}
		var sb strings.Builder
		_ = r.WriteTextFiltered(&sb, keep) // a strings.Builder never fails
		w.Header().Set("Content-Type", ContentType)
		w.Header().Set("Content-Length", strconv.Itoa(sb.Len()))
		if req.Method == http.MethodHead {
			return
		}
		_, _ = io.WriteString(w, sb.String())
	})
}

func (r *Registry) newMeta(name, help, typ string, labelNames []string) meta {
	if !validMetricName(name) {
		panic(fmt.Sprintf("metrics: invalid metric name %q", name))
	}
	seen := map[string]bool{}
	for _, l := range labelNames {
		if !validLabelName(l) {
			panic(fmt.Sprintf("metrics: %s: invalid label name %q", name, l))
		}
		if seen[l] {
			panic(fmt.Sprintf("metrics: %s: duplicate label name %q", name, l))
		}
		seen[l] = true
	}
	return meta{reg: r, name: name, help: help, typ: typ, labelNames: slices.Clone(labelNames)}
}

func (r *Registry) register(f family, names ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range names {
		if _, dup := r.names[n]; dup {
			panic(fmt.Sprintf("metrics: duplicate registration of %q", n))
		}
	}
	for _, n := range names {
		r.names[n] = struct{}{}
	}
	i := sort.Search(len(r.families), func(i int) bool { return r.families[i].familyName() >= f.familyName() })
	r.families = slices.Insert(r.families, i, f)
}

// meta is what every family shares.
type meta struct {
	reg        *Registry
	name, help string
	typ        string
	labelNames []string
	dropped    atomic.Uint64
}

func (m *meta) familyName() string   { return m.name }
func (m *meta) droppedCount() uint64 { return m.dropped.Load() }

func (m *meta) checkArity(values []string) {
	if len(values) != len(m.labelNames) {
		panic(fmt.Sprintf("metrics: %s: got %d label values, want %d %v", m.name, len(values), len(m.labelNames), m.labelNames))
	}
}

// writeHeader writes the HELP and TYPE lines.
func (m *meta) writeHeader(b *bufio.Writer) {
	if m.help != "" {
		b.WriteString("# HELP ")
		b.WriteString(m.name)
		_ = b.WriteByte(' ')
		writeEscaped(b, m.help, false)
		_ = b.WriteByte('\n')
	}
	b.WriteString("# TYPE ")
	b.WriteString(m.name)
	_ = b.WriteByte(' ')
	b.WriteString(m.typ)
	_ = b.WriteByte('\n')
}

// writeSample writes one sample line. extraName/extraValue, if extraName is
// not empty, is appended as a last label (used for "le").
func (m *meta) writeSample(b *bufio.Writer, name string, values []string, extraName, extraValue, value string) {
	b.WriteString(name)
	if len(values) > 0 || extraName != "" {
		_ = b.WriteByte('{')
		for i, v := range values {
			if i > 0 {
				_ = b.WriteByte(',')
			}
			b.WriteString(m.labelNames[i])
			b.WriteString(`="`)
			writeEscaped(b, v, true)
			_ = b.WriteByte('"')
		}
		if extraName != "" {
			if len(values) > 0 {
				_ = b.WriteByte(',')
			}
			b.WriteString(extraName)
			b.WriteString(`="`)
			b.WriteString(extraValue)
			_ = b.WriteByte('"')
		}
		_ = b.WriteByte('}')
	}
	_ = b.WriteByte(' ')
	b.WriteString(value)
	_ = b.WriteByte('\n')
}

// series is one label combination of a family.
type series[T any] struct {
	values []string
	m      *T
}

// vec is the label-values -> series map shared by counters and histograms.
type vec[T any] struct {
	meta
	newT func([]string) *T

	mu     sync.RWMutex
	series map[string]*series[T]
}

func (v *vec[T]) init(newT func([]string) *T) {
	v.newT = newT
	v.series = map[string]*series[T]{}
	if len(v.labelNames) == 0 {
		// A family without labels has exactly one series, visible
		// (at zero) from registration on.
		v.series[""] = &series[T]{m: newT(nil)}
	}
}

// seriesKey joins label values with 0xff, a byte that never occurs in valid
// UTF-8, so distinct (sanitized) value lists have distinct keys.
func seriesKey(values []string) string { return strings.Join(values, "\xff") }

// sanitize returns values with invalid UTF-8 replaced; it copies only if
// needed.
func sanitize(values []string) []string {
	for i, s := range values {
		if !utf8.ValidString(s) {
			out := slices.Clone(values)
			for j := i; j < len(out); j++ {
				out[j] = strings.ToValidUTF8(out[j], "\uFFFD")
			}
			return out
		}
	}
	return values
}

func (v *vec[T]) with(values []string) *T {
	v.checkArity(values)
	values = sanitize(values)
	key := seriesKey(values)
	v.mu.RLock()
	s := v.series[key]
	v.mu.RUnlock()
	if s != nil {
		return s.m
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if s := v.series[key]; s != nil {
		return s.m
	}
	if int64(len(v.series)) >= v.reg.limit.Load() {
		v.dropped.Add(1)
		return nil
	}
	values = slices.Clone(values)
	s = &series[T]{values: values, m: v.newT(values)}
	v.series[key] = s
	return s.m
}

// snapshot returns the series kept by keep, sorted by label values.
func (v *vec[T]) snapshot(keep Filter) []*series[T] {
	v.mu.RLock()
	out := make([]*series[T], 0, len(v.series))
	for _, s := range v.series {
		out = append(out, s)
	}
	v.mu.RUnlock()
	out = slices.DeleteFunc(out, func(s *series[T]) bool {
		return keep != nil && !keep(v.name, v.labelNames, s.values)
	})
	slices.SortFunc(out, func(a, b *series[T]) int { return slices.Compare(a.values, b.values) })
	return out
}

// CounterVec is a counter family, partitioned by label values.
type CounterVec struct{ vec vec[Counter] }

// With returns the counter for the given label values, in the order of the
// label names given at registration, creating it if needed. It panics if the
// number of values is wrong. It returns nil (whose methods are no-ops) if
// the series would exceed the family's series limit.
func (v *CounterVec) With(labelValues ...string) *Counter { return v.vec.with(labelValues) }

func (v *CounterVec) familyName() string   { return v.vec.name }
func (v *CounterVec) droppedCount() uint64 { return v.vec.dropped.Load() }

func (v *CounterVec) write(b *bufio.Writer, keep Filter) bool {
	ss := v.vec.snapshot(keep)
	if len(ss) == 0 {
		return false
	}
	v.vec.writeHeader(b)
	for _, s := range ss {
		v.vec.writeSample(b, v.vec.name, s.values, "", "", formatFloat(s.m.Value()))
	}
	return true
}

// Counter is a monotonically increasing value. A nil *Counter is valid and
// ignores everything.
type Counter struct {
	ints atomic.Uint64 // integral increments (fast path)
	frac atomic.Uint64 // float64 bits of all other increments
}

// Inc adds 1.
func (c *Counter) Inc() {
	if c != nil {
		c.ints.Add(1)
	}
}

// Add adds delta. Negative, NaN and infinite deltas are ignored (a counter
// never decreases, and a bad measurement must not crash the server).
func (c *Counter) Add(delta float64) {
	if c == nil || !(delta >= 0) || math.IsInf(delta, 1) {
		return
	}
	if delta == math.Trunc(delta) && delta < 1<<53 {
		c.ints.Add(uint64(delta))
		return
	}
	for {
		old := c.frac.Load()
		n := math.Float64bits(math.Float64frombits(old) + delta)
		if c.frac.CompareAndSwap(old, n) {
			return
		}
	}
}

// Value returns the current value (0 for a nil Counter).
func (c *Counter) Value() float64 {
	if c == nil {
		return 0
	}
	return float64(c.ints.Load()) + math.Float64frombits(c.frac.Load())
}

// HistogramVec is a histogram family, partitioned by label values.
type HistogramVec struct {
	vec   vec[Histogram]
	upper []float64
}

// With returns the histogram for the given label values, in the order of
// the label names given at registration, creating it if needed. It panics if
// the number of values is wrong. It returns nil (whose methods are no-ops) if
// the series would exceed the family's series limit.
func (v *HistogramVec) With(labelValues ...string) *Histogram { return v.vec.with(labelValues) }

func (v *HistogramVec) familyName() string   { return v.vec.name }
func (v *HistogramVec) droppedCount() uint64 { return v.vec.dropped.Load() }

func (v *HistogramVec) write(b *bufio.Writer, keep Filter) bool {
	ss := v.vec.snapshot(keep)
	if len(ss) == 0 {
		return false
	}
	les := make([]string, len(v.upper)+1)
	for i, u := range v.upper {
		les[i] = formatFloat(u)
	}
	les[len(v.upper)] = "+Inf"
	counts := make([]uint64, len(v.upper)+1)
	v.vec.writeHeader(b)
	for _, s := range ss {
		h := s.m
		h.mu.Lock()
		copy(counts, h.counts)
		sum, count := h.sum, h.count
		h.mu.Unlock()
		var cum uint64
		for i, c := range counts {
			cum += c
			v.vec.writeSample(b, v.vec.name+"_bucket", s.values, "le", les[i], strconv.FormatUint(cum, 10))
		}
		v.vec.writeSample(b, v.vec.name+"_sum", s.values, "", "", formatFloat(sum))
		v.vec.writeSample(b, v.vec.name+"_count", s.values, "", "", strconv.FormatUint(count, 10))
	}
	return true
}

// Histogram counts observations in buckets. A nil *Histogram is valid and
// ignores everything.
type Histogram struct {
	upper []float64 // shared with the vec, read-only

	mu     sync.Mutex
	counts []uint64 // per bucket, not cumulative; last is +Inf
	sum    float64
	count  uint64
}

// Observe records v. NaN is ignored.
func (h *Histogram) Observe(v float64) {
	if h == nil || math.IsNaN(v) {
		return
	}
	i, _ := slices.BinarySearch(h.upper, v) // first bucket with upper >= v
	h.mu.Lock()
	h.counts[i]++
	h.sum += v
	h.count++
	h.mu.Unlock()
}

// ObserveDuration records d in seconds.
func (h *Histogram) ObserveDuration(d time.Duration) { h.Observe(d.Seconds()) }

// funcFamily is a family whose series are computed at scrape time.
type funcFamily struct {
	meta
	unlimited bool
	collect   func(emit func(float64, ...string))
}

func (f *funcFamily) write(b *bufio.Writer, keep Filter) bool {
	type sample struct {
		values []string
		value  float64
	}
	byKey := map[string]*sample{}
	limit := int(f.reg.limit.Load())
	done := false
	f.collect(func(value float64, labelValues ...string) {
		if done {
			panic(fmt.Sprintf("metrics: %s: emit called after collect returned", f.name))
		}
		f.checkArity(labelValues)
		labelValues = sanitize(labelValues)
		key := seriesKey(labelValues)
		if s := byKey[key]; s != nil {
			s.value = value
			return
		}
		if !f.unlimited && len(byKey) >= limit {
			f.dropped.Add(1)
			return
		}
		byKey[key] = &sample{values: slices.Clone(labelValues), value: value}
	})
	done = true
	ss := make([]*sample, 0, len(byKey))
	for _, s := range byKey {
		if keep == nil || keep(f.name, f.labelNames, s.values) {
			ss = append(ss, s)
		}
	}
	if len(ss) == 0 {
		return false
	}
	slices.SortFunc(ss, func(a, b *sample) int { return slices.Compare(a.values, b.values) })
	f.writeHeader(b)
	for _, s := range ss {
		f.writeSample(b, f.name, s.values, "", "", formatFloat(s.value))
	}
	return true
}

// formatFloat formats like the Prometheus client: +Inf, -Inf, NaN, integral
// values without exponent (below 1e15), shortest round-trip otherwise.
func formatFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "+Inf"
	case math.IsInf(f, -1):
		return "-Inf"
	case math.IsNaN(f):
		return "NaN"
	case f == math.Trunc(f) && math.Abs(f) < 1e15:
		return strconv.FormatFloat(f, 'f', -1, 64)
	default:
		return strconv.FormatFloat(f, 'g', -1, 64)
	}
}

// writeEscaped writes s escaping backslash and newline, and double quote if
// quote is set (label values; HELP text does not escape quotes).
func writeEscaped(b *bufio.Writer, s string, quote bool) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			b.WriteString(`\\`)
		case c == '\n':
			b.WriteString(`\n`)
		case c == '"' && quote:
			b.WriteString(`\"`)
		default:
			_ = b.WriteByte(c)
		}
	}
}

// validMetricName reports whether s matches [a-zA-Z_:][a-zA-Z0-9_:]*.
func validMetricName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c == ':' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || i > 0 && '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

// validLabelName reports whether s matches [a-zA-Z_][a-zA-Z0-9_]* (no colon,
// unlike metric names) and does not start with the reserved "__".
func validLabelName(s string) bool {
	return validMetricName(s) && !strings.Contains(s, ":") && !strings.HasPrefix(s, "__")
}
