package warren

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Error kinds: the closed set the server reports in error.data.kind.
const (
	KindParseError     = "parse_error"      // body is not JSON (400)
	KindInvalidRequest = "invalid_request"  // not a JSON-RPC 2.0 request (400)
	KindMethodNotFound = "method_not_found" // no such method (404)
	KindInvalidParams  = "invalid_params"   // missing, mistyped, unknown or out-of-range params (400)
	KindUnauthorized   = "unauthorized"     // no key, or malformed, expired or revoked (401)
	KindForbidden      = "forbidden"        // the key may not touch this namespace or method (403)
	KindNotFound       = "not_found"        // no such sandbox, process, file, image or key (404)
	KindConflict       = "conflict"         // wrong state: name in use, not running, ... (409)
	KindTooLarge       = "too_large"        // body, file or output over its limit (413)
	KindLimit          = "limit"            // a count limit (429)
	KindTimeout        = "timeout"          // ran past its timeout (504)
	KindExecFailed     = "exec_failed"      // the command could not be started (422)
	KindUnavailable    = "unavailable"      // the server is shutting down, or cannot run an isolation tier (503)
	KindUnsupported    = "unsupported"      // the server or its backend cannot do this, e.g. pause (501)
	KindInternal       = "internal"         // a bug or a host failure (500)
)

// codeKinds maps JSON-RPC codes to kinds, for answers without data.kind.
var codeKinds = map[int]string{
	-32700: KindParseError,
	-32600: KindInvalidRequest,
	-32601: KindMethodNotFound,
	-32602: KindInvalidParams,
	-32001: KindUnauthorized,
	-32002: KindForbidden,
	-32003: KindNotFound,
	-32004: KindConflict,
	-32005: KindTooLarge,
	-32006: KindLimit,
	-32007: KindTimeout,
	-32008: KindExecFailed,
	-32009: KindUnavailable,
	-32010: KindUnsupported,
	-32603: KindInternal,
}

// statusKinds maps HTTP statuses to kinds, for answers with no error object
// (a proxy's error page, say). Ambiguous statuses (400, 404) are left out.
var statusKinds = map[int]string{
	http.StatusUnauthorized:          KindUnauthorized,
	http.StatusForbidden:             KindForbidden,
	http.StatusConflict:              KindConflict,
	http.StatusRequestEntityTooLarge: KindTooLarge,
	http.StatusTooManyRequests:       KindLimit,
	http.StatusGatewayTimeout:        KindTimeout,
	http.StatusUnprocessableEntity:   KindExecFailed,
	http.StatusServiceUnavailable:    KindUnavailable,
	http.StatusNotImplemented:        KindUnsupported,
	http.StatusInternalServerError:   KindInternal,
}

// Error is a failure reported by the server. Error returns the server's
// message.
type Error struct {
	Kind       string         // one of the Kind* constants; "" if unknown
	Message    string         // the server's message
	HTTPStatus int            // HTTP status of the answer
	Code       int            // JSON-RPC error code; 0 if the answer had none
	Data       map[string]any // error.data as sent (kind, sandbox, state, limit, ...)
}

// Error returns the server's message.
func (e *Error) Error() string { return e.Message }

// KindOf returns the Kind of the [*Error] in err's chain, or "" if there is
// none.
func KindOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return ""
}

// IsNotFound reports whether err is a server error of kind not_found.
func IsNotFound(err error) bool { return KindOf(err) == KindNotFound }

// IsConflict reports whether err is a server error of kind conflict.
func IsConflict(err error) bool { return KindOf(err) == KindConflict }

// IsInvalidParams reports whether err is a server error of kind invalid_params.
func IsInvalidParams(err error) bool { return KindOf(err) == KindInvalidParams }

// IsUnauthorized reports whether err is a server error of kind unauthorized.
func IsUnauthorized(err error) bool { return KindOf(err) == KindUnauthorized }

// IsForbidden reports whether err is a server error of kind forbidden.
func IsForbidden(err error) bool { return KindOf(err) == KindForbidden }

// IsTooLarge reports whether err is a server error of kind too_large.
func IsTooLarge(err error) bool { return KindOf(err) == KindTooLarge }

// IsLimit reports whether err is a server error of kind limit.
func IsLimit(err error) bool { return KindOf(err) == KindLimit }

// IsTimeout reports whether err is a server error of kind timeout.
func IsTimeout(err error) bool { return KindOf(err) == KindTimeout }

// IsExecFailed reports whether err is a server error of kind exec_failed.
func IsExecFailed(err error) bool { return KindOf(err) == KindExecFailed }

// IsUnavailable reports whether err is a server error of kind unavailable.
func IsUnavailable(err error) bool { return KindOf(err) == KindUnavailable }

// IsUnsupported reports whether err is a server error of kind unsupported.
func IsUnsupported(err error) bool { return KindOf(err) == KindUnsupported }

// IsInternal reports whether err is a server error of kind internal.
func IsInternal(err error) bool { return KindOf(err) == KindInternal }

type rpcErrorObject struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data"`
}

func (o *rpcErrorObject) toError(status int) *Error {
	e := &Error{Code: o.Code, Message: o.Message, HTTPStatus: status}
	if len(o.Data) > 0 {
		var data map[string]any
		if json.Unmarshal(o.Data, &data) == nil {
			e.Data = data
			if k, ok := data["kind"].(string); ok {
				e.Kind = k
			}
		}
	}
	if e.Kind == "" {
		e.Kind = codeKinds[o.Code]
	}
	if e.Kind == "" {
		e.Kind = statusKinds[status]
	}
	if e.Message == "" {
		e.Message = fmt.Sprintf("server answered HTTP %d with no message", status)
	}
	return e
}

// responseError turns a non-200 answer into an [*Error], using its JSON-RPC
// error object when it has one.
func responseError(resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var body struct {
		Error *rpcErrorObject `json:"error"`
	}
	if json.Unmarshal(raw, &body) == nil && body.Error != nil {
		return body.Error.toError(resp.StatusCode)
	}
	msg := strings.TrimSpace(string(raw))
	if len(msg) > 512 {
		msg = msg[:512] + "..."
	}
	if msg == "" {
		msg = "(empty body)"
	}
	return &Error{
		Kind:       statusKinds[resp.StatusCode],
		Message:    fmt.Sprintf("server answered HTTP %d: %s", resp.StatusCode, msg),
		HTTPStatus: resp.StatusCode,
	}
}
