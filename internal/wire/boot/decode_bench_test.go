package boot

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// envDecode makes this test binary, started by BenchmarkFirstConfigDecode,
// decode one config and print how long that took; envDecodeFile names the
// config. The child makes no JSON of its own first, which would build the
// caches whose cost is measured.
const (
	envDecode     = "WARREN_TEST_DECODE_INTO"
	envDecodeFile = "WARREN_TEST_DECODE_FILE"
)

// TestDecodeHelper is the child side of BenchmarkFirstConfigDecode; it does
// nothing in a normal run.
func TestDecodeHelper(t *testing.T) {
	into := os.Getenv(envDecode)
	if into == "" {
		return
	}
	data, err := os.ReadFile(os.Getenv(envDecodeFile))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	switch into {
	case "binary":
		_, err = decodeConfig(data)
	case "json":
		// What the agent decoded before the binary form.
		var c Config
		err = json.Unmarshal(data, &c)
	}
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("decode_ns %d\n", time.Since(t0).Nanoseconds())
}

// BenchmarkFirstConfigDecode measures what every fresh agent pays to
// decode its config: the first decode in a new process, in the binary form
// the host sends and, for comparison, as JSON (encoding/json's first decode
// of a type builds its caches). Each iteration starts this test binary once
// per form; the metrics are the medians.
func BenchmarkFirstConfigDecode(b *testing.B) {
	cfg := realConfig(b)
	js, err := json.Marshal(cfg)
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	binFile, jsonFile := filepath.Join(dir, "config.bin"), filepath.Join(dir, "config.json")
	if err := os.WriteFile(binFile, encodeConfig(cfg), 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(jsonFile, js, 0o600); err != nil {
		b.Fatal(err)
	}
	var binNs, jsonNs []float64
	for b.Loop() {
		binNs = append(binNs, decodeOnce(b, binFile, "binary"))
		jsonNs = append(jsonNs, decodeOnce(b, jsonFile, "json"))
	}
	med := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	b.ReportMetric(med(binNs)/1e6, "binary-ms")
	b.ReportMetric(med(jsonNs)/1e6, "json-ms")
}

func decodeOnce(b *testing.B, file, into string) float64 {
	cmd := exec.Command(os.Args[0], "-test.run=^TestDecodeHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), envDecode+"="+into, envDecodeFile+"="+file)
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("decode helper: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "decode_ns "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatalf("decode helper printed no time:\n%s", out)
	return 0
}
