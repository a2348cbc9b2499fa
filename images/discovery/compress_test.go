package discovery

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/corralhq/corral/testsupport/require"
	"github.com/pierrec/lz4/v4"
)

// TestCompressInitrd: the discovery image is zstd (the kernel unpacks it
// fastest of what stays near the budget) unless zstd's output is over the
// budget: then xz, and the manifest says which.
func TestCompressInitrd(t *testing.T) {
	require.Tool(t, "zstd", "xz")
	dir := t.TempDir()
	src := filepath.Join(dir, "initramfs.cpio")
	var b bytes.Buffer
	for i := range 20000 {
		fmt.Fprintf(&b, "line %d of a compressible archive %x\n", i, i*7919)
	}
	if err := os.WriteFile(src, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	rc, err := Options{}.recipe(Discover)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		maxSize int64
		want    string
		magic   []byte
	}{
		"zstd within the budget":  {maxSize: MaxInitrdSize, want: "zstd", magic: []byte{0x28, 0xb5, 0x2f, 0xfd}},
		"xz when zstd is over it": {maxSize: 1, want: "xz", magic: []byte{0xfd, '7', 'z', 'X', 'Z', 0}},
	} {
		t.Run(name, func(t *testing.T) {
			rc := rc
			rc.maxSize = tc.maxSize
			dst := filepath.Join(t.TempDir(), "initrd.img")
			got, err := compressInitrd(slog.New(slog.DiscardHandler), rc, src, dst)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("compression = %q, want %q", got, tc.want)
			}
			img, err := os.ReadFile(dst)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(img, tc.magic) {
				t.Errorf("image starts % x, want %s's magic % x", img[:min(len(img), 6)], tc.want, tc.magic)
			}
			out, err := exec.Command(tc.want, "-dc", dst).Output()
			if err != nil || !bytes.Equal(out, b.Bytes()) {
				t.Errorf("%s -dc: %v, %d bytes back of %d", tc.want, err, len(out), b.Len())
			}
		})
	}
}

// TestTrimPCIIDs: the shipped pci.ids keeps the vendor, device, class and
// subclass lines agent/facts reads and drops comments, blank lines,
// subsystems and programming interfaces, which it never reads.
func TestTrimPCIIDs(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "pci.ids"), filepath.Join(dir, "trimmed")
	in := "# List of PCI ID's\n#\n\n1af4  Red Hat, Inc.\n\t1000  Virtio network device\n\t\t1af4 0001  Virtio network device\n\t1001  Virtio block device\n" +
		"# comment\n8086  Intel Corporation\n\t100e  82540EM Gigabit Ethernet Controller\n\t\t8086 001e  PRO/1000 MT Desktop Adapter\n\n" +
		"C 01  Mass storage controller\n\t06  SATA controller\n\t\t01  AHCI 1.0\nC 02  Network controller\n\t00  Ethernet controller"
	if err := os.WriteFile(src, []byte(in), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := trimPCIIDs(src, dst); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	want := "1af4  Red Hat, Inc.\n\t1000  Virtio network device\n\t1001  Virtio block device\n8086  Intel Corporation\n\t100e  82540EM Gigabit Ethernet Controller\n" +
		"C 01  Mass storage controller\n\t06  SATA controller\nC 02  Network controller\n\t00  Ethernet controller"
	if string(got) != want {
		t.Errorf("trimmed:\n%q\nwant:\n%q", got, want)
	}
}

// TestGzipAndLZ4Files: both compress a file that reads back the same (LZ4
// in the legacy frame the kernel's unpacker takes).
func TestGzipAndLZ4Files(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "in")
	want := bytes.Repeat([]byte("corral initramfs member\n"), 50000)
	if err := os.WriteFile(src, want, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		compress func(src, dst string) error
		reader   func(io.Reader) (io.Reader, error)
	}{
		"gzip": {gzipFile, func(r io.Reader) (io.Reader, error) { return gzip.NewReader(r) }},
		"lz4":  {lz4File, func(r io.Reader) (io.Reader, error) { return lz4.NewReader(r), nil }},
	} {
		dst := filepath.Join(dir, name)
		if err := tc.compress(src, dst); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		f, err := os.Open(dst)
		if err != nil {
			t.Fatal(err)
		}
		r, err := tc.reader(f)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := io.ReadAll(r)
		f.Close()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: read back %d bytes (%v), want %d", name, len(got), err, len(want))
		}
	}
	if err := gzipFile(filepath.Join(dir, "missing"), filepath.Join(dir, "x")); err == nil {
		t.Fatal("a missing source compressed without an error")
	}
}
