// Package auth owns Warren's API keys: issuing and verifying
// microsandbox-compatible keys, loading or creating the server's signing
// secret on disk, and extracting a key from HTTP request headers.
//
// A key is the string "msb_" followed by a compact HS256 JWT
// (RFC 7519) signed with the server secret. Its claims are
//
//	exp        expiry, unix seconds (required)
//	iat        issue time, unix seconds (optional when verifying)
//	namespace  the namespace the key may act in; "*" means all (required)
//	jti        Warren's key id, used for revocation (optional)
//
// Keys minted by microsandbox's own server with the same secret carry no
// jti; they verify with an empty Claims.ID.
//
// Signer deals in cryptographic validity only. Keys adds the server's
// record of the keys it issued (the api_keys table), where revocation is
// kept: Keys.Verify accepts a key only if it is valid and not revoked.
// Mapping errors to a transport status is the caller's job.
package auth
