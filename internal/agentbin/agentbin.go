// Package agentbin finds the warren-agent binary the native backend runs in
// every sandbox: an explicit path, the copy embedded in a release build of
// warren (build tag embedagent), or the file next to the warren binary.
package agentbin

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Find returns the agent's path. explicit (a flag) wins, then $WARREN_AGENT,
// then the embedded copy (extracted once under cacheDir, named by its hash),
// then warren-agent beside the running executable.
func Find(explicit, cacheDir string) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	if p := os.Getenv("WARREN_AGENT"); p != "" {
		return p, nil
	}
	if len(embedded) > 0 {
		return extract(cacheDir)
	}
	exe, err := os.Executable()
	if err == nil {
		p := filepath.Join(filepath.Dir(exe), "warren-agent")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("warren-agent not found: build with `make build` (which embeds it), put it next to warren, or set WARREN_AGENT")
}

func extract(cacheDir string) (string, error) {
	sum := sha256.Sum256(embedded)
	p := filepath.Join(cacheDir, "warren-agent-"+hex.EncodeToString(sum[:8]))
	if b, err := os.ReadFile(p); err == nil && sha256.Sum256(b) == sum {
		return p, nil
	}
	if err := os.MkdirAll(cacheDir, 0o711); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(cacheDir, ".agent-")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(embedded); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return "", fmt.Errorf("install embedded agent: %w", err)
	}
	return p, nil
}
