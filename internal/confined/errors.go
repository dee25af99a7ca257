package confined

import (
	"archive/tar"
	"errors"
	"io"
	iofs "io/fs"
	"strconv"
	"syscall"

	"github.com/warren-sandbox/warren/internal/wire"
)

// Error is the error type of this package's operations.
type Error struct {
	Op   string // "stat", "write", "extract", ...
	Path string // the path as the client sees it ("/a/b"), or the raw input
	// Kind is one of the wire.Err* kinds; empty means Kind derives it
	// from Err.
	Kind string
	Err  error
}

func (e *Error) Error() string {
	s := e.Op
	if e.Path != "" {
		s += " " + strconv.Quote(e.Path)
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

type errorString string

func (e errorString) Error() string { return string(e) }

// Kind maps an error to one of wire.ErrInvalid, ErrNotFound, ErrExists,
// ErrPermission, ErrTooLarge, ErrLimit or ErrInternal. It returns "" for a
// nil error. Errors of this package carry their kind; other errors are
// classified by their errno, and anything unknown is ErrInternal.
func Kind(err error) string {
	if err == nil {
		return ""
	}
	var fe *Error
	for e := err; errors.As(e, &fe); e = fe.Err {
		if fe.Kind != "" {
			return fe.Kind
		}
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errnoKind(errno)
	}
	switch {
	case errors.Is(err, iofs.ErrNotExist):
		return wire.ErrNotFound
	case errors.Is(err, iofs.ErrExist):
		return wire.ErrExists
	case errors.Is(err, iofs.ErrPermission):
		return wire.ErrPermission
	case errors.Is(err, iofs.ErrInvalid), errors.Is(err, tar.ErrHeader),
		errors.Is(err, tar.ErrFieldTooLong), errors.Is(err, io.ErrUnexpectedEOF):
		return wire.ErrInvalid
	}
	return wire.ErrInternal
}

func errnoKind(errno syscall.Errno) string {
	switch errno {
	case syscall.ENOENT:
		return wire.ErrNotFound
	case syscall.EEXIST, syscall.ENOTEMPTY:
		return wire.ErrExists
	case syscall.EACCES, syscall.EPERM, syscall.EROFS, syscall.EBUSY, syscall.ETXTBSY:
		return wire.ErrPermission
	case syscall.EINVAL, syscall.ENAMETOOLONG, syscall.ENOTDIR, syscall.EISDIR,
		syscall.ELOOP, syscall.EXDEV, syscall.EMLINK:
		return wire.ErrInvalid
	case syscall.EFBIG, syscall.ENOSPC, syscall.EDQUOT:
		return wire.ErrTooLarge
	}
	return wire.ErrInternal
}
