package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// abandon closes l's files without a checkpoint, as a crash leaves them.
func (l *Log) abandon() {
	if l.stop != nil {
		close(l.stop)
		<-l.done
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	_ = l.f.Close()
	_ = l.liveF.Close()
}

func openLog(t *testing.T, dir string, every int) *Log {
	t.Helper()
	l, err := Open(Options{Dir: dir, CheckpointEvery: every, CheckpointInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func callRecord(i int) *Record {
	return &Record{Kind: KindCall, Namespace: "team-a", Sandbox: fmt.Sprintf("sb%d", i), Labels: map[string]string{"team": "a"},
		KeyID: "k1", Call: &Call{Method: "sandbox.get", Params: json.RawMessage(`{"sandbox":"x"}`), Outcome: "ok", DurationMs: 1}}
}

// writeLog writes n call records, a checkpoint every `every`, and closes.
func writeLog(t *testing.T, dir string, n, every int) {
	t.Helper()
	l := openLog(t, dir, every)
	for i := range n {
		if err := l.Append(callRecord(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

func verify(t *testing.T, dir string) *Report {
	t.Helper()
	r, err := Verify(dir, VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func readLines(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.SplitAfter(b, []byte{'\n'})[:bytes.Count(b, []byte{'\n'})]
}

func writeLines(t *testing.T, path string, lines [][]byte) {
	t.Helper()
	if err := os.WriteFile(path, bytes.Join(lines, nil), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestIntactLogVerifies(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, 25, 10)
	// A second writer's life continues the chain.
	writeLog(t, dir, 5, 10)
	r := verify(t, dir)
	if len(r.Problems) != 0 {
		t.Fatalf("problems in an intact log: %v", r.Problems)
	}
	// 30 records, checkpoints after 10, 20 (count) and two closes.
	if r.Records != 34 || r.Checkpoints != 4 || r.LastSeq != 34 || r.SignedSeq != 34 {
		t.Fatalf("report %+v", r)
	}
	fi, err := os.Stat(SegmentPath(dir, 1))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("segment mode: %v %v", fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Join(dir, KeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key mode: %v", err)
	}
}

func TestTamperDetected(t *testing.T) {
	// 25 records with checkpoints after records 10 and 20: lines 1-10,
	// checkpoint (11), 12-21, checkpoint (22), 23-27, close checkpoint (28).
	seg := segmentName(1)
	for _, tc := range []struct {
		name   string
		mutate func(lines [][]byte) [][]byte
		want   []Problem // Severity, Line, Seq and a word of What
	}{
		{"edit a record", func(l [][]byte) [][]byte {
			l[4] = bytes.Replace(l[4], []byte(`"sb4"`), []byte(`"sb9"`), 1)
			return l
		}, []Problem{{Line: 5, Seq: 5, Severity: Tampered, What: "edited"}}},
		{"edit a record's seq", func(l [][]byte) [][]byte {
			l[4] = bytes.Replace(l[4], []byte(`{"seq":5,`), []byte(`{"seq":6,`), 1)
			return l
		}, []Problem{{Line: 6, Seq: 6, Severity: Tampered, What: "again"}, {Line: 5, Seq: 6, Severity: Tampered, What: "edited"},
			{Line: 5, Seq: 6, Severity: Tampered, What: "seq 5 is missing"}}},
		{"delete a record", func(l [][]byte) [][]byte {
			return append(l[:6:6], l[7:]...)
		}, []Problem{{Line: 7, Seq: 8, Severity: Tampered, What: "seq 7 is missing"}}},
		{"reorder two records", func(l [][]byte) [][]byte {
			l[12], l[13] = l[13], l[12]
			return l
		}, []Problem{{Line: 14, Seq: 13, Severity: Tampered, What: "out of order"}}},
		{"remove a checkpoint", func(l [][]byte) [][]byte {
			return append(l[:10:10], l[11:]...)
		}, []Problem{{Line: 11, Seq: 12, Severity: Tampered, What: "seq 11 is missing"}}},
		{"forge a checkpoint", func(l [][]byte) [][]byte {
			l[21] = bytes.Replace(l[21], []byte(`"reason":"count"`), []byte(`"reason":"close"`), 1)
			return l
		}, []Problem{{Line: 22, Seq: 22, Severity: Tampered, What: "signature"}, {Line: 22, Seq: 22, Severity: Tampered, What: "edited"}}},
		{"truncate the tail past the last checkpoint", func(l [][]byte) [][]byte {
			return l[:25]
		}, []Problem{{Line: 25, Seq: 25, Severity: Unanchored, What: "3 records after its last checkpoint (seq 22)"}}},
		{"cut a line short", func(l [][]byte) [][]byte {
			l[27] = l[27][:40]
			return l
		}, []Problem{{Line: 28, Severity: Unanchored, What: "torn"}, {Line: 27, Seq: 27, Severity: Unanchored, What: "after its last checkpoint"}}},
		{"garble a line", func(l [][]byte) [][]byte {
			l[2] = []byte("hello\n")
			return l
		}, []Problem{{Line: 3, Severity: Tampered, What: "not a record"}, {Line: 4, Seq: 4, Severity: Tampered, What: "seq 3 is missing"}}},
		{"insert a copy", func(l [][]byte) [][]byte {
			return append(l[:3:3], append([][]byte{l[1]}, l[3:]...)...)
		}, []Problem{{Line: 4, Seq: 2, Severity: Tampered, What: "again"}}},
		{"remove the first records", func(l [][]byte) [][]byte {
			return l[2:]
		}, []Problem{{Line: 1, Seq: 3, Severity: Tampered, What: "starts at seq 3"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeLog(t, dir, 25, 10)
			path := SegmentPath(dir, 1)
			lines := readLines(t, path)
			if len(lines) != 28 {
				t.Fatalf("%d lines", len(lines))
			}
			writeLines(t, path, tc.mutate(lines))
			r := verify(t, dir)
			if len(r.Problems) != len(tc.want) {
				t.Fatalf("problems:\n%v\nwant %d like %v", r.Problems, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				p := r.Problems[i]
				if p.File != seg || p.Line != w.Line || p.Seq != w.Seq || p.Severity != w.Severity || !strings.Contains(p.What, w.What) {
					t.Errorf("problem %d: %v\nwant %s:%d seq %d %s ...%s...", i, p, seg, w.Line, w.Seq, w.Severity, w.What)
				}
			}
		})
	}
}

func TestTornTailRecovered(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, 100)
	for i := range 5 {
		if err := l.Append(callRecord(i)); err != nil {
			t.Fatal(err)
		}
	}
	l.abandon()
	path := SegmentPath(dir, 1)
	b, _ := os.ReadFile(path)
	torn := b[:len(b)-30] // the last record lost its end in the crash
	if err := os.WriteFile(path, torn, 0o600); err != nil {
		t.Fatal(err)
	}
	r := verify(t, dir)
	if r.Worst() != Unanchored || !strings.Contains(r.Problems[0].What, "torn") || r.Problems[0].Line != 5 {
		t.Fatalf("torn tail: %v", r.Problems)
	}
	// The next writer records the torn line and goes on.
	writeLog(t, dir, 2, 100)
	r = verify(t, dir)
	if r.Worst() != Note || len(r.Problems) != 1 || r.Problems[0].Line != 5 || !strings.Contains(r.Problems[0].What, "torn line") {
		t.Fatalf("after recovery: %v", r.Problems)
	}
	var rec *Recovery
	_ = Scan(dir, Filter{Kinds: []Kind{KindRecovery}}, func(_ []byte, e *Entry) error { rec = e.Recovery; return nil })
	if rec == nil || rec.Reason != "torn" || rec.LastSeq != 4 || rec.Line != 5 {
		t.Fatalf("recovery record %+v", rec)
	}
}

func TestUnclosedRecorded(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, 100)
	_ = l.Append(callRecord(1))
	l.abandon()
	r := verify(t, dir)
	if r.Worst() != Unanchored {
		t.Fatalf("unclosed log: %v", r.Problems)
	}
	writeLog(t, dir, 1, 100)
	r = verify(t, dir)
	if r.Worst() != Note || !strings.Contains(r.Problems[0].What, "did not close") {
		t.Fatalf("after reopen: %v", r.Problems)
	}
}

func TestLiveTailIsNoProblem(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, 100)
	defer func() { _ = l.Close() }()
	_ = l.Append(callRecord(1))
	r := verify(t, dir)
	if !r.Live || r.Worst() != Note {
		t.Fatalf("live log: %+v", r)
	}
	if _, err := Open(Options{Dir: dir}); err == nil || !strings.Contains(err.Error(), "another server") {
		t.Fatalf("second server writer: %v", err)
	}
}

func TestRotationAndMissingSegment(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(Options{Dir: dir, SegmentBytes: 2000, CheckpointInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 60 {
		if err := l.Append(callRecord(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	segs, _ := segments(dir)
	if len(segs) < 4 {
		t.Fatalf("segments %v", segs)
	}
	if r := verify(t, dir); len(r.Problems) != 0 || r.Files != len(segs) {
		t.Fatalf("%+v", r)
	}
	if err := os.Remove(SegmentPath(dir, 2)); err != nil {
		t.Fatal(err)
	}
	r := verify(t, dir)
	if r.Worst() != Tampered || r.Problems[0].File != segmentName(3) || !strings.Contains(r.Problems[0].What, "missing") {
		t.Fatalf("%v", r.Problems)
	}
}

func TestOneOffBesideServer(t *testing.T) {
	dir := t.TempDir()
	srv := openLog(t, dir, 1000)
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Go(func() {
			for i := range 50 {
				_ = srv.Append(callRecord(g*100 + i))
			}
		})
	}
	wg.Go(func() {
		for range 3 {
			cli, err := Open(Options{Dir: dir, OneOff: true})
			if err != nil {
				t.Error(err)
				return
			}
			_ = cli.Append(&Record{Kind: KindKey, Key: &KeyChange{Action: "create", ID: "abc", Namespace: "ns", By: "cli"}})
			if err := cli.Close(); err != nil {
				t.Error(err)
			}
		}
	})
	wg.Wait()
	// A file in the inbox that is no record is set aside, and said so.
	if err := os.WriteFile(filepath.Join(dir, inboxDir, "00000000000000000001-x.json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	r := verify(t, dir)
	if len(r.Problems) != 0 || r.Records != 100+3+2 {
		t.Fatalf("%+v", r)
	}
	var keys, bad int
	_ = Scan(dir, Filter{}, func(_ []byte, e *Entry) error {
		if e.Key != nil && e.Key.By == "cli" {
			keys++
		}
		if e.Recovery != nil && e.Recovery.Reason == "bad inbox file" {
			bad++
		}
		return nil
	})
	if keys != 3 || bad != 1 {
		t.Fatalf("key records %d, bad inbox files recorded %d", keys, bad)
	}
	if _, err := os.Stat(filepath.Join(dir, inboxDir, "00000000000000000001-x.json.bad")); err != nil {
		t.Fatal(err)
	}
	// Alone, a one-off writer appends and signs itself.
	cli, err := Open(Options{Dir: dir, OneOff: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = cli.Append(&Record{Kind: KindKey, Key: &KeyChange{Action: "revoke", ID: "abc", By: "cli"}})
	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	if r := verify(t, dir); len(r.Problems) != 0 || r.Records != 105+2 {
		t.Fatalf("%+v", r)
	}
}

func TestScanFilters(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, 1000)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	recs := []*Record{
		{Kind: KindCall, Time: t0, Namespace: "a", Sandbox: "s1", KeyID: "k1", Labels: map[string]string{"team": "x"}, Call: &Call{Method: "sandbox.create", Outcome: "ok"}},
		{Kind: KindExec, Time: t0.Add(time.Hour), Namespace: "a", Sandbox: "s1", KeyID: "k1", Labels: map[string]string{"team": "x", "env": "dev"}, Exec: &Exec{Via: "exec", Outcome: "ok"}},
		{Kind: KindCall, Time: t0.Add(2 * time.Hour), Namespace: "b", Sandbox: "s2", KeyID: "k2", Call: &Call{Method: "sandbox.get", Outcome: "not_found"}},
		{Kind: KindRefusal, Time: t0.Add(3 * time.Hour), Namespace: "b", KeyID: "k2", Refusal: &Refusal{Method: "sandbox.create", Kind: "limit", Message: "m"}},
	}
	for _, r := range recs {
		if err := l.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	_ = l.Close()
	for _, tc := range []struct {
		name string
		f    Filter
		want []int
	}{
		{"all", Filter{Kinds: []Kind{KindCall, KindExec, KindRefusal}}, []int{0, 1, 2, 3}},
		{"namespace", Filter{Namespace: "b"}, []int{2, 3}},
		{"sandbox", Filter{Sandbox: "s1"}, []int{0, 1}},
		{"key", Filter{KeyID: "k2", Kinds: []Kind{KindCall}}, []int{2}},
		{"label", Filter{Labels: map[string]string{"team": "x"}}, []int{0, 1}},
		{"two labels", Filter{Labels: map[string]string{"team": "x", "env": "dev"}}, []int{1}},
		{"method", Filter{Methods: []string{"sandbox.create"}}, []int{0, 3}},
		{"time", Filter{Since: t0.Add(time.Hour), Until: t0.Add(3 * time.Hour)}, []int{1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []int
			err := Scan(dir, tc.f, func(_ []byte, e *Entry) error {
				for i, r := range recs {
					if r.Time.Equal(e.Time) && e.Kind == r.Kind {
						got = append(got, i)
					}
				}
				return nil
			})
			if err != nil || fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("got %v (%v), want %v", got, err, tc.want)
			}
		})
	}
}

func TestParamsRedacted(t *testing.T) {
	in := `{"sandbox":"s","env":["A=1","OPENAI_API_KEY=sk-live-123"],"api_token":"t0k","nested":{"Password":"hunter2","ok":"fine","private_key":{"x":"y"}},"secrets":["openai"],"data":"` + strings.Repeat("x", 2000) + `"}`
	out := string(Params([]byte(in)))
	for _, secret := range []string{"sk-live-123", "t0k", "hunter2", "\"y\"", "openai", "A=1"} {
		if strings.Contains(out, secret) {
			t.Errorf("%q survives in %s", secret, out)
		}
	}
	for _, kept := range []string{`"sandbox":"s"`, `"OPENAI_API_KEY=[redacted]"`, `"ok":"fine"`, `…[+1488 bytes]`} {
		if !strings.Contains(out, kept) {
			t.Errorf("%q missing in %s", kept, out)
		}
	}
	if got := string(Params([]byte(`{"data":"` + strings.Repeat("x", 2<<20) + `"}`))); !strings.Contains(got, "[truncated]") {
		t.Errorf("large params: %s", got)
	}
	big := `{"a":[` + strings.Repeat(`"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",`, 300) + `"x"]}`
	if got := Params([]byte(big)); len(got) > MaxParams || !strings.Contains(string(got), "[truncated]") {
		t.Errorf("params past MaxParams: %d bytes", len(got))
	}
}

func TestRedactHookAndBounds(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(Options{Dir: dir, CheckpointInterval: -1, Redact: func(b []byte) []byte {
		return bytes.ReplaceAll(b, []byte("s3cr3t"), []byte(Redacted))
	}})
	if err != nil {
		t.Fatal(err)
	}
	e := &Exec{Via: "shell", Outcome: "ok"}
	e.SetArgv([]string{"/bin/sh", "-c", "echo s3cr3t; " + strings.Repeat("y", 10000)})
	if err := l.Append(&Record{Kind: KindExec, Exec: e}); err != nil {
		t.Fatal(err)
	}
	if err := l.Append(&Record{Kind: KindConfig, Config: &Config{Problems: []string{strings.Repeat("z", MaxRecord)}}}); err == nil {
		t.Fatal("a record past MaxRecord was taken")
	}
	_ = l.Close()
	b, _ := os.ReadFile(SegmentPath(dir, 1))
	if bytes.Contains(b, []byte("s3cr3t")) || !bytes.Contains(b, []byte("argv_sha256")) {
		t.Fatalf("log: %s", b)
	}
	if r := verify(t, dir); len(r.Problems) != 0 {
		t.Fatal(r.Problems)
	}
}

func TestAnchors(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, 25, 10)
	lines := readLines(t, SegmentPath(dir, 1))
	anchor := lines[21] // the checkpoint after 20 records
	r, err := Verify(dir, VerifyOptions{Anchors: [][]byte{anchor}})
	if err != nil || len(r.Problems) != 0 {
		t.Fatalf("%v %v", r.Problems, err)
	}
	// Cut back to the first checkpoint, which is properly signed: only
	// the anchor kept elsewhere shows the loss.
	writeLines(t, SegmentPath(dir, 1), lines[:11])
	r, _ = Verify(dir, VerifyOptions{})
	if len(r.Problems) != 0 {
		t.Fatalf("without anchors: %v", r.Problems)
	}
	r, _ = Verify(dir, VerifyOptions{Anchors: [][]byte{anchor}})
	if r.Worst() != Tampered || r.Problems[0].Seq != 22 || !strings.Contains(r.Problems[0].What, "not in the log") {
		t.Fatalf("with anchors: %v", r.Problems)
	}
}

// Every cut of a log is found: mid-line as torn, at a record as an
// unsigned end, at an earlier checkpoint by the last checkpoint kept
// elsewhere.
func TestEveryCutDetected(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, 12, 5)
	path := SegmentPath(dir, 1)
	orig, _ := os.ReadFile(path)
	lines := readLines(t, path)
	anchor := bytes.TrimSpace(lines[len(lines)-1])
	end := 0
	for i, l := range lines[:len(lines)-1] {
		for _, cut := range []int{end + len(l)/2, end + len(l)} {
			if err := os.WriteFile(path, orig[:cut], 0o600); err != nil {
				t.Fatal(err)
			}
			r, err := Verify(dir, VerifyOptions{Anchors: [][]byte{anchor}})
			if err != nil || r.Worst() != Tampered {
				t.Fatalf("cut at byte %d (line %d): %v %v", cut, i+1, r.Problems, err)
			}
			r = verify(t, dir)
			checkpoint := bytes.Contains(l, []byte(`"kind":"checkpoint"`)) && cut == end+len(l)
			if (r.Worst() == Unanchored) == checkpoint {
				t.Fatalf("cut at byte %d (line %d, checkpoint %t) without anchors: %v", cut, i+1, checkpoint, r.Problems)
			}
		}
		end += len(l)
	}
}
