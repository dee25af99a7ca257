package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The SigV4 test suite's examples (AWS's "Signature Version 4 test suite",
// credentials AKIDEXAMPLE, region us-east-1, service "service", 2015-08-30
// 12:36:00 UTC), and the S3 documentation's GET Object example
// ("Examples: Signature Calculations in AWS Signature Version 4",
// Authenticating Requests: Using the Authorization Header).
func TestSignV4Vectors(t *testing.T) {
	suite := signer{accessKey: "AKIDEXAMPLE", secretKey: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", region: "us-east-1", service: "service"}
	suiteTime := time.Date(2015, 8, 30, 12, 36, 0, 0, time.UTC)
	for _, tc := range []struct {
		name      string
		s         signer
		at        time.Time
		method    string
		url       string
		headers   map[string]string
		payload   string
		creq, sts string
		auth      string
	}{{
		name: "get-vanilla", s: suite, at: suiteTime, method: "GET", url: "https://example.amazonaws.com/",
		payload: emptySHA256,
		creq: "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" +
			"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		sts: "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n" +
			"bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63",
		auth: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, " +
			"SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
	}, {
		name: "get-vanilla-query-order-key-case", s: suite, at: suiteTime, method: "GET",
		url: "https://example.amazonaws.com/?Param2=value2&Param1=value1", payload: emptySHA256,
		creq: "GET\n/\nParam1=value1&Param2=value2\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" +
			"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		sts: "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n" +
			"816cd5b414d056048ba4f7c5386d6e0533120fb1fcfa93762cf0fc39e2cf19e0",
		auth: "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, " +
			"SignedHeaders=host;x-amz-date, Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500",
	}, {
		name: "s3-get-object",
		s:    signer{accessKey: "AKIAIOSFODNN7EXAMPLE", secretKey: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", region: "us-east-1", service: "s3"},
		at:   time.Date(2013, 5, 24, 0, 0, 0, 0, time.UTC), method: "GET", url: "https://examplebucket.s3.amazonaws.com/test.txt",
		headers: map[string]string{"Range": "bytes=0-9", "X-Amz-Content-Sha256": emptySHA256},
		payload: emptySHA256,
		creq: "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n" +
			"x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\nx-amz-date:20130524T000000Z\n\n" +
			"host;range;x-amz-content-sha256;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		sts: "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n" +
			"7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972",
		auth: "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, " +
			"SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, tc.url, nil)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			tc.s.sign(req, tc.payload, tc.at)
			creq, _ := canonicalRequest(req, tc.payload)
			if creq != tc.creq {
				t.Errorf("canonical request:\n%s\nwant:\n%s", creq, tc.creq)
			}
			scope := tc.at.Format("20060102") + "/" + tc.s.region + "/" + tc.s.service + "/aws4_request"
			if sts := stringToSign(tc.at.Format("20060102T150405Z"), scope, creq); sts != tc.sts {
				t.Errorf("string to sign:\n%s\nwant:\n%s", sts, tc.sts)
			}
			if got := req.Header.Get("Authorization"); got != tc.auth {
				t.Errorf("Authorization:\n%s\nwant:\n%s", got, tc.auth)
			}
		})
	}
}

func TestURIEncode(t *testing.T) {
	for in, want := range map[string]string{
		"/a b/c+d/é~_.-": "/a%20b/c%2Bd/%C3%A9~_.-",
		"k=v&x/y":        "k%3Dv%26x/y",
	} {
		if got := uriEncode(in, false); got != want {
			t.Errorf("uriEncode(%q) = %q, want %q", in, got, want)
		}
	}
	if got := uriEncode("a/b", true); got != "a%2Fb" {
		t.Errorf("uriEncode(a/b, slash) = %q", got)
	}
}

// fake is an S3 server that answers as serve says, after checking each
// request's signature with the client's signer.
func fake(t *testing.T, serve func(r *http.Request) (int, string)) *Client {
	t.Helper()
	var c *Client
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := r.Header.Get("Authorization")
		r.Header.Del("Authorization")
		at, _ := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
		c.sig.sign(r, r.Header.Get("X-Amz-Content-Sha256"), at)
		if want := r.Header.Get("Authorization"); got != want {
			w.WriteHeader(http.StatusForbidden)
			_, _ = io.WriteString(w, "<Error><Code>SignatureDoesNotMatch</Code><Message>bad</Message></Error>")
			return
		}
		status, body := serve(r)
		w.Header().Set("ETag", `"etag of `+r.URL.Path+`"`)
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	var err error
	c, err = New(srv.URL, "", "AKID", "secret")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// lister serves a listing: list answers for a continuation token.
func lister(list func(token string) (int, string)) func(r *http.Request) (int, string) {
	return func(r *http.Request) (int, string) {
		if r.URL.Query().Get("list-type") != "2" {
			return 400, ""
		}
		return list(r.URL.Query().Get("continuation-token"))
	}
}

func page(truncated bool, next string, keys ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "<ListBucketResult><IsTruncated>%v</IsTruncated><NextContinuationToken>%s</NextContinuationToken>", truncated, next)
	for _, k := range keys {
		fmt.Fprintf(&b, "<Contents><Key>%s</Key><ETag>&quot;e-%s&quot;</ETag><Size>3</Size></Contents>", k, k)
	}
	return b.String() + "</ListBucketResult>"
}

func collect(c *Client, limit int) ([]Object, error) {
	var out []Object
	err := c.ListObjects(context.Background(), "b", "", limit, func(o Object) error {
		out = append(out, o)
		return nil
	})
	return out, err
}

func TestListPages(t *testing.T) {
	c := fake(t, lister(func(token string) (int, string) {
		switch token {
		case "":
			return 200, page(true, "t1", "a", "b")
		case "t1":
			return 200, page(false, "", "c")
		}
		return 400, ""
	}))
	got, err := collect(c, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []Object{{"a", "e-a", 3}, {"b", "e-b", 3}, {"c", "e-c", 3}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("listing %v, want %v", got, want)
	}
}

// A hostile server: every kind of bad page ends the listing with an error,
// promptly.
func TestListHostile(t *testing.T) {
	var n atomic.Int64
	for name, tc := range map[string]struct {
		list func(token string) (int, string)
		want string
	}{
		"endless pages": {func(string) (int, string) {
			return 200, page(true, fmt.Sprint(n.Add(1)), fmt.Sprint("k", n.Load()))
		}, "more than 50 objects"},
		"endless empty pages": {func(string) (int, string) { return 200, page(true, fmt.Sprint(n.Add(1))) }, "empty pages"},
		"same token":          {func(string) (int, string) { return 200, page(true, "t", "a") }, "without a new continuation token"},
		"no token":            {func(string) (int, string) { return 200, page(true, "", "a") }, "without a new continuation token"},
		"huge": {func(string) (int, string) {
			return 200, "<ListBucketResult>" + strings.Repeat("<x/>", maxListBody/4+1) + "</ListBucketResult>"
		}, "larger than"},
		"malformed":     {func(string) (int, string) { return 200, "<ListBucketResult><Contents>" }, "malformed"},
		"not a listing": {func(string) (int, string) { return 200, "<Foo/>" }, "malformed"},
		"long key":      {func(string) (int, string) { return 200, page(false, "", strings.Repeat("k", maxKeyLen+1)) }, "key of 1025 bytes"},
		"too many keys": {func(string) (int, string) {
			keys := make([]string, maxPageKeys+1)
			for i := range keys {
				keys[i] = fmt.Sprint(i)
			}
			return 200, page(false, "", keys...)
		}, "more than the 1000"},
		"negative size": {func(string) (int, string) {
			return 200, "<ListBucketResult><Contents><Key>a</Key><Size>-1</Size></Contents></ListBucketResult>"
		}, "size -1"},
		"error": {func(string) (int, string) {
			return 403, "<Error><Code>AccessDenied</Code><Message>no\n way</Message><StringToSign>secret</StringToSign></Error>"
		}, "AccessDenied (HTTP 403): no way"},
	} {
		t.Run(name, func(t *testing.T) {
			c := fake(t, lister(tc.list))
			_, err := collect(c, 50)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one with %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Fatalf("error %v echoes the request as signed", err)
			}
		})
	}
}

// An error from the callback stops the listing.
func TestListStops(t *testing.T) {
	c := fake(t, lister(func(string) (int, string) { return 200, page(true, "t", "a") }))
	stop := errors.New("stop")
	if err := c.ListObjects(context.Background(), "b", "", 10, func(Object) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("error %v, want stop", err)
	}
}

// A signed request with a key that needs encoding reaches the server as
// signed, and the server's XML error is read.
func TestErrorsAndEncoding(t *testing.T) {
	var path string
	c := fake(t, func(r *http.Request) (int, string) {
		path = r.URL.Path
		return 404, "<Error><Code>NoSuchKey</Code><Message>gone</Message></Error>"
	})
	key := "a b/c+d/é?x=1#y%2F"
	_, err := c.GetObject(context.Background(), "b", key)
	var e *Error
	if !errors.As(err, &e) || e.Code != "NoSuchKey" || e.Status != 404 {
		t.Fatalf("error %v, want NoSuchKey", err)
	}
	if path != "/b/"+key {
		t.Fatalf("the server got path %q, want %q", path, "/b/"+key)
	}
	if _, err := c.GetObject(context.Background(), "b", ""); err == nil {
		t.Fatal("an empty key was accepted")
	}
	if _, err := New("ftp://x", "", "a", "b"); err == nil {
		t.Fatal("an ftp endpoint was accepted")
	}
	if _, err := New("http://u:p@x", "", "a", "b"); err == nil {
		t.Fatal("an endpoint with credentials was accepted")
	}
}

func FuzzDecodeList(f *testing.F) {
	f.Add([]byte(page(true, "t", "a", "b")))
	f.Add([]byte("<ListBucketResult><Contents><Key>a</Key><Size>-1</Size></Contents></ListBucketResult>"))
	f.Add([]byte("<ListBucketResult><Contents>"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := decodeList(bytes.NewReader(data))
		if err != nil {
			return
		}
		if len(p.Objects) > maxPageKeys {
			t.Fatalf("%d keys", len(p.Objects))
		}
		for _, o := range p.Objects {
			if o.Key == "" || len(o.Key) > maxKeyLen || o.Size < 0 {
				t.Fatalf("object %+v passed", o)
			}
		}
	})
}

// The object calls: what each sends (method, path, length, payload mode,
// content type) and reads back (the ETag without its quotes, a missing
// bucket as false).
func TestObjectCalls(t *testing.T) {
	var seen []string
	c := fake(t, func(r *http.Request) (int, string) {
		b, _ := io.ReadAll(r.Body)
		seen = append(seen, fmt.Sprintf("%s %s %d %s %s %q", r.Method, r.URL.Path, r.ContentLength,
			r.Header.Get("X-Amz-Content-Sha256"), r.Header.Get("Content-Type"), b))
		switch {
		case r.Method == http.MethodHead && r.URL.Path == "/gone":
			return 404, ""
		case r.Method == http.MethodPut && r.URL.Path == "/b/k":
			return 200, ""
		case r.Method == http.MethodGet:
			return 200, "content"
		}
		return 200, ""
	})
	ctx := context.Background()
	if ok, err := c.BucketExists(ctx, "gone"); ok || err != nil {
		t.Fatalf("missing bucket: %v %v", ok, err)
	}
	if ok, err := c.BucketExists(ctx, "b"); !ok || err != nil {
		t.Fatalf("bucket: %v %v", ok, err)
	}
	if err := c.MakeBucket(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if etag, err := c.PutObject(ctx, "b", "k", strings.NewReader("abc"), 3, "text/plain"); err != nil || etag != "etag of /b/k" {
		t.Fatalf("PutObject: ETag %q, %v", etag, err)
	}
	r, err := c.GetObject(ctx, "b", "k")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(r)
	_ = r.Close()
	if string(got) != "content" {
		t.Fatalf("GetObject read %q", got)
	}
	if err := c.RemoveObject(ctx, "b", "k"); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`HEAD /gone 0 ` + emptySHA256 + `  ""`,
		`HEAD /b 0 ` + emptySHA256 + `  ""`,
		`PUT /b 0 ` + emptySHA256 + `  ""`,
		`PUT /b/k 3 UNSIGNED-PAYLOAD text/plain "abc"`,
		`GET /b/k 0 ` + emptySHA256 + `  ""`,
		`DELETE /b/k 0 ` + emptySHA256 + `  ""`,
	}
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Fatalf("requests:\n%s\nwant:\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
}

func TestUnquoteETag(t *testing.T) {
	for in, want := range map[string]string{`"abc"`: "abc", "abc": "abc", `"abc-2"`: "abc-2", `""`: ""} {
		if got := unquote(in); got != want {
			t.Errorf("unquote(%s) = %q, want %q", in, got, want)
		}
	}
}
