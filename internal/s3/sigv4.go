package s3

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"
)

// AWS Signature Version 4, header form
// (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_sigv-create-signed-request.html).

const (
	algorithm = "AWS4-HMAC-SHA256"
	// unsignedPayload is the payload hash of a streamed body: S3 accepts
	// it in place of the body's SHA-256, so a file is read once.
	unsignedPayload = "UNSIGNED-PAYLOAD"
	emptySHA256     = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
)

// signer signs requests for one service in one region.
type signer struct {
	accessKey, secretKey string
	region, service      string
}

// sign sets the request's X-Amz-Date and Authorization headers. The
// request's URL path and query must be on the wire as uriEncode writes
// them (request does so); payloadHash is the body's hex SHA-256 or
// unsignedPayload.
func (s signer) sign(req *http.Request, payloadHash string, now time.Time) {
	amzDate := now.UTC().Format("20060102T150405Z")
	req.Header.Set("X-Amz-Date", amzDate)
	scope := amzDate[:8] + "/" + s.region + "/" + s.service + "/aws4_request"
	creq, signed := canonicalRequest(req, payloadHash)
	sts := stringToSign(amzDate, scope, creq)
	key := hmacSHA256([]byte("AWS4"+s.secretKey), amzDate[:8])
	key = hmacSHA256(key, s.region)
	key = hmacSHA256(key, s.service)
	key = hmacSHA256(key, "aws4_request")
	sig := hex.EncodeToString(hmacSHA256(key, sts))
	req.Header.Set("Authorization", algorithm+" Credential="+s.accessKey+"/"+scope+
		", SignedHeaders="+signed+", Signature="+sig)
}

func stringToSign(amzDate, scope, creq string) string {
	return algorithm + "\n" + amzDate + "\n" + scope + "\n" + sha256Hex([]byte(creq))
}

func sha256Hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// canonicalRequest returns the canonical request and its signed headers:
// the host, and those of the request's headers a proxy cannot change
// without breaking the request (content type, range, x-amz-*).
func canonicalRequest(req *http.Request, payloadHash string) (creq, signedHeaders string) {
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	vals := map[string]string{"host": strings.TrimSpace(host)}
	for k, vs := range req.Header {
		lk := strings.ToLower(k)
		if lk == "content-type" || lk == "content-md5" || lk == "range" || strings.HasPrefix(lk, "x-amz-") {
			tv := make([]string, len(vs))
			for i, v := range vs {
				tv[i] = strings.Join(strings.Fields(v), " ") // trimmed, inner runs of spaces to one
			}
			vals[lk] = strings.Join(tv, ",")
		}
	}
	names := make([]string, 0, len(vals))
	for k := range vals {
		names = append(names, k)
	}
	sort.Strings(names)
	var hdrs strings.Builder
	for _, k := range names {
		hdrs.WriteString(k + ":" + vals[k] + "\n")
	}
	signedHeaders = strings.Join(names, ";")
	path := req.URL.Path
	if path == "" {
		path = "/"
	}
	creq = req.Method + "\n" + uriEncode(path, false) + "\n" + canonicalQuery(req.URL.RawQuery) + "\n" +
		hdrs.String() + "\n" + signedHeaders + "\n" + payloadHash
	return creq, signedHeaders
}

// canonicalQuery sorts the query's parameters by name, then value, each
// URI-encoded.
func canonicalQuery(raw string) string {
	q, _ := url.ParseQuery(raw)
	return encodeQuery(q)
}

// encodeQuery writes a query as canonicalQuery does, so that what is
// sent is what is signed.
func encodeQuery(q url.Values) string {
	var ps []string
	for k, vs := range q {
		for _, v := range vs {
			ps = append(ps, uriEncode(k, true)+"="+uriEncode(v, true))
		}
	}
	sort.Strings(ps)
	return strings.Join(ps, "&")
}

// uriEncode percent-encodes every byte but the unreserved characters
// (A-Z a-z 0-9 - _ . ~), and '/' unless slash.
func uriEncode(s string, slash bool) string {
	const hexd = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' ||
			c == '-' || c == '_' || c == '.' || c == '~' || (c == '/' && !slash) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexd[c>>4])
		b.WriteByte(hexd[c&15])
	}
	return b.String()
}

func hmacSHA256(key []byte, data string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(data))
	return m.Sum(nil)
}
