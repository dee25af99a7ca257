package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/audit"
)

const auditAbout = `
Reads the audit log that 'warren serve' writes (docs/policy.md, "Audit
log"): every API call, every run in a sandbox, every egress decision,
policy refusal, key and config change, and each sandbox's resource usage.
These commands read the files in the data directory directly (<data
dir>/audit, or --dir): no server is needed, and they change nothing.

Subcommands:
  (none)        print the records the filters select, one line each
                (or --json, -q: sequence numbers, --format: docs/cli.md)
  export        print them as stored: JSON lines, each verifiable
  verify        check the log: the chain of hashes, sequence numbers,
                checkpoint signatures and its end; say where it is damaged
  checkpoints   print the signed checkpoint lines: keep them somewhere the
                server cannot write, and give them to verify --anchor

Filters (query and export):
  --namespace NS --sandbox NAME --key ID --label K=V (repeatable)
  --kind api_call,exec,egress,refusal,key,config,usage,checkpoint,recovery
  --method sandbox.exec,...  --since T --until T (RFC 3339, or a duration
  ago like 2h)

verify exits 0 when the log is intact (a note may say a crash was
recorded), 1 when it was tampered with, 2 when its end is not signed and
no server is writing it (a crash, or records removed from its end).`

func auditCmd(ctx context.Context, args []string) error {
	sub := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	fs := newFlagSet("warren audit "+sub, "warren audit [export|verify|checkpoints] [flags]", auditAbout)
	w := bufio.NewWriter(os.Stdout)
	defer func() { _ = w.Flush() }()
	dataDir := fs.String("data-dir", envOr("WARREN_DATA_DIR", "/var/lib/warren"), "the server's data directory (env WARREN_DATA_DIR)")
	dir := fs.String("dir", "", "the audit log's directory (default <data dir>/audit)")
	switch sub {
	case "", "export":
		var f audit.Filter
		var labels, kinds, methods stringList
		var since, until string
		fs.StringVar(&f.Namespace, "namespace", "", "records of this namespace")
		fs.StringVar(&f.Sandbox, "sandbox", "", "records of this sandbox")
		fs.StringVar(&f.KeyID, "key", "", "records of calls made with this API key id")
		fs.Var(&labels, "label", "records of sandboxes with label K=V (repeatable: all of them)")
		fs.Var(&kinds, "kind", "records of these kinds (comma-separated)")
		fs.Var(&methods, "method", "calls of these methods (comma-separated)")
		fs.StringVar(&since, "since", "", "records at or after T (RFC 3339, or a duration ago: 2h)")
		fs.StringVar(&until, "until", "", "records before T")
		var lf listFlags
		if sub == "" {
			lf.register(fs, "sequence numbers")
		}
		if err := parseFlags(fs, args); err != nil {
			return err
		}
		rs, err := newRowStream(&lf, w, func(e *audit.Entry) string { return strconv.FormatUint(e.Seq, 10) })
		if err != nil {
			return err
		}
		if err := wantArgs(fs, fs.Args()); err != nil {
			return err
		}
		if f.Labels, err = parseLabels(labels); err != nil {
			return err
		}
		for _, k := range splitList(kinds) {
			f.Kinds = append(f.Kinds, audit.Kind(k))
		}
		f.Methods = splitList(methods)
		if f.Since, err = parseWhen(since); err != nil {
			return fmt.Errorf("--since: %w", err)
		}
		if f.Until, err = parseWhen(until); err != nil {
			return fmt.Errorf("--until: %w", err)
		}
		err = audit.Scan(logDir(*dir, *dataDir), f, func(line []byte, e *audit.Entry) error {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			switch {
			case sub == "export":
				_, err := w.Write(append(line, '\n'))
				return err
			case lf != (listFlags{}):
				return rs.write(e)
			}
			_, err := fmt.Fprintln(w, summary(e))
			return err
		})
		if err != nil {
			return err
		}
		return rs.close()
	case "verify":
		pub := fs.String("pub", "", "the checkpoint public key (default <dir>/checkpoint.pub; keep a copy where the server cannot write)")
		anchor := fs.String("anchor", "", "a file of checkpoint lines kept outside the log (warren audit checkpoints): each must be in the log")
		asJSON := fs.Bool("json", false, "print the report as JSON")
		if err := parseFlags(fs, args); err != nil {
			return err
		}
		return auditVerify(logDir(*dir, *dataDir), *pub, *anchor, *asJSON)
	case "checkpoints":
		if err := parseFlags(fs, args); err != nil {
			return err
		}
		return audit.Scan(logDir(*dir, *dataDir), audit.Filter{Kinds: []audit.Kind{audit.KindCheckpoint}}, func(line []byte, _ *audit.Entry) error {
			_, err := w.Write(append(line, '\n'))
			return err
		})
	default:
		return usageError{"warren audit", fmt.Sprintf("unknown subcommand %.40q%s (or none, to query)", sub, didYouMean(sub, []string{"export", "verify", "checkpoints"}, ""))}
	}
}

func logDir(dir, dataDir string) string {
	if dir != "" {
		return dir
	}
	return filepath.Join(dataDir, "audit")
}

func auditVerify(dir, pubPath, anchorPath string, asJSON bool) error {
	var o audit.VerifyOptions
	if pubPath != "" {
		pub, err := audit.ReadPublicKey(pubPath)
		if err != nil {
			return err
		}
		o.PublicKey = pub
	}
	if anchorPath != "" {
		b, err := os.ReadFile(anchorPath) //nolint:gosec // the operator's file
		if err != nil {
			return err
		}
		for l := range bytes.Lines(b) {
			if l = bytes.TrimSpace(l); len(l) > 0 {
				o.Anchors = append(o.Anchors, l)
			}
		}
	}
	rep, err := audit.Verify(dir, o)
	if err != nil {
		return err
	}
	if asJSON {
		b, _ := json.MarshalIndent(rep, "", "  ")
		fmt.Println(string(b))
	} else {
		for _, p := range rep.Problems {
			fmt.Println(p)
		}
		state := "intact"
		switch rep.Worst() {
		case audit.Tampered:
			state = "TAMPERED"
		case audit.Unanchored:
			state = "end not signed"
		}
		live := ""
		if rep.Live {
			live = ", a server is writing it"
		}
		fmt.Printf("%s: %d records in %d files, %d checkpoints verified, signed up to seq %d of %d%s\n",
			state, rep.Records, rep.Files, rep.Checkpoints, rep.SignedSeq, rep.LastSeq, live)
	}
	switch rep.Worst() {
	case audit.Tampered:
		return exitError{1}
	case audit.Unanchored:
		return exitError{2}
	}
	return nil
}

// summary is one record as a line for a person.
func summary(e *audit.Entry) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s  %6d  %-10s", e.Time.UTC().Format(time.RFC3339), e.Seq, e.Kind)
	if e.Namespace != "" || e.Sandbox != "" {
		fmt.Fprintf(&b, "  %s/%s", e.Namespace, e.Sandbox)
	}
	switch {
	case e.Call != nil:
		fmt.Fprintf(&b, "  %s %s %.1fms", e.Call.Method, e.Call.Outcome, e.Call.DurationMs)
	case e.Exec != nil:
		what := strings.Join(e.Exec.Argv, " ")
		if e.Exec.CodeSHA256 != "" {
			what = fmt.Sprintf("%s code sha256:%.16s (%d bytes)", e.Exec.Language, e.Exec.CodeSHA256, e.Exec.CodeBytes)
		}
		exit := ""
		if e.Exec.ExitCode != nil {
			exit = fmt.Sprintf(" exit %d", *e.Exec.ExitCode)
		}
		fmt.Fprintf(&b, "  %s: %.120q %s%s %.1fms", e.Exec.Via, what, e.Exec.Outcome, exit, e.Exec.DurationMs)
	case e.Egress != nil:
		fmt.Fprintf(&b, "  %s %s %s:%d %s", e.Egress.Kind, e.Egress.Verdict, e.Egress.Name, e.Egress.Port, e.Egress.Reason)
	case e.Refusal != nil:
		fmt.Fprintf(&b, "  %s %s: %s", e.Refusal.Method, e.Refusal.Kind, e.Refusal.Message)
	case e.Key != nil:
		fmt.Fprintf(&b, "  %s key %s (namespace %q) by %s", e.Key.Action, e.Key.ID, e.Key.Namespace, e.Key.By)
	case e.Config != nil:
		fmt.Fprintf(&b, "  accepted=%t %s %s", e.Config.Accepted, e.Config.Path, strings.Join(e.Config.Problems, "; "))
	case e.Usage != nil:
		fmt.Fprintf(&b, "  %s: cpu %.2fs memory %.0f MiB·s egress %d/%d bytes", e.Usage.Reason, e.Usage.CPUSeconds, e.Usage.MemorySeconds/(1<<20),
			e.Usage.EgressBytesOut, e.Usage.EgressBytesIn)
	case e.Checkpoint != nil:
		fmt.Fprintf(&b, "  %s, key %s", e.Checkpoint.Reason, e.Checkpoint.KeyID)
	case e.Recovery != nil:
		fmt.Fprintf(&b, "  %s after seq %d", e.Recovery.Reason, e.Recovery.LastSeq)
	}
	if e.KeyID != "" {
		fmt.Fprintf(&b, "  key=%s", e.KeyID)
	}
	if len(e.Labels) > 0 {
		lb, _ := json.Marshal(e.Labels)
		fmt.Fprintf(&b, "  labels=%s", lb)
	}
	return b.String()
}

func parseLabels(l []string) (map[string]string, error) {
	if len(l) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range l {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--label %q: want KEY=VALUE", kv)
		}
		out[k] = v
	}
	return out, nil
}

func splitList(l []string) []string {
	var out []string
	for _, s := range l {
		for p := range strings.SplitSeq(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

// parseWhen reads a time: RFC 3339, or a duration before now.
func parseWhen(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return time.Now().Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%q: want an RFC 3339 time (2026-01-02T15:04:05Z) or a duration ago (2h)", s)
}

// auditKeyChange records a key created or revoked offline in the log in
// dataDir's audit directory, beside a server that may be writing it.
// Without that directory (a server run with --audit=false) nothing is
// recorded.
func auditKeyChange(dataDir, action, id, ns string) error {
	dir := filepath.Join(dataDir, "audit")
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	l, err := audit.Open(audit.Options{Dir: dir, OneOff: true})
	if err != nil {
		return fmt.Errorf("record the key change in the audit log: %w", err)
	}
	err = l.Append(&audit.Record{Kind: audit.KindKey, Key: &audit.KeyChange{Action: action, ID: id, Namespace: ns, By: "cli"}})
	if cerr := l.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("record the key change in the audit log: %w", err)
	}
	return nil
}
