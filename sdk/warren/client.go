// Package warren is a Go client for the extended API of a Warren sandbox
// server (see docs/api.md in the Warren repository): create, list and remove
// sandboxes, run commands and shell scripts with stdin, environment, working
// directory and user, manage background processes, read and write files,
// move whole directory trees as tar streams, and read logs.
//
// A [Client] holds the server's address and credentials; a [Sandbox] is a
// handle to one named sandbox:
//
//	c := warren.New() // MSB_SERVER_URL and MSB_API_KEY, or the defaults
//	sb, err := c.Create(ctx, warren.Spec{Name: "build", Image: "python"})
//	if err != nil {
//		return err
//	}
//	defer c.Remove(context.WithoutCancel(ctx), sb.Name)
//	res, err := sb.Shell(ctx, "echo hello; uname -a")
//	fmt.Print(res.Output())
//
// One-shot helpers ([Client.RunPython], [Client.RunShell]) create a sandbox,
// run, and always stop and remove it.
//
// Failures reported by the server are [*Error] values with a Kind from a
// closed set ([KindNotFound], [KindConflict], ...); test them with
// [IsNotFound], [IsConflict] and friends, or [KindOf].
//
// The WebSocket endpoint (/api/v1/ws, streaming exec and terminals) is not
// covered: the standard library has no WebSocket client and this module has
// no dependencies. Background processes ([Sandbox.StartProcess] and
// [Process.Output] with a wait) give streaming output by polling instead.
//
// For the five microsandbox-compatible methods alone, package
// github.com/warren-sandbox/warren/sdk/msb offers the microsandbox Go SDK's
// API.
package warren

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

// DefaultServerURL is the server address used when neither [WithServerURL]
// nor MSB_SERVER_URL is set.
const DefaultServerURL = "http://127.0.0.1:5555"

// DefaultNamespace is the namespace the server uses when a request names
// none and the API key is for every namespace (or the server runs in dev
// mode). With a key for one namespace, a request that names none uses the
// key's namespace.
const DefaultNamespace = "default"

// DefaultImage is the image of the sandboxes [Client.RunPython] and
// [Client.RunShell] create, unless [WithDefaultImage] or [RunImage] says
// otherwise. The server maps the language name to an image.
const DefaultImage = "python"

const maxResponse = 128 << 20

// Client talks to one Warren server. It is safe for concurrent use.
type Client struct {
	serverURL string
	apiKey    string
	namespace string
	hc        *http.Client
	image     string
}

// Option configures a [Client].
type Option func(*Client)

// WithServerURL sets the server's base URL (for example
// "http://127.0.0.1:5555"). Without it MSB_SERVER_URL is used, else
// [DefaultServerURL].
func WithServerURL(url string) Option {
	return func(c *Client) { c.serverURL = url }
}

// WithAPIKey sets the API key, sent as "Authorization: Bearer <key>". Without
// it MSB_API_KEY is used; when both are empty no Authorization header is sent
// (a dev server needs none).
func WithAPIKey(key string) Option {
	return func(c *Client) { c.apiKey = key }
}

// WithNamespace sets the namespace of every request. Without it none is sent
// and the server uses the API key's namespace, or "default" for a key for
// every namespace (and in dev mode).
func WithNamespace(ns string) Option {
	return func(c *Client) { c.namespace = ns }
}

// WithHTTPClient sets the HTTP client. Without it [http.DefaultClient] is
// used. Long calls (exec with a long timeout, process waits) hold a request
// open for their whole duration, so a short http.Client.Timeout cuts them
// short; prefer bounding calls with their context.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) { c.hc = hc }
}

// WithDefaultImage sets the image of the sandboxes created by
// [Client.RunPython] and [Client.RunShell] (default [DefaultImage]).
func WithDefaultImage(image string) Option {
	return func(c *Client) { c.image = image }
}

// New returns a client configured by opts, with environment fallbacks
// MSB_SERVER_URL and MSB_API_KEY. It makes no request.
func New(opts ...Option) *Client {
	c := &Client{}
	for _, o := range opts {
		if o != nil {
			o(c)
		}
	}
	if c.serverURL == "" {
		c.serverURL = os.Getenv("MSB_SERVER_URL")
	}
	if c.serverURL == "" {
		c.serverURL = DefaultServerURL
	}
	c.serverURL = strings.TrimRight(c.serverURL, "/")
	if c.apiKey == "" {
		c.apiKey = os.Getenv("MSB_API_KEY")
	}
	if c.hc == nil {
		c.hc = http.DefaultClient
	}
	if c.image == "" {
		c.image = DefaultImage
	}
	return c
}

// ServerURL returns the server's base URL.
func (c *Client) ServerURL() string { return c.serverURL }

// Namespace returns the namespace requests name, or "" when none is set (the
// server then uses the key's namespace, or "default"; see [WithNamespace]).
func (c *Client) Namespace() string { return c.namespace }

// Health checks GET /api/v1/health, which needs no key.
func (c *Client) Health(ctx context.Context) error {
	req, err := c.newRequest(ctx, http.MethodGet, "/api/v1/health", nil)
	if err != nil {
		return err
	}
	resp, err := c.do(req, "health")
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	return nil
}

// do sends req; a transport failure or a status other than 200 is an
// error (the body then closed), otherwise the caller closes the body.
func (c *Client) do(req *http.Request, what string) (*http.Response, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("warren: %s: %w", what, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer func() { _ = resp.Body.Close() }()
		return nil, responseError(resp)
	}
	return resp, nil
}

// Call sends one JSON-RPC request and decodes its result into result (which
// may be nil). It is the escape hatch for methods this package does not wrap
// (image.*, key.*, audit.*). params is sent as is: no namespace is added.
// A failure reported by the server is an [*Error].
func (c *Client) Call(ctx context.Context, method string, params, result any) error {
	body, err := json.Marshal(rpcRequest{JSONRPC: "2.0", Method: method, Params: params, ID: newUUID()})
	if err != nil {
		return fmt.Errorf("warren: %s: encode request: %w", method, err)
	}
	req, err := c.newRequest(ctx, http.MethodPost, "/api/v1/rpc", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.do(req, method)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return fmt.Errorf("warren: %s: read response: %w", method, err)
	}
	var out rpcResponse
	if err := json.Unmarshal(raw, &out); err != nil {
		return fmt.Errorf("warren: %s: decode response: %w", method, err)
	}
	if out.Error != nil {
		return out.Error.toError(resp.StatusCode)
	}
	if result == nil {
		return nil
	}
	if err := json.Unmarshal(out.Result, result); err != nil {
		return fmt.Errorf("warren: %s: decode result: %w", method, err)
	}
	return nil
}

// newRequest builds a request to the server with the auth header set.
func (c *Client) newRequest(ctx context.Context, method, path string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.serverURL+path, body)
	if err != nil {
		return nil, fmt.Errorf("warren: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	return req, nil
}

// ns returns the namespace for routes that need one in the path: "-", the
// server's default for the key, when the client names none.
func (c *Client) ns() string {
	if c.namespace == "" {
		return "-"
	}
	return c.namespace
}

type rpcRequest struct {
	JSONRPC string `json:"jsonrpc"`
	Method  string `json:"method"`
	Params  any    `json:"params,omitempty"`
	ID      string `json:"id"`
}

type rpcResponse struct {
	Result json.RawMessage `json:"result"`
	Error  *rpcErrorObject `json:"error"`
}

// secs converts a duration to the seconds the API takes.
func secs(d time.Duration) float64 { return d.Seconds() }

// dur converts the API's seconds to a duration.
func dur(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails on supported platforms (Go 1.24+)
	return fmt.Sprintf("%x", b)
}

// newUUID returns a random (version 4) UUID string.
func newUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
