package msb

import (
	"encoding/json"
	"errors"
	"strings"
)

// ErrExecutionNotParsed is returned by the Get* methods when the server's
// result could not be parsed.
var ErrExecutionNotParsed = errors.New("execution output could not be parsed")

// outputLine is one line of output, newline removed.
type outputLine struct {
	Stream string `json:"stream"`
	Text   string `json:"text"`
}

type outputLines []outputLine

// join returns the lines of stream joined by newlines.
func (ls outputLines) join(stream string) string {
	var b strings.Builder
	for _, l := range ls {
		if l.Stream == stream {
			if b.Len() > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(l.Text)
		}
	}
	return b.String()
}

// hasStderr reports whether any stderr line is non-empty.
func (ls outputLines) hasStderr() bool {
	for _, l := range ls {
		if l.Stream == "stderr" && l.Text != "" {
			return true
		}
	}
	return false
}

// CodeExecution is the result of running code in the sandbox's REPL.
// Output holds the server's raw result; the methods parse it.
type CodeExecution struct {
	Output   json.RawMessage // the raw JSON result from the server
	parsed   executionData
	parsedOK bool
}

type executionData struct {
	OutputLines outputLines `json:"output"`
	Status      string      `json:"status"`
	Language    string      `json:"language"`
	HasError    bool        `json:"has_error"`
}

// GetOutput returns the stdout lines joined by newlines.
func (ce CodeExecution) GetOutput() (string, error) {
	if !ce.parsedOK {
		return "", ErrExecutionNotParsed
	}
	return ce.parsed.OutputLines.join("stdout"), nil
}

// GetError returns the stderr lines joined by newlines.
func (ce CodeExecution) GetError() (string, error) {
	if !ce.parsedOK {
		return "", ErrExecutionNotParsed
	}
	return ce.parsed.OutputLines.join("stderr"), nil
}

// HasError reports whether the code failed: status "error" or "exception",
// a server-reported has_error, or any non-empty stderr line.
func (ce CodeExecution) HasError() bool {
	if !ce.parsedOK {
		return false
	}
	switch ce.parsed.Status {
	case "error", "exception":
		return true
	}
	return ce.parsed.HasError || ce.parsed.OutputLines.hasStderr()
}

// GetStatus returns the execution status ("success", "error", ...), or
// "unknown" if the result could not be parsed.
func (ce CodeExecution) GetStatus() string {
	if !ce.parsedOK {
		return "unknown"
	}
	return ce.parsed.Status
}

// GetLanguage returns the language the code ran in, or "unknown" if the
// result could not be parsed.
func (ce CodeExecution) GetLanguage() string {
	if !ce.parsedOK {
		return "unknown"
	}
	return ce.parsed.Language
}

// CommandExecution is the result of running a command.
// Output holds the server's raw result; the methods parse it.
type CommandExecution struct {
	Output   json.RawMessage // the raw JSON result from the server
	parsed   commandData
	parsedOK bool
}

type commandData struct {
	OutputLines outputLines `json:"output"`
	Command     string      `json:"command"`
	Args        []string    `json:"args"`
	ExitCode    int         `json:"exit_code"`
	Success     bool        `json:"success"`
}

// GetOutput returns the stdout lines joined by newlines.
func (ce CommandExecution) GetOutput() (string, error) {
	if !ce.parsedOK {
		return "", ErrExecutionNotParsed
	}
	return ce.parsed.OutputLines.join("stdout"), nil
}

// GetError returns the stderr lines joined by newlines.
func (ce CommandExecution) GetError() (string, error) {
	if !ce.parsedOK {
		return "", ErrExecutionNotParsed
	}
	return ce.parsed.OutputLines.join("stderr"), nil
}

// HasError reports whether the command failed: a non-zero exit code or any
// non-empty stderr line.
func (ce CommandExecution) HasError() bool {
	if !ce.parsedOK {
		return false
	}
	return !ce.parsed.Success || ce.parsed.OutputLines.hasStderr()
}

// GetExitCode returns the command's exit code, or -1 if the result could not
// be parsed.
func (ce CommandExecution) GetExitCode() int {
	if !ce.parsedOK {
		return -1
	}
	return ce.parsed.ExitCode
}

// IsSuccess reports whether the command exited with code 0.
func (ce CommandExecution) IsSuccess() bool {
	if !ce.parsedOK {
		return false
	}
	return ce.parsed.Success
}

// GetCommand returns the command that was run.
func (ce CommandExecution) GetCommand() string {
	if !ce.parsedOK {
		return ""
	}
	return ce.parsed.Command
}

// GetArgs returns the command's arguments.
func (ce CommandExecution) GetArgs() []string {
	if !ce.parsedOK {
		return nil
	}
	return ce.parsed.Args
}
