// Package wire defines the protocol between the host and the in-sandbox
// agent (warren-agent): the requests, answers, limits and error kinds both
// sides share. It has no dependencies, so the agent stays small.
//
// The transport is HTTP/1.1 over a unix socket that the host creates and hands
// to the agent as an inherited listener. Streams are newline-delimited JSON.
// Byte payloads ([]byte fields) are base64 in JSON so binary output and invalid
// UTF-8 survive unchanged. The schema is pinned by testdata/protocol.golden.
package wire

import "time"

// Version is the protocol version. Bump it on any incompatible change to the
// types in this file; the golden schema test fails until the golden file is
// regenerated, so a change is never accidental.
const Version = "1"

// Limits the agent applies to what a client may ask for.
const (
	// DefaultOutputLimit caps captured stdout+stderr of one exec.
	DefaultOutputLimit = 1 << 20
	// MaxOutputLimit is the largest output cap a client may request of
	// output that is held whole: an exec's answer to sandbox.exec and
	// sandbox.shell, and a REPL run's lines, which the agent keeps in the
	// sandbox's memory until the run ends.
	MaxOutputLimit = 64 << 20
	// MaxReplLines bounds the lines a REPL run keeps, whatever their
	// bytes: each costs its header in the agent's memory until the run
	// ends (64 MiB of empty lines would cost 2 GiB).
	MaxReplLines = 1 << 20
	// MaxStreamedOutput is the largest output cap of an exec: its output
	// streams through the agent, and the host may spool it.
	MaxStreamedOutput = 1 << 30
	// MaxStdin is the largest stdin a client may send with an exec.
	MaxStdin = 16 << 20
	// MaxFileRead is the largest file the read endpoint returns whole.
	MaxFileRead = 64 << 20
	// MaxFileWrite is the largest body the write endpoint accepts.
	MaxFileWrite = 256 << 20
	// MaxTarUpload is the largest tar stream the upload endpoint accepts.
	MaxTarUpload = 1 << 30
	// MaxRequestJSON bounds every JSON request body.
	MaxRequestJSON = 32 << 20
	// ProcessOutputKeep is how many bytes of each stream a background
	// process keeps for re-reading.
	ProcessOutputKeep = 1 << 20
	// MaxProcesses bounds the background processes the agent tracks.
	MaxProcesses = 256
)

// Health is the answer of GET /v1/health.
type Health struct {
	Version string `json:"version"`
	Pid     int    `json:"pid"`
	// Procs is the agent's GOMAXPROCS: how many of its threads may run
	// Go code at once.
	Procs int `json:"procs"`
}

// ExecRequest runs one command to completion (POST /v1/exec) or starts a
// background process (POST /v1/processes).
type ExecRequest struct {
	// Argv is executed directly, no shell. Argv[0] is looked up in PATH
	// when it has no slash.
	Argv []string `json:"argv"`
	// Env is laid over the sandbox's default environment ("K=V" entries;
	// a key given here wins).
	Env []string `json:"env,omitempty"`
	// Cwd is the working directory; empty means the sandbox default.
	Cwd string `json:"cwd,omitempty"`
	// User is "uid", "uid:gid" or a user name from /etc/passwd.
	User string `json:"user,omitempty"`
	// Stdin is written to the process and then closed.
	Stdin []byte `json:"stdin,omitempty"`
	// TimeoutMs kills the whole process group after this long; 0 = none.
	TimeoutMs int64 `json:"timeout_ms,omitempty"`
	// OutputLimit caps stdout+stderr bytes kept; 0 = DefaultOutputLimit.
	OutputLimit int64 `json:"output_limit,omitempty"`
	// NoOutputLimit streams all output, ignoring OutputLimit: for a client
	// that writes output through instead of keeping it (exec only; the
	// pipe's back-pressure bounds the agent's memory).
	NoOutputLimit bool `json:"no_output_limit,omitempty"`
	// TTY runs the process on a pseudo-terminal (background processes only).
	TTY bool `json:"tty,omitempty"`
	// Rows and Cols are the terminal's size from the start (TTY only; 0 =
	// the kernel's 0x0). Set before the process runs, so its first
	// look at the size is right; a later Resize changes it.
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
	// HoldOutput (background processes only) makes the process wait for
	// its reader instead of losing output: a stream that holds
	// ProcessOutputKeep bytes not yet read takes no more until they are,
	// so the process blocks on its writes (the pipe's back-pressure, as a
	// terminal's), and its end waits until its output has been read. For a
	// client attached for the process's whole life (a WebSocket session),
	// which removes the process when it goes.
	HoldOutput bool `json:"hold_output,omitempty"`
}

// Stream names.
const (
	Stdout = "stdout"
	Stderr = "stderr"
)

// ExecEvent is one line of the NDJSON stream answering POST /v1/exec.
// Exactly one of Data (with Stream) or Exit is set; Exit is the last event.
type ExecEvent struct {
	Stream string      `json:"stream,omitempty"`
	Data   []byte      `json:"data,omitempty"`
	Exit   *ExitStatus `json:"exit,omitempty"`
}

// ExitStatus says how a process ended.
type ExitStatus struct {
	// Code is the exit code, or 128+signal when killed by a signal.
	Code int `json:"code"`
	// Signal names the terminating signal ("SIGKILL"), if any.
	Signal string `json:"signal,omitempty"`
	// TimedOut is set when the agent killed the process at its timeout.
	TimedOut bool `json:"timed_out,omitempty"`
	// Truncated is set when output exceeded the limit and was cut.
	Truncated bool `json:"truncated,omitempty"`
	// DurationMs is wall time from start to exit.
	DurationMs float64 `json:"duration_ms"`
	// Error is set when the process could not be started at all
	// (not found, permission denied); Code is then 127 or 126.
	Error string `json:"error,omitempty"`
}

// ProcessInfo describes a background process.
type ProcessInfo struct {
	ID        string      `json:"id"`
	Argv      []string    `json:"argv"`
	Pid       int         `json:"pid"`
	Running   bool        `json:"running"`
	StartedAt time.Time   `json:"started_at"`
	Exit      *ExitStatus `json:"exit,omitempty"`
}

// OutputChunk answers GET /v1/processes/{id}/output?stream=S&offset=N.
// Offsets count bytes since the process started. When the requested offset
// is older than what is kept, Offset is the oldest kept byte and Dropped says
// how many bytes were skipped.
type OutputChunk struct {
	Offset     int64  `json:"offset"`
	Data       []byte `json:"data"`
	NextOffset int64  `json:"next_offset"`
	Dropped    int64  `json:"dropped,omitempty"`
	// EOF is set when the process has exited and all output was returned.
	EOF bool `json:"eof,omitempty"`
}

// SignalRequest is the body of POST /v1/processes/{id}/signal.
type SignalRequest struct {
	// Signal is a name ("SIGTERM", "TERM") or a number ("15").
	Signal string `json:"signal"`
}

// ResizeRequest is the body of POST /v1/processes/{id}/resize (TTY only).
type ResizeRequest struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// FileInfo describes one file (GET /v1/files/stat, /v1/files/list).
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"` // permission bits and type bits as in os.FileMode
	Type    string    `json:"type"` // "file", "dir", "symlink", "other"
	ModTime time.Time `json:"mod_time"`
	// Target is the link target of a symlink (not followed).
	Target string `json:"target,omitempty"`
}

// MkdirRequest is the body of POST /v1/files/mkdir.
type MkdirRequest struct {
	Path    string `json:"path"`
	Parents bool   `json:"parents,omitempty"`
	Mode    uint32 `json:"mode,omitempty"` // default 0755
}

// RemoveRequest is the body of POST /v1/files/remove.
type RemoveRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive,omitempty"`
}

// MoveRequest is the body of POST /v1/files/move.
type MoveRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// ReplRequest is the body of POST /v1/repl/run.
type ReplRequest struct {
	// Language is "python" or "node" (aliases "nodejs", "javascript").
	Language string `json:"language"`
	Code     string `json:"code"`
	// TimeoutMs interrupts the running code; the interpreter survives.
	TimeoutMs int64 `json:"timeout_ms,omitempty"`
	// OutputLimit caps the output bytes the run keeps (up to
	// MaxOutputLimit); 0 = the agent's default, DefaultOutputLimit.
	OutputLimit int64 `json:"output_limit,omitempty"`
}

// Repl run statuses.
const (
	ReplSuccess   = "success"
	ReplError     = "error"   // the code raised
	ReplTimeout   = "timeout" // interrupted at the timeout; state kept
	ReplRestarted = "restarted"
)

// OutputLine is one line of output, newline removed.
type OutputLine struct {
	Stream string `json:"stream"`
	Text   string `json:"text"`
}

// ReplResult answers POST /v1/repl/run.
type ReplResult struct {
	Status string       `json:"status"`
	Output []OutputLine `json:"output"`
	// Result is the repr of the value of the last expression, if any.
	Result *string `json:"result,omitempty"`
	// Error is the exception's one-line summary when Status is not success.
	Error     string `json:"error,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
	// DurationMs is the time spent running the code.
	DurationMs float64 `json:"duration_ms"`
}

// ErrorBody is the JSON body of every non-2xx agent answer.
type ErrorBody struct {
	// Kind is one of the Err* constants.
	Kind    string `json:"kind"`
	Message string `json:"message"`
	// Cause says why a program could not be started (Cause*), so that a
	// client can exit 127 or 126 as a shell does without reading Message;
	// Kind is then ErrNotFound, as before the field existed. Empty for
	// every other error, and from agents that predate it.
	Cause string `json:"cause,omitempty"`
}

// Causes of a program that could not be started.
const (
	CauseNotFound      = "not_found"      // no such program or interpreter (ENOENT): exit 127
	CauseNotExecutable = "not_executable" // EACCES, ENOEXEC, EISDIR, no working directory: exit 126
)

// Error kinds the agent reports.
const (
	ErrInvalid    = "invalid"   // bad input: path, argv, sizes, JSON
	ErrNotFound   = "not_found" // file, process, executable
	ErrExists     = "exists"
	ErrPermission = "permission"
	ErrTooLarge   = "too_large"
	ErrLimit      = "limit" // a count limit such as MaxProcesses
	ErrInternal   = "internal"
)
