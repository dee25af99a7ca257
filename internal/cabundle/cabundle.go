// Package cabundle is where a sandbox's system trust store is and how a
// CA of Warren's is put in it (proxy-mode secrets, internal/secrets): the
// host and the agent, which installs it at the sandbox's start, share it.
// It depends on nothing, so that the agent links nothing more.
package cabundle

import "strings"

// Path is where a sandbox with proxy-mode secrets finds a trust store
// holding the image's CAs and its own (SSL_CERT_FILE and the like name
// it).
const Path = "/etc/ssl/certs/ca-certificates.crt"

// Sources are where images keep their system trust store, in the order
// looked for (Debian, Ubuntu, Alpine; Fedora, RHEL; others).
var Sources = []string{Path, "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"}

// MaxBundle bounds the image's trust store that is read (a hostile
// image's "bundle" may be anything).
const MaxBundle = 16 << 20

// Markers of the CA's block in a sandbox's system bundle, so the next
// start replaces it rather than adding another.
const (
	Begin = "# BEGIN warren sandbox CA (replaced at every start)\n"
	End   = "# END warren sandbox CA\n"
)

// Append returns bundle (a PEM trust store, the image's) with the CA's
// certificate at its end, in place of a block a former start added. The
// bundle's own certificates are kept byte for byte.
func Append(bundle, caPEM []byte) []byte {
	s := string(bundle)
	if i := strings.Index(s, Begin); i >= 0 {
		rest := s[i:]
		if j := strings.Index(rest, End); j >= 0 {
			s = s[:i] + rest[j+len(End):]
		} else {
			s = s[:i]
		}
	}
	if s != "" && !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	return []byte(s + Begin + string(caPEM) + End)
}
