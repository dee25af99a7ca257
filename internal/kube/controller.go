package kube

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
)

// Controller binds Sandboxes to live nodes and marks those of dead nodes
// lost. Each pass is level-triggered: it lists the node Leases and every
// Sandbox and recomputes the nodes' use from the Sandboxes placed on them,
// so a missed or failed write is corrected by the next pass, and a
// restarted controller needs no state but when it saw each Lease change.
//
// Liveness is judged by when this controller saw a Lease's resourceVersion
// change, against the Lease's duration, never by the renew time the node
// wrote: the node's clock may be wrong (the way kube's leader election
// and node lifecycle controller judge it).
type Controller struct {
	Client *Client
	// Namespace holds the nodes' Leases.
	Namespace string
	// SandboxNamespace limits the controller to the Sandboxes of one
	// namespace; "" = all.
	SandboxNamespace string
	Period           time.Duration // between passes; 1s when 0
	Log              *slog.Logger

	seen map[string]observed // Lease name → its last change seen
}

type observed struct {
	resourceVersion string
	at              time.Time
}

// statusWriters bounds the status updates one pass sends at once.
const statusWriters = 8

// listPage is how many objects one list call returns at most.
const listPage = 500

// Run reconciles every Period until ctx ends, logging failed passes.
func (c *Controller) Run(ctx context.Context) {
	period := c.Period
	if period <= 0 {
		period = time.Second
	}
	for {
		if err := c.Reconcile(ctx); err != nil && ctx.Err() == nil && c.Log != nil {
			c.Log.Warn("placement pass", "err", err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(period):
		}
	}
}

// Reconcile is one pass: read the nodes and Sandboxes, place the pending
// ones, mark those on dead nodes lost, and write the statuses that change.
func (c *Controller) Reconcile(ctx context.Context) error {
	nodes, err := c.liveNodes(ctx)
	if err != nil {
		return err
	}
	var sbs []Sandbox
	list := "/apis/" + APIVersion + "/sandboxes"
	if c.SandboxNamespace != "" {
		list = "/apis/" + APIVersion + "/namespaces/" + url.PathEscape(c.SandboxNamespace) + "/sandboxes"
	}
	err = listAll(ctx, c.Client, list, func(b []byte) (ListMeta, error) {
		var l SandboxList
		err := json.Unmarshal(b, &l)
		sbs = append(sbs, l.Items...)
		return l.Metadata, err
	})
	if err != nil {
		return fmt.Errorf("list sandboxes: %w", err)
	}
	byName := map[string]*node{}
	for _, n := range nodes {
		byName[n.name] = n
	}
	var writes []Sandbox
	var pending []*Sandbox
	for i := range sbs {
		s := &sbs[i]
		switch s.Status.Phase {
		case PhasePlaced:
			if n := byName[s.Status.Node]; n != nil {
				n.add(s)
				continue
			}
			s.Status.Phase = PhaseLost
			s.Status.Error = "node " + s.Status.Node + " stopped renewing its lease"
			writes = append(writes, *s)
		case "", PhasePending:
			pending = append(pending, s)
		}
	}
	// First come, first placed: an older request is not starved by newer
	// small ones taking the room it waits for.
	slices.SortStableFunc(pending, func(a, b *Sandbox) int {
		return cmp.Or(created(a).Compare(created(b)), cmp.Compare(a.Metadata.Namespace, b.Metadata.Namespace), cmp.Compare(a.Metadata.Name, b.Metadata.Name))
	})
	for _, s := range pending {
		old := s.Status
		n, tier, why := place(nodes, s)
		if n != nil {
			n.add(s)
			s.Status = SandboxStatus{Phase: PhasePlaced, Node: n.name, Tier: tier}
		} else {
			s.Status = SandboxStatus{Phase: PhasePending, Error: why}
		}
		s.Status.ObservedGeneration = s.Metadata.Generation
		if s.Status != old {
			writes = append(writes, *s)
		}
	}
	return c.writeStatuses(ctx, writes)
}

func created(s *Sandbox) time.Time {
	if s.Metadata.CreationTimestamp == nil {
		return time.Time{}
	}
	return *s.Metadata.CreationTimestamp
}

// liveNodes lists the node Leases and returns the nodes whose Lease
// changed within its duration, as this controller saw it.
func (c *Controller) liveNodes(ctx context.Context) ([]*node, error) {
	var leases []Lease
	path := "/apis/coordination.k8s.io/v1/namespaces/" + url.PathEscape(c.Namespace) + "/leases?labelSelector=" + url.QueryEscape(NodeLabel+"=true")
	err := listAll(ctx, c.Client, path, func(b []byte) (ListMeta, error) {
		var l LeaseList
		err := json.Unmarshal(b, &l)
		leases = append(leases, l.Items...)
		return l.Metadata, err
	})
	if err != nil {
		return nil, fmt.Errorf("list node leases: %w", err)
	}
	now := time.Now()
	seen := make(map[string]observed, len(leases))
	var nodes []*node
	for _, l := range leases {
		name := l.Metadata.Name
		o, ok := c.seen[name]
		if !ok || o.resourceVersion != l.Metadata.ResourceVersion {
			o = observed{l.Metadata.ResourceVersion, now}
		}
		seen[name] = o
		// A node may not stay alive for longer than an hour unrenewed.
		d := time.Duration(min(l.Spec.LeaseDurationSeconds, 3600)) * time.Second
		if l.Spec.HolderIdentity == "" || now.Sub(o.at) > d {
			continue
		}
		var info NodeInfo
		if err := json.Unmarshal([]byte(l.Metadata.Annotations[CapacityAnnotation]), &info); err != nil {
			if c.Log != nil {
				c.Log.Warn("a node lease without a readable capacity is ignored", "node", name, "err", err.Error())
			}
			continue
		}
		nodes = append(nodes, &node{name: name, info: info})
	}
	c.seen = seen // forgets deleted Leases
	slices.SortFunc(nodes, func(a, b *node) int { return cmp.Compare(a.name, b.name) })
	return nodes, nil
}

// writeStatuses writes the Sandboxes' statuses, a few at once. A conflict
// (the Sandbox changed since it was listed) is left to the next pass.
func (c *Controller) writeStatuses(ctx context.Context, sbs []Sandbox) error {
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
		next  = make(chan *Sandbox)
	)
	for range min(statusWriters, len(sbs)) {
		wg.Go(func() {
			for s := range next {
				p := "/apis/" + APIVersion + "/namespaces/" + url.PathEscape(s.Metadata.Namespace) + "/sandboxes/" + url.PathEscape(s.Metadata.Name) + "/status"
				err := c.Client.Do(ctx, http.MethodPut, p, s, nil)
				if err != nil && !IsCode(err, http.StatusConflict) && !IsCode(err, http.StatusNotFound) {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("sandbox %s/%s status: %w", s.Metadata.Namespace, s.Metadata.Name, err)
					}
					mu.Unlock()
				}
			}
		})
	}
	for i := range sbs {
		select {
		case next <- &sbs[i]:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(next)
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// listAll pages through a list, handing each page to decode.
func listAll(ctx context.Context, c *Client, path string, decode func([]byte) (ListMeta, error)) error {
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	cont := ""
	for {
		p := path + sep + "limit=" + fmt.Sprint(listPage)
		if cont != "" {
			p += "&continue=" + url.QueryEscape(cont)
		}
		var raw json.RawMessage
		if err := c.Do(ctx, http.MethodGet, p, nil, &raw); err != nil {
			return err
		}
		meta, err := decode(raw)
		if err != nil {
			return err
		}
		if meta.Continue == "" {
			return nil
		}
		cont = meta.Continue
	}
}
