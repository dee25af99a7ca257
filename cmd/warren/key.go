package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/warren-sandbox/warren/internal/auth"
	"github.com/warren-sandbox/warren/internal/store"
)

const keyAbout = `
Manages the API keys 'warren serve' accepts. Keys are 'msb_' followed by a
JWT signed with this host's secret (data directory, secret.key), so
microsandbox clients accept them as MSB_API_KEY. A key is scoped to one
namespace, or to all with --namespace '*'.

Subcommands:
  create --namespace NS [--expire 30d] [--description TEXT]
                      print a new key (shown only once)
  list                list keys (id, namespace, expiry, revocation)
  revoke ID           make a key unusable at once

These work on the host's database directly (run them as the server's user);
a running server sees changes immediately. create and revoke are recorded
in the audit log (<data dir>/audit) when it exists.`

func keyCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren key", "warren key create|list|revoke [flags]", keyAbout)
	dataDir := fs.String("data-dir", envOr("WARREN_DATA_DIR", "/var/lib/warren"), "where the key database and the signing secret are (env WARREN_DATA_DIR)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return exitError{2}
	}
	// Every flag, before or after the subcommand, is parsed before
	// anything is created on disk: a mistyped flag or a --data-dir given
	// after the subcommand must not leave a database and a secret in the
	// wrong directory.
	sub, rest := fs.Arg(0), fs.Args()[1:]
	var run func(keys *auth.Keys) error
	switch sub {
	case "create":
		cfs := newFlagSet("warren key create", "warren key create --namespace NS [--expire 30d] [--description TEXT] [--data-dir DIR]", keyAbout)
		cfs.StringVar(dataDir, "data-dir", *dataDir, "where the key database and the signing secret are (env WARREN_DATA_DIR)")
		ns := cfs.String("namespace", "", "namespace the key may use ('*' = all)")
		expire := cfs.String("expire", "30d", "lifetime: a duration like 12h, 30d or 1y")
		desc := cfs.String("description", "", "a note shown by 'warren key list'")
		if _, err := parseArgs(cfs, rest, 0); err != nil {
			return err
		}
		if *ns == "" {
			return fmt.Errorf("--namespace is required (use '*' for a key that may use every namespace)")
		}
		ttl, err := parseLifetime(*expire)
		if err != nil {
			return err
		}
		run = func(keys *auth.Keys) error {
			k, rec, err := keys.Create(ctx, *ns, ttl, *desc)
			if err != nil {
				return err
			}
			fmt.Println(k)
			fmt.Fprintf(os.Stderr, "key %s for namespace %q, expires %s\n", rec.ID, rec.Namespace, rec.Expires.Format(time.RFC3339))
			return auditKeyChange(*dataDir, "create", rec.ID, rec.Namespace)
		}
	case "list":
		lfs := newFlagSet("warren key list", "warren key list [--data-dir DIR]", keyAbout)
		lfs.StringVar(dataDir, "data-dir", *dataDir, "where the key database and the signing secret are (env WARREN_DATA_DIR)")
		if _, err := parseArgs(lfs, rest, 0); err != nil {
			return err
		}
		run = func(keys *auth.Keys) error { return listKeys(ctx, keys) }
	case "revoke":
		rfs := newFlagSet("warren key revoke", "warren key revoke ID [--data-dir DIR]", keyAbout)
		rfs.StringVar(dataDir, "data-dir", *dataDir, "where the key database and the signing secret are (env WARREN_DATA_DIR)")
		pos, err := parseArgs(rfs, rest, 1)
		if err != nil {
			return fmt.Errorf("%w (usage: warren key revoke ID; ids are listed by 'warren key list')", err)
		}
		run = func(keys *auth.Keys) error {
			if err := keys.Revoke(ctx, pos[0]); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "key %s revoked\n", pos[0])
			return auditKeyChange(*dataDir, "revoke", pos[0], "")
		}
	default:
		return fmt.Errorf("unknown subcommand %q: want create, list or revoke", sub)
	}
	db, err := store.Open(filepath.Join(*dataDir, "warren.db"))
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }()
	secret, err := auth.LoadOrCreateSecret(filepath.Join(*dataDir, "secret.key"))
	if err != nil {
		return err
	}
	signer, err := auth.NewSigner(secret)
	if err != nil {
		return err
	}
	return run(auth.NewKeys(signer, db.DB()))
}

// parseArgs parses fs from args with flags and want positional arguments
// in any order (the flag package stops at the first non-flag).
func parseArgs(fs *flag.FlagSet, args []string, want int) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(pos) != want {
		return nil, fmt.Errorf("%s: want %d argument(s) besides flags, got %d: %q", fs.Name(), want, len(pos), pos)
	}
	return pos, nil
}

func listKeys(ctx context.Context, keys *auth.Keys) error {
	recs, err := keys.List(ctx)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAMESPACE\tCREATED\tEXPIRES\tSTATUS\tDESCRIPTION")
	for _, r := range recs {
		status := "valid"
		switch {
		case r.Revoked != nil:
			status = "revoked " + r.Revoked.Format(time.RFC3339)
		case time.Now().After(r.Expires):
			status = "expired"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Namespace, r.Created.Format(time.RFC3339), r.Expires.Format(time.RFC3339), status, r.Description)
	}
	return tw.Flush()
}

// parseLifetime reads a duration that may use d (days) and y (365 days).
func parseLifetime(s string) (time.Duration, error) {
	for suffix, unit := range map[string]time.Duration{"d": 24 * time.Hour, "y": 365 * 24 * time.Hour} {
		if n, ok := strings.CutSuffix(s, suffix); ok {
			v, err := strconv.ParseFloat(n, 64)
			if err != nil || v <= 0 {
				break
			}
			return time.Duration(v * float64(unit)), nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("lifetime %q: want a positive duration like 12h, 30d or 1y", s)
	}
	return d, nil
}
