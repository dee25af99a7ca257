// Package s3 is a small client of the S3 API: the six calls the S3
// workspace store makes (bucket exists/make, put, get, remove, list), with
// path-style URLs and Signature V4. It replaces a general SDK whose
// packages' initialisation took a quarter of every warren command's start.
package s3

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode"
)

// Bounds on what a server sends back.
const (
	// maxErrorBody bounds an error's XML body read.
	maxErrorBody = 64 << 10
	// maxListBody bounds one page of a listing: 1000 keys of S3's
	// largest (1024 bytes), escaped, with their other fields.
	maxListBody = 16 << 20
	// maxKeyLen is S3's limit on a key's length.
	maxKeyLen = 1024
	// maxPageKeys is the keys a page is asked for, and the most it may hold.
	maxPageKeys = 1000
	// maxEmptyPages bounds the pages in a row without a key a listing
	// follows (a server paging forever).
	maxEmptyPages = 100
	// maxMessage bounds the server's error message kept in an Error.
	maxMessage = 512
)

// Client is a client of one S3 server. Its methods are safe for
// concurrent use.
type Client struct {
	endpoint *url.URL // scheme and host
	sig      signer
	hc       *http.Client
	now      func() time.Time
}

// New returns a client of the server at endpoint (http(s)://host[:port])
// in region ("" is us-east-1).
func New(endpoint, region, accessKey, secretKey string) (*Client, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return nil, fmt.Errorf("s3 endpoint %q: want http(s)://host[:port]", endpoint)
	}
	if region == "" {
		region = "us-east-1"
	}
	// No whole-request timeout: a download lasts as long as the file
	// needs (callers' contexts bound it); each step before it is bounded.
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 60 * time.Second,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   8,
	}
	return &Client{
		endpoint: &url.URL{Scheme: u.Scheme, Host: u.Host},
		sig:      signer{accessKey: accessKey, secretKey: secretKey, region: region, service: "s3"},
		hc:       &http.Client{Transport: tr, CheckRedirect: noRedirect},
		now:      time.Now,
	}, nil
}

// noRedirect: a redirect would be followed unsigned; S3 errors instead.
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// Error is an S3 error response.
type Error struct {
	Status  int    // HTTP status
	Code    string // S3's error code (NoSuchKey, AccessDenied...), or the HTTP status text
	Message string // the server's message, bounded and printable
}

func (e *Error) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("%s (HTTP %d)", e.Code, e.Status)
	}
	return fmt.Sprintf("%s (HTTP %d): %s", e.Code, e.Status, e.Message)
}

// Object is one entry of a listing.
type Object struct {
	Key  string
	ETag string // without its quotes
	Size int64
}

// request sends a signed request for bucket[/key] and returns the
// response when its status is 2xx, else the server's error.
func (c *Client) request(ctx context.Context, method, bucket, key string, q url.Values, body io.Reader, size int64, payloadHash string, hdr http.Header) (*http.Response, error) {
	p := "/" + bucket
	if key != "" {
		p += "/" + key
	}
	u := *c.endpoint
	u.Path = p
	u.RawPath = uriEncode(p, false) // on the wire as signed
	u.RawQuery = encodeQuery(q)
	if body == nil || size == 0 {
		body = http.NoBody
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return nil, err
	}
	req.ContentLength = size
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	req.Header.Set("User-Agent", "warren")
	req.Header.Set("X-Amz-Content-Sha256", payloadHash)
	c.sig.sign(req, payloadHash, c.now())
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer func() { _ = resp.Body.Close() }()
	return nil, readError(resp)
}

// readError reads an S3 error from a response: its XML body's code and
// message (nothing else of it: some carry the request as signed).
func readError(resp *http.Response) error {
	e := &Error{Status: resp.StatusCode, Code: http.StatusText(resp.StatusCode)}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var x struct {
		Code    string
		Message string
	}
	if xml.Unmarshal(b, &x) == nil && x.Code != "" {
		e.Code = printable(x.Code, 64)
		e.Message = printable(x.Message, maxMessage)
	}
	return e
}

// printable is s cut to n bytes, without control characters.
func printable(s string, n int) string {
	if len(s) > n {
		s = s[:n] + "..."
	}
	return strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return -1
		}
		return r
	}, s)
}

// drain discards the rest of a body (bounded) so that its connection is
// reused, and closes it.
func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
}

// BucketExists reports whether the bucket exists (and is readable).
func (c *Client) BucketExists(ctx context.Context, bucket string) (bool, error) {
	resp, err := c.request(ctx, http.MethodHead, bucket, "", nil, nil, 0, emptySHA256, nil)
	var e *Error
	if errors.As(err, &e) && e.Status == http.StatusNotFound {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	drain(resp)
	return true, nil
}

// MakeBucket creates the bucket in the client's region.
func (c *Client) MakeBucket(ctx context.Context, bucket string) error {
	var body []byte
	if c.sig.region != "us-east-1" {
		body = []byte(`<CreateBucketConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><LocationConstraint>` +
			xmlEscape(c.sig.region) + `</LocationConstraint></CreateBucketConfiguration>`)
	}
	resp, err := c.request(ctx, http.MethodPut, bucket, "", nil, bytes.NewReader(body), int64(len(body)), sha256Hex(body), nil)
	if err != nil {
		return err
	}
	drain(resp)
	return nil
}

func xmlEscape(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

// PutObject uploads size bytes of body as the object and returns its ETag.
// The body is streamed, unsigned (its hash would need a second read).
func (c *Client) PutObject(ctx context.Context, bucket, key string, body io.Reader, size int64, contentType string) (string, error) {
	if key == "" {
		return "", errors.New("s3: empty key")
	}
	h := http.Header{}
	if contentType != "" {
		h.Set("Content-Type", contentType)
	}
	resp, err := c.request(ctx, http.MethodPut, bucket, key, nil, body, size, unsignedPayload, h)
	if err != nil {
		return "", err
	}
	drain(resp)
	return unquote(resp.Header.Get("ETag")), nil
}

// GetObject returns the object's content; the caller closes it.
func (c *Client) GetObject(ctx context.Context, bucket, key string) (io.ReadCloser, error) {
	if key == "" {
		return nil, errors.New("s3: empty key")
	}
	resp, err := c.request(ctx, http.MethodGet, bucket, key, nil, nil, 0, emptySHA256, nil)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// RemoveObject deletes the object (none is no error, as in S3).
func (c *Client) RemoveObject(ctx context.Context, bucket, key string) error {
	if key == "" {
		return errors.New("s3: empty key")
	}
	resp, err := c.request(ctx, http.MethodDelete, bucket, key, nil, nil, 0, emptySHA256, nil)
	if err != nil {
		return err
	}
	drain(resp)
	return nil
}

// ListObjects calls fn for each object whose key starts with prefix, all
// levels down, in key order, at most limit of them (more is an error).
// An error from fn stops the listing and is returned.
func (c *Client) ListObjects(ctx context.Context, bucket, prefix string, limit int, fn func(Object) error) error {
	token, n, empty := "", 0, 0
	for {
		q := url.Values{"list-type": {"2"}, "prefix": {prefix}, "max-keys": {fmt.Sprint(maxPageKeys)}}
		if token != "" {
			q.Set("continuation-token", token)
		}
		resp, err := c.request(ctx, http.MethodGet, bucket, "", q, nil, 0, emptySHA256, nil)
		if err != nil {
			return err
		}
		page, err := decodeList(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return fmt.Errorf("s3: listing of %s: %w", bucket, err)
		}
		for _, o := range page.Objects {
			if n++; n > limit {
				return fmt.Errorf("s3: listing of %s: more than %d objects", bucket, limit)
			}
			if err := fn(o); err != nil {
				return err
			}
		}
		if !page.Truncated {
			return nil
		}
		if len(page.Objects) == 0 {
			if empty++; empty > maxEmptyPages {
				return fmt.Errorf("s3: listing of %s: more than %d empty pages in a row", bucket, maxEmptyPages)
			}
		} else {
			empty = 0
		}
		if page.Next == "" || page.Next == token {
			return fmt.Errorf("s3: listing of %s: truncated page without a new continuation token", bucket)
		}
		token = page.Next
	}
}

// listPage is one page of a ListObjectsV2 response.
type listPage struct {
	Truncated bool
	Next      string
	Objects   []Object
}

// decodeList reads one ListObjectsV2 page, bounded: the body's size, the
// keys per page, each key's length.
func decodeList(r io.Reader) (listPage, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxListBody+1))
	if err != nil {
		return listPage{}, err
	}
	if len(b) > maxListBody {
		return listPage{}, fmt.Errorf("page larger than %d bytes", maxListBody)
	}
	var x struct {
		XMLName               xml.Name `xml:"ListBucketResult"`
		IsTruncated           bool
		NextContinuationToken string
		Contents              []struct {
			Key  string
			ETag string
			Size int64
		}
	}
	if err := xml.Unmarshal(b, &x); err != nil {
		return listPage{}, fmt.Errorf("malformed page: %w", err)
	}
	if len(x.Contents) > maxPageKeys {
		return listPage{}, fmt.Errorf("page of %d keys, more than the %d asked for", len(x.Contents), maxPageKeys)
	}
	if len(x.NextContinuationToken) > maxKeyLen*4 {
		return listPage{}, fmt.Errorf("continuation token longer than %d bytes", maxKeyLen*4)
	}
	p := listPage{Truncated: x.IsTruncated, Next: x.NextContinuationToken, Objects: make([]Object, 0, len(x.Contents))}
	for _, o := range x.Contents {
		if o.Key == "" || len(o.Key) > maxKeyLen {
			return listPage{}, fmt.Errorf("key of %d bytes (want 1 to %d)", len(o.Key), maxKeyLen)
		}
		if o.Size < 0 {
			return listPage{}, fmt.Errorf("object %q of size %d", o.Key, o.Size)
		}
		p.Objects = append(p.Objects, Object{Key: o.Key, ETag: unquote(o.ETag), Size: o.Size})
	}
	return p, nil
}

// unquote strips an ETag's quotes ("abc" and &quot;abc&quot; alike).
func unquote(etag string) string {
	return strings.TrimSuffix(strings.TrimPrefix(etag, `"`), `"`)
}
