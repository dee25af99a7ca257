package buildinfo

import "testing"

// TestLinkTimeValues: what the linker sets is what is reported; unset, the
// version is "dev" and the commit is never empty.
func TestLinkTimeValues(t *testing.T) {
	if Version() != "dev" || Commit() == "" {
		t.Fatalf("unset: version %q, commit %q", Version(), Commit())
	}
	version, commit = "v1.2.3", "abc123"
	defer func() { version, commit = "", "" }()
	if Version() != "v1.2.3" || Commit() != "abc123" {
		t.Fatalf("set: version %q, commit %q", Version(), Commit())
	}
}
