package audit

import (
	"encoding/json"
	"math"
	"testing"
	"time"
)

// checkEncode: appendRecord writes what json.Marshal writes, or fails
// where it fails.
func checkEncode(t *testing.T, r *Record) {
	t.Helper()
	want, werr := json.Marshal(r)
	got, gerr := appendRecord([]byte("prefix"), r)
	if (werr != nil) != (gerr != nil) || (werr == nil && string(got) != "prefix"+string(want)) {
		t.Fatalf("appendRecord(%+v)\n got %s (%v)\nwant %s (%v)", r, got, gerr, want, werr)
	}
}

func TestEncodeAsMarshal(t *testing.T) {
	code, zero := 3, 0
	hostile := "<a href=\"x\">&\u2028\u2029\x00\x1f\x7f\b\f\n\r\t\\ é 😀 \xff\xc3"
	when := time.Date(2026, 11, 26, 13, 1, 2, 300400500, time.UTC)
	for _, r := range []*Record{
		{},
		{Kind: KindCall, Time: when, Namespace: "team-a", Sandbox: "web-1", Labels: map[string]string{"z": "1", "a": hostile, "": "e", "m": ""},
			KeyID: "0123456789abcdef", RequestID: "9f8e",
			Call: &Call{Method: "sandbox.exec", Params: Params([]byte(`{"a":"<b>","env":["K=V"],"n":1.50}`)), Outcome: "ok", DurationMs: 12.5}},
		{Kind: KindCall, Time: when.In(time.FixedZone("x", -3*3600-1800)), Call: &Call{Method: hostile, Outcome: "limit", DurationMs: 1e-7}},
		{Kind: KindCall, Call: &Call{Params: json.RawMessage(" { \"a\" : [ 1 , 2 ] } "), DurationMs: 1e21}},
		{Kind: KindCall, Call: &Call{Params: json.RawMessage(`{"a":`)}},
		{Kind: KindCall, Call: &Call{DurationMs: math.NaN()}},
		{Kind: KindExec, Exec: &Exec{DurationMs: math.Inf(-1)}},
		{Kind: KindCall, Time: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), Call: &Call{}},
		{Kind: KindExec, Time: when, Sandbox: "s", Exec: &Exec{Via: "command", Argv: []string{"sh", "-c", hostile, ""}, ArgvSHA256: "ab",
			ExitCode: &code, Signal: "KILL", TimedOut: true, OOMKilled: true, ProcessID: "p1", Outcome: "ok", DurationMs: -0.001}},
		{Kind: KindExec, Exec: &Exec{Via: "repl", Language: "python", CodeSHA256: "cd", CodeBytes: 12, ExitCode: &zero, Argv: []string{}, DurationMs: 123456789.125}},
		{Kind: KindEgress, Time: when, Labels: map[string]string{"k": "v"}, Egress: &Egress{Seq: 1, Kind: "dns", Name: hostile, Verdict: "allow", Rules: []string{"a"}}},
		{Kind: KindRefusal, Refusal: &Refusal{Method: "m", Kind: "limit", Message: hostile}},
		{Kind: KindKey, Key: &KeyChange{Action: "create", ID: "i", By: "api"}},
		{Kind: KindConfig, Config: &Config{Accepted: true, Problems: []string{hostile}}},
		{Kind: KindUsage, Usage: &Usage{From: when, To: when, CPUSeconds: 0.1, DiskBytes: new(int64(5)), Reason: "stop"}},
		{Kind: KindCheckpoint, Checkpoint: &Checkpoint{Reason: "count", KeyID: "k"}},
		{Kind: KindRecovery, Recovery: &Recovery{Reason: "torn", LastSeq: 3, File: "f", Line: 2, Bytes: 9}},
		{Kind: Kind(hostile), Call: &Call{}, Exec: &Exec{}, Refusal: &Refusal{}},
	} {
		checkEncode(t, r)
	}
	for _, f := range []float64{0, 1, -1, 0.1, 1e-6, 9.99e-7, 1e20, 1e21, 123.456, math.MaxFloat64, math.SmallestNonzeroFloat64, math.Copysign(0, -1)} {
		checkEncode(t, &Record{Kind: KindCall, Call: &Call{DurationMs: f}})
	}
}

// FuzzEncode: appendRecord and json.Marshal agree on any strings,
// numbers and times.
func FuzzEncode(f *testing.F) {
	f.Add("sandbox.exec", "<&>\u2028", "k", "v", 12.5, int64(1764162062), 3, []byte(`{"a":1}`))
	f.Add("", "\xff", "", "", 1e-9, int64(-1), 0, []byte(`[`))
	f.Fuzz(func(t *testing.T, a, b, k, v string, d float64, sec int64, code int, params []byte) {
		when := time.Unix(sec, int64(code)).UTC()
		checkEncode(t, &Record{Kind: Kind(a), Time: when, Namespace: b, Labels: map[string]string{k: v, b: a},
			Call: &Call{Method: b, Params: params, Outcome: a, DurationMs: d}})
		checkEncode(t, &Record{Kind: KindExec, Time: when, Sandbox: a, Exec: &Exec{Via: a, Argv: []string{a, b, k}, ExitCode: &code,
			CodeBytes: code, Signal: v, Outcome: b, DurationMs: d}})
	})
}
