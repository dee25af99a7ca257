package testenv

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// S3 is a real S3 server for a test: SeaweedFS's weed (scripts/s3-server.sh
// builds it once into a cache), listening on loopback, with its own data
// directory, stopped at the test's end.
type S3 struct {
	Endpoint             string // http://127.0.0.1:PORT
	AccessKey, SecretKey string
}

var weedBin = sync.OnceValues(func() (string, error) {
	out, err := exec.Command(filepath.Join(ModuleRoot(), "scripts", "s3-server.sh")).Output() //nolint:gosec // the module's own script
	if err != nil {
		return "", fmt.Errorf("scripts/s3-server.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
})

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

// StartS3 starts an S3 server and waits until it answers.
func StartS3(t testing.TB) S3 {
	t.Helper()
	bin, err := weedBin()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := S3{AccessKey: "warrentest", SecretKey: "warrentest-secret-" + strconv.Itoa(os.Getpid())}
	p := func() string { return strconv.Itoa(freePort(t)) }
	s3port := p()
	s.Endpoint = "http://127.0.0.1:" + s3port
	args := []string{"mini", "-dir=" + dir, "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
		"-master.port=" + p(), "-master.port.grpc=" + p(), "-volume.port=" + p(), "-volume.port.grpc=" + p(),
		"-filer.port=" + p(), "-filer.port.grpc=" + p(), "-s3.port=" + s3port, "-s3.port.grpc=" + p(),
		"-webdav=false", "-admin.ui=false", "-master.telemetry=false", "-s3.iam=false"}
	cmd := exec.Command(bin, args...) //nolint:gosec // the binary the module's script built
	cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID="+s.AccessKey, "AWS_SECRET_ACCESS_KEY="+s.SecretKey)
	var log SyncBuffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		// An anonymous request: 403 means the S3 API is up and checking.
		req, _ := http.NewRequestWithContext(ctx, "GET", s.Endpoint+"/", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode < 500 {
				return s
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the S3 server did not answer within 60s: %v\n%s", err, log.String())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
