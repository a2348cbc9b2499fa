package volume

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/corralhq/corral/hypervisor/cloudinit"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/testsupport/require"
)

func needQemuImg(t *testing.T) {
	t.Helper()
	require.Tool(t, "qemu-img")
}

func newStore(t *testing.T) *Store {
	t.Helper()
	needQemuImg(t)
	s, err := New(Config{Dir: filepath.Join(t.TempDir(), "volumes")})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// files lists the directory, hidden files included: tests assert nothing
// half-created is left behind.
func files(t *testing.T, s *Store) []string {
	t.Helper()
	es, err := os.ReadDir(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

func TestCreateResizeDelete(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	v, err := s.Create(ctx, "disk1", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	if v.Format != "qcow2" || v.SizeBytes != 64<<20 || v.Path != filepath.Join(s.Dir(), "disk1") {
		t.Fatalf("created %+v", v)
	}
	st, _ := os.Stat(v.Path)
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	if _, err := s.Create(ctx, "disk1", 1<<20); !errors.Is(err, apierr.ErrAlreadyExists) {
		t.Errorf("second create: %v, want apierr.ErrAlreadyExists", err)
	}
	if v, err = s.Resize(ctx, "disk1", 128<<20); err != nil || v.SizeBytes != 128<<20 {
		t.Fatalf("resize: %+v %v", v, err)
	}
	if _, err := s.Resize(ctx, "disk1", 1<<20); !errors.Is(err, apierr.ErrInvalid) {
		t.Errorf("shrink: %v, want apierr.ErrInvalid", err)
	}
	if _, err := s.Resize(ctx, "nope", 1<<20); !errors.Is(err, apierr.ErrNotFound) {
		t.Errorf("resize unknown: %v, want apierr.ErrNotFound", err)
	}
	list, err := s.List(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "disk1" {
		t.Fatalf("list: %+v %v", list, err)
	}
	if err := s.Delete(ctx, "disk1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "disk1"); !errors.Is(err, apierr.ErrNotFound) {
		t.Errorf("second delete: %v, want apierr.ErrNotFound", err)
	}
	if got := files(t, s); len(got) != 0 {
		t.Errorf("left behind: %v", got)
	}
}

func TestBadNames(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	for _, name := range []string{"../escape", "a/b", ".hidden", "", "x/../../y"} {
		if _, err := s.Create(ctx, name, 1<<20); !errors.Is(err, apierr.ErrInvalid) {
			t.Errorf("Create(%q): %v, want apierr.ErrInvalid", name, err)
		}
		if err := s.Delete(ctx, name); !errors.Is(err, apierr.ErrInvalid) {
			t.Errorf("Delete(%q): %v, want apierr.ErrInvalid", name, err)
		}
	}
	if _, err := s.Create(ctx, "zero", 0); !errors.Is(err, apierr.ErrInvalid) {
		t.Errorf("zero size: %v", err)
	}
	if got := files(t, s); len(got) != 0 {
		t.Errorf("left behind: %v", got)
	}
}

// makeImage writes a qcow2 image of virtual size virt with the first
// dataBytes filled with non-zero data.
func makeImage(t *testing.T, s *Store, name string, virt, dataBytes int64) {
	t.Helper()
	raw := filepath.Join(t.TempDir(), name+".raw")
	f, err := os.Create(raw)
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte("corral-data-"), 1<<16)
	for w := int64(0); w < dataBytes; {
		n, err := f.Write(chunk[:min(int64(len(chunk)), dataBytes-w)])
		if err != nil {
			t.Fatal(err)
		}
		w += int64(n)
	}
	if err := f.Truncate(virt); err != nil {
		t.Fatal(err)
	}
	f.Close()
	out, err := exec.Command("qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, filepath.Join(s.Dir(), name)).CombinedOutput()
	if err != nil {
		t.Fatalf("convert: %v %s", err, out)
	}
	os.Remove(raw)
}

// TestCreateFromIsCopyOnWrite: an overlay takes the same time whatever the
// backing size, and the backing volume is then in use.
func TestCreateFromIsCopyOnWrite(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	makeImage(t, s, "small", 100<<20, 100<<20)
	makeImage(t, s, "big", 10<<30, 100<<20)
	for _, base := range []string{"small", "big"} {
		b, _ := s.Get(ctx, base)
		start := time.Now()
		v, err := s.CreateFrom(ctx, base+"-vm", base, 0)
		d := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("BENCH create from image %s (virtual %d MiB, allocated %d MiB): %v, overlay %d KiB",
			base, b.SizeBytes>>20, b.ActualBytes>>20, d.Round(time.Millisecond), v.ActualBytes>>10)
		if v.BackingFile != b.Path || v.SizeBytes != b.SizeBytes {
			t.Errorf("overlay %+v, backing %+v", v, b)
		}
		if v.ActualBytes > 2<<20 {
			t.Errorf("overlay allocates %d bytes: data was copied", v.ActualBytes)
		}
	}
	if _, err := s.CreateFrom(ctx, "grown", "small", 200<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateFrom(ctx, "shrunk", "small", 1<<20); !errors.Is(err, apierr.ErrInvalid) {
		t.Errorf("smaller overlay: %v, want apierr.ErrInvalid", err)
	}
	if _, err := s.CreateFrom(ctx, "orphan", "missing", 0); !errors.Is(err, apierr.ErrNotFound) {
		t.Errorf("unknown backing: %v, want apierr.ErrNotFound", err)
	}
	if err := s.Delete(ctx, "small"); !errors.Is(err, apierr.ErrPrecondition) {
		t.Errorf("delete backing volume: %v, want apierr.ErrPrecondition", err)
	}
	for _, n := range []string{"small-vm", "grown", "small"} {
		if err := s.Delete(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := files(t, s), []string{"big", "big-vm"}; !slices.Equal(got, want) {
		t.Errorf("files %v, want %v", got, want)
	}
}

func TestStaleTempRemoved(t *testing.T) {
	needQemuImg(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, ".tmp-x-123"), []byte("junk"), 0o600)
	s, err := New(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if got := files(t, s); len(got) != 0 {
		t.Errorf("left: %v", got)
	}
}

func TestFetch(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	// A small real qcow2 to serve, and a raw image.
	makeImage(t, s, "src", 4<<20, 1<<20)
	qcow, _ := os.ReadFile(filepath.Join(s.Dir(), "src"))
	os.Remove(filepath.Join(s.Dir(), "src"))
	rawImg := bytes.Repeat([]byte{7}, 2<<20)
	sum := func(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }

	mux := http.NewServeMux()
	mux.HandleFunc("/img.qcow2", func(w http.ResponseWriter, r *http.Request) { w.Write(qcow) })
	mux.HandleFunc("/img.raw", func(w http.ResponseWriter, r *http.Request) { w.Write(rawImg) })
	var iso bytes.Buffer
	if err := (cloudinit.Seed{InstanceID: "i", Hostname: "h"}).WriteISO(&iso); err != nil {
		t.Fatal(err)
	}
	mux.HandleFunc("/boot.iso", func(w http.ResponseWriter, r *http.Request) { w.Write(iso.Bytes()) })
	mux.HandleFunc("/chunked", func(w http.ResponseWriter, r *http.Request) {
		for range 4 {
			w.Write(rawImg)
			w.(http.Flusher).Flush()
		}
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		w.Write(rawImg[:1024])
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	v, err := s.Fetch(ctx, FetchRequest{Name: "q", URL: srv.URL + "/img.qcow2", SHA256: sum(qcow), SizeBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if v.Format != "qcow2" || v.SizeBytes != 8<<20 {
		t.Errorf("fetched qcow2: %+v", v)
	}
	v, err = s.Fetch(ctx, FetchRequest{Name: "r", URL: srv.URL + "/img.raw", SHA256: sum(rawImg)})
	if err != nil {
		t.Fatal(err)
	}
	if v.Format != "qcow2" || v.SizeBytes != uint64(len(rawImg)) {
		t.Errorf("fetched raw (converted): %+v", v)
	}

	v, err = s.Fetch(ctx, FetchRequest{Name: "iso", URL: srv.URL + "/boot.iso", SHA256: sum(iso.Bytes()), SizeBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	if v.Format != "raw" || v.SizeBytes != uint64(iso.Len()) {
		t.Errorf("fetched ISO must stay raw and unresized: %+v", v)
	}
	if _, err := s.CreateFrom(ctx, "iso-overlay", "iso", 0); err != nil {
		t.Errorf("overlay on a raw backing file: %v", err)
	}
	s.Delete(ctx, "iso-overlay")
	s.Delete(ctx, "iso")

	bad := map[string]struct {
		req  FetchRequest
		want error
	}{
		"404":             {FetchRequest{Name: "b", URL: srv.URL + "/missing"}, ErrFetch},
		"too large":       {FetchRequest{Name: "b", URL: srv.URL + "/img.raw", MaxBytes: 1 << 20}, ErrTooLarge},
		"too large chunk": {FetchRequest{Name: "b", URL: srv.URL + "/chunked", MaxBytes: 3 << 20}, ErrTooLarge},
		"wrong checksum":  {FetchRequest{Name: "b", URL: srv.URL + "/img.raw", SHA256: sum(qcow)}, ErrChecksum},
		"timeout":         {FetchRequest{Name: "b", URL: srv.URL + "/slow", Timeout: 300 * time.Millisecond}, ErrFetch},
		"bad scheme":      {FetchRequest{Name: "b", URL: "file:///etc/passwd"}, apierr.ErrInvalid},
		"bad digest":      {FetchRequest{Name: "b", URL: srv.URL + "/img.raw", SHA256: "abc"}, apierr.ErrInvalid},
		"traversal":       {FetchRequest{Name: "../b", URL: srv.URL + "/img.raw"}, apierr.ErrInvalid},
		"exists":          {FetchRequest{Name: "q", URL: srv.URL + "/img.raw"}, apierr.ErrAlreadyExists},
		"small size":      {FetchRequest{Name: "b", URL: srv.URL + "/img.raw", SizeBytes: 1 << 20}, apierr.ErrInvalid},
	}
	for name, tc := range bad {
		t.Run(name, func(t *testing.T) {
			_, err := s.Fetch(ctx, tc.req)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			t.Logf("error: %v", err)
			if got, want := files(t, s), []string{"q", "r"}; !slices.Equal(got, want) {
				t.Errorf("files %v, want %v", got, want)
			}
		})
	}
}
