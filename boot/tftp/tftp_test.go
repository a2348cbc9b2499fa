package tftp

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pin/tftp/v3"

	"github.com/corralhq/corral/images"
)

type fakeCatalog map[string]images.Artifact

func (c fakeCatalog) Lookup(name string) (images.Artifact, bool) { a, ok := c[name]; return a, ok }

func testCatalog(t *testing.T) (fakeCatalog, []byte) {
	t.Helper()
	dir := t.TempDir()
	efi := bytes.Repeat([]byte("0123456789abcdef"), 4096+7) // 65648 bytes: many blocks, odd tail
	files := map[string][]byte{images.IPXEEFI: efi, images.UndionlyKPXE: []byte("undi"), images.DiscoverKernel: []byte("kernel")}
	c := fakeCatalog{}
	for n, b := range files {
		p := filepath.Join(dir, n)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		k := images.KindIPXE
		if n == images.DiscoverKernel {
			k = images.KindKernel
		}
		c[n] = images.Artifact{Name: n, Kind: k, Path: p, Size: int64(len(b))}
	}
	return c, efi
}

type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) Event(mac, source, event, detail string, attrs map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, mac+" "+source+" "+event+" "+attrs["file"]+" "+attrs["bytes"])
}

func (r *recorder) all() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.events, "\n")
}

type macs struct{}

func (macs) MACForIP(ip net.IP) (string, bool) { return "52:54:00:00:00:01", ip.IsLoopback() }

func startServer(t *testing.T) (string, []byte, *recorder) {
	t.Helper()
	cat, efi := testCatalog(t)
	rec := &recorder{}
	s, err := New(Config{Listen: "127.0.0.1:0", Catalog: cat, Timeline: rec, MACs: macs{}, Limits: Limits{Timeout: 500 * time.Millisecond, Retries: 2}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return s.Addr().String(), efi, rec
}

func fetch(t *testing.T, addr, name string, blksize int, tsize bool) ([]byte, int64, error) {
	t.Helper()
	c, err := tftp.NewClient(addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetTimeout(time.Second)
	c.SetRetries(2)
	if blksize > 0 {
		c.SetBlockSize(blksize)
	}
	if tsize {
		c.RequestTSize(true)
	}
	wt, err := c.Receive(name, "octet")
	if err != nil {
		return nil, 0, err
	}
	size, _ := wt.(tftp.IncomingTransfer).Size()
	var b bytes.Buffer
	if _, err := wt.WriteTo(&b); err != nil {
		return nil, 0, err
	}
	return b.Bytes(), size, nil
}

func TestServesIPXEWithOptions(t *testing.T) {
	addr, efi, rec := startServer(t)
	for name, tc := range map[string]struct {
		blksize int
		tsize   bool
	}{
		"default 512":         {},
		"blksize 1468+tsize":  {blksize: 1468, tsize: true},
		"blksize 8192 capped": {blksize: 8192},
	} {
		t.Run(name, func(t *testing.T) {
			got, size, err := fetch(t, addr, images.IPXEEFI, tc.blksize, tc.tsize)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, efi) {
				t.Fatalf("got %d bytes, want %d", len(got), len(efi))
			}
			if tc.tsize && size != int64(len(efi)) {
				t.Errorf("tsize = %d, want %d", size, len(efi))
			}
		})
	}
	time.Sleep(50 * time.Millisecond)
	if !strings.Contains(rec.all(), "52:54:00:00:00:01 tftp tftp-file ipxe.efi 65648") {
		t.Errorf("timeline lacks the transfer:\n%s", rec.all())
	}
}

func TestRefusals(t *testing.T) {
	addr, _, rec := startServer(t)
	for _, name := range []string{"../ipxe.efi", "/ipxe.efi", "/etc/passwd", "x/../../ipxe.efi", "vmlinuz", "nope.efi", "IPXE.EFI", ""} {
		t.Run(name, func(t *testing.T) {
			_, _, err := fetch(t, addr, name, 0, false)
			if err == nil {
				t.Fatalf("%q was served", name)
			}
			if !strings.Contains(err.Error(), "code: 1") && name != "" {
				t.Errorf("want a TFTP error packet, got %v", err)
			}
		})
	}
	// Write requests.
	c, _ := tftp.NewClient(addr)
	c.SetTimeout(time.Second)
	c.SetRetries(1)
	rf, err := c.Send(images.IPXEEFI, "octet")
	if err == nil {
		_, err = rf.ReadFrom(strings.NewReader("evil"))
	}
	if err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Errorf("write request: err = %v, want read-only refusal", err)
	}
	// Still serving afterwards.
	if _, _, err := fetch(t, addr, images.UndionlyKPXE, 0, false); err != nil {
		t.Fatalf("server stopped serving after refusals: %v", err)
	}
	time.Sleep(50 * time.Millisecond)
	if !strings.Contains(rec.all(), "tftp-refused") {
		t.Errorf("refusals not on the timeline:\n%s", rec.all())
	}
}

func TestCheckName(t *testing.T) {
	cat, _ := testCatalog(t)
	for name, want := range map[string]error{
		"ipxe.efi":       nil,
		"undionly.kpxe":  nil,
		"vmlinuz":        ErrRefused,
		"../ipxe.efi":    ErrRefused,
		"/ipxe.efi":      ErrRefused,
		"a\\ipxe.efi":    ErrRefused,
		"ipxe.efi ":      ErrRefused, //nolint:gocritic // the trailing space is the case under test
		"":               ErrRefused,
		"ipxe.efi\n":     ErrRefused,
		"..":             ErrRefused,
		"undionly.kpxe.": ErrRefused,
	} {
		got, err := CheckName(name, cat)
		if !errors.Is(err, want) {
			t.Errorf("CheckName(%q) = %q, %v; want %v", name, got, err, want)
		}
		if err == nil && got != name {
			t.Errorf("CheckName(%q) = %q", name, got)
		}
	}
}

// FuzzCheckName: whatever the name, an accepted one is exactly an iPXE
// binary of the catalog and never a path.
func FuzzCheckName(f *testing.F) {
	for _, s := range []string{"ipxe.efi", "../ipxe.efi", "/etc/passwd", "undionly.kpxe", "vmlinuz", "ipxe.efi/..", "\x00", "snp-arm64.efi"} {
		f.Add(s)
	}
	cat := fakeCatalog{
		images.IPXEEFI:        {Name: images.IPXEEFI, Kind: images.KindIPXE},
		images.UndionlyKPXE:   {Name: images.UndionlyKPXE, Kind: images.KindIPXE},
		images.DiscoverKernel: {Name: images.DiscoverKernel, Kind: images.KindKernel},
	}
	f.Fuzz(func(t *testing.T, name string) {
		got, err := CheckName(name, cat)
		if err != nil {
			if !errors.Is(err, ErrRefused) {
				t.Fatalf("error not wrapping ErrRefused: %v", err)
			}
			return
		}
		if got != name || strings.ContainsAny(got, "/\\") || strings.Contains(got, "..") {
			t.Fatalf("accepted %q as %q", name, got)
		}
		if a, ok := cat[got]; !ok || a.Kind != images.KindIPXE {
			t.Fatalf("accepted a non-iPXE name %q", got)
		}
	})
}
