package kube

import (
	"encoding/json"
	"time"
)

// The API group of Warren's custom resources and the label that marks a
// Lease as a Warren node's.
const (
	Group      = "warren.dev"
	Version    = "v1alpha1"
	APIVersion = Group + "/" + Version
	// NodeLabel marks a node's Lease (value "true"), so the controller
	// lists nodes with a label selector and ignores other Leases.
	NodeLabel = Group + "/node"
	// CapacityAnnotation holds a node's NodeInfo as JSON on its Lease.
	CapacityAnnotation = Group + "/capacity"
)

// ObjectMeta is the part of Kubernetes' metadata Warren reads and writes.
type ObjectMeta struct {
	Name              string            `json:"name,omitempty"`
	Namespace         string            `json:"namespace,omitempty"`
	UID               string            `json:"uid,omitempty"`
	ResourceVersion   string            `json:"resourceVersion,omitempty"`
	Generation        int64             `json:"generation,omitempty"`
	CreationTimestamp *time.Time        `json:"creationTimestamp,omitempty"`
	Labels            map[string]string `json:"labels,omitempty"`
	Annotations       map[string]string `json:"annotations,omitempty"`
}

// ListMeta is a list's metadata.
type ListMeta struct {
	ResourceVersion string `json:"resourceVersion,omitempty"`
	Continue        string `json:"continue,omitempty"`
}

// MicroTime is Kubernetes' RFC 3339 time with microseconds, which Lease
// times must be written as.
type MicroTime struct{ time.Time }

const microFormat = "2006-01-02T15:04:05.000000Z07:00"

// MarshalJSON writes t in UTC with microseconds.
func (t MicroTime) MarshalJSON() ([]byte, error) {
	return json.Marshal(t.UTC().Format(microFormat))
}

// UnmarshalJSON reads any RFC 3339 time.
func (t *MicroTime) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	p, err := time.Parse(time.RFC3339Nano, s)
	t.Time = p
	return err
}

// Lease is a coordination.k8s.io/v1 Lease.
type Lease struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   ObjectMeta `json:"metadata"`
	Spec       LeaseSpec  `json:"spec"`
}

// LeaseSpec is a Lease's spec.
type LeaseSpec struct {
	HolderIdentity       string     `json:"holderIdentity,omitempty"`
	LeaseDurationSeconds int32      `json:"leaseDurationSeconds,omitempty"`
	AcquireTime          *MicroTime `json:"acquireTime,omitempty"`
	RenewTime            *MicroTime `json:"renewTime,omitempty"`
	LeaseTransitions     int32      `json:"leaseTransitions,omitempty"`
}

// LeaseList is a list of Leases.
type LeaseList struct {
	Metadata ListMeta `json:"metadata"`
	Items    []Lease  `json:"items"`
}

// NodeInfo is what a node offers, published on its Lease.
type NodeInfo struct {
	// Endpoint is the node's API address (host:port) a gateway would route to.
	Endpoint  string  `json:"endpoint,omitempty"`
	MemoryMiB int64   `json:"memory_mib"`
	CPUs      float64 `json:"cpus"`
	Sandboxes int     `json:"sandboxes"`
	// Tiers are the isolation tiers the node runs (the first is its default).
	Tiers  []string          `json:"tiers"`
	Labels map[string]string `json:"labels,omitempty"`
}

// Sandbox is a warren.dev/v1alpha1 Sandbox: a sandbox request (spec) and
// where and how it was placed (status).
type Sandbox struct {
	APIVersion string        `json:"apiVersion"`
	Kind       string        `json:"kind"`
	Metadata   ObjectMeta    `json:"metadata"`
	Spec       SandboxSpec   `json:"spec"`
	Status     SandboxStatus `json:"status,omitempty"`
}

// SandboxSpec is the sandbox request, as the CRD's schema validates it
// (deploy/kubernetes/crd-sandbox.yaml).
type SandboxSpec struct {
	Image     string            `json:"image"`
	Tier      string            `json:"tier,omitempty"`
	Resources Resources         `json:"resources,omitempty"`
	Egress    *Egress           `json:"egress,omitempty"`
	Secrets   []string          `json:"secrets,omitempty"`
	Workspace string            `json:"workspace,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	// NodeSelector: node labels a node must all have to run the sandbox.
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
}

// Resources is what a sandbox asks for; the controller packs by it.
type Resources struct {
	MemoryMiB int64   `json:"memoryMiB,omitempty"`
	CPUs      float64 `json:"cpus,omitempty"`
}

// Egress is a sandbox's network policy.
type Egress struct {
	Mode  string   `json:"mode,omitempty"`
	Allow []string `json:"allow,omitempty"`
}

// The phases of a Sandbox.
const (
	// PhasePending: not placed yet (status.error says why when no node fits).
	PhasePending = "Pending"
	// PhasePlaced: bound to status.node, which runs it.
	PhasePlaced = "Placed"
	// PhaseLost: its node stopped renewing its Lease.
	PhaseLost = "Lost"
)

// SandboxStatus is the controller's record of a Sandbox.
type SandboxStatus struct {
	Phase string `json:"phase,omitempty"`
	Node  string `json:"node,omitempty"`
	Tier  string `json:"tier,omitempty"`
	Error string `json:"error,omitempty"`
	// ObservedGeneration is the spec generation this status is about.
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// SandboxList is a list of Sandboxes.
type SandboxList struct {
	Metadata ListMeta  `json:"metadata"`
	Items    []Sandbox `json:"items"`
}
