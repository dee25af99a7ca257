// Package mcp serves Warren over the Model Context Protocol (PROTOCOL.md §5).
//
// It owns the MCP tool catalogue (names, descriptions, input schemas), its
// two prompts, and the translation between MCP tool calls and Warren's JSON-RPC methods
// (docs/api.md). It speaks the Streamable HTTP transport through the
// official Go SDK (github.com/modelcontextprotocol/go-sdk), and it does no
// authentication or authorization of its own: warren serve mounts
// [Handler] at /mcp behind the API server's authentication (rpc's
// Server.Authenticated), and every tool call goes back to the API server
// through [Caller] with a context that carries that request's values (so
// the server finds the caller's claims in it).
package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/warren-sandbox/warren/internal/buildinfo"
)

// Caller runs Warren's JSON-RPC methods for MCP tool calls.
type Caller interface {
	// CallMCP runs method with params on behalf of the /mcp request whose
	// context is ctx; the implementation re-reads the caller's identity
	// (claims) from ctx itself. A non-nil error becomes a tool result with
	// isError set, carrying err.Error().
	CallMCP(ctx context.Context, method string, params json.RawMessage) (any, error)
}

// ServerName is the implementation name reported in the MCP handshake.
const ServerName = "warren"

// Handler returns the http.Handler to mount at /mcp (Streamable HTTP).
// log may be nil.
//
// Context propagation (go-sdk v1.8.0): the SDK runs every incoming JSON-RPC
// message on a jsonrpc2 connection whose base context is the context passed
// to Server.Connect, and each tool handler's ctx derives from that base
// (values kept, cancellation detached). In the SDK's default stateful mode
// the connection — and so its base context — is created by the initialize
// POST and reused for every later POST of the session, so a tool call would
// see the initialize request's values, not its own request's (and a
// session would outlive a revoked or expired key). With
// StreamableHTTPOptions.Stateless each POST gets a fresh temporary session
// connected with that POST's req.Context(), so the context handed to
// CallMCP carries the values (the claims) of the very request that carried
// the tool call. req.Extra.Header / TokenInfo would not help: Warren's
// claims are not an SDK TokenInfo, and headers would mean authenticating
// twice. Stateless costs nothing here: Warren's tools never send
// server-to-client requests, and sampling/elicitation are not used.
func Handler(c Caller, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	srv := NewServer(c, log)
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, &sdk.StreamableHTTPOptions{
		Stateless: true,
		// Plain application/json replies: no tool streams progress, and
		// plain JSON is friendlier to proxies and curl.
		JSONResponse: true,
		Logger:       log,
		// The SDK's DNS-rebinding guard rejects requests that reach a
		// loopback address with a non-loopback Host, which breaks the usual
		// reverse proxy on 127.0.0.1. Every /mcp request is authenticated
		// by a bearer API key (never a cookie) before it gets here, so a
		// rebound browser page gains nothing.
		DisableLocalhostProtection: true,
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The SDK wants a POST to accept both JSON and an event stream.
		// Every answer here is plain JSON (JSONResponse), so a client
		// that accepts only JSON, or says nothing, gets what it can
		// read, as microsandbox answers it; one that accepts no JSON
		// still hears from the SDK why not.
		if r.Method == http.MethodPost && acceptsJSON(r.Header.Values("Accept")) {
			r = r.Clone(r.Context())
			r.Header.Set("Accept", "application/json, text/event-stream")
		}
		h.ServeHTTP(w, r)
	})
}

// acceptsJSON reports whether Accept header values admit application/json:
// no Accept at all, or a media range that covers it.
func acceptsJSON(values []string) bool {
	empty := true
	for _, v := range values {
		for _, part := range strings.Split(v, ",") {
			base, _, _ := strings.Cut(part, ";")
			switch strings.ToLower(strings.TrimSpace(base)) {
			case "":
			case "application/json", "application/*", "*/*":
				return true
			default:
				empty = false
			}
		}
	}
	return empty
}

// NewServer returns an MCP server exposing Warren's tools, each of which
// calls c. Most callers want [Handler]; this is for other transports.
func NewServer(c Caller, log *slog.Logger) *sdk.Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := sdk.NewServer(&sdk.Implementation{Name: ServerName, Title: "Warren sandboxes", Version: buildinfo.Version()}, &sdk.ServerOptions{
		Instructions: instructions,
		Logger:       log,
	})
	addTools(s, c, log)
	addPrompts(s)
	return s
}

const instructions = `Warren runs isolated sandboxes (lightweight Linux environments).
Start one with sandbox_start (pick any name), then run code (sandbox_run_code),
commands (sandbox_run_command, sandbox_shell) and work with its files
(sandbox_read_file, sandbox_write_file, sandbox_list_files). Stop it with
sandbox_stop when done (its files are kept; sandbox_remove deletes it).
The namespace argument is optional everywhere; omitted, it is the API key's
namespace ("default" with a key for every namespace).`

// textResult is a successful tool result holding text.
func textResult(text string) *sdk.CallToolResult {
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: text}}}
}

// errorResult is a failed tool result: isError with the message as text,
// so the model sees what went wrong and can correct itself.
func errorResult(err error) *sdk.CallToolResult {
	msg := err.Error()
	if msg == "" {
		msg = "error"
	}
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: msg}}, IsError: true}
}

// jsonResult renders a method's result as JSON text.
func jsonResult(v any) *sdk.CallToolResult {
	b, err := json.Marshal(v)
	if err != nil {
		return errorResult(errors.New("encode result: " + err.Error()))
	}
	return textResult(string(b))
}
