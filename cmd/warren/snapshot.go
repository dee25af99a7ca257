package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

const snapshotAbout = `
Checkpoints running sandboxes of a running server into named snapshots of
their namespace, and starts new sandboxes from them (docs/api.md,
"Snapshots"; isolation gvisor only: docs/isolation.md says what a copy
keeps and what it shares).

  warren snapshot create SANDBOX NAME      checkpoint SANDBOX into NAME (it runs on)
  warren snapshot restore NAME SANDBOX     a new SANDBOX from NAME, running
  warren snapshot fork SANDBOX [--count N] N running copies of SANDBOX
  warren snapshot ls                       the namespace's snapshots
  warren snapshot get NAME                 its source, size and time
  warren snapshot rm NAME`

func snapshotCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren snapshot", "warren snapshot create|restore|fork|ls|get|rm [flags] ARGS", snapshotAbout)
	c, ns := clientFlags(fs)
	count := fs.Int("count", 1, "fork: how many copies")
	var lf listFlags
	lf.register(fs, "names")
	sub, err := subcommand(fs, args, "create", "restore", "fork", "ls", "get", "rm")
	if err != nil {
		return err
	}
	usage := map[string]string{
		"create": " SANDBOX NAME", "restore": " NAME SANDBOX", "fork": " SANDBOX", "ls": "", "get": " NAME", "rm": " NAME",
	}[sub]
	fs = subFlagSet(fs, sub, "warren snapshot "+sub+" [flags]"+usage, snapshotAbout)
	pos, err := parseInterspersed(fs, args[1:])
	if err != nil {
		return err
	}
	var want []string
	for _, w := range strings.Fields(usage) {
		want = append(want, map[string]string{"SANDBOX": "SANDBOX (the sandbox)", "NAME": "NAME (the snapshot)"}[w])
	}
	if err := wantArgs(fs, pos, want...); err != nil {
		return err
	}
	var out any = new(json.RawMessage)
	switch sub {
	case "create":
		err = c.call(ctx, "sandbox.checkpoint", map[string]any{"namespace": *ns, "sandbox": pos[0], "snapshot": pos[1]}, out)
	case "restore":
		var info struct {
			Name  string `json:"name"`
			State string `json:"state"`
		}
		if err := c.call(ctx, "sandbox.restore", map[string]any{"namespace": *ns, "snapshot": pos[0], "name": pos[1]}, &info); err != nil {
			return err
		}
		fmt.Printf("%s %s\n", info.Name, info.State)
		return nil
	case "fork":
		var res struct {
			Sandboxes []struct {
				Name  string `json:"name"`
				State string `json:"state"`
			} `json:"sandboxes"`
		}
		if err := c.call(ctx, "sandbox.fork", map[string]any{"namespace": *ns, "sandbox": pos[0], "count": *count}, &res); err != nil {
			return err
		}
		for _, s := range res.Sandboxes {
			fmt.Printf("%s %s\n", s.Name, s.State)
		}
		return nil
	case "get":
		err = c.call(ctx, "snapshot.get", map[string]any{"namespace": *ns, "snapshot": pos[0]}, out)
	case "rm":
		return c.call(ctx, "snapshot.remove", map[string]any{"namespace": *ns, "snapshot": pos[0]}, nil)
	case "ls":
		var l struct {
			Snapshots []snapshotRow `json:"snapshots"`
		}
		if err := c.call(ctx, "snapshot.list", map[string]any{"namespace": *ns}, &l); err != nil {
			return err
		}
		return printList(&lf, l.Snapshots, func(s snapshotRow) string { return s.Name }, "NAMESPACE\tNAME\tSOURCE\tISOLATION\tBYTES\tCREATED",
			func(s snapshotRow) string {
				return s.Namespace + "\t" + s.Name + "\t" + s.Source + "\t" + s.Isolation + "\t" + strconv.FormatInt(s.Bytes, 10) + "\t" + s.Created
			})
	}
	if err != nil {
		return err
	}
	b, _ := json.MarshalIndent(out, "", "  ")
	fmt.Println(string(b))
	return nil
}

// snapshotRow is a snapshot as 'snapshot ls' shows it (its --json and
// --format fields).
type snapshotRow struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Source    string `json:"source"`
	Isolation string `json:"isolation"`
	Image     string `json:"image"`
	Bytes     int64  `json:"bytes"`
	Created   string `json:"created"`
}
