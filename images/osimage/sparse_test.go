package osimage

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestSparseFile: what sparseFile stores reads back byte for byte,
// whatever the sizes of the writes, with the zero blocks (and a trailing
// run of zeros) left as holes where the filesystem has them.
func TestSparseFile(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	img := make([]byte, 9<<20+123) // ends in zeros, mid-block
	for _, r := range [][2]int{{0, 512}, {4095, 4097}, {3 << 20, 3<<20 + 5000}, {7<<20 + 1, 7<<20 + 2}} {
		for i := r[0]; i < r[1]; i++ {
			img[i] = byte(rng.UintN(255) + 1)
		}
	}
	for name, step := range map[string]int{"1 MiB writes": 1 << 20, "odd writes": 7919, "one write": len(img)} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "img")
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			s := newSparseFile(f)
			for p := img; len(p) > 0; {
				k := min(step, len(p))
				if n, err := s.Write(p[:k]); n != k || err != nil {
					t.Fatalf("write: %d %v", n, err)
				}
				p = p[k:]
			}
			if err := s.finish(); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, img) {
				t.Fatalf("read back %d bytes, not the %d written", len(got), len(img))
			}
			var st syscall.Stat_t
			if err := syscall.Stat(path, &st); err != nil {
				t.Fatal(err)
			}
			// Five blocks hold data (one spans two): a filesystem with holes
			// allocates about that, never the image's 9 MiB.
			if holes(t) && st.Blocks*512 > 1<<20 {
				t.Errorf("%d bytes allocated for 24 KiB of data in a %d-byte image", st.Blocks*512, len(img))
			}
		})
	}
}

// holes reports whether the test directory's filesystem keeps holes.
func holes(t *testing.T) bool {
	path := filepath.Join(t.TempDir(), "probe")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks*512 < 1<<20
}
