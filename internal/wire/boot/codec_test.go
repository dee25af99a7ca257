package boot

import (
	"bytes"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/warren-sandbox/warren/internal/oci"
)

// realConfig is a config as the native backend builds it.
func realConfig(t testing.TB) *Config {
	t.Helper()
	sp, err := oci.Build(oci.Params{
		RootPath: "/var/lib/warren/sandboxes/x/rootfs", Hostname: "sandbox", Env: oci.DefaultEnv, Cwd: "/",
		ImageMounts: []specs.Mount{{Destination: "/usr", Type: "bind", Source: "/usr", Options: []string{"rbind", "ro"}}},
		Volumes:     []specs.Mount{{Destination: "/data", Type: "bind", Source: "/srv", Options: []string{"bind", "ro"}}},
		UserNS:      &oci.IDMap{Host: 1 << 20, Size: 65536},
		MemoryBytes: 512 << 20, CPUs: 1, PidsMax: 1024,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &Config{Spec: SpecFrom(sp), SeccompFilter: bytes.Repeat([]byte{6, 0, 0, 0, 0, 0, 0xff, 0x7f}, 190),
		Rootfs: Rootfs{Lower: []string{"/var/lib/warren/images/host/etc", "/"}, Upper: "/u", Work: "/w", UserXattr: true},
		Python: "/usr/bin/python3", Node: "/usr/bin/node", User: "1000:1000", Lifeline: true}
}

// TestCodecRoundTrip: a real config, and configs with every field of every
// type in them filled at random, come back equal. A field added to Config,
// Spec or the OCI types they use without a place in the encoding makes
// this fail.
func TestCodecRoundTrip(t *testing.T) {
	check := func(name string, c *Config) {
		t.Helper()
		got, err := decodeConfig(encodeConfig(c))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(got, c) {
			t.Fatalf("%s: round trip changed the config:\n got %#v\nwant %#v", name, got, c)
		}
	}
	check("real", realConfig(t))
	check("empty", &Config{})
	check("empty spec", &Config{Spec: &Spec{}})
	rng := rand.New(rand.NewPCG(7, 11))
	for i := 0; i < 300; i++ {
		var c Config
		fill(rng, reflect.ValueOf(&c).Elem(), 0)
		check("random", &c)
	}
}

// fill sets v to random contents: strings with any bytes, integers up to
// their type's maximum, pointers and slices nil or not (a slice never
// empty but not nil: both encode alike). Fields the config does not carry
// (json:"-") stay zero.
func fill(rng *rand.Rand, v reflect.Value, depth int) {
	switch v.Kind() {
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).Tag.Get("json") == "-" {
				continue
			}
			fill(rng, v.Field(i), depth+1)
		}
	case reflect.Pointer:
		if rng.IntN(4) > 0 || depth == 0 {
			v.Set(reflect.New(v.Type().Elem()))
			fill(rng, v.Elem(), depth+1)
		}
	case reflect.Slice:
		if n := rng.IntN(4); n > 0 {
			v.Set(reflect.MakeSlice(v.Type(), n, n))
			for i := 0; i < n; i++ {
				fill(rng, v.Index(i), depth+1)
			}
		}
	case reflect.String:
		b := make([]byte, rng.IntN(20))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		v.SetString(string(b))
	case reflect.Bool:
		v.SetBool(rng.IntN(2) == 1)
	case reflect.Uint8:
		v.SetUint(uint64(byte(rng.Uint32())))
	case reflect.Uint32:
		v.SetUint(uint64([]uint32{0, 1, math.MaxUint32, rng.Uint32()}[rng.IntN(4)]))
	case reflect.Uint64:
		v.SetUint([]uint64{0, 1, math.MaxUint64, rng.Uint64()}[rng.IntN(4)])
	default:
		panic("fill: no rule for " + v.Type().String())
	}
}

func TestDecodeConfigRejects(t *testing.T) {
	valid := encodeConfig(realConfig(t))
	for n := 0; n < len(valid); n++ {
		if _, err := decodeConfig(valid[:n]); err == nil {
			t.Fatalf("a config cut to %d of %d bytes decoded", n, len(valid))
		}
	}
	bad := map[string][]byte{
		"JSON":          []byte(`{"spec":null}`),
		"other version": append([]byte("WCF2"), valid[4:]...),
		"trailing byte": append(bytes.Clone(valid), 0),
		// Spec present, then a length of 2^62 for... the root's presence
		// is a bool: 0xff is not one.
		"bad bool": append(bytes.Clone(configMagic), 1, 0xff),
		// Spec present, no root, a hostname of 2^56 bytes.
		"huge length": append(bytes.Clone(configMagic), 1, 0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01),
		"overlong integer": append(bytes.Clone(configMagic), 1, 0,
			0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01),
	}
	for name, b := range bad {
		if _, err := decodeConfig(b); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	// An id mapping beyond 32 bits.
	c := &Config{Spec: &Spec{Mounts: []specs.Mount{{UIDMappings: []specs.LinuxIDMapping{{Size: 1}}}}}}
	b := encodeConfig(c)
	i := bytes.LastIndex(b, []byte{0, 0, 1}) // the mapping: 0, 0, 1
	wide := append(append(bytes.Clone(b[:i+2]), 0x80, 0x80, 0x80, 0x80, 0x10), b[i+3:]...)
	if _, err := decodeConfig(wide); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("a 2^32 id mapping size: %v", err)
	}
}

// FuzzDecodeConfig: any input decodes or fails cleanly (no panic, no huge
// allocation), and what decodes encodes to something that decodes equal.
func FuzzDecodeConfig(f *testing.F) {
	f.Add(encodeConfig(realConfig(f)))
	f.Add(encodeConfig(&Config{}))
	f.Add(encodeConfig(&Config{Spec: &Spec{}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeConfig(b)
		if err != nil {
			return
		}
		again, err := decodeConfig(encodeConfig(c))
		if err != nil {
			t.Fatalf("re-encoded config does not decode: %v", err)
		}
		if !reflect.DeepEqual(again, c) {
			t.Fatalf("re-encoded config decodes differently")
		}
	})
}
