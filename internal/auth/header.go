package auth

import (
	"net/http"
	"strings"
)

// FromHeader extracts an API key from the Authorization header, or, when
// that is absent or blank, from Proxy-Authorization. The value may be
// "Bearer <key>" (scheme case-insensitive) or the bare key. Any other scheme,
// or an empty key, yields ok=false.
func FromHeader(h http.Header) (key string, ok bool) {
	for _, name := range [...]string{"Authorization", "Proxy-Authorization"} {
		v := strings.TrimSpace(h.Get(name))
		if v == "" {
			continue
		}
		i := strings.IndexAny(v, " \t")
		if i < 0 {
			// A bare key; "Bearer" alone is a scheme with no credentials.
			if strings.EqualFold(v, "Bearer") {
				return "", false
			}
			return v, true
		}
		if !strings.EqualFold(v[:i], "Bearer") {
			return "", false
		}
		rest := strings.TrimSpace(v[i:])
		if rest == "" || strings.ContainsAny(rest, " \t") {
			return "", false
		}
		return rest, true
	}
	return "", false
}
