package cabundle

import (
	"bytes"
	"testing"
)

func TestAppend(t *testing.T) {
	bundle := []byte("-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----")
	ca1, ca2 := []byte("-----BEGIN CERTIFICATE-----\nONE\n-----END CERTIFICATE-----\n"), []byte("-----BEGIN CERTIFICATE-----\nTWO\n-----END CERTIFICATE-----\n")
	once := Append(bundle, ca1)
	if !bytes.HasPrefix(once, append(bundle, '\n')) || !bytes.Contains(once, ca1) {
		t.Fatalf("bundle: %s", once)
	}
	twice := Append(once, ca2)
	if bytes.Contains(twice, ca1) || !bytes.Contains(twice, ca2) || bytes.Count(twice, []byte(Begin)) != 1 || !bytes.HasPrefix(twice, append(bundle, '\n')) {
		t.Fatalf("second start's bundle: %s", twice)
	}
	if got := Append(nil, ca1); !bytes.HasPrefix(got, []byte(Begin)) {
		t.Fatalf("empty bundle: %s", got)
	}
	// A block cut short (an edited bundle) is dropped to its end.
	if got := Append(append(append([]byte(nil), bundle...), "\n"+Begin+"junk"...), ca2); !bytes.Equal(got, Append(bundle, ca2)) {
		t.Fatalf("a torn block: %s", got)
	}
}
