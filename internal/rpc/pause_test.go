package rpc_test

import (
	"net/http"
	"strings"
	"testing"
)

// TestPauseMethods: sandbox.pause and sandbox.resume, the state paused in
// sandbox.get, sandbox.list, sandbox.metrics.get and /metrics, the
// conflict that names sandbox.resume for requests that need the agent, and
// "resume": true (resume=true on the HTTP routes) resuming first; a
// restarted server finds the sandbox paused.
func TestPauseMethods(t *testing.T) {
	e := newFakeEnv(t, true, nil)
	e.must("sandbox.create", map[string]any{"name": "p", "idle_action": "pause"}, nil)
	ref := map[string]any{"sandbox": "p"}
	var info struct {
		State      string `json:"state"`
		IdleAction string `json:"idle_action"`
	}
	e.must("sandbox.pause", ref, &info)
	if info.State != "paused" || info.IdleAction != "pause" {
		t.Fatalf("sandbox.pause answered %+v", info)
	}
	e.must("sandbox.get", ref, &info)
	if info.State != "paused" {
		t.Fatalf("sandbox.get: %+v", info)
	}
	var list struct {
		Sandboxes []struct{ Name, State string } `json:"sandboxes"`
	}
	e.must("sandbox.list", map[string]any{"state": "paused"}, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].State != "paused" {
		t.Fatalf("sandbox.list state paused: %+v", list)
	}
	var met struct {
		Sandboxes []struct {
			Running bool `json:"running"`
			Paused  bool `json:"paused"`
		} `json:"sandboxes"`
	}
	e.must("sandbox.metrics.get", ref, &met)
	if len(met.Sandboxes) != 1 || !met.Sandboxes[0].Running || !met.Sandboxes[0].Paused {
		t.Fatalf("sandbox.metrics.get: %+v", met)
	}
	if n := e.scrape(t, e.admin)[`warren_sandboxes{namespace="default",state="paused"}`]; n != 1 {
		t.Errorf("/metrics paused count = %v", n)
	}

	// Requests that need the agent: a conflict naming sandbox.resume.
	for method, params := range map[string]map[string]any{
		"sandbox.exec":         {"sandbox": "p", "argv": []string{"true"}},
		"sandbox.command.run":  {"sandbox": "p", "command": "true"},
		"sandbox.file.read":    {"sandbox": "p", "path": "/x"},
		"sandbox.process.list": {"sandbox": "p"},
		"sandbox.repl.run":     {"sandbox": "p", "language": "python", "code": "1"},
	} {
		r := e.call(method, params)
		if r.Status != http.StatusConflict || r.kind() != "conflict" || !strings.Contains(r.Error.Message, "sandbox.resume") {
			t.Errorf("%s on a paused sandbox: %d %s", method, r.Status, r.Raw)
		}
	}
	req, _ := http.NewRequest("GET", e.url+"/api/v1/sandboxes/default/p/tar?path=/", nil)
	if resp := e.do(t, req, e.admin); resp.StatusCode != http.StatusConflict {
		t.Errorf("tar download of a paused sandbox: %d", resp.StatusCode)
	} else {
		_ = resp.Body.Close()
	}
	// A param that only methods needing the agent take.
	if r := e.call("sandbox.get", map[string]any{"sandbox": "p", "resume": true}); r.kind() != "invalid_params" {
		t.Errorf("sandbox.get with resume: %s", r.Raw)
	}

	// "resume": true resumes first.
	var res struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
	}
	e.must("sandbox.exec", map[string]any{"sandbox": "p", "argv": []string{"echo", "hi"}, "resume": true}, &res)
	if res.ExitCode != 0 || res.Stdout != "hi\n" {
		t.Fatalf("exec with resume: %+v", res)
	}
	if e.must("sandbox.get", ref, &info); info.State != "running" {
		t.Fatalf("after exec with resume: %s", info.State)
	}
	e.must("sandbox.pause", ref, nil)
	e.must("sandbox.command.run", map[string]any{"sandbox": "p", "command": "true", "resume": true}, nil)
	e.must("sandbox.pause", ref, nil)
	req, _ = http.NewRequest("GET", e.url+"/api/v1/sandboxes/default/p/tar?path=/&resume=true", nil)
	if resp := e.do(t, req, e.admin); resp.StatusCode != http.StatusOK {
		t.Errorf("tar download with resume=true: %d", resp.StatusCode)
	} else {
		_ = resp.Body.Close()
	}
	if e.must("sandbox.get", ref, &info); info.State != "running" {
		t.Fatalf("after tar with resume=true: %s", info.State)
	}

	// A restart finds it paused; resume; stop of a paused one.
	e.must("sandbox.pause", ref, nil)
	e.restart()
	if e.must("sandbox.get", ref, &info); info.State != "paused" {
		t.Fatalf("after a restart: %s", info.State)
	}
	e.must("sandbox.resume", ref, &info)
	if info.State != "running" {
		t.Fatalf("sandbox.resume answered %+v", info)
	}
	e.must("sandbox.pause", ref, nil)
	e.must("sandbox.stop", ref, nil)
	if r := e.call("sandbox.resume", ref); r.kind() != "conflict" {
		t.Errorf("resume of a stopped sandbox: %s", r.Raw)
	}
	if r := e.call("sandbox.pause", map[string]any{"sandbox": "nope"}); r.kind() != "not_found" {
		t.Errorf("pause of a missing sandbox: %s", r.Raw)
	}
	if r := e.call("sandbox.create", map[string]any{"name": "bad", "idle_action": "sleep"}); r.kind() != "invalid_params" || !strings.Contains(r.Error.Message, "idle_action") {
		t.Errorf("create with idle_action sleep: %s", r.Raw)
	}
}
