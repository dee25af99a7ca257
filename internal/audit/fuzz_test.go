package audit

import (
	"bytes"
	"os"
	"testing"
)

// FuzzVerify feeds hostile segment files to the verifier and the reader:
// they must report, never panic or hang.
func FuzzVerify(f *testing.F) {
	seedDir := f.TempDir()
	l, err := Open(Options{Dir: seedDir, CheckpointEvery: 3, CheckpointInterval: -1})
	if err != nil {
		f.Fatal(err)
	}
	for i := range 5 {
		_ = l.Append(callRecord(i))
	}
	_ = l.Append(&Record{Kind: KindRecovery, Recovery: &Recovery{Reason: "torn", File: segmentName(1), Line: 2, Bytes: 9}})
	_ = l.Close()
	seed, err := os.ReadFile(SegmentPath(seedDir, 1))
	if err != nil {
		f.Fatal(err)
	}
	pub, err := ReadPublicKey(seedDir + "/" + PubFile)
	if err != nil {
		f.Fatal(err)
	}
	var anchor []byte
	for l := range bytes.Lines(seed) {
		if bytes.Contains(l, []byte(`"kind":"checkpoint"`)) {
			anchor = bytes.TrimSpace(l) // the last one: every cut loses it
		}
	}
	f.Add(seed)
	f.Add([]byte(`{"seq":1,"prev":"0000000000000000000000000000000000000000000000000000000000000000","kind":"checkpoint","sig":"AAAA"}` + "\n"))
	f.Add([]byte("garbage\n{\"seq\":99999999999999999999999\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(SegmentPath(dir, 1), data, 0o600); err != nil {
			t.Fatal(err)
		}
		r, err := Verify(dir, VerifyOptions{PublicKey: pub, Anchors: [][]byte{anchor}})
		if err != nil {
			t.Fatal(err) // the files are readable: any content gets a report
		}
		if (len(r.Problems) == 0) != (r.Worst() == "") || (!bytes.Equal(data, seed) && bytes.HasPrefix(seed, data) && r.Worst() == "") {
			t.Fatalf("report %+v for %q", r, data)
		}
		_ = Scan(dir, Filter{}, func([]byte, *Entry) error { return nil })
	})
}

// FuzzParams: any params give bounded JSON, without panics, redacted as
// decoding them would have (checkParams).
func FuzzParams(f *testing.F) {
	f.Add([]byte(`{"env":["A=B"],"token":"x","n":{"password":1}}`))
	f.Add([]byte(`{"env":{"A":"B"},"argv":[1,2,{"key":[]}]}`))
	f.Add([]byte(`{"a":"<\u00e9\n>","k\u0065y":[1.5e3,null]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		out := Params(data)
		if len(out) > MaxParams+64 {
			t.Fatalf("%d bytes", len(out))
		}
		checkParams(t, data)
	})
}
