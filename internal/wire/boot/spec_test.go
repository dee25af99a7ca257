package boot

import (
	"encoding/json"
	"reflect"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/warren-sandbox/warren/internal/oci"
)

// hostApplied are the parts of the OCI spec the host applies itself (or
// sends another way), so SpecFrom leaves them out: the id maps and
// namespaces' creation (the spawner), cgroup limits, the seccomp profile
// (Config.SeccompFilter), the version, and the process user (the agent
// runs as the namespace's root and takes the default user from
// Config.User).
var hostApplied = map[string][]string{
	"":        {"ociVersion"},
	"process": {"user"},
	"linux":   {"uidMappings", "gidMappings", "resources", "seccomp"},
}

// TestSpecFromKeepsWhatTheAgentApplies: the agent's Spec carries every
// field of the spec the host builds except those the host applies, with
// the same values under the same JSON names. A field the OCI spec gains
// fails this until it is projected or listed in hostApplied.
func TestSpecFromKeepsWhatTheAgentApplies(t *testing.T) {
	sp, err := oci.Build(oci.Params{
		RootPath: "/r", Hostname: "h", Env: []string{"A=b"}, Cwd: "/w",
		ImageMounts: []specs.Mount{{Destination: "/usr", Type: "bind", Source: "/usr", Options: []string{"rbind", "ro"}}},
		Volumes:     []specs.Mount{{Destination: "/data", Type: "bind", Source: "/srv", Options: []string{"bind"}}},
		UserNS:      &oci.IDMap{Host: 1 << 20, Size: 65536},
		MemoryBytes: 1 << 30, CPUs: 1.5, PidsMax: 100, NoFile: 1024,
	})
	if err != nil {
		t.Fatal(err)
	}
	sp.Root.Readonly = true
	want := asMap(t, sp)
	for section, keys := range hostApplied {
		m := want
		if section != "" {
			m = want[section].(map[string]any)
		}
		for _, k := range keys {
			if _, ok := m[k]; !ok {
				t.Errorf("the host's spec has no %s.%s: hostApplied is stale", section, k)
			}
			delete(m, k)
		}
	}
	if got := asMap(t, SpecFrom(sp)); !reflect.DeepEqual(got, want) {
		g, _ := json.MarshalIndent(got, "", " ")
		w, _ := json.MarshalIndent(want, "", " ")
		t.Errorf("SpecFrom drops or changes fields the agent applies:\ngot  %s\nwant %s", g, w)
	}
}

func asMap(t *testing.T, v any) map[string]any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}
