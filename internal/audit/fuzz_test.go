package audit

import (
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
	f.Add(seed)
	f.Add([]byte(`{"seq":1,"prev":"0000000000000000000000000000000000000000000000000000000000000000","kind":"checkpoint","sig":"AAAA"}` + "\n"))
	f.Add([]byte("garbage\n{\"seq\":99999999999999999999999\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(SegmentPath(dir, 1), data, 0o600); err != nil {
			t.Fatal(err)
		}
		r, err := Verify(dir, VerifyOptions{PublicKey: pub, Anchors: [][]byte{seed[:min(len(seed), 200)]}})
		if err == nil && r.Records > 0 && len(r.Problems) == 0 && r.Worst() != "" {
			t.Fatal("a problem-free report with a severity")
		}
		_ = Scan(dir, Filter{}, func([]byte, *Entry) error { return nil })
	})
}

// FuzzParams: any params give a bounded JSON object, without panics.
func FuzzParams(f *testing.F) {
	f.Add([]byte(`{"env":["A=B"],"token":"x","n":{"password":1}}`))
	f.Add([]byte(`{"env":{"A":"B"},"argv":[1,2,{"key":[]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		out := Params(data)
		if len(out) > MaxParams+64 {
			t.Fatalf("%d bytes", len(out))
		}
	})
}
