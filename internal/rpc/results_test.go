package rpc

import (
	"flag"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/results.golden")

// results maps every method (and the WebSocket stream's messages) to the
// type of its answer.
var results = map[string]any{
	"sandbox.start":          "",
	"sandbox.stop":           "",
	"sandbox.repl.run":       replResult{},
	"sandbox.command.run":    commandResult{},
	"sandbox.metrics.get":    metricsList{},
	"sandbox.create":         sandboxInfo{},
	"sandbox.get":            sandboxInfo{},
	"sandbox.pause":          sandboxInfo{},
	"sandbox.resume":         sandboxInfo{},
	"sandbox.checkpoint":     snapshotInfo{},
	"sandbox.restore":        sandboxInfo{},
	"sandbox.fork":           forkResult{},
	"snapshot.list":          snapshotList{},
	"snapshot.get":           snapshotInfo{},
	"snapshot.remove":        removedResult{},
	"sandbox.list":           sandboxList{},
	"sandbox.remove":         removedResult{},
	"sandbox.logs":           logLines{},
	"sandbox.egress.get":     egressRules{},
	"workspace.create":       workspaceInfo{},
	"workspace.get":          workspaceInfo{},
	"workspace.list":         workspaceList{},
	"workspace.remove":       done{},
	"workspace.sync":         syncResult{},
	"sandbox.egress.set":     egressRules{},
	"sandbox.egress.log":     egressLog{},
	"sandbox.port.expose":    portInfo{},
	"sandbox.port.list":      portList{},
	"sandbox.port.unexpose":  portList{},
	"sandbox.exec":           execResult{},
	"sandbox.shell":          execResult{},
	"sandbox.process.start":  processInfo{},
	"sandbox.process.list":   processList{},
	"sandbox.process.get":    processInfo{},
	"sandbox.process.output": outputResult{},
	"sandbox.process.wait":   processInfo{},
	"sandbox.process.signal": done{},
	"sandbox.process.stdin":  done{},
	"sandbox.process.resize": done{},
	"sandbox.process.remove": done{},
	"sandbox.file.read":      fileData{},
	"sandbox.file.write":     fileWritten{},
	"sandbox.file.list":      fileList{},
	"sandbox.file.stat":      fileInfo{},
	"sandbox.file.mkdir":     done{},
	"sandbox.file.remove":    done{},
	"sandbox.file.move":      done{},
	"namespace.usage":        namespaceUsageResult{},
	"image.list":             imageList{},
	"image.pull":             imageInfo{},
	"key.create":             keyCreated{},
	"key.list":               keyList{},
	"key.revoke":             revokedResult{},
	"ws":                     wsMsg{},
}

// resultSchema renders the JSON shape of every result type: per method
// its type, then each struct type reached from them, once, with its
// fields' JSON names and Go types.
func resultSchema(t *testing.T) string {
	pkg := reflect.TypeOf(done{}).PkgPath()
	short := pkg[strings.LastIndex(pkg, "/")+1:] + "."
	var b strings.Builder
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range results {
			if !yield(k) {
				return
			}
		}
	})
	var queue []reflect.Type
	for _, m := range names {
		rt := reflect.TypeOf(results[m])
		fmt.Fprintf(&b, "%-24s %s\n", m, rt.Name())
		queue = append(queue, rt)
	}
	seen := map[reflect.Type]bool{}
	for len(queue) > 0 {
		rt := queue[0]
		queue = queue[1:]
		for rt.Kind() == reflect.Pointer || rt.Kind() == reflect.Slice || rt.Kind() == reflect.Map {
			rt = rt.Elem()
		}
		if rt.Kind() != reflect.Struct || seen[rt] {
			continue
		}
		seen[rt] = true
		if rt.PkgPath() != pkg {
			// time.Time marshals as a string; any other package's type
			// would make its changes the API's.
			if rt.PkgPath() != "time" {
				t.Errorf("result type %s: the API's results are its own types", rt)
			}
			continue
		}
		fmt.Fprintf(&b, "\n%s\n", rt.Name())
		for i := range rt.NumField() {
			f := rt.Field(i)
			ft := f.Type
			if ft == reflect.TypeFor[*outText]() {
				ft = reflect.TypeFor[string]() // what it marshals as
			}
			if ft == reflect.TypeFor[*lineSpool]() {
				ft = reflect.TypeFor[[]outputLine]() // what it marshals as
			}
			fmt.Fprintf(&b, "  %-22s %s\n", f.Tag.Get("json"), strings.ReplaceAll(ft.String(), short, ""))
			queue = append(queue, ft)
		}
	}
	return b.String()
}

// TestResultsGolden pins the JSON shape of every method's answer, which
// clients depend on: a change shows here (regenerate with go test
// ./internal/rpc -run TestResultsGolden -update once it is meant).
func TestResultsGolden(t *testing.T) {
	for m := range (&Server{}).methodTable() {
		if _, ok := results[m]; !ok {
			t.Errorf("method %s: no result type in the golden list", m)
		}
	}
	got := resultSchema(t)
	if *update {
		if err := os.WriteFile("testdata/results.golden", []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("testdata/results.golden")
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("result shapes changed; if that is meant, run with -update.\ngot:\n%s", got)
	}
}
