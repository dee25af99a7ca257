package egress

import "testing"

// An observer sees every record, numbered and stamped, beyond what the
// ring keeps.
func TestObserveSeesEveryRecord(t *testing.T) {
	s := NewSandbox("ns", "sb", nil)
	var got []Record
	s.Observe(func(r Record) { got = append(got, r) })
	for range LogSize + 5 {
		s.Record(Record{Kind: "tcp", Verdict: "allow", BytesOut: 10})
	}
	s.SetPolicy(nil)
	if len(got) != LogSize+6 || got[0].Seq != 1 || got[len(got)-1].Kind != "policy" || got[3].Namespace != "ns" || got[3].Time.IsZero() {
		t.Fatalf("observed %d records; first %+v last %+v", len(got), got[0], got[len(got)-1])
	}
}
