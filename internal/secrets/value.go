// Package secrets gives sandboxes secrets by logical name: providers hold
// the values (a directory of files, the server's environment, or any
// other Provider), grants say which namespace may use which name and how
// it is delivered (into the sandbox's environment, or only through the
// egress proxy as a placeholder it replaces), and Value carries a value
// through the server without ever being printed.
//
// Invariants:
//   - A value is read from its provider at every start of a sandbox that
//     names it (so a rotated value takes effect at the next start) and is
//     kept only in memory: never in the database, a log, an error, a
//     response or a file of Warren's.
//   - No error of this package contains a value: errors name the secret,
//     the provider and the key.
//   - A name is usable in a namespace only when a grant names it there.
package secrets

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
)

// MaxValue bounds a secret's value.
const MaxValue = 64 << 10

const redacted = "[secret]"

// Value is a secret's value. It cannot be printed, logged or marshalled:
// every way the fmt, slog and encoding/json packages have of showing it
// shows "[secret]" instead. Reveal is the one way to the bytes, for the
// code that delivers them.
type Value struct {
	b []byte
}

// NewValue wraps b (not copied).
func NewValue(b []byte) Value { return Value{b: b} }

// Reveal returns the value's bytes; the caller must not keep or show them.
func (v Value) Reveal() []byte { return v.b }

// Len is the value's length in bytes.
func (v Value) Len() int { return len(v.b) }

// String implements fmt.Stringer without revealing the value.
func (Value) String() string { return redacted }

// GoString implements fmt.GoStringer without revealing the value.
func (Value) GoString() string { return redacted }

// Format implements fmt.Formatter so that no verb (%x, %+v, ...) reaches
// the bytes through reflection.
func (Value) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, redacted) }

// LogValue implements slog.LogValuer.
func (Value) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalJSON keeps the value out of JSON output.
func (Value) MarshalJSON() ([]byte, error) { return json.Marshal(redacted) }

// MarshalText keeps the value out of text encodings (and JSON map keys).
func (Value) MarshalText() ([]byte, error) { return []byte(redacted), nil }
