// Package agentbin finds the two helper binaries the native backend runs:
// warren-agent, PID 1 of every sandbox, and warren-spawner, the host-side
// process that starts the agents. Each comes from an explicit path, its
// environment variable, the copy embedded in a release build of warren
// (build tag embedagent), or the file next to the warren binary.
package agentbin

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
)

// Find returns the agent's path: explicit (a flag) wins, then $WARREN_AGENT,
// then the embedded copy (extracted once under cacheDir, named by its hash),
// then warren-agent beside the running executable.
func Find(explicit, cacheDir string) (string, error) {
	return find("warren-agent", "WARREN_AGENT", explicit, embeddedAgent, cacheDir)
}

// FindSpawner returns the spawner's path, looked for as Find looks for the
// agent ($WARREN_SPAWNER, then embedded, then beside warren).
func FindSpawner(explicit, cacheDir string) (string, error) {
	return find("warren-spawner", "WARREN_SPAWNER", explicit, embeddedSpawner, cacheDir)
}

func find(name, env, explicit string, embedded []byte, cacheDir string) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	if p := os.Getenv(env); p != "" {
		return p, nil
	}
	if len(embedded) > 0 {
		return extract(name, embedded, cacheDir)
	}
	exe, err := os.Executable()
	if err == nil {
		p := filepath.Join(filepath.Dir(exe), name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found: build with `make build` (which embeds it), put it next to warren, or set %s", name, env)
}

func extract(name string, embedded []byte, cacheDir string) (string, error) {
	sum := sha256.Sum256(embedded)
	p := filepath.Join(cacheDir, name+"-"+hex.EncodeToString(sum[:8]))
	if b, err := os.ReadFile(p); err == nil && sha256.Sum256(b) == sum { //nolint:gosec // p is cacheDir joined with a name made from the embedded binary's hash
		return p, nil
	}
	if err := os.MkdirAll(cacheDir, 0o711); err != nil { //nolint:gosec // 0711 like the data dir it sits in: it holds only binaries shipped inside warren itself, and listing stays refused
		return "", err
	}
	tmp, err := os.CreateTemp(cacheDir, "."+name+"-")
	if err != nil {
		return "", err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(embedded); err != nil {
		_ = tmp.Close()
		return "", err
	}
	if err := tmp.Chmod(0o755); err != nil {
		_ = tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return "", fmt.Errorf("install embedded %s: %w", name, err)
	}
	return p, nil
}
