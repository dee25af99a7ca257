package audit

import (
	"encoding/json"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the process's user and system time: on a loaded machine a
// benchmark's wall time per op says more about the other processes than
// about the code, its CPU time per op does not.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkAppend is what an API call pays to be recorded, one record
// after the other: its params redacted, the record encoded, hashed and
// written (the target: 20 µs).
func BenchmarkAppend(b *testing.B) {
	l, err := Open(Options{Dir: b.TempDir(), CheckpointInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	params := []byte(`{"sandbox":"web-1","namespace":"team-a","argv":["python3","-c","print(1)"],"env":["TOKEN=abc"],"timeout":30}`)
	labels := map[string]string{"team": "a", "project": "billing"}
	b.ReportAllocs()
	c0 := cpuTime()
	defer func() { b.ReportMetric(float64(cpuTime()-c0)/float64(b.N), "cpu-ns/op") }()
	for b.Loop() {
		r := &Record{Kind: KindCall, Namespace: "team-a", Sandbox: "web-1", Labels: labels, KeyID: "0123456789abcdef",
			RequestID: "9f8e7d6c5b4a3210", Call: &Call{Method: "sandbox.exec", Params: Params(params), Outcome: "ok", DurationMs: 12.5}}
		if err := l.Append(r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerify reports records verified per second (the issue's
// target: 200k/s).
func BenchmarkVerify(b *testing.B) {
	dir := b.TempDir()
	l, err := Open(Options{Dir: dir, CheckpointInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	const n = 100000
	r := &Record{Kind: KindCall, Namespace: "team-a", Sandbox: "web-1", Labels: map[string]string{"team": "a"}, KeyID: "0123456789abcdef",
		Call: &Call{Method: "sandbox.exec", Params: json.RawMessage(`{"sandbox":"web-1","argv":["python3","-c","print(1)"]}`), Outcome: "ok", DurationMs: 12.5}}
	for range n {
		if err := l.Append(r); err != nil {
			b.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		rep, err := Verify(dir, VerifyOptions{})
		if err != nil || len(rep.Problems) != 0 {
			b.Fatal(err, rep.Problems)
		}
	}
	b.ReportMetric(float64(n+n/10000+1)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
}
