package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/warren-sandbox/warren/internal/kube"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

// clusterFlags are serve's node mode: registering with a Kubernetes
// cluster (docs/kubernetes.md).
type clusterFlags struct {
	kubeconfig string // "" = off, "in-cluster" = the pod's service account
	node       string
	namespace  string
	labels     stringList
	lease      time.Duration
}

func (f *clusterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.kubeconfig, "cluster", envOr("WARREN_CLUSTER", ""), "node mode: register this server as a node of a Kubernetes cluster, through this kubeconfig file\n(in-cluster = the pod's service account; env WARREN_CLUSTER; docs/kubernetes.md)")
	host, _ := os.Hostname()
	fs.StringVar(&f.node, "node-name", envOr("WARREN_NODE_NAME", strings.ToLower(host)), "node mode: this node's name, its Lease's (env WARREN_NODE_NAME; default the host name)")
	fs.StringVar(&f.namespace, "cluster-namespace", envOr("WARREN_CLUSTER_NAMESPACE", "warren-system"), "node mode: the namespace of the nodes' Leases")
	fs.Var(&f.labels, "node-label", "node mode: a KEY=VALUE label Sandboxes' nodeSelector can ask for (repeatable)")
	fs.DurationVar(&f.lease, "lease-duration", kube.DefaultLeaseDuration, "node mode: how long the node's Lease holds unrenewed (renewed every third of it);\nits sandboxes are marked lost that long after the server stops")
}

// validate checks the node-mode flags, before the server starts anything.
func (f *clusterFlags) validate() (labels map[string]string, err error) {
	if f.kubeconfig == "" {
		return nil, nil
	}
	labels = map[string]string{}
	var errs []error
	for _, l := range f.labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" || len(k) > 253 || len(v) > 63 {
			errs = append(errs, fmt.Errorf("--node-label %q: want KEY=VALUE (a value of at most 63 characters)", l))
			continue
		}
		labels[k] = v
	}
	if !kube.ValidName(f.node) {
		errs = append(errs, fmt.Errorf("--node-name %q: want lower-case letters, digits, '-' and '.', at most 63", f.node))
	}
	if !kube.ValidName(f.namespace) {
		errs = append(errs, fmt.Errorf("--cluster-namespace %q: want a Kubernetes namespace name", f.namespace))
	}
	if f.lease < time.Second || f.lease > time.Hour {
		errs = append(errs, fmt.Errorf("--lease-duration %s: want 1s to 1h", f.lease))
	}
	return labels, errors.Join(errs...)
}

// registrar returns the node's registrar, nil when node mode is off.
func (f *clusterFlags) registrar(log *slog.Logger, endpoint string, capacity sandbox.Capacity, maxRunning int, tiers []string) (*kube.Registrar, error) {
	labels, err := f.validate()
	if err != nil || f.kubeconfig == "" {
		return nil, err
	}
	client, err := kube.Load(f.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--cluster: %w", err)
	}
	return &kube.Registrar{
		Client: client, Namespace: f.namespace, Node: f.node, Duration: f.lease, Log: log,
		Info: kube.NodeInfo{
			Endpoint: endpoint, MemoryMiB: capacity.MemoryBytes >> 20, CPUs: capacity.CPUs,
			Sandboxes: maxRunning, Tiers: tiers, Labels: labels,
		},
	}, nil
}

// tierNames is the tiers a server runs, its default first.
func tierNames(def string, on map[string]sandbox.Tier) []string {
	names := []string{def}
	for _, n := range sandbox.TierNames {
		if _, ok := on[n]; ok && n != def {
			names = append(names, n)
		}
	}
	return slices.Clip(names)
}

// joinCluster registers the node and keeps renewing its Lease in the
// background until ctx ends; the server refuses to start when the first
// registration fails, so a misconfigured node is seen at once.
func joinCluster(ctx context.Context, r *kube.Registrar) (stop func(), err error) {
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = r.Register(rctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("--cluster: %w", err)
	}
	ctx, cancel = context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx)
	}()
	return func() {
		cancel()
		<-done
		r.Client.Close()
	}, nil
}

const controllerAbout = `
Runs the placement controller of a Kubernetes cluster's Warren nodes: it
places each Sandbox custom resource on a live node with room (best fit by
memory, honouring its tier and nodeSelector) and marks the Sandboxes of a
node whose Lease expired Lost, recording the outcome in their status.
One pass per --period; run one replica (docs/kubernetes.md).

Example:
  warren controller --cluster in-cluster`

func controllerCmd(ctx context.Context, args []string) error {
	fs := newFlagSet("warren controller", "warren controller --cluster KUBECONFIG [flags]", controllerAbout)
	kubeconfig := fs.String("cluster", envOr("WARREN_CLUSTER", ""), "kubeconfig file of the cluster, or in-cluster (env WARREN_CLUSTER)")
	namespace := fs.String("cluster-namespace", envOr("WARREN_CLUSTER_NAMESPACE", "warren-system"), "the namespace of the nodes' Leases")
	sandboxes := fs.String("sandbox-namespace", "", "place only the Sandboxes of this namespace (default: all)")
	period := fs.Duration("period", time.Second, "time between passes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := wantArgs(fs, fs.Args()); err != nil {
		return err
	}
	if *kubeconfig == "" {
		return usageError{"warren controller", "--cluster is required"}
	}
	if *period < 10*time.Millisecond || *period > time.Hour {
		return fmt.Errorf("--period %s: want 10ms to 1h", *period)
	}
	client, err := kube.Load(*kubeconfig)
	if err != nil {
		return fmt.Errorf("--cluster: %w", err)
	}
	defer client.Close()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	log.Info("placing sandboxes", "namespace", *namespace, "period", period.String())
	(&kube.Controller{Client: client, Namespace: *namespace, SandboxNamespace: *sandboxes, Period: *period, Log: log}).Run(ctx)
	return nil
}
