package osimage

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	osimagev1 "github.com/corralhq/corral/api/osimage/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/diskmap"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/testsupport/require"
)

// qemuImages writes a sparse raw disk with a little data, its qcow2
// (compressed) and what qemu-img converts that qcow2 back to, and returns
// the three files' contents.
func qemuImages(t *testing.T) (rawDisk, qc, converted []byte) {
	t.Helper()
	require.Tool(t, "qemu-img")
	dir := t.TempDir()
	src, qp, cp := filepath.Join(dir, "src.raw"), filepath.Join(dir, "img.qcow2"), filepath.Join(dir, "conv.raw")
	rawDisk = make([]byte, 12<<20)
	for i, off := range []int{0, 5<<20 + 4097, 11 << 20} {
		copy(rawDisk[off:], bytes.Repeat([]byte{byte('A' + i)}, 300000))
	}
	if err := os.WriteFile(src, rawDisk, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"convert", "-f", "raw", "-O", "qcow2", "-c", src, qp},
		{"convert", "-f", "qcow2", "-O", "raw", qp, cp},
	} {
		if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img %v: %v\n%s", args, err, out)
		}
	}
	qc, _ = os.ReadFile(qp)
	converted, _ = os.ReadFile(cp)
	return rawDisk, qc, converted
}

// TestRaw: a READY image's raw view and block map. The map is built in
// the background once the image is READY, cached beside the content,
// reused, rebuilt when the cache is damaged, and removed with the
// content; the raw view of a qcow2 is what qemu-img converts it to.
func TestRaw(t *testing.T) {
	rawDisk, qc, converted := qemuImages(t)
	dir := t.TempDir()
	s := newService(t, Config{Dir: dir})
	ctx := context.Background()
	for name, tc := range map[string]struct {
		data   []byte
		format osimagev1.OSImageFormat
		want   []byte
	}{
		"disk-raw":   {rawDisk, raw, rawDisk},
		"disk-qcow2": {qc, qcow2, converted},
	} {
		t.Run(name, func(t *testing.T) {
			h := &osimagev1.UploadOSImageHeader{Name: name, Sha256: sum(tc.data), SizeBytes: uint64(len(tc.data)), Format: tc.format}
			if _, err := s.Upload(ctx, h, bytes.NewReader(tc.data)); err != nil {
				t.Fatal(err)
			}
			mapPath := s.mapPath(h.Sha256)
			deadline := time.Now().Add(20 * time.Second)
			for {
				if _, err := os.Stat(mapPath); err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("no block map built in the background")
				}
				time.Sleep(10 * time.Millisecond)
			}
			before, _ := os.Stat(mapPath)

			ri, err := s.Raw(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if ri.Name != name || ri.SHA256 != h.Sha256 || ri.Size != int64(len(tc.want)) || ri.Path != "/os-images/"+h.Sha256+"/raw" {
				t.Errorf("Raw = %+v", ri)
			}
			m, err := diskmap.Parse(ri.Map, ri.MapSHA256)
			if err != nil {
				t.Fatal(err)
			}
			if m.Size != int64(len(tc.want)) || m.DataBytes() == 0 || m.DataBytes() > 4<<20 {
				t.Errorf("map of %d bytes with %d data bytes", m.Size, m.DataBytes())
			}
			after, _ := os.Stat(mapPath)
			if !os.SameFile(before, after) {
				t.Error("the cached map was rebuilt, not reused")
			}

			rv, size, err := s.OpenRaw(h.Sha256)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(rv)
			if size != int64(len(tc.want)) || !bytes.Equal(got, tc.want) {
				t.Errorf("raw view: %d bytes (size %d), want %d; equal %v", len(got), size, len(tc.want), bytes.Equal(got, tc.want))
			}
			// Seeks and reads of every size, as ranges make them.
			for i, at := range []struct{ off, n int64 }{{5 << 20, 70000}, {0, 1}, {size - 3, 10}, {1<<20 - 5, 2<<20 + 11}, {5<<20 + 4000, 300}, {size, 5}} {
				if _, err := rv.Seek(at.off, io.SeekStart); err != nil {
					t.Fatal(err)
				}
				buf, err := io.ReadAll(io.LimitReader(rv, at.n))
				want := tc.want[min(at.off, size):min(at.off+at.n, size)]
				if err != nil || !bytes.Equal(buf, want) {
					t.Errorf("read %d (%d at %d): %d bytes, %v", i, at.n, at.off, len(buf), err)
				}
			}
			if end, err := rv.Seek(0, io.SeekEnd); end != size || err != nil {
				t.Errorf("seek to end: %d, %v", end, err)
			}
			rv.Close()

			// A damaged cache is found and rebuilt.
			if err := os.WriteFile(mapPath, []byte(`{"version":1}`), 0o644); err != nil {
				t.Fatal(err)
			}
			again, err := s.Raw(ctx, name)
			if err != nil || again.MapSHA256 != ri.MapSHA256 {
				t.Errorf("after damage: %v, digest %s want %s", err, again.MapSHA256, ri.MapSHA256)
			}

			if err := s.Delete(ctx, name); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(mapPath); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("map left after delete: %v", err)
			}
			if _, _, err := s.OpenRaw(h.Sha256); !errors.Is(err, apierr.ErrNotFound) {
				t.Errorf("OpenRaw after delete: %v", err)
			}
		})
	}
}

// TestRawOnDemand: without Run, Raw builds the map itself, once for
// concurrent callers.
func TestRawOnDemand(t *testing.T) {
	rawDisk, _, _ := qemuImages(t)
	s, err := New(Config{Store: mem.New(), Dir: t.TempDir(), Appliance: "a1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	h := &osimagev1.UploadOSImageHeader{Name: "d", Sha256: sum(rawDisk), SizeBytes: uint64(len(rawDisk)), Format: raw}
	if _, err := s.Upload(ctx, h, bytes.NewReader(rawDisk)); err != nil {
		t.Fatal(err)
	}
	digests := make(chan string, 8)
	for range 8 {
		go func() {
			ri, err := s.Raw(ctx, "d")
			if err != nil {
				t.Error(err)
			}
			digests <- ri.MapSHA256
		}()
	}
	first := <-digests
	for range 7 {
		if d := <-digests; d != first || d == "" {
			t.Errorf("digest %q, want %q", d, first)
		}
	}
}

func TestRawRefusals(t *testing.T) {
	s := newService(t, Config{})
	ctx := context.Background()
	if _, err := s.Raw(ctx, "nope"); !errors.Is(err, apierr.ErrNotFound) {
		t.Errorf("unknown: %v", err)
	}
	if _, err := s.Register(ctx, &osimagev1.RegisterOSImageRequest{Name: "later", SourceUrl: "http://127.0.0.1:1/x.img",
		Sha256: sum([]byte("x")), Format: raw}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Raw(ctx, "later"); !errors.Is(err, apierr.ErrPrecondition) {
		t.Errorf("not READY: %v", err)
	}
	for sum, class := range map[string]error{"abc": apierr.ErrInvalid, sum([]byte("nothing")): apierr.ErrNotFound} {
		if _, _, err := s.OpenRaw(sum); !errors.Is(err, class) {
			t.Errorf("OpenRaw(%s): %v, want %v", sum, err, class)
		}
	}
}
