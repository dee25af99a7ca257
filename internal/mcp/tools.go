package mcp

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"
	"unicode/utf8"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Tool arguments mirror the RPC params (docs/api.md): a tool's arguments
// are marshalled as they are and sent as the method's params, so optional
// fields carry omitempty and reach the method only when the model set them.
// Fields without omitempty are required in the inferred input schema.

// StartConfig is sandbox_start's optional config.
type StartConfig struct {
	Image   string   `json:"image,omitempty" jsonschema:"image: host (default), python, node, or the name of a stored image"`
	Memory  float64  `json:"memory,omitempty" jsonschema:"memory limit in MiB, a whole number (default 512)"`
	CPUs    float64  `json:"cpus,omitempty" jsonschema:"number of CPUs (default 1)"`
	Volumes []string `json:"volumes,omitempty" jsonschema:"host paths bound into the sandbox, each HOST:GUEST or HOST:GUEST:ro (only beneath the server's allowed directories)"`
	Ports   []string `json:"ports,omitempty" jsonschema:"ports published on the host, each HOST:GUEST or PORT (refused while sandboxes have no network)"`
	Envs    []string `json:"envs,omitempty" jsonschema:"environment variables, each KEY=VALUE"`
	Workdir string   `json:"workdir,omitempty" jsonschema:"working directory for commands and code"`
}

// StartArgs are sandbox_start's arguments (sandbox.start).
type StartArgs struct {
	Sandbox   string       `json:"sandbox" jsonschema:"name of the sandbox to start (created if it does not exist)"`
	Namespace string       `json:"namespace,omitempty" jsonschema:"namespace of the sandbox (default: the API key's namespace, or \"default\" with a key for every namespace)"`
	Config    *StartConfig `json:"config,omitempty" jsonschema:"settings used when the sandbox is created"`
}

// SandboxArgs name one sandbox (sandbox_stop, sandbox_remove).
type SandboxArgs struct {
	Sandbox   string `json:"sandbox" jsonschema:"name of the sandbox"`
	Namespace string `json:"namespace,omitempty" jsonschema:"namespace of the sandbox (default: the API key's namespace, or \"default\" with a key for every namespace)"`
}

// RunCodeArgs are sandbox_run_code's arguments (sandbox.repl.run).
type RunCodeArgs struct {
	Sandbox   string  `json:"sandbox" jsonschema:"name of a started sandbox"`
	Namespace string  `json:"namespace,omitempty" jsonschema:"namespace of the sandbox (default: the API key's namespace, or \"default\" with a key for every namespace)"`
	Language  string  `json:"language" jsonschema:"language of the code: python, nodejs, node or javascript"`
	Code      string  `json:"code" jsonschema:"the code to run; state (variables, imports) persists between runs in the same sandbox and language"`
	Timeout   float64 `json:"timeout,omitempty" jsonschema:"time limit in seconds (default: the server's)"`
}

// RunCommandArgs are sandbox_run_command's arguments (sandbox.command.run).
type RunCommandArgs struct {
	Sandbox   string   `json:"sandbox" jsonschema:"name of a started sandbox"`
	Namespace string   `json:"namespace,omitempty" jsonschema:"namespace of the sandbox (default: the API key's namespace, or \"default\" with a key for every namespace)"`
	Command   string   `json:"command" jsonschema:"program to run, e.g. ls (no shell: use sandbox_shell for pipes and redirections)"`
	Args      []string `json:"args,omitempty" jsonschema:"arguments to the program, e.g. [\"-la\", \"/tmp\"]"`
	Timeout   float64  `json:"timeout,omitempty" jsonschema:"time limit in seconds (default: the server's)"`
}

// MetricsArgs are sandbox_get_metrics's arguments (sandbox.metrics.get).
type MetricsArgs struct {
	Sandbox   string `json:"sandbox,omitempty" jsonschema:"name of one sandbox (default: all in the namespace)"`
	Namespace string `json:"namespace,omitempty" jsonschema:"namespace (default: the API key's, or \"default\" with a key for every namespace; * means every namespace the key may see)"`
}

// ListArgs are sandbox_list's arguments (sandbox.list).
type ListArgs struct {
	Namespace string `json:"namespace,omitempty" jsonschema:"namespace (default: the API key's, or \"default\" with a key for every namespace; * means every namespace the key may see)"`
	State     string `json:"state,omitempty" jsonschema:"only sandboxes in this state: starting, running, stopping, stopped or error"`
}

// ShellArgs are sandbox_shell's arguments (sandbox.shell).
type ShellArgs struct {
	Sandbox   string  `json:"sandbox" jsonschema:"name of a started sandbox"`
	Namespace string  `json:"namespace,omitempty" jsonschema:"namespace of the sandbox (default: the API key's namespace, or \"default\" with a key for every namespace)"`
	Script    string  `json:"script" jsonschema:"shell script run by /bin/sh -c (pipes, redirections and && work)"`
	Timeout   float64 `json:"timeout,omitempty" jsonschema:"time limit in seconds (default: the server's); on timeout the result says timed_out"`
}

// PathArgs name one path in a sandbox (sandbox_read_file, sandbox_list_files).
type PathArgs struct {
	Sandbox   string `json:"sandbox" jsonschema:"name of a started sandbox"`
	Namespace string `json:"namespace,omitempty" jsonschema:"namespace of the sandbox (default: the API key's namespace, or \"default\" with a key for every namespace)"`
	Path      string `json:"path" jsonschema:"absolute path inside the sandbox"`
}

// WriteFileArgs are sandbox_write_file's arguments.
type WriteFileArgs struct {
	Sandbox   string `json:"sandbox" jsonschema:"name of a started sandbox"`
	Namespace string `json:"namespace,omitempty" jsonschema:"namespace of the sandbox (default: the API key's namespace, or \"default\" with a key for every namespace)"`
	Path      string `json:"path" jsonschema:"absolute path inside the sandbox; the file is created or replaced"`
	Content   string `json:"content" jsonschema:"the file's new content, as text"`
}

// writeFileParams are sandbox.file.write's params.
type writeFileParams struct {
	Sandbox   string `json:"sandbox"`
	Namespace string `json:"namespace,omitempty"`
	Path      string `json:"path"`
	Data      string `json:"data"`
}

// ToolNames lists the tools Handler offers, in the order they are added.
var ToolNames = []string{
	"sandbox_start", "sandbox_stop", "sandbox_run_code", "sandbox_run_command", "sandbox_get_metrics",
	"sandbox_list", "sandbox_remove", "sandbox_shell",
	"sandbox_read_file", "sandbox_write_file", "sandbox_list_files",
}

func ptr[T any](v T) *T { return &v }

func addTools(s *sdk.Server, c Caller, log *slog.Logger) {
	readOnly := &sdk.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)}

	addTool(s, c, log, &sdk.Tool{
		Name:  "sandbox_start",
		Title: "Start a sandbox",
		Description: "Start the named sandbox, creating it if it does not exist (config applies on creation). " +
			"Starting a running sandbox succeeds; starting a stopped one restarts it with its files kept. " +
			"Call this before running code or commands in a sandbox.",
		Annotations: &sdk.ToolAnnotations{IdempotentHint: true, DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
	}, "sandbox.start", asParams[StartArgs], jsonResult)

	addTool(s, c, log, &sdk.Tool{
		Name:        "sandbox_stop",
		Title:       "Stop a sandbox",
		Description: "Stop the named sandbox, killing everything running in it. Its files are kept; sandbox_start restarts it. Stopping a stopped sandbox succeeds.",
		Annotations: &sdk.ToolAnnotations{IdempotentHint: true, DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
	}, "sandbox.stop", asParams[SandboxArgs], jsonResult)

	addTool(s, c, log, &sdk.Tool{
		Name:  "sandbox_run_code",
		Title: "Run code in a sandbox",
		Description: "Run Python or JavaScript code in a started sandbox's REPL. Variables and imports persist between runs. " +
			"Returns JSON: {status, language, output: [{stream, text}], has_error, result?}.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
	}, "sandbox.repl.run", asParams[RunCodeArgs], jsonResult)

	addTool(s, c, log, &sdk.Tool{
		Name:  "sandbox_run_command",
		Title: "Run a command in a sandbox",
		Description: "Run a program with arguments (no shell) in a started sandbox and wait for it. " +
			"Returns JSON: {command, args, exit_code, success, output: [{stream, text}]}. Exceeding the timeout is an error.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
	}, "sandbox.command.run", asParams[RunCommandArgs], jsonResult)

	addTool(s, c, log, &sdk.Tool{
		Name:        "sandbox_get_metrics",
		Title:       "Get sandbox metrics",
		Description: "Get resource usage of one sandbox or of all sandboxes in a namespace. Returns JSON: {sandboxes: [{namespace, name, running, cpu_usage, memory_usage, disk_usage}]}.",
		Annotations: readOnly,
	}, "sandbox.metrics.get", asParams[MetricsArgs], jsonResult)

	addTool(s, c, log, &sdk.Tool{
		Name:        "sandbox_list",
		Title:       "List sandboxes",
		Description: "List sandboxes with their state, image and resources. Returns JSON: {sandboxes: [...]}.",
		Annotations: readOnly,
	}, "sandbox.list", asParams[ListArgs], jsonResult)

	addTool(s, c, log, &sdk.Tool{
		Name:        "sandbox_remove",
		Title:       "Remove a sandbox",
		Description: "Delete the named sandbox and all its files, stopping it first if it runs. Returns JSON: {removed} (false when it did not exist).",
		Annotations: &sdk.ToolAnnotations{IdempotentHint: true, DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
	}, "sandbox.remove", asParams[SandboxArgs], jsonResult)

	addTool(s, c, log, &sdk.Tool{
		Name:  "sandbox_shell",
		Title: "Run a shell script in a sandbox",
		Description: "Run a script with /bin/sh -c in a started sandbox and wait for it. " +
			"Returns JSON: {exit_code, signal, timed_out, oom_killed, truncated, stdout, stderr, duration_ms}; a non-zero exit or timeout is a normal result.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
	}, "sandbox.shell", asParams[ShellArgs], jsonResult)

	addTool(s, c, log, &sdk.Tool{
		Name:  "sandbox_read_file",
		Title: "Read a file in a sandbox",
		Description: "Read a file in a started sandbox. A UTF-8 text file is returned as its text; " +
			"any other file as JSON {size, encoding: \"base64\", data}.",
		Annotations: readOnly,
	}, "sandbox.file.read", asParams[PathArgs], readFileResult)

	addTool(s, c, log, &sdk.Tool{
		Name:        "sandbox_write_file",
		Title:       "Write a file in a sandbox",
		Description: "Create or replace a text file in a started sandbox (mode 0644). Returns JSON: {size}.",
		Annotations: &sdk.ToolAnnotations{IdempotentHint: true, DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
	}, "sandbox.file.write", func(a WriteFileArgs) (any, error) {
		return writeFileParams{Sandbox: a.Sandbox, Namespace: a.Namespace, Path: a.Path,
			Data: base64.StdEncoding.EncodeToString([]byte(a.Content))}, nil
	}, jsonResult)

	addTool(s, c, log, &sdk.Tool{
		Name:  "sandbox_list_files",
		Title: "List a directory in a sandbox",
		Description: "List the entries of a directory in a started sandbox. " +
			"Returns JSON: {entries: [{name, path, size, mode, type, mod_time, target?}]}.",
		Annotations: readOnly,
	}, "sandbox.file.list", asParams[PathArgs], jsonResult)
}

// asParams sends a tool's arguments as the method's params unchanged.
func asParams[In any](a In) (any, error) { return a, nil }

// addTool registers a tool that calls method with toParams(args) and
// renders its result with render. Every failure is a tool result with
// isError set, never a protocol error.
func addTool[In any](s *sdk.Server, c Caller, log *slog.Logger, t *sdk.Tool, method string,
	toParams func(In) (any, error), render func(any) *sdk.CallToolResult) {
	sdk.AddTool(s, t, func(ctx context.Context, _ *sdk.CallToolRequest, args In) (*sdk.CallToolResult, any, error) {
		start := time.Now()
		p, err := toParams(args)
		if err != nil {
			return errorResult(err), nil, nil
		}
		params, err := json.Marshal(p)
		if err != nil {
			return errorResult(fmt.Errorf("encode params: %w", err)), nil, nil
		}
		res, err := c.CallMCP(ctx, method, params)
		if err != nil {
			log.DebugContext(ctx, "mcp tool failed", "tool", t.Name, "method", method, "err", err, "duration", time.Since(start))
			return errorResult(err), nil, nil
		}
		log.DebugContext(ctx, "mcp tool", "tool", t.Name, "method", method, "duration", time.Since(start))
		return render(res), nil, nil
	})
}

// readFileResult turns sandbox.file.read's {data: base64, size} into the
// file's text when it is UTF-8, for the model to read directly.
func readFileResult(v any) *sdk.CallToolResult {
	b, err := json.Marshal(v)
	if err != nil {
		return errorResult(fmt.Errorf("encode result: %w", err))
	}
	var r struct {
		Data string `json:"data"`
		Size int64  `json:"size"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return errorResult(fmt.Errorf("decode sandbox.file.read result: %w", err))
	}
	data, err := base64.StdEncoding.DecodeString(r.Data)
	if err != nil {
		return errorResult(fmt.Errorf("decode sandbox.file.read data: %w", err))
	}
	if utf8.Valid(data) {
		return textResult(string(data))
	}
	return jsonResult(struct {
		Size     int64  `json:"size"`
		Encoding string `json:"encoding"`
		Data     string `json:"data"`
	}{r.Size, "base64", r.Data})
}
