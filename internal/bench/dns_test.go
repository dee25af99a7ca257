package bench_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/warren-sandbox/warren/internal/bench"
)

// TestFakeUpstream: the benchmark's upstream answers its name's A query
// with its address, and any other name NXDOMAIN.
func TestFakeUpstream(t *testing.T) {
	want := netip.MustParseAddr("198.51.100.10")
	at, stop, err := bench.FakeUpstream("bench.warren.test", want)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", at.String())
	}}
	got, err := r.LookupNetIP(context.Background(), "ip4", "bench.warren.test")
	if err != nil || len(got) != 1 || got[0] != want {
		t.Errorf("bench.warren.test: %v %v, want %v", got, err, want)
	}
	_, err = r.LookupNetIP(context.Background(), "ip4", "other.warren.test")
	var dnsErr *net.DNSError
	if !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
		t.Errorf("other.warren.test: %v, want not found", err)
	}
}
