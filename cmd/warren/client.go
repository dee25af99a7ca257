package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"
)

// apiClient is the CLI's JSON-RPC client for a running 'warren serve'.
type apiClient struct {
	url     string
	key     string
	verbose bool
	hc      *http.Client
}

// clientFlags are the flags of commands that talk to the server, with the
// global flags as defaults. The key is best read from the environment
// (MSB_API_KEY), where it does not show in ps or history.
//
// The namespace is empty unless given: the server then uses the API key's
// own (or "default" for a key for every namespace), so a namespace's key
// needs no --namespace.
func clientFlags(fs *flag.FlagSet) (*apiClient, *string) {
	c := &apiClient{hc: &http.Client{}}
	fs.StringVar(&c.url, "server", cmp.Or(globals.server, envOr("MSB_SERVER_URL", "http://127.0.0.1:5555")), "server URL (env MSB_SERVER_URL)")
	fs.StringVar(&c.key, "key", cmp.Or(globals.key, os.Getenv("MSB_API_KEY")), "API key (env MSB_API_KEY, better: a flag shows in ps and history)")
	fs.BoolVar(&c.verbose, "v", globals.verbose, "print each call to the server and its duration on stderr")
	ns := fs.String("namespace", globals.namespace, "namespace (default: the API key's own; \"default\" for a key for every namespace)")
	return c, ns
}

// pathNamespace is ns as a route's {namespace}: "-" stands for the
// namespace a request naming none gets.
func pathNamespace(ns string) string {
	if ns == "" {
		return "-"
	}
	return ns
}

type rpcError struct {
	Code    int            `json:"code"`
	Message string         `json:"message"`
	Data    map[string]any `json:"data"`
}

func (e *rpcError) Error() string { return e.Message }

func (c *apiClient) call(ctx context.Context, method string, params, out any) error {
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method, "params": params, "id": 1})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, "POST", strings.TrimRight(c.url, "/")+"/api/v1/rpc", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	start := time.Now()
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the server at %s (is 'warren serve' running?): %w", c.url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if c.verbose {
		fmt.Fprintf(os.Stderr, "%s %s: %s, %d bytes in %s\n", c.url, method, resp.Status, len(raw), time.Since(start).Round(time.Microsecond))
	}
	if err != nil {
		return err
	}
	var r struct {
		Result json.RawMessage `json:"result"`
		Error  *rpcError       `json:"error"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return fmt.Errorf("server answered %s: %.200s", resp.Status, raw)
	}
	if r.Error != nil {
		return r.Error
	}
	if out != nil {
		return json.Unmarshal(r.Result, out)
	}
	return nil
}

const psAbout = `
Lists the sandboxes of a running server ('warren serve') that are up
(starting, running, paused or stopping; -a: all), with their state, image
and limits. The namespace is the API key's own unless given; --namespace
'*' lists every namespace the key may see.`

func psCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren ps", "warren ps [-a] [--namespace NS|'*'] [--state STATE] [--json|-q|--format T]", psAbout)
	c, ns := clientFlags(fs)
	all := fs.Bool("a", false, "all sandboxes, the stopped ones too (without: those starting, running, paused or stopping)")
	state := fs.String("state", "", "only sandboxes in this state (starting, running, paused, stopping, stopped, error)")
	var lf listFlags
	lf.register(fs, "names")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := wantArgs(fs, fs.Args()); err != nil {
		return err
	}
	var out struct {
		Sandboxes []psRow `json:"sandboxes"`
	}
	if err := c.call(ctx, "sandbox.list", map[string]any{"namespace": *ns, "state": *state}, &out); err != nil {
		return err
	}
	if *state == "" && !*all {
		// As docker ps: what is up, paused included.
		out.Sandboxes = slices.DeleteFunc(out.Sandboxes, func(s psRow) bool { return s.State == "stopped" || s.State == "error" })
	}
	return printList(&lf, out.Sandboxes, func(s psRow) string { return s.Name }, "NAMESPACE\tNAME\tSTATE\tIMAGE\tMEMORY\tCPUS\tUP",
		func(s psRow) string {
			up := "-"
			if s.StartedAt != nil && s.State == "running" {
				up = time.Since(*s.StartedAt).Round(time.Second).String()
			}
			st := s.State
			if s.Error != "" {
				st += " (" + s.Error + ")"
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%dM\t%g\t%s", s.Namespace, s.Name, st, s.Image, s.MemoryMiB, s.CPUs, up)
		})
}

// psRow is a sandbox as 'warren ps' shows it (its --json and --format
// fields: sandbox.list's, a part).
type psRow struct {
	Namespace string     `json:"namespace"`
	Name      string     `json:"name"`
	State     string     `json:"state"`
	Error     string     `json:"error,omitempty"`
	Image     string     `json:"image"`
	MemoryMiB int64      `json:"memory_mib"`
	CPUs      float64    `json:"cpus"`
	StartedAt *time.Time `json:"started_at"`
}

const logsAbout = `
Prints a sandbox's log from a running server: its lifecycle and every
command, code run and process with its outcome, oldest first.`

func logsCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren logs", "warren logs [-f] [--tail N] NAME", logsAbout)
	c, ns := clientFlags(fs)
	tail := fs.Int("tail", 0, "only the last N lines (0 = all kept)")
	follow := fs.Bool("f", false, "follow: print new lines as they are written, until interrupted")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := wantArgs(fs, fs.Args(), "NAME (the sandbox)"); err != nil {
		return err
	}
	if *follow {
		return followLogs(ctx, c, *ns, fs.Arg(0), *tail)
	}
	var out struct {
		Lines []string `json:"lines"`
	}
	if err := c.call(ctx, "sandbox.logs", map[string]any{"namespace": *ns, "sandbox": fs.Arg(0), "tail": *tail}, &out); err != nil {
		return err
	}
	for _, l := range out.Lines {
		fmt.Println(l)
	}
	return nil
}
