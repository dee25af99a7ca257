package service

import (
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Output pumps: how the agent reads a process's stdout and stderr.
//
// A Go reader woken for every write of a fast writer is expensive for the
// whole host, not only for the sandbox: `yes` writes 8 KiB at a time, and
// each write wakes the reader through the runtime's poller, a handful of
// thread switches each. Measured with `yes` streaming into a background
// process's buffer, the other sandboxes' exec p99 went from 22 ms to 49 ms
// (max 90 ms) on a 2-CPU host, while `yes | cat` inside a sandbox, the same
// bytes with a C reader, cost them nothing (docs/performance.md). So a pump
// that sees the writer streaming waits a moment before its next read: the
// pipe fills meanwhile and one wakeup carries up to a pipe's worth. Small
// writes (a prompt, a line of a log) are read as soon as they come. A
// streaming writer's pipe is grown to streamingPipe so that the pause costs
// it little throughput (1 GB through a background process: 1.8 s before,
// see docs/performance.md for after).

const (
	// pumpBuf is one read's buffer: a default pipe's capacity; a
	// streaming writer's reads get streamingBuf.
	pumpBuf      = 64 << 10
	streamingBuf = 256 << 10
	// streamingPipe is what a streaming writer's pipe is grown to (the
	// kernel's default pipe-max-size; a user over its pipe-user-pages
	// budget keeps the pipe it has).
	streamingPipe = 1 << 20
	// streamingRead: a read this large means the writer is streaming.
	streamingRead = 16 << 10
	// coalesceWait is the pause after a streaming read: short enough
	// that output still reads as live, long enough that a 64 KiB pipe
	// fills at the rate a process can write it.
	coalesceWait = 500 * time.Microsecond
)

// pump copies r to emit until r ends, coalescing the reads of a streaming
// writer. emit gets a buffer it must not keep.
func pump(r io.Reader, emit func([]byte)) {
	buf := make([]byte, pumpBuf)
	streaming := false
	for {
		n, err := r.Read(buf)
		if n > 0 {
			emit(buf[:n])
		}
		if err != nil {
			return
		}
		if n < streamingRead {
			continue
		}
		if !streaming {
			streaming = true
			growPipe(r)
			buf = make([]byte, streamingBuf)
		}
		if n < len(buf) {
			time.Sleep(coalesceWait)
		}
	}
}

// growPipe asks for a pipe of streamingPipe bytes under r, if r is one;
// refused (EPERM over the user's pipe budget, not a pipe), it stays as is.
func growPipe(r io.Reader) {
	f, ok := r.(*os.File)
	if !ok {
		return
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, streamingPipe)
	})
}

// pumpTo is pump into a writer whose errors end nothing (the rings).
func pumpTo(w io.Writer, r io.Reader) {
	pump(r, func(b []byte) { _, _ = w.Write(b) })
}
