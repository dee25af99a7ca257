package fakenet

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
)

// The package the index serves: one pure-Python module.
const (
	pkgName    = "warren-probe"
	pkgModule  = "warren_probe"
	pkgVersion = "1.0"
	// PackageGreeting is what the module's GREETING holds, for a test
	// to check it imported the installed module.
	PackageGreeting = "hello from the fake index"
)

// index is a PEP 503 simple repository with one project.
type index struct {
	wheelName string
	wheel     []byte
	sha256    string
}

// newIndex builds the wheel (PEP 427: the module, and METADATA, WHEEL and
// RECORD in the .dist-info directory).
func newIndex() (*index, error) {
	distInfo := fmt.Sprintf("%s-%s.dist-info", pkgModule, pkgVersion)
	files := []struct{ name, body string }{
		{pkgModule + ".py", fmt.Sprintf("GREETING = %q\n", PackageGreeting)},
		{distInfo + "/METADATA", fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: a package of the fake index\n", pkgName, pkgVersion)},
		{distInfo + "/WHEEL", "Wheel-Version: 1.0\nGenerator: fakenet\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	z := zip.NewWriter(&buf)
	var record strings.Builder
	for _, f := range files {
		w, err := z.Create(f.name)
		if err != nil {
			return nil, err
		}
		if _, err := w.Write([]byte(f.body)); err != nil {
			return nil, err
		}
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	fmt.Fprintf(&record, "%s/RECORD,,\n", distInfo)
	w, err := z.Create(distInfo + "/RECORD")
	if err != nil {
		return nil, err
	}
	if _, err := w.Write([]byte(record.String())); err != nil {
		return nil, err
	}
	if err := z.Close(); err != nil {
		return nil, err
	}
	sum := sha256.Sum256(buf.Bytes())
	return &index{wheelName: fmt.Sprintf("%s-%s-py3-none-any.whl", pkgModule, pkgVersion), wheel: buf.Bytes(),
		sha256: hex.EncodeToString(sum[:])}, nil
}

// ServeHTTP serves /simple/, /simple/warren-probe/ and the wheel under
// /files/.
func (x *index) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/simple/", "/simple":
		w.Header().Set("Content-Type", "text/html")
		_, _ = fmt.Fprintf(w, "<!DOCTYPE html>\n<html><body><a href=\"/simple/%s/\">%s</a></body></html>\n", pkgName, pkgName)
	case "/simple/" + pkgName + "/", "/simple/" + pkgName:
		w.Header().Set("Content-Type", "text/html")
		_, _ = fmt.Fprintf(w, "<!DOCTYPE html>\n<html><body><a href=\"/files/%s#sha256=%s\">%s</a></body></html>\n",
			x.wheelName, x.sha256, x.wheelName)
	case "/files/" + x.wheelName:
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(x.wheel)
	default:
		http.NotFound(w, r)
	}
}
