// Package audit owns the server's tamper-evident audit log: typed records
// of API calls, runs, egress decisions, policy refusals, key and config
// changes and resource usage, appended to JSONL segment files in which
// every line commits to the hash of the line before it, anchored by
// checkpoints signed with an ed25519 key (log.go); the verifier that
// finds any edited, removed, reordered or truncated line and says where
// (verify.go); and the reader that queries and exports records offline
// (query.go). docs/policy.md "Audit log" is the user's description.
package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Kind names what a record is about.
type Kind string

// The kinds of records.
const (
	KindCall       Kind = "api_call"
	KindExec       Kind = "exec"
	KindEgress     Kind = "egress"
	KindRefusal    Kind = "refusal"
	KindKey        Kind = "key"
	KindConfig     Kind = "config"
	KindUsage      Kind = "usage"
	KindCheckpoint Kind = "checkpoint"
	KindRecovery   Kind = "recovery"
)

// Record is one audit record. Kind says which of the pointer fields is
// set. Time, Namespace, Sandbox and Labels are on every record that is
// about a sandbox; the writer adds the chain fields (Entry).
//
// The field order is part of the file format: Kind comes first, so every
// line starts {"seq":N,"prev":"…","kind":"…" (log.go).
type Record struct {
	Kind      Kind              `json:"kind"`
	Time      time.Time         `json:"time"`
	Namespace string            `json:"namespace,omitempty"`
	Sandbox   string            `json:"sandbox,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	// KeyID is the id of the API key the caller used ("" in dev mode or
	// for a key without one).
	KeyID     string `json:"key_id,omitempty"`
	RequestID string `json:"request_id,omitempty"`

	Call       *Call       `json:"call,omitempty"`
	Exec       *Exec       `json:"exec,omitempty"`
	Egress     *Egress     `json:"egress,omitempty"`
	Refusal    *Refusal    `json:"refusal,omitempty"`
	Key        *KeyChange  `json:"key,omitempty"`
	Config     *Config     `json:"config,omitempty"`
	Usage      *Usage      `json:"usage,omitempty"`
	Checkpoint *Checkpoint `json:"checkpoint,omitempty"`
	Recovery   *Recovery   `json:"recovery,omitempty"`
}

// Call is one API method call.
type Call struct {
	Method string `json:"method"`
	// Params are the request's params with secret-looking values
	// replaced by "[redacted]" and clipped (Params).
	Params json.RawMessage `json:"params,omitempty"`
	// Outcome is "ok" or the error's kind ("limit", "not_found", ...).
	Outcome    string  `json:"outcome"`
	DurationMs float64 `json:"duration_ms"`
}

// Exec is one run in a sandbox: a command, an exec, a shell script, a
// background or WebSocket process (Argv), or a REPL run (the code's
// hash: code can be megabytes and is the caller's, so it is not kept).
type Exec struct {
	// Via is the method family: "command", "exec", "shell", "process",
	// "ws" or "repl".
	Via  string   `json:"via"`
	Argv []string `json:"argv,omitempty"`
	// ArgvSHA256 is the hash of the whole argv (NUL-separated), set when
	// Argv had to be clipped.
	ArgvSHA256 string `json:"argv_sha256,omitempty"`
	Language   string `json:"language,omitempty"`
	CodeSHA256 string `json:"code_sha256,omitempty"`
	CodeBytes  int    `json:"code_bytes,omitempty"`
	// ExitCode is nil when the run did not finish (Outcome says why) or
	// is a process that was started, not waited for.
	ExitCode   *int    `json:"exit_code,omitempty"`
	Signal     string  `json:"signal,omitempty"`
	TimedOut   bool    `json:"timed_out,omitempty"`
	OOMKilled  bool    `json:"oom_killed,omitempty"`
	ProcessID  string  `json:"process_id,omitempty"`
	Outcome    string  `json:"outcome"`
	DurationMs float64 `json:"duration_ms"`
}

// Egress is one record of a sandbox's network log (internal/egress).
type Egress struct {
	Seq        uint64   `json:"seq"`
	Kind       string   `json:"kind"` // dns, tcp, policy
	Name       string   `json:"name,omitempty"`
	Addr       string   `json:"addr,omitempty"`
	Port       uint16   `json:"port,omitempty"`
	Verdict    string   `json:"verdict"`
	Rule       string   `json:"rule,omitempty"`
	Reason     string   `json:"reason,omitempty"`
	BytesOut   int64    `json:"bytes_out,omitempty"`
	BytesIn    int64    `json:"bytes_in,omitempty"`
	DurationMs float64  `json:"duration_ms,omitempty"`
	Rules      []string `json:"rules,omitempty"`
}

// Refusal is a request the policy refused (errors of kind limit or
// forbidden), with the message the caller got.
type Refusal struct {
	Method  string `json:"method"`
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

// KeyChange is an API key created or revoked.
type KeyChange struct {
	Action    string `json:"action"` // "create" or "revoke"
	ID        string `json:"id"`
	Namespace string `json:"namespace,omitempty"` // the key's
	// By is "api" (a key.* method) or "cli" (warren key, offline).
	By string `json:"by"`
}

// Config is a configuration load or reload.
type Config struct {
	Accepted bool     `json:"accepted"`
	Path     string   `json:"path,omitempty"`
	Problems []string `json:"problems,omitempty"`
}

// Usage is what a sandbox used over [From, To): records of one sandbox
// do not overlap, so summing them (by label, namespace...) gives totals.
type Usage struct {
	From          time.Time `json:"from"`
	To            time.Time `json:"to"`
	CPUSeconds    float64   `json:"cpu_seconds"`
	MemorySeconds float64   `json:"memory_byte_seconds"`
	// DiskBytes is what the sandbox had written at To (nil: unmeasured).
	DiskBytes      *int64 `json:"disk_bytes,omitempty"`
	EgressBytesOut int64  `json:"egress_bytes_out"`
	EgressBytesIn  int64  `json:"egress_bytes_in"`
	// Reason is "periodic", "stop", "remove" or "exited".
	Reason string `json:"reason"`
}

// Checkpoint is a signed anchor (log.go says what the signature covers).
type Checkpoint struct {
	Reason string `json:"reason"` // "count", "interval", "close"
	KeyID  string `json:"key_id"`
}

// Recovery is written when a writer opens a log whose previous writer
// did not end it with a checkpoint.
type Recovery struct {
	// Reason: "torn" (the last line was cut short: a crash while it was
	// written) or "unclosed" (the previous writer stopped without a
	// final checkpoint: a crash or a kill).
	Reason  string `json:"reason"`
	LastSeq uint64 `json:"last_seq"`
	// The torn line, kept in the file as it was, and excluded from the
	// chain: its file, its 1-based line number and its length.
	File  string `json:"file,omitempty"`
	Line  int    `json:"line,omitempty"`
	Bytes int    `json:"bytes,omitempty"`
}

// Entry is a record as it is stored: its place in the chain, the record
// and, for a checkpoint, the signature.
type Entry struct {
	Seq  uint64 `json:"seq"`
	Prev string `json:"prev"`
	Record
	Sig string `json:"sig,omitempty"`
}

// Bounds on what a record holds; Append refuses a record larger than
// MaxRecord once these are applied.
const (
	MaxParams   = 8 << 10
	maxString   = 512
	maxArgv     = 64
	maxArgvSize = 4 << 10
	MaxRecord   = 64 << 10
	// maxParamsWalk bounds the params that are parsed for redaction; larger
	// ones (a file.write's data) are kept as a marker only.
	maxParamsWalk = 1 << 20
)

// Redacted replaces secret-looking values.
const Redacted = "[redacted]"

// secretWords make a params key secret-looking when it contains one.
var secretWords = []string{"secret", "token", "key", "password", "passwd", "credential", "authorization"}

func secretName(k string) bool {
	k = strings.ToLower(k)
	for _, w := range secretWords {
		if strings.Contains(k, w) {
			return true
		}
	}
	return false
}

// Clip cuts s to at most n bytes on a character boundary, saying how
// much was cut.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + fmt.Sprintf("…[+%d bytes]", len(s)-i)
}

// SetArgv fills e.Argv with argv clipped to the record's bounds, and
// e.ArgvSHA256 with the whole argv's hash when anything was cut.
func (e *Exec) SetArgv(argv []string) {
	out := make([]string, 0, min(len(argv), maxArgv))
	size, cut := 0, len(argv) > maxArgv
	for _, a := range argv[:min(len(argv), maxArgv)] {
		c := Clip(a, max(64, min(maxString, maxArgvSize-size)))
		cut = cut || len(c) != len(a)
		size += len(c)
		out = append(out, c)
		if size >= maxArgvSize {
			cut = cut || len(out) < len(argv)
			break
		}
	}
	e.Argv = out
	if cut {
		h := sha256.New()
		for i, a := range argv {
			if i > 0 {
				h.Write([]byte{0})
			}
			h.Write([]byte(a))
		}
		e.ArgvSHA256 = hex.EncodeToString(h.Sum(nil))
	}
}

// SetCode records code by its hash and length.
func (e *Exec) SetCode(language, code string) {
	sum := sha256.Sum256([]byte(code))
	e.Language, e.CodeSHA256, e.CodeBytes = Clip(language, 64), hex.EncodeToString(sum[:]), len(code)
}
