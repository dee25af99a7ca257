package metrics

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func text(t *testing.T, r *Registry, keep Filter) string {
	t.Helper()
	var sb strings.Builder
	if err := r.WriteTextFiltered(&sb, keep); err != nil {
		t.Fatal(err)
	}
	out := sb.String()
	parseExposition(t, out) // every output must be well-formed
	return out
}

func TestGolden(t *testing.T) {
	r := NewRegistry()
	reqs := r.Counter("warren_http_requests_total", "HTTP requests by method and code.", "method", "code")
	reqs.With("GET", "200").Add(3)
	reqs.With("POST", "500").Inc()
	reqs.With("GET", "404").Add(0.5)
	r.Counter("warren_boot_total", "Boots.") // no labels: present at 0
	lat := r.Histogram("warren_exec_seconds", "Exec latency.\nIn seconds \\o/", []float64{0.01, 0.1, 1}, "namespace", "kind")
	lat.With("ns1", "repl").Observe(0.05)
	lat.With("ns1", "repl").Observe(0.005)
	lat.With("ns1", "repl").Observe(3)
	r.GaugeFunc("warren_sandboxes", "Sandboxes by state.", []string{"namespace", "state"}, func(emit func(float64, ...string)) {
		emit(2, "ns2", "running")
		emit(1, "ns1", "stopped")
		emit(7, "ns1", "running")
	})
	r.GaugeFunc("warren_empty", "Nothing to see.", nil, func(func(float64, ...string)) {})

	want := `# HELP warren_boot_total Boots.
# TYPE warren_boot_total counter
warren_boot_total 0
# HELP warren_exec_seconds Exec latency.\nIn seconds \\o/
# TYPE warren_exec_seconds histogram
warren_exec_seconds_bucket{namespace="ns1",kind="repl",le="0.01"} 1
warren_exec_seconds_bucket{namespace="ns1",kind="repl",le="0.1"} 2
warren_exec_seconds_bucket{namespace="ns1",kind="repl",le="1"} 2
warren_exec_seconds_bucket{namespace="ns1",kind="repl",le="+Inf"} 3
warren_exec_seconds_sum{namespace="ns1",kind="repl"} 3.055
warren_exec_seconds_count{namespace="ns1",kind="repl"} 3
# HELP warren_http_requests_total HTTP requests by method and code.
# TYPE warren_http_requests_total counter
warren_http_requests_total{method="GET",code="200"} 3
warren_http_requests_total{method="GET",code="404"} 0.5
warren_http_requests_total{method="POST",code="500"} 1
# HELP warren_sandboxes Sandboxes by state.
# TYPE warren_sandboxes gauge
warren_sandboxes{namespace="ns1",state="running"} 7
warren_sandboxes{namespace="ns1",state="stopped"} 1
warren_sandboxes{namespace="ns2",state="running"} 2
`
	if got := text(t, r, nil); got != want {
		t.Fatalf("output mismatch\n--- got\n%s--- want\n%s", got, want)
	}
}

func TestHistogramBuckets(t *testing.T) {
	r := NewRegistry()
	h := r.Histogram("h", "h", []float64{1, 2, 5, math.Inf(1)}) // trailing +Inf is implicit
	for _, v := range []float64{0, 1, 1.5, 2, 2.0001, 4, 5, 6, 100, -1, math.NaN(), math.Inf(1)} {
		h.With().Observe(v)
	}
	h.With().ObserveDuration(1500 * time.Millisecond)
	s := parseExposition(t, text(t, r, nil))
	want := map[string]float64{
		`h_bucket{le="1"}`:    3,  // 0, 1 (le is inclusive), -1
		`h_bucket{le="2"}`:    6,  // + 1.5, 2, 1.5s
		`h_bucket{le="5"}`:    9,  // + 2.0001, 4, 5
		`h_bucket{le="+Inf"}`: 12, // + 6, 100, +Inf; NaN is ignored
		`h_count`:             12,
	}
	for k, v := range want {
		if s[k] != v {
			t.Errorf("%s = %v, want %v", k, s[k], v)
		}
	}
	if !math.IsInf(s["h_sum"], 1) {
		t.Errorf("h_sum = %v, want +Inf (an +Inf observation)", s["h_sum"])
	}

	// Default buckets, and finite sum.
	d := r.Histogram("d", "d", nil, "k")
	d.With("a").Observe(0.25)
	d.With("a").Observe(0.5)
	s = parseExposition(t, text(t, r, nil))
	if got := s[`d_bucket{k="a",le="0.0005"}`]; got != 0 {
		t.Errorf("0.0005 bucket = %v", got)
	}
	if got := s[`d_bucket{k="a",le="0.5"}`]; got != 2 {
		t.Errorf("0.5 bucket = %v", got)
	}
	if got := s[`d_bucket{k="a",le="10"}`]; got != 2 {
		t.Errorf("10 bucket = %v", got)
	}
	if s[`d_sum{k="a"}`] != 0.75 || s[`d_count{k="a"}`] != 2 {
		t.Errorf("sum/count = %v/%v", s[`d_sum{k="a"}`], s[`d_count{k="a"}`])
	}
	n := 0
	for k := range s {
		if strings.HasPrefix(k, "d_bucket") {
			n++
		}
	}
	if n != len(DefaultLatencyBuckets)+1 {
		t.Errorf("%d buckets, want %d", n, len(DefaultLatencyBuckets)+1)
	}
}

func TestEscaping(t *testing.T) {
	r := NewRegistry()
	c := r.Counter("c", `say "hi"\n`+"\nnext", "v")
	c.With("a\"b\\c\nd").Inc()
	c.With("\xff\xfeok").Inc() // a run of invalid UTF-8 becomes one U+FFFD
	c.With("\xfeok").Inc()     // ... and merges with the above
	got := text(t, r, nil)
	want := `# HELP c say "hi"\\n\nnext
# TYPE c counter
c{v="a\"b\\c\nd"} 1
c{v="�ok"} 2
`
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	if s := parseExposition(t, got); s["c{v=\"a\"b\\c\nd\"}"] != 1 {
		t.Fatalf("parser did not round-trip the escaped value: %v", s)
	}
}

func TestFilter(t *testing.T) {
	r := NewRegistry()
	errs := r.Counter("errors_total", "e", "namespace", "kind")
	errs.With("alpha", "oom").Inc()
	errs.With("beta", "oom").Inc()
	reqs := r.Counter("http_requests_total", "r", "method", "code")
	reqs.With("GET", "200").Inc()
	lat := r.Histogram("start_seconds", "s", []float64{1}, "namespace")
	lat.With("alpha").Observe(0.5)
	lat.With("beta").Observe(0.5)
	r.GaugeFunc("sandboxes", "s", []string{"namespace", "state"}, func(emit func(float64, ...string)) {
		emit(1, "alpha", "running")
		emit(2, "beta", "running")
	})

	got := text(t, r, MatchLabel("namespace", "alpha"))
	want := `# HELP errors_total e
# TYPE errors_total counter
errors_total{namespace="alpha",kind="oom"} 1
# HELP sandboxes s
# TYPE sandboxes gauge
sandboxes{namespace="alpha",state="running"} 1
# HELP start_seconds s
# TYPE start_seconds histogram
start_seconds_bucket{namespace="alpha",le="1"} 1
start_seconds_bucket{namespace="alpha",le="+Inf"} 1
start_seconds_sum{namespace="alpha"} 0.5
start_seconds_count{namespace="alpha"} 1
`
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}

	// The filter sees the family name and parallel name/value slices,
	// without "le".
	var seen []string
	text(t, r, func(metric string, names, values []string) bool {
		if len(names) != len(values) {
			t.Errorf("%s: %v vs %v", metric, names, values)
		}
		for _, n := range names {
			if n == "le" {
				t.Errorf("%s: filter saw le", metric)
			}
		}
		seen = append(seen, fmt.Sprint(metric, names, values))
		return false
	})
	if len(seen) != 7 {
		t.Errorf("filter called %d times, want 7: %q", len(seen), seen)
	}
	if got := text(t, r, func(string, []string, []string) bool { return false }); got != "" {
		t.Errorf("everything filtered, got %q", got)
	}
}

func TestConcurrency(t *testing.T) {
	r := NewRegistry()
	c := r.Counter("c_total", "c", "kind")
	h := r.Histogram("h_seconds", "h", nil, "kind")
	f := r.Counter("f_total", "f")
	const workers, n = 8, 10000
	stop := make(chan struct{})
	scraped := make(chan int)
	go func() {
		scrapes := 0
		for {
			select {
			case <-stop:
				scraped <- scrapes
				return
			default:
			}
			var sb strings.Builder
			if err := r.WriteText(&sb); err != nil {
				t.Error(err)
			}
			s := parseExposition(t, sb.String())
			// A scrape sees a consistent histogram: +Inf bucket == count.
			for _, k := range []string{"command", "repl"} {
				inf, cnt := s[`h_seconds_bucket{kind="`+k+`",le="+Inf"}`], s[`h_seconds_count{kind="`+k+`"}`]
				if inf != cnt {
					t.Errorf("inconsistent histogram: +Inf %v, count %v", inf, cnt)
				}
			}
			scrapes++
		}
	}()
	var wg sync.WaitGroup
	for w := range workers {
		kind := []string{"command", "repl"}[w%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				c.With(kind).Inc()
				h.With(kind).Observe(float64(i%4) * 0.25) // 0, .25, .5, .75: exact sums
				f.With().Add(0.5)
			}
		}()
	}
	wg.Wait()
	close(stop)
	if got := <-scraped; got == 0 {
		t.Log("scraper never completed a scrape during the run")
	}
	s := parseExposition(t, text(t, r, nil))
	half := float64(workers / 2 * n)
	checks := map[string]float64{
		`c_total{kind="command"}`:                   half,
		`c_total{kind="repl"}`:                      half,
		`h_seconds_count{kind="command"}`:           half,
		`h_seconds_bucket{kind="repl",le="+Inf"}`:   half,
		`h_seconds_bucket{kind="repl",le="0.5"}`:    half * 3 / 4,
		`h_seconds_sum{kind="repl"}`:                half * 0.375,
		`f_total`:                                   float64(workers * n / 2),
		`h_seconds_bucket{kind="command",le="0.2"}`: half / 4,
	}
	for k, v := range checks {
		if s[k] != v {
			t.Errorf("%s = %v, want %v", k, s[k], v)
		}
	}
}

func TestCardinalityCap(t *testing.T) {
	r := NewRegistry()
	r.SetSeriesLimit(3)
	c := r.Counter("c_total", "c", "client")
	h := r.Histogram("h", "h", []float64{1}, "client")
	for i := range 10 {
		v := strconv.Itoa(i)
		c.With(v).Inc()
		h.With(v).Observe(1)
	}
	c.With("0").Inc() // existing series still work when full
	if got := c.With("99"); got != nil {
		t.Fatalf("With beyond limit returned %v, want nil", got)
	}
	c.With("99").Add(5) // nil counter: no-op, no panic
	var nilH *Histogram
	nilH.Observe(1)
	nilH.ObserveDuration(time.Second)
	r.GaugeFunc("g", "g", []string{"i"}, func(emit func(float64, ...string)) {
		for i := range 5 {
			emit(float64(i), strconv.Itoa(i))
		}
	})

	s := parseExposition(t, text(t, r, nil))
	count := func(prefix string) int {
		n := 0
		for k := range s {
			if strings.HasPrefix(k, prefix) {
				n++
			}
		}
		return n
	}
	if n := count("c_total{"); n != 3 {
		t.Errorf("c_total has %d series, want 3", n)
	}
	if n := count("h_count{"); n != 3 {
		t.Errorf("h has %d series, want 3", n)
	}
	if n := count("g{"); n != 3 {
		t.Errorf("g has %d series, want 3", n)
	}
	if s[`c_total{client="0"}`] != 2 {
		t.Errorf("c_total{client=0} = %v", s[`c_total{client="0"}`])
	}
	for k, v := range map[string]float64{
		DroppedSeriesMetric + `{metric="c_total"}`: 9, // 7 new values + 2 With("99")
		DroppedSeriesMetric + `{metric="h"}`:       7,
		DroppedSeriesMetric + `{metric="g"}`:       2, // one scrape so far
	} {
		if s[k] != v {
			t.Errorf("%s = %v, want %v", k, s[k], v)
		}
	}
	// The dropped counter itself is not subject to the limit.
	if n := count(DroppedSeriesMetric + "{"); n != 3 {
		t.Errorf("dropped counter has %d series, want 3", n)
	}
	// Raising the limit admits new series again.
	r.SetSeriesLimit(0) // default
	if c.With("new") == nil {
		t.Error("With after raising the limit returned nil")
	}
}

func TestCounterAdd(t *testing.T) {
	r := NewRegistry()
	c := r.Counter("c", "c").With()
	c.Add(-1)
	c.Add(math.NaN())
	c.Add(math.Inf(1))
	c.Add(2)
	c.Add(0.25)
	c.Inc()
	if c.Value() != 3.25 {
		t.Fatalf("Value = %v, want 3.25", c.Value())
	}
	var nc *Counter
	nc.Inc()
	nc.Add(1)
	if nc.Value() != 0 {
		t.Fatal("nil counter has a value")
	}
}

func TestPanics(t *testing.T) {
	mustPanic := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s: no panic", name)
			}
		}()
		f()
	}
	r := NewRegistry()
	cv := r.Counter("ok_total", "", "a", "b")
	hv := r.Histogram("lat", "", nil, "a")
	r.GaugeFunc("bad_arity", "", []string{"a"}, func(emit func(float64, ...string)) { emit(1) })

	mustPanic("empty name", func() { r.Counter("", "") })
	mustPanic("bad name", func() { r.Counter("1abc", "") })
	mustPanic("bad name char", func() { r.Counter("a-b", "") })
	mustPanic("bad label", func() { r.Counter("x1", "", "a:b") })
	mustPanic("reserved label", func() { r.Counter("x2", "", "__name") })
	mustPanic("dup label", func() { r.Counter("x3", "", "a", "a") })
	mustPanic("duplicate", func() { r.Counter("ok_total", "") })
	mustPanic("duplicate gauge", func() { r.GaugeFunc("ok_total", "", nil, func(func(float64, ...string)) {}) })
	mustPanic("duplicate dropped", func() { r.Counter(DroppedSeriesMetric, "") })
	mustPanic("histogram suffix collision", func() { r.Counter("lat_count", "") })
	mustPanic("le label", func() { r.Histogram("h2", "", nil, "le") })
	mustPanic("unsorted buckets", func() { r.Histogram("h3", "", []float64{1, 0.5}) })
	mustPanic("duplicate buckets", func() { r.Histogram("h4", "", []float64{1, 1}) })
	mustPanic("NaN bucket", func() { r.Histogram("h5", "", []float64{math.NaN()}) })
	mustPanic("nil collect", func() { r.GaugeFunc("g", "", nil, nil) })
	mustPanic("too few values", func() { cv.With("x") })
	mustPanic("too many values", func() { hv.With("x", "y") })
	mustPanic("emit arity", func() { _ = r.WriteText(&strings.Builder{}) })

	// Metric names may contain colons.
	r.Counter("ns:sub:ok", "")
}

func TestHandler(t *testing.T) {
	r := NewRegistry()
	c := r.Counter("reqs_total", "r", "namespace")
	c.With("a").Inc()
	c.With("b").Inc()
	srv := httptest.NewServer(r.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if ct := resp.Header.Get("Content-Type"); ct != "text/plain; version=0.0.4; charset=utf-8" {
		t.Errorf("Content-Type %q", ct)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	parseExposition(t, string(body))
	if !strings.Contains(string(body), `reqs_total{namespace="b"} 1`) {
		t.Errorf("body:\n%s", body)
	}

	for _, tc := range []struct {
		method string
		code   int
	}{{http.MethodHead, 200}, {http.MethodPost, 405}} {
		req := httptest.NewRequest(tc.method, "/metrics", nil)
		rec := httptest.NewRecorder()
		r.Handler().ServeHTTP(rec, req)
		if rec.Code != tc.code {
			t.Errorf("%s: code %d, want %d", tc.method, rec.Code, tc.code)
		}
		if tc.method == http.MethodHead && rec.Body.Len() != 0 {
			t.Errorf("HEAD returned a body")
		}
	}

	fh := r.FilteredHandler(func(req *http.Request) Filter {
		return MatchLabel("namespace", req.URL.Query().Get("ns"))
	})
	rec := httptest.NewRecorder()
	fh.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics?ns=a", nil))
	fbody := rec.Body.String()
	if !strings.Contains(fbody, `reqs_total{namespace="a"} 1`) || strings.Contains(fbody, `"b"`) {
		t.Errorf("filtered body:\n%s", fbody)
	}
}

func TestFormatFloat(t *testing.T) {
	for in, want := range map[float64]string{
		0: "0", 1: "1", -3: "-3", 1e6: "1000000", 123456789012: "123456789012",
		0.5: "0.5", 0.0005: "0.0005", 1e-7: "1e-07", 1e20: "1e+20", 2.5e15: "2.5e+15",
		math.Inf(1): "+Inf", math.Inf(-1): "-Inf",
	} {
		if got := formatFloat(in); got != want {
			t.Errorf("formatFloat(%v) = %q, want %q", in, got, want)
		}
	}
	if got := formatFloat(math.NaN()); got != "NaN" {
		t.Errorf("NaN -> %q", got)
	}
}

// parseExposition is an independent parser for the text format 0.0.4 as
// produced here. It fails the test on any malformed line and returns
// samples keyed by `name{k="v",...}` with label values unescaped.
func parseExposition(t *testing.T, s string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	if s == "" {
		return out
	}
	if !strings.HasSuffix(s, "\n") {
		t.Fatalf("output does not end with a newline: %q", s)
	}
	types := map[string]string{}
	helps := map[string]bool{}
	var cur, curType string // family of the latest TYPE line
	type hist struct {
		last    float64
		sawInf  bool
		infVal  float64
		buckets int
	}
	hists := map[string]*hist{} // by series without le
	validName := func(n string, colon bool) bool {
		if n == "" {
			return false
		}
		for i, c := range n {
			ok := c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9' || colon && c == ':'
			if !ok {
				return false
			}
		}
		return true
	}
	for ln, line := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
		fail := func(msg string, a ...any) {
			t.Helper()
			t.Fatalf("line %d %q: %s", ln+1, line, fmt.Sprintf(msg, a...))
		}
		if line == "" {
			fail("empty line")
		}
		if strings.HasPrefix(line, "# HELP ") {
			rest := strings.TrimPrefix(line, "# HELP ")
			name, help, ok := strings.Cut(rest, " ")
			if !ok || !validName(name, true) {
				fail("bad HELP")
			}
			for i := 0; i < len(help); i++ {
				if help[i] == '\\' {
					if i+1 >= len(help) || (help[i+1] != '\\' && help[i+1] != 'n') {
						fail("bad escape in HELP")
					}
					i++
				}
			}
			if helps[name] || types[name] != "" {
				fail("HELP repeated or after TYPE")
			}
			helps[name] = true
			continue
		}
		if strings.HasPrefix(line, "# TYPE ") {
			f := strings.Fields(strings.TrimPrefix(line, "# TYPE "))
			if len(f) != 2 || !validName(f[0], true) {
				fail("bad TYPE")
			}
			switch f[1] {
			case "counter", "gauge", "histogram":
			default:
				fail("unknown type")
			}
			if types[f[0]] != "" {
				fail("duplicate TYPE")
			}
			types[f[0]] = f[1]
			cur, curType = f[0], f[1]
			continue
		}
		if strings.HasPrefix(line, "#") {
			fail("unexpected comment")
		}
		// name
		i := 0
		for i < len(line) && line[i] != '{' && line[i] != ' ' {
			i++
		}
		name := line[:i]
		if !validName(name, true) {
			fail("bad metric name %q", name)
		}
		var labels [][2]string
		if i < len(line) && line[i] == '{' {
			i++
			for {
				if i < len(line) && line[i] == '}' {
					i++
					break
				}
				j := i
				for j < len(line) && line[j] != '=' {
					j++
				}
				ln := line[i:j]
				if !validName(ln, false) {
					fail("bad label name %q", ln)
				}
				if j+1 >= len(line) || line[j+1] != '"' {
					fail("label value not quoted")
				}
				j += 2
				var v strings.Builder
				for {
					if j >= len(line) {
						fail("unterminated label value")
					}
					c := line[j]
					if c == '"' {
						j++
						break
					}
					if c == '\\' {
						if j+1 >= len(line) {
							fail("dangling backslash")
						}
						switch line[j+1] {
						case '\\':
							v.WriteByte('\\')
						case '"':
							v.WriteByte('"')
						case 'n':
							v.WriteByte('\n')
						default:
							fail("bad escape")
						}
						j += 2
						continue
					}
					v.WriteByte(c)
					j++
				}
				for _, l := range labels {
					if l[0] == ln {
						fail("duplicate label %q", ln)
					}
				}
				labels = append(labels, [2]string{ln, v.String()})
				i = j
				if i < len(line) && line[i] == ',' {
					i++
					continue
				}
				if i >= len(line) || line[i] != '}' {
					fail("expected , or }")
				}
			}
			if len(labels) == 0 {
				fail("empty label set")
			}
		}
		if i >= len(line) || line[i] != ' ' {
			fail("no space before value")
		}
		val := line[i+1:]
		if strings.ContainsAny(val, " \t") {
			fail("trailing fields (timestamps are not produced)")
		}
		var f float64
		switch val {
		case "+Inf":
			f = math.Inf(1)
		case "-Inf":
			f = math.Inf(-1)
		case "NaN":
			f = math.NaN()
		default:
			var err error
			if f, err = strconv.ParseFloat(val, 64); err != nil || strings.ContainsAny(val, "InN") {
				fail("bad value %q", val)
			}
		}
		// The sample must belong to the current family.
		switch {
		case curType == "histogram" && (name == cur+"_bucket" || name == cur+"_sum" || name == cur+"_count"):
		case curType != "histogram" && name == cur:
		default:
			fail("sample outside its family (current %s %s)", cur, curType)
		}
		var key strings.Builder
		var base strings.Builder // series without le, for histogram checks
		key.WriteString(name)
		le := ""
		if len(labels) > 0 {
			key.WriteByte('{')
			for n, l := range labels {
				if n > 0 {
					key.WriteByte(',')
				}
				fmt.Fprintf(&key, `%s="%s"`, l[0], l[1]) // raw value
				if l[0] == "le" {
					le = l[1]
				} else {
					fmt.Fprintf(&base, "%s=%q,", l[0], l[1])
				}
			}
			key.WriteByte('}')
		}
		k := key.String()
		if _, dup := out[k]; dup {
			fail("duplicate series")
		}
		out[k] = f
		if curType == "histogram" {
			h := hists[base.String()]
			if h == nil {
				h = &hist{}
				hists[base.String()] = h
			}
			switch name {
			case cur + "_bucket":
				if le == "" || labels[len(labels)-1][0] != "le" {
					fail("bucket without trailing le")
				}
				if h.sawInf {
					fail("bucket after +Inf")
				}
				if f < h.last {
					fail("buckets not cumulative")
				}
				h.last = f
				h.buckets++
				if le == "+Inf" {
					h.sawInf, h.infVal = true, f
				}
			case cur + "_count":
				if !h.sawInf || h.infVal != f {
					fail("count %v does not match +Inf bucket", f)
				}
			default:
				if le != "" {
					fail("le on non-bucket sample")
				}
			}
		}
	}
	return out
}
