package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/warren-sandbox/warren/internal/agent"
	"github.com/warren-sandbox/warren/internal/errdefs"
)

// Envelope-level kinds (the rest are errdefs').
var (
	errParse          = errors.New("parse_error")
	errInvalidRequest = errors.New("invalid_request")
	errMethodNotFound = errors.New("method_not_found")
	errInvalidParams  = errdefs.ErrInvalid
)

// kindWire maps every kind to its HTTP status and JSON-RPC code. This
// table is the only place either is decided.
var kindWire = map[string]struct {
	status int
	code   int
}{
	"parse_error":      {http.StatusBadRequest, -32700},
	"invalid_request":  {http.StatusBadRequest, -32600},
	"method_not_found": {http.StatusNotFound, -32601},
	"invalid_params":   {http.StatusBadRequest, -32602},
	"unauthorized":     {http.StatusUnauthorized, -32001},
	"forbidden":        {http.StatusForbidden, -32002},
	"not_found":        {http.StatusNotFound, -32003},
	"conflict":         {http.StatusConflict, -32004},
	"too_large":        {http.StatusRequestEntityTooLarge, -32005},
	"limit":            {http.StatusTooManyRequests, -32006},
	"timeout":          {http.StatusGatewayTimeout, -32007},
	"exec_failed":      {http.StatusUnprocessableEntity, -32008},
	"unavailable":      {http.StatusServiceUnavailable, -32009},
	"unsupported":      {http.StatusNotImplemented, -32010},
	errdefs.Internal:   {http.StatusInternalServerError, -32603},
}

func kindOf(err error) string {
	for _, k := range []error{errParse, errInvalidRequest, errMethodNotFound} {
		if errors.Is(err, k) {
			return k.Error()
		}
	}
	return errdefs.Kind(err)
}

type errorObject struct {
	Code    int            `json:"code"`
	Message string         `json:"message"`
	Data    map[string]any `json:"data"`
}

// toErrorObject is the one mapping of errors to the wire.
func toErrorObject(err error) (*errorObject, int) {
	kind := kindOf(err)
	w, ok := kindWire[kind]
	if !ok {
		kind, w = errdefs.Internal, kindWire[errdefs.Internal]
	}
	obj := &errorObject{Code: w.code, Message: err.Error(), Data: map[string]any{"kind": kind}}
	if c := causeOf(err); c != "" {
		obj.Data["cause"] = c
	}
	return obj, w.status
}

// causeOf is why the agent could not start a program (wire.Cause*), or ""
// for every other error: the kind stays not_found, as clients expect.
func causeOf(err error) string {
	var ae *agent.Error
	if errors.As(err, &ae) {
		return ae.Cause
	}
	return ""
}

// writeError answers with err; status 0 means the kind's status.
func (s *Server) writeError(w http.ResponseWriter, ctx context.Context, id json.RawMessage, err error, status int) {
	auditHTTPError(ctx, err)
	obj, st := toErrorObject(err)
	if status == 0 {
		status = st
	}
	if id == nil {
		id = nullID
	}
	obj.Data["request_id"] = requestID(ctx)
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="warren"`)
	}
	s.m.errors(obj.Data["kind"].(string))
	writeJSON(w, status, response{JSONRPC: "2.0", Error: obj, ID: id})
}

// jsonMessage turns a decoding error into words about the request.
func jsonMessage(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		field := te.Field
		if field == "" {
			field = "value"
		}
		return fmt.Sprintf("%q must be %s, not %s", field, jsonType(te.Type.Kind().String()), te.Value)
	}
	msg := err.Error()
	return strings.TrimPrefix(msg, "json: ")
}

func jsonType(k string) string {
	switch k {
	case "string":
		return "a string"
	case "int", "int64", "int32", "uint16", "uint32", "float64", "float32":
		return "a number"
	case "bool":
		return "true or false"
	case "slice":
		return "an array"
	case "map", "struct":
		return "an object"
	}
	return k
}
