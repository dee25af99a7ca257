package main

import "testing"

// TestPublishAddress: --publish-address takes an IP address, nothing else.
func TestPublishAddress(t *testing.T) {
	for in, want := range map[string]string{"127.0.0.1": "127.0.0.1", "0.0.0.0": "0.0.0.0", "::1": "::1", "::ffff:10.0.0.1": "10.0.0.1"} {
		a, err := (&netFlags{publish: in}).publishAddress()
		if err != nil || a.String() != want {
			t.Errorf("--publish-address %s: %v %v, want %s", in, a, err, want)
		}
	}
	for _, in := range []string{"", "localhost", "0.0.0.0:80", "fe80::1%eth0", "10.0.0.0/8"} {
		if a, err := (&netFlags{publish: in}).publishAddress(); err == nil {
			t.Errorf("--publish-address %q: accepted as %v", in, a)
		}
	}
}
