package seal

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestEnsureCreatesKey0600AndReopens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "d", KeyFile)
	s1, err := Ensure(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("key mode %04o, want 0600", fi.Mode().Perm())
	}
	blob, err := s1.Seal([]byte("hunter2"), []byte("m1"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(blob, []byte("hunter2")) {
		t.Fatal("plaintext visible in blob")
	}
	s2, err := Ensure(path) // second start: same key
	if err != nil {
		t.Fatal(err)
	}
	pt, err := s2.Open(blob, []byte("m1"))
	if err != nil || string(pt) != "hunter2" {
		t.Fatalf("open: %q %v", pt, err)
	}
}

func TestOpenRefuses(t *testing.T) {
	s, err := Ensure(filepath.Join(t.TempDir(), KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	other, _ := Ensure(filepath.Join(t.TempDir(), KeyFile))
	blob, _ := s.Seal([]byte("pw"), []byte("m1"))
	tampered := append([]byte(nil), blob...)
	tampered[len(tampered)-1] ^= 1
	for name, tc := range map[string]struct {
		s    *Sealer
		blob []byte
		ad   string
	}{
		"other machine": {s, blob, "m2"},
		"other key":     {other, blob, "m1"},
		"tampered":      {s, tampered, "m1"},
		"short":         {s, blob[:5], "m1"},
		"empty":         {s, nil, "m1"},
	} {
		if _, err := tc.s.Open(tc.blob, []byte(tc.ad)); !errors.Is(err, ErrOpen) {
			t.Errorf("%s: want ErrOpen, got %v", name, err)
		}
	}
}

func TestEnsureRefusesLooseOrBadKey(t *testing.T) {
	dir := t.TempDir()
	loose := filepath.Join(dir, "loose")
	os.WriteFile(loose, make([]byte, 32), 0o644)
	if _, err := Ensure(loose); err == nil {
		t.Fatal("world-readable key accepted")
	}
	short := filepath.Join(dir, "short")
	os.WriteFile(short, make([]byte, 7), 0o600)
	if _, err := Ensure(short); err == nil {
		t.Fatal("short key accepted")
	}
}
