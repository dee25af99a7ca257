package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	sub, err := subcommand(fs, fs.Args(), "create", "list", "revoke")
	if err != nil {
		return err
	}
	// Every flag, before or after the subcommand, is parsed before
	// anything is created on disk: a mistyped flag or a --data-dir given
	// after the subcommand must not leave a database and a secret in the
	// wrong directory.
	rest := fs.Args()[1:]
	var run func(keys *auth.Keys) error
	switch sub {
	case "create":
		cfs := subFlagSet(fs, "create", "warren key create --namespace NS [--expire 30d] [--description TEXT] [--data-dir DIR]",
			"Prints a new API key (shown only once) for namespace NS, or for every\nnamespace with --namespace '*'.")
		ns := cfs.String("namespace", globals.namespace, "namespace the key may use ('*' = all)")
		expire := cfs.String("expire", "30d", "lifetime: a duration like 12h, 30d or 1y")
		desc := cfs.String("description", "", "a note shown by 'warren key list'")
		if _, err := parseArgs(cfs, rest); err != nil {
			return err
		}
		if *ns == "" {
			return usageError{cfs.Name(), "missing --namespace NS (use '*' for a key that may use every namespace)"}
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
		lfs := subFlagSet(fs, "list", "warren key list [--data-dir DIR] [flags]", "Lists the API keys: id, namespace, expiry, revocation. -q prints the ids.")
		var lf listFlags
		lf.register(lfs, "ids")
		if _, err := parseArgs(lfs, rest); err != nil {
			return err
		}
		run = func(keys *auth.Keys) error { return listKeys(ctx, keys, &lf) }
	case "revoke":
		rfs := subFlagSet(fs, "revoke", "warren key revoke ID [--data-dir DIR]", "Makes the key ID unusable at once; 'warren key list' lists the ids.")
		pos, err := parseArgs(rfs, rest, "ID (the key's, from 'warren key list')")
		if err != nil {
			return err
		}
		run = func(keys *auth.Keys) error {
			if err := keys.Revoke(ctx, pos[0]); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "key %s revoked\n", pos[0])
			return auditKeyChange(*dataDir, "revoke", pos[0], "")
		}
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

// parseArgs parses fs from args with flags and the positional arguments
// want in any order (the flag package stops at the first non-flag).
func parseArgs(fs *flag.FlagSet, args []string, want ...string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	return pos, wantArgs(fs, pos, want...)
}

// keyRow is a row of 'warren key list' (its --json and --format fields).
type keyRow struct {
	ID          string     `json:"id"`
	Namespace   string     `json:"namespace"`
	Created     time.Time  `json:"created"`
	Expires     time.Time  `json:"expires"`
	Revoked     *time.Time `json:"revoked"`
	Status      string     `json:"status"` // valid, expired or revoked
	Description string     `json:"description"`
}

func listKeys(ctx context.Context, keys *auth.Keys, lf *listFlags) error {
	recs, err := keys.List(ctx)
	if err != nil {
		return err
	}
	rows := make([]keyRow, len(recs))
	for i, r := range recs {
		rows[i] = keyRow{ID: r.ID, Namespace: r.Namespace, Created: r.Created, Expires: r.Expires, Revoked: r.Revoked, Status: "valid", Description: r.Description}
		switch {
		case r.Revoked != nil:
			rows[i].Status = "revoked"
		case time.Now().After(r.Expires):
			rows[i].Status = "expired"
		}
	}
	return printList(lf, rows, func(r keyRow) string { return r.ID }, "ID\tNAMESPACE\tCREATED\tEXPIRES\tSTATUS\tDESCRIPTION",
		func(r keyRow) string {
			status := r.Status
			if r.Revoked != nil {
				status += " " + r.Revoked.Format(time.RFC3339)
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s", r.ID, r.Namespace, r.Created.Format(time.RFC3339), r.Expires.Format(time.RFC3339), status, r.Description)
		})
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
