package setup

import (
	"strings"
	"testing"

	"github.com/warren-sandbox/warren/internal/oci"
	"github.com/warren-sandbox/warren/internal/wire/boot"
)

// TestApplyRefusesUnfilteredConfig: a config without a seccomp filter or
// without no_new_privs is refused before anything is mounted, never run
// unfiltered.
func TestApplyRefusesUnfilteredConfig(t *testing.T) {
	sp, err := oci.Build(oci.Params{RootPath: "/nonexistent"})
	if err != nil {
		t.Fatal(err)
	}
	noNNP := boot.SpecFrom(sp)
	noNNP.Process.NoNewPrivileges = false
	for name, cfg := range map[string]*boot.Config{
		"no filter":       {Spec: boot.SpecFrom(sp)},
		"no no_new_privs": {Spec: noNNP, SeccompFilter: []byte{1}},
	} {
		if _, err := Apply(cfg, nil, nil); err == nil || !strings.Contains(err.Error(), "no seccomp filter or no_new_privs") {
			t.Errorf("%s: Apply = %v, want the refusal", name, err)
		}
	}
}
