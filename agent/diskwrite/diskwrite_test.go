package diskwrite

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/images/blockmap"
	"github.com/corralhq/corral/internal/diskmap"
	"github.com/corralhq/corral/testsupport/require"
)

const mib = 1 << 20

// testImage is a raw image served the way the appliance serves it: its
// raw view over HTTP with ranges.
type testImage struct {
	raw  []byte
	m    *diskmap.Map
	url  string
	view *blockmap.Image
}

// sparseRaw writes a sparse raw image of size with random data at the
// offsets given (n bytes each) and returns its path and bytes.
func sparseRaw(t testing.TB, dir string, size int64, chunks map[int64]int) (string, []byte) {
	t.Helper()
	path := filepath.Join(dir, "image.raw")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, size)
	for off, n := range chunks {
		p := make([]byte, n)
		rand.Read(p)
		copy(want[off:], p)
		if _, err := f.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
	}
	return path, want
}

func serve(t testing.TB, path string, format blockmap.Format, raw []byte) *testImage {
	t.Helper()
	im, err := blockmap.Open(path, format)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { im.Close() })
	m, err := im.Map(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	data, digest, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if m, err = diskmap.Parse(data, digest); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "", time.Time{}, io.NewSectionReader(im, 0, im.Size()))
	}))
	t.Cleanup(srv.Close)
	return &testImage{raw: raw, m: m, url: srv.URL, view: im}
}

func defaultImage(t testing.TB) *testImage {
	dir := t.TempDir()
	path, raw := sparseRaw(t, dir, 24*mib+4096, map[int64]int{0: 3 * mib, 5*mib + 17: 1000, 12 * mib: 2 * mib, 24 * mib: 4096})
	return serve(t, path, blockmap.Raw, raw)
}

// randomFile makes a regular file of size filled with random bytes.
func randomFile(t testing.TB, size int64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "disk")
	p := make([]byte, size)
	rand.Read(p)
	if err := os.WriteFile(path, p, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func config(img *testImage, dev string) Config {
	return Config{Device: dev, Map: img.m, Fetch: HTTPFetch(http.DefaultClient, img.url), Backoff: time.Millisecond}
}

// checkDevice compares the first len(want) bytes of dev with want.
func checkDevice(t testing.TB, dev string, want []byte) {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(f, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("device differs from the image first at byte %d", i)
			}
		}
	}
}

func TestWriteRegularFile(t *testing.T) {
	img := defaultImage(t)
	dev := randomFile(t, 32*mib)
	var last, total int64
	cfg := config(img, dev)
	cfg.Progress = func(done, tot int64) { last, total = done, tot }
	if err := Write(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	checkDevice(t, dev, img.raw)
	if last != img.m.Size || total != img.m.Size {
		t.Fatalf("progress ended at %d/%d, want %d", last, total, img.m.Size)
	}
	st, err := os.Stat(dev)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != 32*mib {
		t.Fatalf("file size changed to %d", st.Size())
	}
}

// loopDevice attaches a loop device over a random 64 MiB file and
// detaches it at cleanup.
func loopDevice(t testing.TB, size int64) string {
	t.Helper()
	require.Root(t, "loop devices")
	require.Tool(t, "losetup")
	backing := randomFile(t, size)
	out, err := exec.Command("losetup", "--find", "--show", backing).CombinedOutput()
	if err != nil {
		require.Missing(t, "losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v: %s", dev, err, out)
		}
	})
	return dev
}

func TestWriteLoopDevice(t *testing.T) {
	dev := loopDevice(t, 32*mib)
	t.Run("raw", func(t *testing.T) {
		img := defaultImage(t)
		if err := Write(context.Background(), config(img, dev)); err != nil {
			t.Fatal(err)
		}
		checkDevice(t, dev, img.raw)
	})
	t.Run("qcow2 served raw", func(t *testing.T) {
		require.Tool(t, "qemu-img")
		dir := t.TempDir()
		src, _ := sparseRaw(t, dir, 20*mib+512, map[int64]int{mib: 2 * mib, 9*mib + 5: 300000, 20 * mib: 512})
		q := filepath.Join(dir, "image.qcow2")
		back := filepath.Join(dir, "back.raw")
		for _, args := range [][]string{{"convert", "-c", "-f", "raw", "-O", "qcow2", src, q}, {"convert", "-f", "qcow2", "-O", "raw", q, back}} {
			if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
				t.Fatalf("qemu-img %v: %v: %s", args, err, out)
			}
		}
		want, err := os.ReadFile(back)
		if err != nil {
			t.Fatal(err)
		}
		img := serve(t, q, blockmap.Qcow2, want)
		if err := Write(context.Background(), config(img, dev)); err != nil {
			t.Fatal(err)
		}
		checkDevice(t, dev, want)
	})
}

func TestTamperedExtentNamed(t *testing.T) {
	img := defaultImage(t)
	dev := randomFile(t, 32*mib)
	cfg := config(img, dev)
	cfg.Attempts = 2
	honest := cfg.Fetch
	bad := img.m.Extents[1]
	calls := 0
	cfg.Fetch = func(ctx context.Context, off, n int64) (io.ReadCloser, error) {
		if off != bad.Offset {
			return honest(ctx, off, n)
		}
		calls++
		p := make([]byte, n)
		rand.Read(p)
		return io.NopCloser(bytes.NewReader(p)), nil
	}
	err := Write(context.Background(), cfg)
	var ee *ExtentError
	if !errors.As(err, &ee) || !errors.Is(err, ErrHashMismatch) || ee.Index != 1 || ee.Extent != bad {
		t.Fatalf("Write = %v, want a hash mismatch on extent 1", err)
	}
	if !strings.Contains(err.Error(), "extent 1 ") || !strings.Contains(err.Error(), bad.SHA256) {
		t.Fatalf("error does not name the extent: %v", err)
	}
	if calls != 2 {
		t.Fatalf("tampered extent fetched %d times, want 2 attempts", calls)
	}
}

func TestRefusedBeforeWriting(t *testing.T) {
	img := defaultImage(t)
	small := randomFile(t, img.m.Size-1)
	before, _ := os.ReadFile(small)
	fetched := false
	fetch := func(ctx context.Context, off, n int64) (io.ReadCloser, error) {
		fetched = true
		return nil, errors.New("must not fetch")
	}
	check := func(t *testing.T, m *diskmap.Map, want error) {
		err := Write(context.Background(), Config{Device: small, Map: m, Fetch: fetch})
		if !errors.Is(err, want) {
			t.Fatalf("Write = %v, want %v", err, want)
		}
		after, _ := os.ReadFile(small)
		if fetched || !bytes.Equal(before, after) {
			t.Fatal("device touched before the refusal")
		}
	}
	t.Run("oversized", func(t *testing.T) { check(t, img.m, ErrTooSmall) })
	t.Run("malformed", func(t *testing.T) {
		m := *img.m
		m.Extents = append([]diskmap.Extent{}, m.Extents...)
		m.Extents[0], m.Extents[1] = m.Extents[1], m.Extents[0]
		m.Size = 1 << 20
		check(t, &m, diskmap.ErrMalformed)
	})
	t.Run("oversized block device", func(t *testing.T) {
		dev := loopDevice(t, 16*mib)
		before := readAll(t, dev)
		err := Write(context.Background(), Config{Device: dev, Map: img.m, Fetch: fetch})
		if !errors.Is(err, ErrTooSmall) {
			t.Fatalf("Write = %v, want ErrTooSmall", err)
		}
		if fetched || !bytes.Equal(before, readAll(t, dev)) {
			t.Fatal("device touched before the refusal")
		}
	})
}

func readAll(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// truncating ends each reader after half its bytes for the first fails
// fetches of every extent.
func truncating(honest Fetch, fails int) Fetch {
	seen := map[int64]int{}
	return func(ctx context.Context, off, n int64) (io.ReadCloser, error) {
		rc, err := honest(ctx, off, n)
		if err != nil {
			return nil, err
		}
		seen[off]++
		if seen[off] > fails {
			return rc, nil
		}
		return struct {
			io.Reader
			io.Closer
		}{io.LimitReader(rc, n/2), rc}, nil
	}
}

func TestTruncatedFetch(t *testing.T) {
	img := defaultImage(t)
	t.Run("retried", func(t *testing.T) {
		dev := randomFile(t, 32*mib)
		cfg := config(img, dev)
		cfg.Fetch = truncating(cfg.Fetch, 2)
		if err := Write(context.Background(), cfg); err != nil {
			t.Fatal(err)
		}
		checkDevice(t, dev, img.raw)
	})
	t.Run("fails cleanly", func(t *testing.T) {
		dev := randomFile(t, 32*mib)
		cfg := config(img, dev)
		cfg.Fetch = truncating(cfg.Fetch, 3)
		err := Write(context.Background(), cfg)
		var ee *ExtentError
		if !errors.As(err, &ee) || ee.Index != 0 || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("Write = %v, want extent 0 ending early", err)
		}
	})
	t.Run("server ignoring Range", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Write(img.raw)
		}))
		defer srv.Close()
		dev := randomFile(t, 32*mib)
		cfg := config(img, dev)
		cfg.Fetch = HTTPFetch(srv.Client(), srv.URL)
		cfg.Attempts = 1
		if err := Write(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "want 206") {
			t.Fatalf("Write = %v, want a refusal of a 200", err)
		}
	})
}

func TestContextEnds(t *testing.T) {
	img := defaultImage(t)
	dev := randomFile(t, 32*mib)
	ctx, cancel := context.WithCancel(context.Background())
	cfg := config(img, dev)
	cfg.Progress = func(done, total int64) { cancel() }
	if err := Write(ctx, cfg); !errors.Is(err, context.Canceled) {
		t.Fatalf("Write = %v, want context.Canceled", err)
	}
}
