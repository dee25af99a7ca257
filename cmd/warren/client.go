package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"
)

// apiClient is the CLI's JSON-RPC client for a running 'warren serve'.
type apiClient struct {
	url string
	key string
	hc  *http.Client
}

// clientFlags are the flags of commands that talk to the server. The key
// is read from the environment only, so it never shows in ps or history.
func clientFlags(fs *flag.FlagSet) (*apiClient, *string) {
	c := &apiClient{key: os.Getenv("MSB_API_KEY"), hc: &http.Client{}}
	fs.StringVar(&c.url, "server", envOr("MSB_SERVER_URL", "http://127.0.0.1:5555"), "server URL (env MSB_SERVER_URL); the API key is read from MSB_API_KEY")
	ns := fs.String("namespace", "default", "namespace")
	return c, ns
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
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the server at %s (is 'warren serve' running?): %w", c.url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
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
Lists the sandboxes of a running server ('warren serve'), with their state,
image and limits. --namespace '*' lists every namespace the key may see.`

func psCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren ps", "warren ps [--namespace NS|'*'] [--state STATE]", psAbout)
	c, ns := clientFlags(fs)
	state := fs.String("state", "", "only sandboxes in this state (starting, running, stopping, stopped, error)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var out struct {
		Sandboxes []struct {
			Namespace string     `json:"namespace"`
			Name      string     `json:"name"`
			State     string     `json:"state"`
			Error     string     `json:"error"`
			Image     string     `json:"image"`
			MemoryMiB int64      `json:"memory_mib"`
			CPUs      float64    `json:"cpus"`
			StartedAt *time.Time `json:"started_at"`
		} `json:"sandboxes"`
	}
	if err := c.call(ctx, "sandbox.list", map[string]any{"namespace": *ns, "state": *state}, &out); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tNAME\tSTATE\tIMAGE\tMEMORY\tCPUS\tUP")
	for _, s := range out.Sandboxes {
		up := "-"
		if s.StartedAt != nil && s.State == "running" {
			up = time.Since(*s.StartedAt).Round(time.Second).String()
		}
		st := s.State
		if s.Error != "" {
			st += " (" + s.Error + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%dM\t%g\t%s\n", s.Namespace, s.Name, st, s.Image, s.MemoryMiB, s.CPUs, up)
	}
	return tw.Flush()
}

const logsAbout = `
Prints a sandbox's log from a running server: its lifecycle and every
command, code run and process with its outcome, oldest first.`

func logsCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren logs", "warren logs [-f] [--tail N] NAME", logsAbout)
	c, ns := clientFlags(fs)
	tail := fs.Int("tail", 0, "only the last N lines (0 = all kept)")
	follow := fs.Bool("f", false, "follow: print new lines as they are written, until interrupted")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return exitError{2}
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
