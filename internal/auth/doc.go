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
// The package deals in cryptographic validity only. Revocation (looking
// Claims.ID up in a store) and mapping ErrInvalid/ErrExpired to a transport
// status are the caller's job.
package auth
