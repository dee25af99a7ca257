package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestNoAgentCode: the host binary links none of the agent's code (package
// guest and below: its setup, server, REPL engines and file API). What the
// two share is in internal/wire: the protocol and, for the agent's start,
// internal/wire/boot. The mirror of warren-agent's TestSmallDependencies.
//
// Both builds are checked: the development one and the release one with the
// agent embedded (build tag embedagent), whose embedded files may not have
// been built yet (-e: the missing files are not what is checked here).
func TestNoAgentCode(t *testing.T) {
	const (
		module = "github.com/warren-sandbox/warren"
		agent  = module + "/internal/guest"
	)
	for _, tags := range []string{"", "embedagent"} {
		out, err := exec.Command("go", "list", "-e", "-tags", tags, "-deps", ".").CombinedOutput()
		if err != nil {
			t.Fatalf("go list -tags %q: %v\n%s", tags, err, out)
		}
		deps := strings.Fields(string(out))
		// The list must be the binary's: one that lost its backend
		// would pass vacuously.
		if !slices.Contains(deps, module+"/internal/backend/native") {
			t.Fatalf("tags %q: the deps of warren lack the native backend:\n%s", tags, out)
		}
		for _, d := range deps {
			if d == agent || strings.HasPrefix(d, agent+"/") {
				t.Errorf("tags %q: warren links the agent's %s; share types through internal/wire", tags, d)
			}
		}
	}
}

// TestNoKubernetesLibraries: node mode talks to the API server through
// internal/kube's small client. client-go (or anything of k8s.io) would run
// its scheme registrations at every warren command's start and add tens of
// megabytes (docs/kubernetes.md).
func TestNoKubernetesLibraries(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/warren-sandbox/warren/internal/kube") {
		t.Fatal("warren does not link internal/kube: the test would pass vacuously")
	}
	for _, d := range deps {
		if strings.HasPrefix(d, "k8s.io/") || strings.HasPrefix(d, "sigs.k8s.io/") {
			t.Errorf("warren links %s", d)
		}
	}
}
