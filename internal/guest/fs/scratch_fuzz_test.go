package fs

import (
	"bytes"
	"os"
	"testing"
)

func FuzzScratchA(f *testing.F) {
	f.Add([]byte("x"))
	f.Fuzz(func(t *testing.T, data []byte) { _ = data })
}

func FuzzScratchB(f *testing.F) {
	f.Add([]byte("x"))
	f.Fuzz(func(t *testing.T, data []byte) { t.TempDir() })
}

func FuzzScratchC(f *testing.F) {
	f.Add([]byte("x"))
	f.Fuzz(func(t *testing.T, data []byte) { newEnv(t) })
}

func FuzzScratchD(f *testing.F) {
	f.Add(mkTar(f, file("a", "x")))
	f.Fuzz(func(t *testing.T, data []byte) {
		d := t.TempDir()
		r, err := Open(d)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		os.Mkdir(d+"/dst", 0o755)
		r.ExtractTar(bytes.NewReader(data), "dst", TarLimits{MaxBytes: 1 << 20, MaxEntries: 1000})
	})
}

func FuzzScratchE(f *testing.F) {
	f.Add([]byte("x"))
	fixed := mkTar(f, file("a", "x"))
	f.Fuzz(func(t *testing.T, data []byte) {
		d := t.TempDir()
		r, err := Open(d)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		r.ExtractTar(bytes.NewReader(fixed), "dst", TarLimits{})
	})
}

func FuzzScratchF(f *testing.F) {
	f.Add([]byte("x"))
	fixed := mkTar(f, dir("a/"))
	f.Fuzz(func(t *testing.T, data []byte) {
		d := t.TempDir()
		r, err := Open(d)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		r.ExtractTar(bytes.NewReader(fixed), "dst", TarLimits{})
	})
}

func FuzzScratchG(f *testing.F) {
	f.Add([]byte("x"))
	f.Fuzz(func(t *testing.T, data []byte) {
		d := t.TempDir()
		r, err := Open(d)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		r.WriteFile("a", bytes.NewReader([]byte("x")), 0o644, 0)
	})
}
