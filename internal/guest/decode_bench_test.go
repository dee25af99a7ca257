package guest

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

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/warren-sandbox/warren/internal/oci"
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
	case "guest":
		var c Config
		err = json.Unmarshal(data, &c)
	case "oci":
		// What the agent decoded before guest.Spec: the whole OCI spec.
		var c struct {
			Spec *specs.Spec `json:"spec"`
		}
		err = json.Unmarshal(data, &c)
	}
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("decode_ns %d\n", time.Since(t0).Nanoseconds())
}

// benchConfig is a config as the native backend sends it.
func benchConfig(t testing.TB) []byte {
	sp, err := oci.Build(oci.Params{
		RootPath: "/var/lib/warren/sandboxes/x/rootfs", Hostname: "sandbox", Env: oci.DefaultEnv, Cwd: "/",
		ImageMounts: []specs.Mount{{Destination: "/usr", Type: "bind", Source: "/usr", Options: []string{"rbind", "ro"}}},
		UserNS:      &oci.IDMap{Host: 1 << 20, Size: 65536},
		MemoryBytes: 512 << 20, CPUs: 1, PidsMax: 1024,
	})
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(Config{Spec: SpecFrom(sp), SeccompFilter: make([]byte, 1500),
		Rootfs: Rootfs{Lower: []string{"/"}, Upper: "/u", Work: "/w"}})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// BenchmarkFirstConfigDecode measures what every fresh agent pays to
// decode its config: the first decode in a new process, which builds
// encoding/json's caches for the target type. Each iteration starts this
// test binary once per target; the metrics are the medians.
func BenchmarkFirstConfigDecode(b *testing.B) {
	file := filepath.Join(b.TempDir(), "config.json")
	if err := os.WriteFile(file, benchConfig(b), 0o600); err != nil {
		b.Fatal(err)
	}
	var guestNs, ociNs []float64
	for b.Loop() {
		guestNs = append(guestNs, decodeOnce(b, file, "guest"))
		ociNs = append(ociNs, decodeOnce(b, file, "oci"))
	}
	med := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	b.ReportMetric(med(guestNs)/1e6, "guest-ms")
	b.ReportMetric(med(ociNs)/1e6, "oci-spec-ms")
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
