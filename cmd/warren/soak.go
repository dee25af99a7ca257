package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/bench"
)

const soakAbout = `
Runs many clients at once over the server's API for a while: sandboxes
started and created, commands, exec, shell, Python REPL runs, file
writes, reads and lists, tar uploads and downloads, background processes
waited for and killed, metrics, stops, restarts and removes, and calls
that must fail (a missing file or sandbox, a name in use). Each client
owns at most two sandboxes and recycles them. Every second it samples the
server's resident memory and open files (/proc) and goroutines (/metrics).

It fails on any error a client did not provoke, on goroutines, open files
or memory growing under steady load (the median of the last third of the
samples after the warm-up against the first third's), on goroutines or
open files not back near their starting values once the clients are gone,
and on anything left behind. It prints latency percentiles per method.

Without -url it starts its own 'warren serve' (this binary, API keys on,
a temporary data and run directory, loopback) and also checks, after the
load and after the server stops, that no sandbox directory, mount, cgroup
or process is left. With -url it soaks that server with -key (a key for
-namespace or '*'), and samples /proc only with -pid.`

func soakCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren bench soak", "warren bench soak [flags]", soakAbout)
	clients := fs.Int("clients", 64, "clients running at once")
	duration := fs.Duration("duration", 5*time.Minute, "how long the load runs")
	think := fs.Duration("think", 250*time.Millisecond, "a client's mean pause between operations")
	warmup := fs.Duration("warmup", 0, "start of the load not judged for trends (0 = a third, at most 1m)")
	url := fs.String("url", "", "soak this server instead of starting one (env MSB_SERVER_URL is not read)")
	key := fs.String("key", "", "with -url: API key for -namespace or '*' (env MSB_API_KEY)")
	adminKey := fs.String("admin-key", "", "with -url: a '*' key to read the goroutine count from /metrics (default -key)")
	ns := fs.String("namespace", "soak", "with -url: namespace of the clients' sandboxes (it should hold none)")
	pid := fs.Int("pid", 0, "with -url: the server's pid, to sample its memory and open files (0 = none)")
	prewarm := fs.Int("prewarm", 2, "without -url: the server's --prewarm")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *clients < 1 || *clients > 1024 {
		return fmt.Errorf("-clients %d: want 1..1024", *clients)
	}
	if *duration < 10*time.Second {
		return fmt.Errorf("-duration %v: want at least 10s (trends need samples)", *duration)
	}
	opts := bench.SoakOptions{Clients: *clients, Duration: *duration, Warmup: *warmup, Think: *think, Log: os.Stderr}
	var srv *bench.SoakServer
	if *url != "" {
		if *key == "" {
			*key = os.Getenv("MSB_API_KEY")
		}
		opts.URL, opts.Key, opts.AdminKey, opts.Namespace = strings.TrimRight(*url, "/"), *key, *adminKey, *ns
		if *pid > 0 {
			p := *pid
			opts.Sample = func() bench.Reading { return bench.ProcSample(p) }
		}
	} else {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		srv, err = bench.StartSoakServer(ctx, self, nil, *prewarm)
		if err != nil {
			return err
		}
		defer srv.Close()
		opts.URL, opts.Key, opts.AdminKey, opts.Sample = srv.URL, srv.Key, srv.AdminKey, srv.Sample
		fmt.Fprintf(os.Stderr, "warren serve (pid %d) on %s; %d clients for %v\n", srv.Pid, srv.URL, *clients, *duration)
	}
	rep, err := bench.Soak(ctx, opts)
	if err != nil {
		if srv != nil {
			_ = srv.Stop()
		}
		return err
	}
	if srv != nil {
		rep.Left = append(rep.Left, srv.Leftovers(false, 30*time.Second)...)
		if err := srv.Stop(); err != nil {
			rep.Left = append(rep.Left, err.Error())
		}
		rep.Left = append(rep.Left, srv.Leftovers(true, 30*time.Second)...)
	}
	rep.Write(os.Stdout)
	if len(rep.Problems()) > 0 {
		return errors.New("soak failed")
	}
	return nil
}
