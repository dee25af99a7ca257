// Package sdktest holds helpers the SDK packages' unit tests share.
package sdktest

import (
	"encoding/json"
	"regexp"
	"testing"
)

// RoundTrip turns v into the shape json.Unmarshal gives a map[string]any.
func RoundTrip(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// ClearEnv unsets the variables the clients read, for the test.
func ClearEnv(t *testing.T) {
	t.Setenv("MSB_API_KEY", "")
	t.Setenv("MSB_SERVER_URL", "")
}

// UUIDRE matches a version-4 UUID, the request id the clients send.
var UUIDRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
