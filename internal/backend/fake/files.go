package fake

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/warren-sandbox/warren/internal/wire"
)

// fsys is a sandbox's file tree in memory: regular files and directories
// only (no symlinks, no owners), keyed by cleaned absolute path. It plays
// the writable layer: kept across stops, dropped by Remove.
//
// Its rules are the real agent's (internal/confined): a leading "/"
// is optional, empty and "." components are dropped, and a name with a
// ".." component, a NUL byte, more than 4096 bytes or a component of more
// than 255 is refused with kind invalid; the error kinds of each operation
// are those the real file API gives for the same case.
type fsys struct {
	mu    sync.Mutex
	nodes map[string]*node // "/" is always there
}

type node struct {
	dir   bool
	data  []byte
	mode  uint32 // permission bits
	mtime time.Time
}

// Limits of the file tree (the real ones: PATH_MAX, NAME_MAX and the
// agent's list limit).
const (
	maxPathLen = 4096
	maxNameLen = 255
	listLimit  = 10000
)

// newFS returns a tree with the directories every image has.
func newFS() *fsys {
	fs := &fsys{nodes: map[string]*node{}}
	for _, d := range []string{"/", "/etc", "/root", "/tmp"} {
		fs.nodes[d] = &node{dir: true, mode: 0o755, mtime: time.Now()}
	}
	fs.nodes["/tmp"].mode = 0o1777
	return fs
}

// fsError is an error with a wire kind, answered as the agent would.
type fsError struct {
	kind, msg string
	cause     string // wire.Cause* of a program not started
}

func (e *fsError) Error() string { return e.msg }

func errorf(kind, format string, args ...any) error {
	return &fsError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// kindOf is err's wire kind (internal for an error without one).
func kindOf(err error) string {
	var fe *fsError
	if errors.As(err, &fe) {
		return fe.kind
	}
	return wire.ErrInternal
}

// clean applies the path rules: the cleaned absolute path, "/" for the root.
func clean(name string) (string, error) {
	quoted := name
	if len(quoted) > 120 {
		quoted = quoted[:120] + "..."
	}
	switch {
	case len(name) > maxPathLen:
		return "", errorf(wire.ErrInvalid, "path %q: longer than 4096 bytes", quoted)
	case strings.IndexByte(name, 0) >= 0:
		return "", errorf(wire.ErrInvalid, "path %q: contains a NUL byte", quoted)
	}
	var comps []string
	for c := range strings.SplitSeq(name, "/") {
		switch {
		case c == "" || c == ".":
			continue
		case c == "..":
			return "", errorf(wire.ErrInvalid, `path %q: contains a ".." component`, quoted)
		case len(c) > maxNameLen:
			return "", errorf(wire.ErrInvalid, "path %q: has a component longer than 255 bytes", quoted)
		}
		comps = append(comps, c)
	}
	return "/" + strings.Join(comps, "/"), nil
}

// parent returns p's parent directory node; p is cleaned and not "/".
func (fs *fsys) parent(op, p string) (*node, error) {
	d := fs.nodes[path.Dir(p)]
	switch {
	case d == nil:
		return nil, errorf(wire.ErrNotFound, "%s %q: no such file or directory", op, p)
	case !d.dir:
		return nil, errorf(wire.ErrInvalid, "%s %q: not a directory", op, p)
	}
	return d, nil
}

func (fs *fsys) info(p string, n *node) wire.FileInfo {
	fi := wire.FileInfo{Name: path.Base(p), Path: p, Size: int64(len(n.data)), Mode: n.mode, Type: "file", ModTime: n.mtime}
	if n.dir {
		fi.Type, fi.Size = "dir", 4096
		fi.Mode |= 1 << 31 // os.ModeDir
	}
	return fi
}

func (fs *fsys) stat(name string) (wire.FileInfo, error) {
	p, err := clean(name)
	if err != nil {
		return wire.FileInfo{}, err
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n := fs.nodes[p]
	if n == nil {
		return wire.FileInfo{}, errorf(wire.ErrNotFound, "stat %q: no such file or directory", p)
	}
	return fs.info(p, n), nil
}

// children lists the names directly below directory p, sorted.
func (fs *fsys) children(p string) []string {
	prefix := strings.TrimSuffix(p, "/") + "/"
	var out []string
	for q := range fs.nodes {
		if q != "/" && strings.HasPrefix(q, prefix) && !strings.Contains(q[len(prefix):], "/") {
			out = append(out, q)
		}
	}
	slices.Sort(out)
	return out
}

func (fs *fsys) list(name string) ([]wire.FileInfo, error) {
	p, err := clean(name)
	if err != nil {
		return nil, err
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n := fs.nodes[p]
	switch {
	case n == nil:
		return nil, errorf(wire.ErrNotFound, "list %q: no such file or directory", p)
	case !n.dir:
		return nil, errorf(wire.ErrInvalid, "list %q: not a directory", p)
	}
	kids := fs.children(p)
	if len(kids) > listLimit {
		return nil, errorf(wire.ErrTooLarge, "list %q: directory has more than %d entries", p, listLimit)
	}
	out := make([]wire.FileInfo, 0, len(kids))
	for _, q := range kids {
		out = append(out, fs.info(q, fs.nodes[q]))
	}
	return out, nil
}

func (fs *fsys) read(name string) ([]byte, error) {
	p, err := clean(name)
	if err != nil {
		return nil, err
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n := fs.nodes[p]
	switch {
	case n == nil:
		return nil, errorf(wire.ErrNotFound, "open %q: no such file or directory", p)
	case n.dir:
		return nil, errorf(wire.ErrInvalid, "open %q: is a directory", p)
	case len(n.data) > wire.MaxFileRead:
		return nil, errorf(wire.ErrTooLarge, "%s is %d bytes; the read limit is %d (download it as tar)", p, len(n.data), wire.MaxFileRead)
	}
	return n.data, nil
}

// write replaces file name with data: the parent must exist and name must
// not be a directory.
func (fs *fsys) write(name string, data []byte, mode uint32) error {
	p, err := clean(name)
	if err != nil {
		return err
	}
	if p == "/" {
		return errorf(wire.ErrInvalid, "write %q: is the root directory", p)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if _, err := fs.parent("write", p); err != nil {
		return err
	}
	if n := fs.nodes[p]; n != nil && n.dir {
		return errorf(wire.ErrInvalid, "write %q: is a directory", p)
	}
	fs.nodes[p] = &node{data: data, mode: mode & 0o777, mtime: time.Now()}
	return nil
}

func (fs *fsys) mkdir(name string, parents bool, mode uint32) error {
	p, err := clean(name)
	if err != nil {
		return err
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if !parents {
		if fs.nodes[p] != nil {
			return errorf(wire.ErrExists, "mkdir %q: file exists", p)
		}
		if _, err := fs.parent("mkdir", p); err != nil {
			return err
		}
		fs.nodes[p] = &node{dir: true, mode: mode & 0o777, mtime: time.Now()}
		return nil
	}
	// Every ancestor is a directory or is made one (0755); p gets mode.
	for q := p; ; q = path.Dir(q) {
		if n := fs.nodes[q]; n != nil {
			if !n.dir {
				return errorf(wire.ErrInvalid, "mkdir %q: %s is not a directory", p, q)
			}
			break
		}
		if q == "/" {
			break
		}
	}
	var made []string
	for q := p; fs.nodes[q] == nil; q = path.Dir(q) {
		made = append(made, q)
	}
	for i := len(made) - 1; i >= 0; i-- {
		m := uint32(0o755)
		if made[i] == p {
			m = mode & 0o777
		}
		fs.nodes[made[i]] = &node{dir: true, mode: m, mtime: time.Now()}
	}
	return nil
}

func (fs *fsys) remove(name string, recursive bool) error {
	p, err := clean(name)
	if err != nil {
		return err
	}
	if p == "/" {
		return errorf(wire.ErrPermission, "remove %q: refusing to remove the root", p)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n := fs.nodes[p]
	if n == nil {
		return errorf(wire.ErrNotFound, "remove %q: no such file or directory", p)
	}
	if n.dir {
		if len(fs.children(p)) > 0 && !recursive {
			return errorf(wire.ErrInvalid, "remove %q: directory not empty (remove it recursively)", p)
		}
		fs.removeBelow(p)
	}
	delete(fs.nodes, p)
	return nil
}

// removeBelow removes everything below directory p.
func (fs *fsys) removeBelow(p string) {
	prefix := p + "/"
	for q := range fs.nodes {
		if strings.HasPrefix(q, prefix) {
			delete(fs.nodes, q)
		}
	}
}

// move renames with rename(2) semantics: a file replaces a file, a
// directory replaces an empty directory, nothing moves into itself.
func (fs *fsys) move(from, to string) error {
	fp, err := clean(from)
	if err != nil {
		return err
	}
	tp, err := clean(to)
	if err != nil {
		return err
	}
	if fp == "/" || tp == "/" {
		return errorf(wire.ErrInvalid, "move: cannot move the root or onto it")
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n := fs.nodes[fp]
	if n == nil {
		return errorf(wire.ErrNotFound, "move %q: no such file or directory", fp)
	}
	if _, err := fs.parent("move", tp); err != nil {
		return err
	}
	if fp == tp {
		return nil
	}
	if n.dir && strings.HasPrefix(tp, fp+"/") {
		return errorf(wire.ErrInvalid, "move %q -> %q: into itself", fp, tp)
	}
	if t := fs.nodes[tp]; t != nil {
		switch {
		case n.dir && !t.dir:
			return errorf(wire.ErrInvalid, "move %q -> %q: not a directory", fp, tp)
		case !n.dir && t.dir:
			return errorf(wire.ErrInvalid, "move %q -> %q: is a directory", fp, tp)
		case t.dir && len(fs.children(tp)) > 0:
			return errorf(wire.ErrExists, "move %q -> %q: directory not empty", fp, tp)
		}
	}
	if n.dir {
		prefix := fp + "/"
		for q, m := range fs.nodes {
			if strings.HasPrefix(q, prefix) {
				delete(fs.nodes, q)
				fs.nodes[tp+"/"+q[len(prefix):]] = m
			}
		}
	}
	delete(fs.nodes, fp)
	fs.nodes[tp] = n
	return nil
}

// tar writes name as the real agent does: a file as one entry under its
// base name, a directory as its contents with names relative to it.
func (fs *fsys) tar(w io.Writer, name string) error {
	p, err := clean(name)
	if err != nil {
		return err
	}
	fs.mu.Lock()
	n := fs.nodes[p]
	if n == nil {
		fs.mu.Unlock()
		return errorf(wire.ErrNotFound, "stat %q: no such file or directory", p)
	}
	type entry struct {
		name string
		n    node
	}
	var ents []entry
	if n.dir {
		prefix := strings.TrimSuffix(p, "/") + "/"
		for q, m := range fs.nodes {
			if q != "/" && strings.HasPrefix(q, prefix) {
				ents = append(ents, entry{q[len(prefix):], *m})
			}
		}
		slices.SortFunc(ents, func(a, b entry) int { return strings.Compare(a.name, b.name) })
	} else {
		ents = append(ents, entry{path.Base(p), *n})
	}
	fs.mu.Unlock()
	tw := tar.NewWriter(w)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Mode: int64(e.n.mode), ModTime: e.n.mtime, Typeflag: tar.TypeReg, Size: int64(len(e.n.data))}
		if e.n.dir {
			h.Name, h.Typeflag, h.Size = e.name+"/", tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(e.n.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// extract unpacks a tar into directory name (made if missing, as the real
// agent does): regular files and directories; entry names follow the path
// rules relative to it, and any other entry type is refused. It stops at
// the first bad entry; entries already written stay.
func (fs *fsys) extract(r io.Reader, name string) error {
	dest, err := clean(name)
	if err != nil {
		return err
	}
	if err := fs.mkdir(dest, true, 0o755); err != nil {
		return err
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return errorf(wire.ErrInvalid, "extract: %v", err)
		}
		rel, err := clean(h.Name)
		if err != nil {
			return err
		}
		p := path.Join(dest, rel)
		perm := uint32(h.FileInfo().Mode().Perm())
		switch h.Typeflag {
		case tar.TypeDir:
			err = fs.mkdir(p, true, perm)
		case tar.TypeReg:
			var buf bytes.Buffer
			if _, err := io.Copy(&buf, io.LimitReader(tr, wire.MaxTarUpload)); err != nil {
				return errorf(wire.ErrInvalid, "extract %q: %v", h.Name, err)
			}
			if err = fs.mkdir(path.Dir(p), true, 0o755); err == nil {
				err = fs.write(p, buf.Bytes(), perm)
			}
		default:
			return errorf(wire.ErrInvalid, "extract %q: the fake agent takes only files and directories", h.Name)
		}
		if err != nil {
			return err
		}
	}
}
