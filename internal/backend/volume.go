package backend

import (
	"errors"
	"fmt"
	"path"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Volume is a host directory or file bind-mounted into a sandbox.
type Volume struct {
	// Source is the absolute host path. The backend resolves it without
	// following symlinks, so what was checked is what gets mounted.
	Source string `json:"source"`
	// Target is the absolute path inside the sandbox.
	Target   string `json:"target"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// MaxVolumes bounds a sandbox's volumes.
const MaxVolumes = 16

// maxPath bounds a volume's paths (PATH_MAX).
const maxPath = 4096

// ParseVolume reads "HOST:GUEST" or "HOST:GUEST:ro|rw", the form of
// microsandbox's and Docker's volumes.
func ParseVolume(s string) (Volume, error) {
	parts := strings.Split(s, ":")
	var v Volume
	switch len(parts) {
	case 3:
		switch parts[2] {
		case "ro":
			v.ReadOnly = true
		case "rw":
		default:
			return Volume{}, fmt.Errorf("volume %.80q: mode %q: want ro or rw", s, parts[2])
		}
	case 2:
	default:
		return Volume{}, fmt.Errorf("volume %.80q: want HOST:GUEST or HOST:GUEST:ro", s)
	}
	v.Source, v.Target = parts[0], parts[1]
	return v, v.Validate()
}

// String is the HOST:GUEST[:ro] form.
func (v Volume) String() string {
	if v.ReadOnly {
		return v.Source + ":" + v.Target + ":ro"
	}
	return v.Source + ":" + v.Target
}

// Validate checks the paths' form (not what is on the host): both absolute
// and clean, and a target that does not replace the root or hide /proc,
// /sys or /dev, which the sandbox's own isolation depends on.
func (v Volume) Validate() error {
	for _, p := range []struct{ what, p string }{{"host path", v.Source}, {"sandbox path", v.Target}} {
		switch {
		case p.p == "" || p.p[0] != '/':
			return fmt.Errorf("volume %s %.80q: want an absolute path", p.what, p.p)
		case len(p.p) > maxPath || strings.ContainsRune(p.p, 0):
			return fmt.Errorf("volume %s %.80q: too long or contains NUL", p.what, p.p)
		case path.Clean(p.p) != p.p:
			return fmt.Errorf("volume %s %.80q: want a clean path (no .., //, . or trailing /)", p.what, p.p)
		}
	}
	if v.Target == "/" {
		return errors.New("volume sandbox path /: a volume cannot replace the root")
	}
	for _, reserved := range []string{"/proc", "/sys", "/dev"} {
		if v.Target == reserved || strings.HasPrefix(v.Target, reserved+"/") {
			return fmt.Errorf("volume sandbox path %.80q: %s is the sandbox's own", v.Target, reserved)
		}
	}
	return nil
}

// ValidateVolumes checks a sandbox's volumes together.
func ValidateVolumes(vs []Volume) error {
	if len(vs) > MaxVolumes {
		return fmt.Errorf("volumes: %d, at most %d", len(vs), MaxVolumes)
	}
	seen := map[string]bool{}
	for _, v := range vs {
		if err := v.Validate(); err != nil {
			return err
		}
		if seen[v.Target] {
			return fmt.Errorf("volume sandbox path %.80q: given twice", v.Target)
		}
		seen[v.Target] = true
	}
	return nil
}

// VolumeMounts are the OCI binds of vs. Not recursive: what is mounted
// below a volume's source on the host stays out of the sandbox, and
// read-only applies to all that is visible.
func VolumeMounts(vs []Volume) []specs.Mount {
	var ms []specs.Mount
	for _, v := range vs {
		opts := []string{"bind", "nosuid", "nodev"}
		if v.ReadOnly {
			opts = append(opts, "ro")
		}
		ms = append(ms, specs.Mount{Destination: v.Target, Type: "bind", Source: v.Source, Options: opts})
	}
	return ms
}
