package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

const workspaceAbout = `
Manages the named workspaces of a running server (docs/policy.md,
"Workspaces"): directories of a namespace that outlive sandboxes, mounted
at /workspace by sandboxes created with --workspace NAME (sandbox.create's
"workspace").

  warren workspace create NAME [--store S] [--quota BYTES]
  warren workspace ls                     the namespace's workspaces
  warren workspace get NAME               its store, quota and usage
  warren workspace rm NAME                refused while a sandbox mounts it
  warren workspace push NAME < files.tar  extract a tar into it
  warren workspace pull NAME > files.tar  its files as a tar
  warren workspace sync NAME              an object store's: push, then pull`

func workspaceCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren workspace", "warren workspace create|ls|get|rm|push|pull|sync [flags] [NAME]", workspaceAbout)
	c, ns := clientFlags(fs)
	store := fs.String("store", "", "create: the store (default: the server's)")
	quota := fs.Int64("quota", 0, "create: the quota in bytes (0: the server's default)")
	var lf listFlags
	lf.register(fs, "names")
	sub, err := subcommand(fs, args, "create", "ls", "get", "rm", "push", "pull", "sync")
	if err != nil {
		return err
	}
	fs = subFlagSet(fs, sub, "warren workspace "+sub+" [flags]"+map[bool]string{true: "", false: " NAME"}[sub == "ls"], workspaceAbout)
	pos, err := parseInterspersed(fs, args[1:])
	if err != nil {
		return err
	}
	if sub == "ls" {
		err = wantArgs(fs, pos)
	} else {
		err = wantArgs(fs, pos, "NAME (the workspace)")
	}
	if err != nil {
		return err
	}
	name := ""
	if len(pos) > 0 {
		name = pos[0]
	}
	ref := map[string]any{"namespace": *ns, "workspace": name}
	var out any
	switch sub {
	case "create":
		out = new(json.RawMessage)
		if err := c.call(ctx, "workspace.create", map[string]any{"namespace": *ns, "name": name, "store": *store, "quota": *quota}, out); err != nil {
			return err
		}
	case "get":
		out = new(json.RawMessage)
		if err := c.call(ctx, "workspace.get", ref, out); err != nil {
			return err
		}
	case "sync":
		out = new(json.RawMessage)
		if err := c.call(ctx, "workspace.sync", ref, out); err != nil {
			return err
		}
	case "rm":
		return c.call(ctx, "workspace.remove", ref, nil)
	case "ls":
		var l struct {
			Workspaces []workspaceRow `json:"workspaces"`
		}
		if err := c.call(ctx, "workspace.list", map[string]any{"namespace": *ns}, &l); err != nil {
			return err
		}
		return printList(&lf, l.Workspaces, func(w workspaceRow) string { return w.Name }, "NAMESPACE\tNAME\tSTORE\tQUOTA\tIN USE",
			func(w workspaceRow) string {
				return fmt.Sprintf("%s\t%s\t%s\t%d\t%v", w.Namespace, w.Name, w.Store, w.Quota, w.InUse)
			})
	case "push":
		return c.workspaceTar(ctx, "PUT", *ns, name, os.Stdin, os.Stdout)
	case "pull":
		return c.workspaceTar(ctx, "GET", *ns, name, nil, os.Stdout)
	}
	b, _ := json.MarshalIndent(out, "", "  ")
	fmt.Println(string(b))
	return nil
}

// workspaceRow is a workspace as 'workspace ls' shows it (its --json and
// --format fields).
type workspaceRow struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Store     string `json:"store"`
	Quota     int64  `json:"quota"`
	InUse     bool   `json:"in_use"`
}

// workspaceTar sends or fetches a workspace's tar (the server's
// /api/v1/workspaces/{namespace}/{name}/tar route).
func (c *apiClient) workspaceTar(ctx context.Context, method, ns, name string, body io.Reader, out io.Writer) error {
	resp, err := c.tarRequest(ctx, method, c.tarURL("workspaces", ns, name, nil), body)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if _, err := io.Copy(out, resp.Body); err != nil {
		return fmt.Errorf("workspace %s: %w", name, err)
	}
	if method == "PUT" {
		fmt.Fprintln(out)
	}
	return nil
}
