package msb

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// JSON-RPC methods of the microsandbox protocol.
const (
	methodSandboxStart      = "sandbox.start"
	methodSandboxStop       = "sandbox.stop"
	methodSandboxReplRun    = "sandbox.repl.run"
	methodSandboxCommandRun = "sandbox.command.run"
	methodSandboxMetricsGet = "sandbox.metrics.get"
)

const rpcRoute = "/api/v1/rpc"

// maxResponse bounds how much of a response body is read.
const maxResponse = 128 << 20

// RPCError is a failure reported by the server: an HTTP status other than
// 200, or a JSON-RPC error object. Error returns the server's message.
//
// errors.Is(err, ErrRPCCall) holds for every RPCError, and
// errors.Is(err, ErrRequestFailed) for those with a non-200 status.
type RPCError struct {
	Code       int    // JSON-RPC error code (for example -32003); 0 if the body had none
	Message    string // the server's message
	Kind       string // error.data.kind (for example "not_found"); empty if absent
	HTTPStatus int    // HTTP status of the response
}

// Error returns the server's message.
func (e *RPCError) Error() string { return e.Message }

// Is makes errors.Is match [ErrRPCCall], and [ErrRequestFailed] for a non-200
// status.
func (e *RPCError) Is(target error) bool {
	switch target {
	case ErrRPCCall:
		return true
	case ErrRequestFailed:
		return e.HTTPStatus != http.StatusOK
	}
	return false
}

// Transport and protocol errors. Failures reported by the server are
// [*RPCError]s, which match ErrRPCCall (and ErrRequestFailed for a non-200
// status) under errors.Is.
var (
	// ErrMarshalReqFailed: the request could not be encoded.
	ErrMarshalReqFailed = errors.New("failed to marshal request")
	// ErrCreateRequestFailed: the HTTP request could not be built (bad URL).
	ErrCreateRequestFailed = errors.New("failed to create request")
	// ErrSendRequestFailed: the server could not be reached.
	ErrSendRequestFailed = errors.New("failed to send request")
	// ErrResponseBodyCloseFailed is kept for compatibility; never returned.
	ErrResponseBodyCloseFailed = errors.New("failed to close response body")
	// ErrReadResponseFailed: the response body could not be read.
	ErrReadResponseFailed = errors.New("failed to read response")
	// ErrUnmarshalRespFailed: a 200 response was not a JSON-RPC response.
	ErrUnmarshalRespFailed = errors.New("failed to unmarshal response")
	// ErrUnmarshalMetricsFailed: the metrics result had an unexpected shape.
	ErrUnmarshalMetricsFailed = errors.New("failed to unmarshal metrics result")
	// ErrRequestFailed matches an [*RPCError] whose HTTP status was not 200.
	ErrRequestFailed = errors.New("request failed")
	// ErrRPCCall matches every [*RPCError].
	ErrRPCCall = errors.New("RPC error")
)

type rpcRequest struct {
	JSONRPC string `json:"jsonrpc"`
	Method  string `json:"method"`
	Params  any    `json:"params"`
	ID      string `json:"id"`
}

type rpcResponse struct {
	Result json.RawMessage `json:"result"`
	Error  *rpcErrorObject `json:"error"`
}

type rpcErrorObject struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data"`
}

func (o *rpcErrorObject) toError(status int) *RPCError {
	e := &RPCError{Code: o.Code, Message: o.Message, HTTPStatus: status}
	var data struct {
		Kind string `json:"kind"`
	}
	if len(o.Data) > 0 && json.Unmarshal(o.Data, &data) == nil {
		e.Kind = data.Kind
	}
	if e.Message == "" {
		e.Message = fmt.Sprintf("server answered HTTP %d with no message", status)
	}
	return e
}

// Request parameters. Namespace is omitted when empty: generation B clients
// send none.
type (
	startParams struct {
		Sandbox   string      `json:"sandbox"`
		Namespace string      `json:"namespace,omitempty"`
		Config    startConfig `json:"config"`
	}
	startConfig struct {
		Image     string            `json:"image,omitempty"`
		Memory    int               `json:"memory"`
		CPUs      int               `json:"cpus"`
		Volumes   []string          `json:"volumes,omitempty"`
		Ports     []string          `json:"ports,omitempty"`
		Envs      []string          `json:"envs,omitempty"`
		DependsOn []string          `json:"depends_on,omitempty"`
		Workdir   string            `json:"workdir,omitempty"`
		Shell     string            `json:"shell,omitempty"`
		Scripts   map[string]string `json:"scripts,omitempty"`
		Exec      string            `json:"exec,omitempty"`
	}
	sandboxParams struct {
		Sandbox   string `json:"sandbox"`
		Namespace string `json:"namespace,omitempty"`
	}
	replRunParams struct {
		Sandbox   string  `json:"sandbox"`
		Namespace string  `json:"namespace,omitempty"`
		Language  string  `json:"language"`
		Code      string  `json:"code"`
		Timeout   float64 `json:"timeout,omitempty"`
	}
	commandRunParams struct {
		Sandbox   string   `json:"sandbox"`
		Namespace string   `json:"namespace,omitempty"`
		Command   string   `json:"command"`
		Args      []string `json:"args"` // a nil slice is sent as null, as the original SDK does
		Timeout   float64  `json:"timeout,omitempty"`
	}
)

type metricsResult struct {
	Sandboxes []sandboxMetrics `json:"sandboxes"`
}

type sandboxMetrics struct {
	Name        string   `json:"name"`
	Namespace   string   `json:"namespace"`
	Running     bool     `json:"running"`
	CPUUsage    *float64 `json:"cpu_usage"`
	MemoryUsage *float64 `json:"memory_usage"`
	DiskUsage   *float64 `json:"disk_usage"`
}

// rpcClient sends JSON-RPC requests over HTTP.
type rpcClient struct {
	hc *http.Client
}

func seconds(d time.Duration) float64 { return d.Seconds() }

// call sends one request and returns the result of a successful answer.
func (c *rpcClient) call(ctx context.Context, cfg *config, method string, params any) (json.RawMessage, error) {
	log := cfg.logger
	req := rpcRequest{JSONRPC: "2.0", Method: method, Params: params, ID: cfg.reqIDPrd()}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMarshalReqFailed, err)
	}
	url := strings.TrimRight(cfg.serverUrl, "/") + rpcRoute
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCreateRequestFailed, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/json")
	if cfg.apiKey != "" {
		hreq.Header.Set("Authorization", "Bearer "+cfg.apiKey)
	}
	log.Debug("sending JSON-RPC request", "method", method, "id", req.ID)
	resp, err := c.hc.Do(hreq)
	if err != nil {
		log.Error("JSON-RPC request failed", "method", method, "id", req.ID, "error", err)
		return nil, fmt.Errorf("%w: %w", ErrSendRequestFailed, err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrReadResponseFailed, err)
	}
	var out rpcResponse
	decodeErr := json.Unmarshal(raw, &out)
	if resp.StatusCode != http.StatusOK {
		var e *RPCError
		if decodeErr == nil && out.Error != nil {
			e = out.Error.toError(resp.StatusCode)
		} else {
			e = &RPCError{HTTPStatus: resp.StatusCode, Message: fmt.Sprintf("server answered HTTP %d: %s", resp.StatusCode, snippet(raw))}
		}
		log.Error("JSON-RPC call failed", "method", method, "id", req.ID, "status", resp.StatusCode, "error", e.Message)
		return nil, e
	}
	if decodeErr != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnmarshalRespFailed, decodeErr)
	}
	if out.Error != nil {
		e := out.Error.toError(resp.StatusCode)
		log.Error("JSON-RPC call failed", "method", method, "id", req.ID, "error", e.Message)
		return nil, e
	}
	log.Debug("JSON-RPC request succeeded", "method", method, "id", req.ID)
	return out.Result, nil
}

// snippet returns the start of a body for an error message.
func snippet(b []byte) string {
	const max = 512
	s := strings.TrimSpace(string(b))
	if len(s) > max {
		s = s[:max] + "..."
	}
	if s == "" {
		s = "(empty body)"
	}
	return s
}

func (c *rpcClient) startSandbox(ctx context.Context, cfg *config, sc startConfig) error {
	cfg.logger.Info("starting sandbox", "name", cfg.name, "image", sc.Image, "memory", sc.Memory, "cpus", sc.CPUs)
	_, err := c.call(ctx, cfg, methodSandboxStart, startParams{Sandbox: cfg.name, Namespace: cfg.namespace, Config: sc})
	return err
}

func (c *rpcClient) stopSandbox(ctx context.Context, cfg *config) error {
	cfg.logger.Info("stopping sandbox", "name", cfg.name)
	_, err := c.call(ctx, cfg, methodSandboxStop, sandboxParams{Sandbox: cfg.name, Namespace: cfg.namespace})
	return err
}

func (c *rpcClient) runRepl(ctx context.Context, cfg *config, lang progLang, code string) (json.RawMessage, error) {
	return c.call(ctx, cfg, methodSandboxReplRun, replRunParams{
		Sandbox:   cfg.name,
		Namespace: cfg.namespace,
		Language:  lang.String(),
		Code:      code,
		Timeout:   seconds(cfg.timeout),
	})
}

func (c *rpcClient) runCommand(ctx context.Context, cfg *config, command string, args []string) (json.RawMessage, error) {
	return c.call(ctx, cfg, methodSandboxCommandRun, commandRunParams{
		Sandbox:   cfg.name,
		Namespace: cfg.namespace,
		Command:   command,
		Args:      args,
		Timeout:   seconds(cfg.timeout),
	})
}

func (c *rpcClient) getMetrics(ctx context.Context, cfg *config) (sandboxMetrics, error) {
	raw, err := c.call(ctx, cfg, methodSandboxMetricsGet, sandboxParams{Sandbox: cfg.name, Namespace: cfg.namespace})
	if err != nil {
		return sandboxMetrics{}, err
	}
	var res metricsResult
	if err := json.Unmarshal(raw, &res); err != nil {
		return sandboxMetrics{}, fmt.Errorf("%w: %w", ErrUnmarshalMetricsFailed, err)
	}
	if len(res.Sandboxes) == 0 {
		// The server knows no such sandbox: report it as not running.
		return sandboxMetrics{Name: cfg.name}, nil
	}
	return res.Sandboxes[0], nil
}
