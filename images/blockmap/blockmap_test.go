package blockmap

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/corralhq/corral/internal/diskmap"
	"github.com/corralhq/corral/testsupport/require"
)

// chunk is data written into a test image at an offset.
type chunk struct {
	off int64
	n   int
}

// rawImage writes a sparse raw file of size with random data at chunks
// (and an explicitly written run of zeros at zeroAt, if n > 0) and
// returns its path and contents.
func rawImage(t *testing.T, size int64, chunks []chunk, zeroAt chunk) (string, []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "disk.raw")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, size)
	for _, c := range chunks {
		p := make([]byte, c.n)
		rand.Read(p)
		copy(want[c.off:], p)
		if _, err := f.WriteAt(p, c.off); err != nil {
			t.Fatal(err)
		}
	}
	if zeroAt.n > 0 {
		if _, err := f.WriteAt(make([]byte, zeroAt.n), zeroAt.off); err != nil {
			t.Fatal(err)
		}
	}
	return path, want
}

// checkMap opens path as format and checks that the raw view equals want
// and that the map's extents cover every non-zero byte with the right
// hashes.
func checkMap(t *testing.T, path string, format Format, want []byte) *diskmap.Map {
	t.Helper()
	im, err := Open(path, format)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if im.Size() != int64(len(want)) {
		t.Fatalf("Size = %d, want %d", im.Size(), len(want))
	}
	got := make([]byte, im.Size()+1)
	if n, err := im.ReadAt(got, 0); n != len(want) || err != io.EOF {
		t.Fatalf("ReadAt of the whole view = %d, %v; want %d, EOF", n, err, len(want))
	}
	got = got[:len(want)]
	if !bytes.Equal(got, want) {
		t.Fatalf("raw view differs from the image's contents")
	}
	m, err := im.Map(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Marshal(); err != nil {
		t.Fatal(err)
	}
	// Rebuild the disk from the map alone: extents over zeros.
	rebuilt := make([]byte, len(want))
	for _, e := range m.Extents {
		if e.Offset%BlockSize != 0 {
			t.Errorf("extent %v not on a block boundary", e)
		}
		p := want[e.Offset:e.End()]
		sum := sha256.Sum256(p)
		if hex.EncodeToString(sum[:]) != e.SHA256 {
			t.Errorf("extent %v: hash differs from its bytes", e)
		}
		copy(rebuilt[e.Offset:], p)
	}
	if !bytes.Equal(rebuilt, want) {
		t.Fatalf("the map's extents over zeros do not give the image")
	}
	return m
}

func TestRaw(t *testing.T) {
	const mib = 1 << 20
	tests := map[string]struct {
		size    int64
		chunks  []chunk
		zeros   chunk
		extents int
		data    int64
	}{
		"all zero sparse":  {size: 16 * mib, extents: 0},
		"all zero written": {size: 8 * mib, zeros: chunk{0, 8 * mib}, extents: 0},
		"sparse, two runs": {
			size:    64 * mib,
			chunks:  []chunk{{0, 100}, {mib + 5, 2 * mib}, {40 * mib, mib}},
			extents: 2, data: 4*mib + 1*mib,
		},
		"data at the end, size not a block multiple": {
			size:    10*mib + 12345,
			chunks:  []chunk{{10*mib + 12000, 345}},
			extents: 1, data: 12345,
		},
		"dense, long run split at the extent bound": {
			size:    66 * mib,
			chunks:  []chunk{{0, 66 * mib}},
			extents: 2, data: 66 * mib,
		},
		"written zeros inside data": {
			size:    8 * mib,
			chunks:  []chunk{{0, 8 * mib}},
			zeros:   chunk{2 * mib, 3 * mib},
			extents: 2, data: 5 * mib,
		},
		"tiny": {size: 4096, chunks: []chunk{{1, 1}}, extents: 1, data: 4096},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path, want := rawImage(t, tc.size, tc.chunks, tc.zeros)
			if tc.zeros.n > 0 {
				clear(want[tc.zeros.off : tc.zeros.off+int64(tc.zeros.n)])
			}
			m := checkMap(t, path, Raw, want)
			if len(m.Extents) != tc.extents || m.DataBytes() != tc.data {
				t.Fatalf("%d extents, %d data bytes; want %d, %d: %v", len(m.Extents), m.DataBytes(), tc.extents, tc.data, m.Extents)
			}
		})
	}
}

func qemuImg(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("qemu-img", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-img %v: %v\n%s", args, err, out)
	}
}

func TestQcow2MatchesQemuImgRaw(t *testing.T) {
	require.Tool(t, "qemu-img")
	const mib = 1 << 20
	src, _ := rawImage(t, 40*mib+3*512, []chunk{{0, 3 * mib}, {7*mib + 333, 70000}, {20 * mib, 5 * mib}, {40*mib + 1000, 536}}, chunk{})
	for name, extra := range map[string][]string{
		"plain":          nil,
		"compressed":     {"-c"},
		"small clusters": {"-o", "cluster_size=4096"},
		"large clusters": {"-o", "cluster_size=2M"},
		"preallocated":   {"-o", "preallocation=metadata"},
		"compat 0.10":    {"-o", "compat=0.10"},
		"extended l2":    {"-o", "extended_l2=on"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			q := filepath.Join(dir, "disk.qcow2")
			qemuImg(t, append(append([]string{"convert", "-f", "raw", "-O", "qcow2"}, extra...), src, q)...)
			back := filepath.Join(dir, "back.raw")
			qemuImg(t, "convert", "-f", "qcow2", "-O", "raw", q, back)
			want, err := os.ReadFile(back)
			if err != nil {
				t.Fatal(err)
			}
			m := checkMap(t, q, Qcow2, want)
			if m.DataBytes() > 12*mib {
				t.Fatalf("map holds %d data bytes for about 8 MiB of data: zeros not skipped", m.DataBytes())
			}
		})
	}
}

func TestOpenRefuses(t *testing.T) {
	dir := t.TempDir()
	raw, _ := rawImage(t, 1<<20, []chunk{{0, 10}}, chunk{})
	if _, err := Open(raw, Qcow2); !errors.Is(err, ErrFormat) {
		t.Errorf("raw opened as qcow2: %v", err)
	}
	if _, err := Open(raw, "vmdk"); !errors.Is(err, ErrFormat) {
		t.Errorf("unknown format: %v", err)
	}
	if _, err := Open(dir, Raw); !errors.Is(err, ErrFormat) {
		t.Errorf("directory as raw: %v", err)
	}
	require.Tool(t, "qemu-img")
	base := filepath.Join(dir, "base.qcow2")
	qemuImg(t, "convert", "-f", "raw", "-O", "qcow2", raw, base)
	overlay := filepath.Join(dir, "overlay.qcow2")
	qemuImg(t, "create", "-f", "qcow2", "-F", "qcow2", "-b", base, overlay)
	if _, err := Open(overlay, Qcow2); !errors.Is(err, ErrFormat) {
		t.Errorf("qcow2 with a backing file: %v", err)
	}
}

func TestMapStopsWithContext(t *testing.T) {
	path, _ := rawImage(t, 8<<20, []chunk{{0, 8 << 20}}, chunk{})
	im, err := Open(path, Raw)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := im.Map(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Map = %v, want context.Canceled", err)
	}
}

// TestConcurrentReads: the appliance serves one Image to several agents
// at once; ReadAt from many goroutines gives the same bytes (run with
// -race).
func TestConcurrentReads(t *testing.T) {
	require.Tool(t, "qemu-img")
	const mib = 1 << 20
	src, _ := rawImage(t, 16*mib, []chunk{{0, 5 * mib}, {9 * mib, 3 * mib}}, chunk{})
	dir := t.TempDir()
	q := filepath.Join(dir, "disk.qcow2")
	qemuImg(t, "convert", "-c", "-f", "raw", "-O", "qcow2", "-o", "cluster_size=16384", src, q)
	want, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	im, err := Open(q, Qcow2)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			p := make([]byte, 300000)
			for off := int64(g) * 7919; off < im.Size(); off += int64(len(p)) * 3 {
				n, err := im.ReadAt(p, off)
				if err != nil && err != io.EOF {
					errs <- err
					return
				}
				if !bytes.Equal(p[:n], want[off:off+int64(n)]) {
					errs <- fmt.Errorf("goroutine %d: bytes at %d differ", g, off)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
