package main

import (
	"context"
	"fmt"
	"strconv"
)

const nsAbout = `
Lists namespaces (tenants) of a running server with their use of their
quotas (docs/policy.md): sandboxes running of the most allowed, memory and
CPUs those hold of the namespace's total, and the disk its sandboxes use
(as last measured). "-" is no quota beyond the server's caps.

A key for every namespace ("*") sees them all; a namespace's key sees its
own.

  warren ns                  every namespace the key may see
  warren ns --namespace NS   one`

func nsCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren ns", "warren ns [flags]", nsAbout)
	c, ns := clientFlags(fs)
	var lf listFlags
	lf.register(fs, "namespaces")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := wantArgs(fs, fs.Args()); err != nil {
		return err
	}
	var out struct {
		Namespaces []nsRow `json:"namespaces"`
	}
	params := map[string]any{}
	if *ns != "" {
		params["namespace"] = *ns
	}
	if err := c.call(ctx, "namespace.usage", params, &out); err != nil {
		return err
	}
	of := func(used string, limit float64, unit string) string {
		l := "-"
		if limit > 0 {
			l = strconv.FormatFloat(limit, 'f', -1, 64)
		}
		return used + "/" + l + unit
	}
	return printList(&lf, out.Namespaces, func(n nsRow) string { return n.Namespace }, "NAMESPACE\tRUNNING\tMEMORY\tCPUS\tDISK\tSANDBOXES\tPER SANDBOX",
		func(n nsRow) string {
			q := n.Quota
			per := fmt.Sprintf("memory %s MiB, cpus %s, disk %s", orDash(float64(q.MaxMemoryMiB)), orDash(q.MaxCPUs), sizeOrDash(q.DiskBytes))
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%d\t%s", n.Namespace,
				of(strconv.Itoa(n.Running), float64(q.MaxSandboxes), ""),
				of(strconv.FormatInt(n.MemoryMiB, 10), float64(q.TotalMemoryMiB), " MiB"),
				of(strconv.FormatFloat(n.CPUs, 'f', -1, 64), q.TotalCPUs, ""),
				bytesText(n.DiskBytes), n.Sandboxes, per)
		})
}

// nsRow is a namespace as 'warren ns' shows it (namespace.usage's; its
// --json and --format fields).
type nsRow struct {
	Namespace string  `json:"namespace"`
	Sandboxes int     `json:"sandboxes"`
	Running   int     `json:"running"`
	MemoryMiB int64   `json:"memory_mib"`
	CPUs      float64 `json:"cpus"`
	DiskBytes int64   `json:"disk_bytes"`
	Quota     struct {
		MaxSandboxes   int     `json:"max_sandboxes"`
		TotalMemoryMiB int64   `json:"total_memory_mib"`
		TotalCPUs      float64 `json:"total_cpus"`
		MaxMemoryMiB   int64   `json:"max_memory_mib"`
		MaxCPUs        float64 `json:"max_cpus"`
		DiskBytes      int64   `json:"disk_bytes"`
	} `json:"quota"`
}

func orDash(x float64) string {
	if x <= 0 {
		return "-"
	}
	return strconv.FormatFloat(x, 'f', -1, 64)
}

// sizeOrDash is bytesText(n), "-" for none.
func sizeOrDash(n int64) string {
	if n <= 0 {
		return "-"
	}
	return bytesText(n)
}

// bytesText is n in the largest binary unit it has one of.
func bytesText(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	x, i := float64(n), 0
	for x >= 1024 && i < len(units)-1 {
		x /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%d B", n)
	}
	return fmt.Sprintf("%.1f %s", x, units[i])
}
