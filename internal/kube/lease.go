package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"time"
)

// DefaultLeaseDuration is how long a node's Lease holds without renewal:
// the controller marks its sandboxes lost after it (plus one controller
// period), inside the 15 s the design allows.
const DefaultLeaseDuration = 10 * time.Second

// ValidName reports whether s is a valid node (Lease) or namespace name: a
// DNS-1123 label, dots allowed. (No regexp: compiling one at package init
// would cost every warren command.)
func ValidName(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
		case (r == '-' || r == '.') && i > 0 && i < len(s)-1:
		default:
			return false
		}
	}
	return true
}

// Registrar keeps a node registered: a Lease named after the node, holder
// the node, with its NodeInfo, renewed every third of its duration.
//
// At shutdown it stops renewing and leaves the Lease as it is: sandboxes
// outlive the server (the next start on the same data directory
// reattaches), so a restart within the duration must not look like a lost
// node, and one that does not come back expires like a crash.
type Registrar struct {
	Client    *Client
	Namespace string
	Node      string
	Info      NodeInfo
	Duration  time.Duration // DefaultLeaseDuration when 0
	Log       *slog.Logger

	lease *Lease // the last one written
}

func (r *Registrar) duration() time.Duration {
	if r.Duration <= 0 {
		return DefaultLeaseDuration
	}
	return r.Duration
}

func (r *Registrar) path(name string) string {
	p := "/apis/coordination.k8s.io/v1/namespaces/" + url.PathEscape(r.Namespace) + "/leases"
	if name != "" {
		p += "/" + url.PathEscape(name)
	}
	return p
}

// Register writes the node's Lease once: creates it, or takes over the one
// a previous run of the node left.
func (r *Registrar) Register(ctx context.Context) error {
	if !ValidName(r.Node) {
		return fmt.Errorf("node name %q: want lower-case letters, digits, '-' and '.', at most 63", r.Node)
	}
	if !ValidName(r.Namespace) {
		return fmt.Errorf("namespace %q: want a DNS label", r.Namespace)
	}
	if r.duration() < time.Second || r.duration() > time.Hour {
		return fmt.Errorf("lease duration %s: want 1s to 1h", r.duration())
	}
	info, err := json.Marshal(r.Info)
	if err != nil {
		return err
	}
	now := &MicroTime{time.Now()}
	l := &Lease{
		APIVersion: "coordination.k8s.io/v1", Kind: "Lease",
		Metadata: ObjectMeta{Name: r.Node, Namespace: r.Namespace,
			Labels:      map[string]string{NodeLabel: "true"},
			Annotations: map[string]string{CapacityAnnotation: string(info)}},
		Spec: LeaseSpec{HolderIdentity: r.Node, AcquireTime: now, RenewTime: now,
			LeaseDurationSeconds: int32(r.duration() / time.Second)}, //nolint:gosec // at most 3600: checked above
	}
	var out Lease
	err = r.Client.Do(ctx, http.MethodPost, r.path(""), l, &out)
	if IsCode(err, http.StatusConflict) { // there already: take it over
		var old Lease
		if err = r.Client.Do(ctx, http.MethodGet, r.path(r.Node), nil, &old); err != nil {
			return fmt.Errorf("register node %s: %w", r.Node, err)
		}
		l.Metadata.ResourceVersion = old.Metadata.ResourceVersion
		l.Spec.LeaseTransitions = old.Spec.LeaseTransitions
		if old.Spec.HolderIdentity != r.Node {
			l.Spec.LeaseTransitions++
		}
		err = r.Client.Do(ctx, http.MethodPut, r.path(r.Node), l, &out)
	}
	if err != nil {
		return fmt.Errorf("register node %s: %w", r.Node, err)
	}
	r.lease = &out
	return nil
}

// renew moves the Lease's renew time to now. After a conflict (someone
// wrote it since) or its deletion it registers afresh.
func (r *Registrar) renew(ctx context.Context) error {
	if r.lease == nil {
		return r.Register(ctx)
	}
	l := *r.lease
	l.Spec.HolderIdentity = r.Node
	l.Spec.RenewTime = &MicroTime{time.Now()}
	var out Lease
	err := r.Client.Do(ctx, http.MethodPut, r.path(r.Node), &l, &out)
	switch {
	case err == nil:
		r.lease = &out
		return nil
	case IsCode(err, http.StatusConflict) || IsCode(err, http.StatusNotFound):
		return r.Register(ctx)
	}
	return err
}

// Run renews the node's Lease (registering it first if Register was not
// called or failed) until ctx ends. A failed renewal is logged and retried
// at the next tick; the Lease expires if the API server stays out of reach.
func (r *Registrar) Run(ctx context.Context) {
	tick := time.NewTicker(r.duration() / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		rctx, cancel := context.WithTimeout(ctx, r.duration()/3)
		err := r.renew(rctx)
		cancel()
		if err != nil && !errors.Is(ctx.Err(), context.Canceled) && r.Log != nil {
			r.Log.Warn("renew the node's lease", "node", r.Node, "err", err.Error())
		}
	}
}
