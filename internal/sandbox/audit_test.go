package sandbox_test

import (
	"sync"
	"testing"
	"time"

	"github.com/warren-sandbox/warren/internal/audit"
	"github.com/warren-sandbox/warren/internal/backend"
	"github.com/warren-sandbox/warren/internal/egress"
	"github.com/warren-sandbox/warren/internal/sandbox"
)

// records is an Auditor that keeps what it is given.
type records struct {
	mu  sync.Mutex
	all []audit.Record
}

func (r *records) Append(rec *audit.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, *rec)
	return nil
}

func (r *records) of(kind audit.Kind) []audit.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []audit.Record
	for _, x := range r.all {
		if x.Kind == kind {
			out = append(out, x)
		}
	}
	return out
}

// TestAuditEgressAndUsage: every egress record of a sandbox reaches the
// audit log with its labels, and its bytes are in the usage record of
// its stop, with the CPU it used.
func TestAuditEgressAndUsage(t *testing.T) {
	rec := &records{}
	reg := egress.NewRegistry()
	e := newEnv(t, sandbox.Options{Egress: reg, Audit: rec})
	m := e.manager(t)
	s := spec
	s.Labels = map[string]string{"team": "t1"}
	info := mustStart(t, m, "a", s)
	e.be.Sandbox(info.ID).SetStats(backend.Stats{CPUUsage: 2 * time.Second, MemoryBytes: 1 << 20})
	es := reg.Lookup(netAddr(t, e, m, "a"))
	if es == nil {
		t.Fatal("not registered")
	}
	es.Record(egress.Record{Kind: "tcp", Verdict: "allow", Name: "pypi.org", Port: 443, BytesOut: 100, BytesIn: 5000})
	es.Record(egress.Record{Kind: "dns", Verdict: "deny", Name: "evil.test"})
	if err := m.Stop(t.Context(), "ns", "a"); err != nil {
		t.Fatal(err)
	}
	eg := rec.of(audit.KindEgress)
	if len(eg) != 2 || eg[0].Egress.Name != "pypi.org" || eg[1].Egress.Verdict != "deny" || eg[0].Labels["team"] != "t1" || eg[0].Sandbox != "a" {
		t.Fatalf("egress records: %+v", eg)
	}
	us := rec.of(audit.KindUsage)
	if len(us) != 1 {
		t.Fatalf("usage records: %+v", us)
	}
	u := us[0].Usage
	if u.Reason != "stop" || u.CPUSeconds != 2 || u.EgressBytesOut != 100 || u.EgressBytesIn != 5000 || us[0].Labels["team"] != "t1" {
		t.Fatalf("usage at stop: %+v labels %v", u, us[0].Labels)
	}
}
