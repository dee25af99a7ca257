package workspace_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/warren-sandbox/warren/internal/diskquota"
	s3client "github.com/warren-sandbox/warren/internal/s3"
	"github.com/warren-sandbox/warren/internal/testenv"
	"github.com/warren-sandbox/warren/internal/workspace"
)

func tarOf(t *testing.T, files map[string]string) *bytes.Reader { return tarOfB(t, files) }

func tarOfB(t testing.TB, files map[string]string) *bytes.Reader {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for name, data := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write([]byte(data))
	}
	_ = tw.Close()
	return bytes.NewReader(b.Bytes())
}

// server is one Warren server's workspaces on the shared S3 store: a data
// directory of its own.
func server(t *testing.T, s3 testenv.S3) *workspace.Manager { return serverB(t, s3) }

func serverB(t testing.TB, s3 testenv.S3) *workspace.Manager {
	t.Helper()
	root := t.TempDir()
	st, err := workspace.NewS3(t.Context(), workspace.S3Options{Endpoint: s3.Endpoint, Bucket: "warren", Region: "us-east-1",
		AccessKeyEnv: "TEST_S3_KEY", SecretKeyEnv: "TEST_S3_SECRET", Cache: filepath.Join(root, ".s3", "s3")})
	if err != nil {
		t.Fatal(err)
	}
	m, err := workspace.New(workspace.Options{Root: root, Stores: map[string]workspace.Store{"s3": st}, DefaultStore: "s3",
		UID: os.Getuid(), GID: os.Getgid()})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func objects(t *testing.T, s3 testenv.S3) map[string]string {
	t.Helper()
	c, err := s3client.New(s3.Endpoint, "", s3.AccessKey, s3.SecretKey)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	err = c.ListObjects(t.Context(), "warren", "", 1000, func(o s3client.Object) error {
		obj, err := c.GetObject(t.Context(), "warren", o.Key)
		if err != nil {
			return err
		}
		var b bytes.Buffer
		_, err = b.ReadFrom(obj)
		_ = obj.Close()
		out[o.Key] = b.String()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func read(t *testing.T, m *workspace.Manager, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

// The snapshot bridge against a real S3 server: what is written in a
// workspace reaches the bucket when its sandbox stops (Detach), another
// server's workspace of the same name starts from it, changes and
// deletions flow both ways, and a file changed on both sides is a
// conflict that overwrites neither.
func TestS3RoundTrip(t *testing.T) {
	s3 := testenv.StartS3(t)
	t.Setenv("TEST_S3_KEY", s3.AccessKey)
	t.Setenv("TEST_S3_SECRET", s3.SecretKey)
	ctx := context.Background()

	a := server(t, s3)
	if _, err := a.Create(ctx, "team", "proj", "", 1<<20); err != nil {
		t.Fatal(err)
	}
	dirA, err := a.Attach(ctx, "team", "proj", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Upload("team", "proj", tarOf(t, map[string]string{"a.txt": "one", "sub/b.txt": "two", "gone.txt": "x"})); err != nil {
		t.Fatal(err)
	}
	if err := a.Detach(ctx, "team", "proj"); err != nil {
		t.Fatal(err)
	}
	got := objects(t, s3)
	want := map[string]string{"team/proj/a.txt": "one", "team/proj/sub/b.txt": "two", "team/proj/gone.txt": "x"}
	if len(got) != len(want) || got["team/proj/a.txt"] != "one" || got["team/proj/sub/b.txt"] != "two" {
		t.Fatalf("objects after the stop: %v, want %v", got, want)
	}

	// Another server (its own cache) creates the same workspace: it
	// starts from the bucket.
	b := server(t, s3)
	if _, err := b.Create(ctx, "team", "proj", "", 1<<20); err != nil {
		t.Fatal(err)
	}
	dirB, err := b.Attach(ctx, "team", "proj", true)
	if err != nil {
		t.Fatal(err)
	}
	if read(t, b, dirB, "sub/b.txt") != "two" {
		t.Fatalf("b sees %q", read(t, b, dirB, "sub/b.txt"))
	}
	// b changes one file and deletes another, and pushes.
	if err := os.WriteFile(filepath.Join(dirB, "a.txt"), []byte("one by b"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dirB, "gone.txt")); err != nil {
		t.Fatal(err)
	}
	st, err := b.Sync(ctx, "team", "proj", false)
	if err != nil || st.Sent != 1 || st.Deleted != 1 || len(st.Conflicts) != 0 {
		t.Fatalf("b's push: %+v %v", st, err)
	}
	// a had not changed those: a pull takes b's changes.
	st, err = a.Sync(ctx, "team", "proj", true)
	if err != nil || st.Received != 1 || st.Deleted != 1 || len(st.Conflicts) != 0 {
		t.Fatalf("a's sync: %+v %v", st, err)
	}
	if read(t, a, dirA, "a.txt") != "one by b" {
		t.Fatalf("a sees %q", read(t, a, dirA, "a.txt"))
	}
	if _, err := os.Stat(filepath.Join(dirA, "gone.txt")); !os.IsNotExist(err) {
		t.Fatalf("deleted on b, still on a: %v", err)
	}
	// Both change sub/b.txt: b pushes first; a's push and pull name the
	// conflict and keep a's copy, the bucket keeps b's.
	_ = os.WriteFile(filepath.Join(dirB, "sub/b.txt"), []byte("two by b"), 0o644)
	_ = os.WriteFile(filepath.Join(dirA, "sub/b.txt"), []byte("two by a, longer"), 0o644)
	if _, err := b.Sync(ctx, "team", "proj", false); err != nil {
		t.Fatal(err)
	}
	st, err = a.Sync(ctx, "team", "proj", true)
	if err != nil || !slices.Equal(st.Conflicts, []string{"sub/b.txt", "sub/b.txt"}) {
		t.Fatalf("a's sync of a conflict: %+v %v", st, err)
	}
	if read(t, a, dirA, "sub/b.txt") != "two by a, longer" || objects(t, s3)["team/proj/sub/b.txt"] != "two by b" {
		t.Fatalf("a conflict overwrote a side: here %q, bucket %q", read(t, a, dirA, "sub/b.txt"), objects(t, s3)["team/proj/sub/b.txt"])
	}

	// Removal takes the objects with it.
	if err := b.Remove(ctx, "team", "proj", nil); err != nil {
		t.Fatal(err)
	}
	if got := objects(t, s3); len(got) != 0 {
		t.Fatalf("objects after removal: %v", got)
	}
}

// BenchmarkS3Sync is the snapshot bridge's cost for a workspace of 1000
// files of 4 KiB: one op is a push of all of them (each changed) and a
// pull of them into a fresh cache, against the test's real S3 server.
// What a sandbox pays instead of a FUSE mount's latency on every file
// operation (docs/policy.md "Workspaces").
func BenchmarkS3Sync(b *testing.B) {
	s3 := testenv.StartS3(b)
	b.Setenv("TEST_S3_KEY", s3.AccessKey)
	b.Setenv("TEST_S3_SECRET", s3.SecretKey)
	ctx := context.Background()
	files := map[string]string{}
	for i := range 1000 {
		files[fmt.Sprintf("d%d/f%d", i%10, i)] = strings.Repeat("x", 4096)
	}
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		a, c := serverB(b, s3), serverB(b, s3)
		name := fmt.Sprintf("w%d", i)
		if _, err := a.Create(ctx, "bench", name, "", 1<<30); err != nil {
			b.Fatal(err)
		}
		if _, err := a.Upload("bench", name, tarOfB(b, files)); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := a.Detach(ctx, "bench", name); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Create(ctx, "bench", name, "", 1<<30); err != nil { // pulls
			b.Fatal(err)
		}
	}
}

// With a disk pool, an object store's local copy is kernel-limited like a
// local workspace (a subvolume on the pool held to the quota), and the
// bridge pushes from it and pulls into it as from a plain directory.
func TestS3KernelLimit(t *testing.T) {
	pool := diskPool(t)
	s3 := testenv.StartS3(t)
	t.Setenv("TEST_S3_KEY", s3.AccessKey)
	t.Setenv("TEST_S3_SECRET", s3.SecretKey)
	ctx := context.Background()
	root := t.TempDir()
	st, err := workspace.NewS3(ctx, workspace.S3Options{Endpoint: s3.Endpoint, Bucket: "warren", Region: "us-east-1",
		AccessKeyEnv: "TEST_S3_KEY", SecretKeyEnv: "TEST_S3_SECRET", Cache: filepath.Join(root, ".s3", "s3")})
	if err != nil {
		t.Fatal(err)
	}
	m, err := workspace.New(workspace.Options{Root: root, Stores: map[string]workspace.Store{"s3": st}, DefaultStore: "s3",
		UID: os.Getuid(), GID: os.Getgid(), Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	const quota = 4 << 20
	if _, err := m.Create(ctx, "team", "proj", "", quota); err != nil {
		t.Fatal(err)
	}
	dir, err := m.Attach(ctx, "team", "proj", true)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(pool, "s3", "team", "proj"); dir != want {
		t.Fatalf("the local copy at %s, want %s on the pool", dir, want)
	}
	if _, limit, err := diskquota.Usage(dir); err != nil || limit != quota {
		t.Fatalf("the local copy's limit: %d %v, want %d", limit, err, quota)
	}
	if _, err := m.Upload("team", "proj", tarOf(t, map[string]string{"a.txt": "one"})); err != nil {
		t.Fatal(err)
	}
	if _, err := fill(filepath.Join(dir, "big"), 8); !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("a write past the quota: %v, want EDQUOT", err)
	}
	if err := os.Remove(filepath.Join(dir, "big")); err != nil {
		t.Fatal(err)
	}
	if err := m.Detach(ctx, "team", "proj"); err != nil {
		t.Fatal(err)
	}
	if got := objects(t, s3); got["team/proj/a.txt"] != "one" || len(got) != 1 {
		t.Fatalf("objects after the stop: %v", got)
	}
	if err := m.Remove(ctx, "team", "proj", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Errorf("the local copy after removal: %v", err)
	}
}
