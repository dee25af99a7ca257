package msb

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"
)

// Option configures a sandbox handle. Options are applied in the order given
// to [NewPythonSandbox] or [NewNodeSandbox].
type Option func(*baseMicroSandbox)

// ReqIdProducer returns the JSON-RPC id of the next request.
type ReqIdProducer func() string

// config is a sandbox handle's resolved configuration.
type config struct {
	serverUrl string
	namespace string // empty: no namespace param is sent (server uses the key's, or "default")
	name      string
	apiKey    string
	timeout   time.Duration
	logger    Logger
	reqIDPrd  ReqIdProducer
}

const (
	defaultServerUrl    = "http://127.0.0.1:5555"
	defaultNameTemplate = "sandbox-%x" // 4 random bytes: 8 hex digits
)

// WithServerUrl sets the server's base URL. Without it the MSB_SERVER_URL
// environment variable is used, else http://127.0.0.1:5555.
func WithServerUrl(serverUrl string) Option {
	return func(b *baseMicroSandbox) { b.cfg.serverUrl = serverUrl }
}

// WithNamespace sets the namespace sent with every request. Without it no
// namespace is sent and the server uses the API key's namespace, or
// "default" for a key for every namespace (and in dev mode).
func WithNamespace(namespace string) Option {
	return func(b *baseMicroSandbox) { b.cfg.namespace = namespace }
}

// WithName sets the sandbox's name. Without it a random name
// "sandbox-<8 hex digits>" is used.
func WithName(name string) Option {
	return func(b *baseMicroSandbox) { b.cfg.name = name }
}

// WithApiKey sets the API key sent as "Authorization: Bearer <key>". Without
// it the MSB_API_KEY environment variable is used; when both are empty no
// Authorization header is sent (enough for a dev server).
func WithApiKey(apiKey string) Option {
	return func(b *baseMicroSandbox) { b.cfg.apiKey = apiKey }
}

// WithLogger sets the logger. Without it nothing is logged.
// A *slog.Logger satisfies [Logger].
func WithLogger(logger Logger) Option {
	return func(b *baseMicroSandbox) { b.cfg.logger = logger }
}

// WithReqIdProducer sets the generator of JSON-RPC request ids. Without it
// each request gets a random UUID.
func WithReqIdProducer(reqIdPrd ReqIdProducer) Option {
	return func(b *baseMicroSandbox) { b.cfg.reqIDPrd = reqIdPrd }
}

// WithHTTPClient sets the HTTP client used to reach the server. If c.Timeout
// is set and [WithTimeout] is not, c.Timeout is also sent as the execution
// timeout of code and command runs.
func WithHTTPClient(c *http.Client) Option {
	return func(b *baseMicroSandbox) { b.rpc = &rpcClient{hc: c} }
}

// WithTimeout sets the timeout of code and command runs, sent to the server
// in seconds as the "timeout" parameter. Zero (the default) sends none and
// the server's default applies.
func WithTimeout(d time.Duration) Option {
	return func(b *baseMicroSandbox) { b.cfg.timeout = d }
}

func newBaseWithOptions(options ...Option) *baseMicroSandbox {
	b := &baseMicroSandbox{}
	for _, opt := range options {
		if opt != nil {
			opt(b)
		}
	}
	if b.cfg.serverUrl == "" {
		b.cfg.serverUrl = os.Getenv("MSB_SERVER_URL")
	}
	if b.cfg.serverUrl == "" {
		b.cfg.serverUrl = defaultServerUrl
	}
	if b.cfg.apiKey == "" {
		b.cfg.apiKey = os.Getenv("MSB_API_KEY")
	}
	if b.cfg.name == "" {
		b.cfg.name = fmt.Sprintf(defaultNameTemplate, randomBytes(4))
	}
	if b.cfg.logger == nil {
		b.cfg.logger = NoOpLogger{}
	}
	if b.cfg.reqIDPrd == nil {
		b.cfg.reqIDPrd = newUUID
	}
	if b.rpc == nil {
		b.rpc = &rpcClient{hc: http.DefaultClient}
	}
	if b.cfg.timeout == 0 && b.rpc.hc != nil {
		b.cfg.timeout = b.rpc.hc.Timeout
	}
	return b
}

// randomBytes returns n bytes from crypto/rand, which never fails on
// supported platforms (Go 1.24+).
func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// newUUID returns a random (version 4) UUID string.
func newUUID() string {
	b := randomBytes(16)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Errors kept for compatibility with the original SDK. This package never
// returns them: the language is fixed by the constructor, random names cannot
// fail, and an API key is optional.
var (
	// ErrLanguageMustBeSpecified is never returned.
	ErrLanguageMustBeSpecified = errors.New("language must be specified")
	// ErrFailedToGenerateRandomName is never returned.
	ErrFailedToGenerateRandomName = errors.New("failed to generate random name")
	// ErrAPIKeyMustBeSpecified is never returned: a missing key is allowed.
	ErrAPIKeyMustBeSpecified = errors.New("API key must be specified either via WithApiKey() or MSB_API_KEY environment variable")
)
