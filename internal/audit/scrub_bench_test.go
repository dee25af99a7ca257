package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"

	"github.com/warren-sandbox/warren/internal/secrets"
)

// BenchmarkAppendScrubbed is BenchmarkAppend with the server's Redact
// hook (the secrets scrubber) knowing 0 (no hook), 1 and 100 values: its
// cost is the difference.
func BenchmarkAppendScrubbed(b *testing.B) {
	for _, n := range []int{0, 1, 100} {
		b.Run(fmt.Sprintf("values=%d", n), func(b *testing.B) {
			opts := Options{Dir: b.TempDir(), CheckpointInterval: -1}
			if n > 0 {
				s := secrets.NewScrubber()
				for i := range n {
					sum := sha256.Sum256([]byte{byte(i)})
					s.Add(secrets.NewValue([]byte("sk-" + hex.EncodeToString(sum[:16]))))
				}
				opts.Redact = s.ScrubJSON
			}
			l, err := Open(opts)
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = l.Close() }()
			params := []byte(`{"sandbox":"web-1","namespace":"team-a","argv":["python3","-c","print(1)"],"env":["TOKEN=abc"],"timeout":30}`)
			labels := map[string]string{"team": "a", "project": "billing"}
			c0 := cpuTime()
			defer func() { b.ReportMetric(float64(cpuTime()-c0)/float64(b.N), "cpu-ns/op") }()
			for b.Loop() {
				r := &Record{Kind: KindCall, Namespace: "team-a", Sandbox: "web-1", Labels: labels, KeyID: "0123456789abcdef",
					RequestID: "9f8e7d6c5b4a3210", Call: &Call{Method: "sandbox.exec", Params: Params(params), Outcome: "ok", DurationMs: 12.5}}
				if err := l.Append(r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
