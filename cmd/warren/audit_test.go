package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestAuditCommands: a real 'warren serve' writes the audit log, 'warren
// key' appends to it beside the running server, and 'warren audit'
// queries, exports and verifies it; an edited record and a cut end are
// reported with their place and exit status.
func TestAuditCommands(t *testing.T) {
	dir := stateDir(t)
	url, srv, stderr := startServe(t, dir, "--dev")
	post := func(method string, params map[string]any) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method, "params": params, "id": 1})
		resp, err := http.Post(url+"/api/v1/rpc", "application/json", bytes.NewReader(body))
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %v %v", method, err, resp)
		}
		_ = resp.Body.Close()
	}
	post("sandbox.create", map[string]any{"name": "aud", "labels": map[string]string{"team": "t1"}})
	post("sandbox.exec", map[string]any{"sandbox": "aud", "argv": []string{"true"}, "env": []string{"API_TOKEN=hunter2-secret"}})
	// A key made offline while the server writes the log.
	if r := run(t, warren(t, dir, "key", "create", "--namespace", "n1"), ""); r.code != 0 {
		t.Fatalf("key create: %+v", r)
	}
	post("sandbox.remove", map[string]any{"sandbox": "aud"})
	stopServe(t, srv)

	audit := func(args ...string) result { return run(t, warren(t, dir, append([]string{"audit"}, args...)...), "") }
	if r := audit("verify"); r.code != 0 || !strings.HasPrefix(r.stdout, "intact:") {
		t.Fatalf("verify: %+v\n%s", r, stderr)
	}
	q := audit("--label", "team=t1", "--kind", "exec,api_call")
	if q.code != 0 || !strings.Contains(q.stdout, "sandbox.exec ok") || !strings.Contains(q.stdout, `exec: "true" ok exit 0`) || strings.Count(q.stdout, "\n") != 4 {
		t.Fatalf("query by label: %+v", q)
	}
	// The same records for scripts: -q, --format and --json agree.
	seqs := audit("--label", "team=t1", "--kind", "exec,api_call", "-q")
	format := audit("--label", "team=t1", "--kind", "exec,api_call", "--format", "{{.Seq}}")
	var entries []struct {
		Seq  uint64 `json:"seq"`
		Kind string `json:"kind"`
	}
	js := audit("--label", "team=t1", "--kind", "exec,api_call", "--json")
	if err := json.Unmarshal([]byte(js.stdout), &entries); err != nil || len(entries) != 4 || seqs.code != 0 || seqs.stdout != format.stdout ||
		strings.Count(seqs.stdout, "\n") != 4 || !strings.HasPrefix(seqs.stdout, strconv.FormatUint(entries[0].Seq, 10)+"\n") {
		t.Fatalf("-q %+v, --format %+v, --json %+v: %v", seqs, format, js, err)
	}
	if r := audit("--sandbox", "nosuch", "--json"); r.code != 0 || r.stdout != "[]\n" {
		t.Fatalf("--json of no records: %+v", r)
	}
	if r := audit("export", "-q"); r.code != 2 || !strings.Contains(r.stderr, "unknown flag -q") {
		t.Fatalf("export -q: %+v", r)
	}
	if r := audit("export", "--kind", "key"); r.code != 0 || !strings.Contains(r.stdout, `"by":"cli"`) || !strings.Contains(r.stdout, `"namespace":"n1"`) {
		t.Fatalf("export of key records: %+v", r)
	}
	auditDir := filepath.Join(dir, "data", "audit")
	raw := readDir(t, auditDir)
	if bytes.Contains(raw, []byte("hunter2-secret")) {
		t.Fatal("a secret-looking param reached the audit log")
	}
	anchors := audit("checkpoints")
	if anchors.code != 0 || strings.Count(anchors.stdout, "\n") < 1 {
		t.Fatalf("checkpoints: %+v", anchors)
	}
	anchorFile := filepath.Join(t.TempDir(), "anchors")
	if err := os.WriteFile(anchorFile, []byte(anchors.stdout), 0o600); err != nil {
		t.Fatal(err)
	}

	seg := filepath.Join(auditDir, "00000001.jsonl")
	orig, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(orig, []byte("\n"))
	edited := -1
	for i, l := range lines {
		if bytes.Contains(l, []byte(`"method":"sandbox.exec"`)) {
			lines[i] = bytes.Replace(l, []byte(`"outcome":"ok"`), []byte(`"outcome":"no"`), 1)
			edited = i
		}
	}
	if err := os.WriteFile(seg, bytes.Join(lines, nil), 0o600); err != nil {
		t.Fatal(err)
	}
	r := audit("verify")
	if want := "00000001.jsonl:" + strconv.Itoa(edited+1); r.code != 1 || !strings.Contains(r.stdout, want) || !strings.Contains(r.stdout, "TAMPERED") {
		t.Fatalf("verify of an edited log: %+v, want %s", r, want)
	}
	// Cut back to the end of an earlier server life or checkpoint: only
	// the end's missing signature, or the anchors, show it.
	if err := os.WriteFile(seg, orig[:bytes.LastIndexByte(orig[:len(orig)-1], '\n')+1], 0o600); err != nil {
		t.Fatal(err)
	}
	if r := audit("verify"); r.code != 2 || !strings.Contains(r.stdout, "end not signed") {
		t.Fatalf("verify of a cut log: %+v", r)
	}
	if r := audit("verify", "--anchor", anchorFile); r.code != 1 || !strings.Contains(r.stdout, "not in the log") {
		t.Fatalf("verify of a cut log with anchors: %+v", r)
	}
}

func readDir(t *testing.T, dir string) []byte {
	t.Helper()
	var all []byte
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		all = append(all, b...)
	}
	return all
}
