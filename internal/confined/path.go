package confined

import (
	"strings"

	"github.com/warren-sandbox/warren/internal/wire"
)

// Path length limits (Linux PATH_MAX and NAME_MAX).
const (
	MaxPathLen = 4096
	MaxNameLen = 255
)

// cleanPath applies the package's path rules to a client-supplied name and
// returns it relative to the root: "." for the root itself, otherwise
// non-empty components joined by "/", none of them "." or "..".
func cleanPath(name string) (string, error) {
	if len(name) > MaxPathLen {
		return "", invalidPath(name, "longer than 4096 bytes")
	}
	if strings.IndexByte(name, 0) >= 0 {
		return "", invalidPath(name, "contains a NUL byte")
	}
	comps := make([]string, 0, 8)
	for c := range strings.SplitSeq(name, "/") {
		switch c {
		case "", ".":
			continue
		case "..":
			return "", invalidPath(name, `contains a ".." component`)
		}
		if len(c) > MaxNameLen {
			return "", invalidPath(name, "has a component longer than 255 bytes")
		}
		comps = append(comps, c)
	}
	if len(comps) == 0 {
		return ".", nil
	}
	return strings.Join(comps, "/"), nil
}

// splitPath splits a cleaned relative path into its parent directory ("."
// for top-level names) and final component. rel must not be ".".
func splitPath(rel string) (dir, base string) {
	i := strings.LastIndexByte(rel, '/')
	if i < 0 {
		return ".", rel
	}
	return rel[:i], rel[i+1:]
}

// joinPath joins a cleaned relative directory and a component or cleaned
// relative path.
func joinPath(dir, name string) string {
	switch {
	case dir == ".":
		return name
	case name == ".":
		return dir
	}
	return dir + "/" + name
}

// display renders a cleaned relative path as the absolute path clients see.
func display(rel string) string {
	if rel == "." {
		return "/"
	}
	return "/" + rel
}

func invalidPath(name, why string) error {
	if len(name) > 120 {
		name = name[:120] + "..."
	}
	return &Error{Op: "path", Path: name, Kind: wire.ErrInvalid, Err: errorString("path " + why)}
}
