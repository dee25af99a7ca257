package main

import (
	"bytes"
	"encoding/json"
	"sort"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/warren-sandbox/warren/internal/guest"
	"github.com/warren-sandbox/warren/internal/oci"
)

// TestWarmConfigShape keeps warmConfig shaped like what the host sends:
// it decodes strictly, and every JSON object the host's config has (each
// is a Go type whose decoder encoding/json builds on first use) is in it.
func TestWarmConfigShape(t *testing.T) {
	d := json.NewDecoder(bytes.NewReader([]byte(warmConfig)))
	d.DisallowUnknownFields()
	var cfg guest.Config
	if err := d.Decode(&cfg); err != nil {
		t.Fatalf("warmConfig does not decode as guest.Config: %v", err)
	}
	// A config as the native backend builds it: the OCI spec without its
	// seccomp section (sent compiled), with mounts, volumes and limits.
	sp, err := oci.Build(oci.Params{
		RootPath: "/r", Hostname: "h", Env: []string{"A=b"}, Cwd: "/", UserNS: &oci.IDMap{Host: 1, Size: 1},
		MemoryBytes: 1 << 30, CPUs: 1, PidsMax: 1,
		ImageMounts: []specs.Mount{{Destination: "/usr", Type: "bind", Source: "/usr", Options: []string{"rbind", "ro"}}},
		Volumes:     []specs.Mount{{Destination: "/data", Type: "bind", Source: "/srv", Options: []string{"bind"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	real, err := json.Marshal(guest.Config{Spec: guest.SpecFrom(sp), SeccompFilter: []byte{1}, Rootfs: guest.Rootfs{Lower: []string{"/"}, Upper: "/u", Work: "/w"}, Python: "p", User: "u", Lifeline: true})
	if err != nil {
		t.Fatal(err)
	}
	have := objectPaths(t, []byte(warmConfig))
	var missing []string
	for p := range objectPaths(t, real) {
		if !have[p] {
			missing = append(missing, p)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("warmConfig lacks objects the host sends: %v", missing)
	}
}

// objectPaths lists the paths of every JSON object in doc ("" is the top,
// arrays add "[]").
func objectPaths(t *testing.T, doc []byte) map[string]bool {
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	var walk func(string, any)
	walk = func(p string, v any) {
		switch x := v.(type) {
		case map[string]any:
			out[p] = true
			for k, e := range x {
				walk(p+"."+k, e)
			}
		case []any:
			for _, e := range x {
				walk(p+"[]", e)
			}
		}
	}
	walk("", v)
	return out
}
