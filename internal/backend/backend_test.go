package backend

import (
	"math"
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/image"
)

// TestConfigValidate: limits the kernel would refuse, or that leave the
// agent no room, are refused up front with the allowed range, never passed
// on to fail later as a raw kernel or cgroup error.
func TestConfigValidate(t *testing.T) {
	img := &image.Image{Layers: []string{"/nonexistent"}}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "" = valid
	}{
		{"defaults", Config{}, ""},
		{"cpus minimum", Config{CPUs: 0.01}, ""},
		{"cpus fraction", Config{CPUs: 0.5}, ""},
		{"cpus maximum", Config{CPUs: 1024}, ""},
		{"cpus below the 1 ms quota", Config{CPUs: 0.001}, "want 0 (unlimited) or 0.01 (a 1 ms quota per 100 ms period)"},
		{"cpus just below", Config{CPUs: 0.0099}, "0.01"},
		{"cpus NaN", Config{CPUs: math.NaN()}, "cpus: NaN out of range"},
		{"cpus +Inf", Config{CPUs: math.Inf(1)}, "cpus: +Inf out of range"},
		{"cpus negative", Config{CPUs: -1}, "cpus: -1 out of range"},
		{"cpus above maximum", Config{CPUs: 1025}, "up to 1024"},
		{"pids minimum", Config{PidsMax: MinPids}, ""},
		{"pids 1", Config{PidsMax: 1}, "pids: 1 is below the minimum of 16"},
		{"pids 15", Config{PidsMax: 15}, "below the minimum of 16"},
		{"pids negative", Config{PidsMax: -1}, "pids: negative"},
		{"memory below minimum", Config{MemoryBytes: 1 << 20}, "below the 16 MiB minimum"},
		{"workdir absolute", Config{Workdir: "/tmp"}, ""},
		{"workdir relative", Config{Workdir: "relative"}, `workdir "relative": want an absolute path`},
		{"workdir dot", Config{Workdir: "./x"}, "want an absolute path"},
		{"network", Config{Network: "--"}, `network "--"`},
		{"disk", Config{DiskBytes: 1 << 30}, ""},
		{"disk minimum", Config{DiskBytes: MinDiskBytes}, ""},
		{"disk below minimum", Config{DiskBytes: 1 << 20}, "disk: 1048576 bytes out of range: want 0 (unlimited) or 16 MiB"},
		{"disk negative", Config{DiskBytes: -1}, "disk: -1 bytes out of range"},
		{"disk above maximum", Config{DiskBytes: MaxDiskBytes + 1}, "up to 1024 TiB"},
		{"read-only root", Config{ReadOnlyRoot: true, WritablePaths: []string{"/home/user", "/var/cache"}}, ""},
		{"write path relative", Config{ReadOnlyRoot: true, WritablePaths: []string{"home"}}, `write path "home": want an absolute, clean path`},
		{"write path unclean", Config{ReadOnlyRoot: true, WritablePaths: []string{"/a/../etc"}}, "want an absolute, clean path"},
		{"write path trailing slash", Config{ReadOnlyRoot: true, WritablePaths: []string{"/a/"}}, "want an absolute, clean path"},
		{"write path root", Config{ReadOnlyRoot: true, WritablePaths: []string{"/"}}, `write path "/": that is the whole root`},
		{"write path proc", Config{ReadOnlyRoot: true, WritablePaths: []string{"/proc/sys"}}, "not in /proc, /sys or /dev"},
		{"write path sys", Config{ReadOnlyRoot: true, WritablePaths: []string{"/sys"}}, "not in /proc, /sys or /dev"},
		{"write path dev", Config{ReadOnlyRoot: true, WritablePaths: []string{"/dev/shm"}}, "not in /proc, /sys or /dev"},
		{"write path devices", Config{ReadOnlyRoot: true, WritablePaths: []string{"/devices"}}, ""},
		{"write path NUL", Config{ReadOnlyRoot: true, WritablePaths: []string{"/a\x00b"}}, "want an absolute, clean path"},
		{"write path long", Config{ReadOnlyRoot: true, WritablePaths: []string{"/" + strings.Repeat("a", MaxWritablePathLen)}}, "longer than 1024 bytes"},
		{"write paths many", Config{ReadOnlyRoot: true, WritablePaths: make([]string, MaxWritablePaths+1)}, "33 given, at most 32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.ID, cfg.Image = "ok", img
			err := cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && err == nil:
				t.Errorf("accepted %+v", tc.cfg)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Errorf("error %q lacks %q", err, tc.want)
			}
			// CheckSettings says the same without an id or image.
			if err2 := tc.cfg.CheckSettings(); (err2 == nil) != (tc.want == "") {
				t.Errorf("CheckSettings: %v, Validate: %v", err2, err)
			}
		})
	}
	// Every problem at once.
	err := (&Config{CPUs: math.NaN(), PidsMax: 2, Workdir: "w"}).Validate()
	for _, want := range []string{"id", "image", "cpus", "pids", "workdir"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
}

// TestValidID: a sandbox id is 1-63 of [a-z0-9_-], starting with a letter
// or digit; anything else is refused, naming the rule.
func TestValidID(t *testing.T) {
	img := &image.Image{Layers: []string{"/"}}
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"a", true}, {"0", true}, {"run-0a6bec55e83e", true}, {"a_b-c", true}, {strings.Repeat("a", 63), true},
		{"", false}, {strings.Repeat("a", 64), false}, {"-a", false}, {"_a", false}, {"A", false}, {"a.b", false},
		{"a/b", false}, {"a b", false}, {"é", false}, {"a\x00", false}, {"a\n", false},
	} {
		err := (&Config{ID: tc.id, Image: img}).Validate()
		if tc.ok != (err == nil) {
			t.Errorf("id %q: %v, want ok=%v", tc.id, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "want 1-63 of [a-z0-9_-]") {
			t.Errorf("id %q: %v does not say the rule", tc.id, err)
		}
	}
}
