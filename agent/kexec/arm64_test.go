package kexec

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	ukexec "github.com/u-root/u-root/pkg/boot/kexec"
	"github.com/u-root/u-root/pkg/dt"
	"golang.org/x/sys/unix"
)

// fakeImage is an arm64 Image header (magic at 56) and a body.
func fakeImage(size int) []byte {
	b := make([]byte, size)
	copy(b[arm64MagicOff:], arm64Magic)
	for i := 64; i < size; i++ {
		b[i] = byte(i)
	}
	return b
}

func gz(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return append(buf.Bytes(), make([]byte, 512)...) // Debian pads Image.gz
}

func memWith(t *testing.T, b []byte) *os.File {
	t.Helper()
	f, err := memFile("test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestARM64Image(t *testing.T) {
	img := fakeImage(1 << 20)
	for name, tc := range map[string]struct {
		in      []byte
		limit   int64
		want    []byte
		same    bool // the input file itself
		wantErr error
	}{
		"plain Image":         {in: img, limit: 2 << 20, want: img, same: true},
		"gzip'd Image":        {in: gz(t, img), limit: 2 << 20, want: img},
		"gzip over the limit": {in: gz(t, img), limit: 1 << 19, wantErr: errAny},
		"gzip of no Image":    {in: gz(t, make([]byte, 4096)), limit: 2 << 20, wantErr: ErrNotImage},
		"neither":             {in: []byte("MZ this is an x86 bzImage or anything else, long enough to have offset 56 in it......."), limit: 2 << 20, wantErr: ErrNotImage},
		"truncated gzip":      {in: gz(t, img)[:200], limit: 2 << 20, wantErr: errAny},
		"empty":               {in: nil, limit: 2 << 20, wantErr: ErrNotImage},
	} {
		t.Run(name, func(t *testing.T) {
			f := memWith(t, tc.in)
			got, err := arm64Image(f, tc.limit)
			if tc.wantErr != nil {
				if err == nil || (tc.wantErr != errAny && !errors.Is(err, tc.wantErr)) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (got == f) != tc.same {
				t.Errorf("returned the input file: %v, want %v", got == f, tc.same)
			}
			b, err := io.ReadAll(got)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b, tc.want) {
				t.Errorf("Image of %d bytes, want %d", len(b), len(tc.want))
			}
			if got != f {
				got.Close()
			}
		})
	}
}

var errAny = errors.New("any error")

// TestLoadARM64: kexec_file_load first; where the kernel has none
// (ENOSYS, Debian 12's arm64 kernel) kexec_load, unless locked down.
func TestLoadARM64(t *testing.T) {
	img := fakeImage(4096)
	enosys := func(*os.File, *os.File, string) error { return unix.ENOSYS }
	ok := func(*os.File, *os.File, string) error { return nil }
	refused := func(*os.File, *os.File, string) error { return unix.EPERM }
	for name, tc := range map[string]struct {
		file, segments loadFunc
		locked         bool
		want           string // syscall; "" an error
	}{
		"kexec_file_load":            {file: ok, segments: refused, want: "kexec_file_load"},
		"no kexec_file_load":         {file: enosys, segments: ok, want: "kexec_load"},
		"no kexec_file_load, locked": {file: enosys, segments: ok, locked: true},
		"kexec_file_load refused":    {file: refused, segments: ok},
		"neither":                    {file: enosys, segments: refused},
	} {
		t.Run(name, func(t *testing.T) {
			var gotImage []byte
			seg := func(k, i *os.File, c string) error {
				gotImage, _ = io.ReadAll(k)
				return tc.segments(k, i, c)
			}
			how, err := loadARM64(memWith(t, gz(t, img)), nil, "console=ttyAMA0", tc.locked, tc.file, seg)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("loaded with %s, want an error", how)
				}
				return
			}
			if err != nil || how != tc.want {
				t.Fatalf("loadARM64 = %q, %v; want %s", how, err, tc.want)
			}
			if how == "kexec_load" && !bytes.Equal(gotImage, img) {
				t.Errorf("kexec_load got %d bytes, not the unpacked Image", len(gotImage))
			}
		})
	}
}

// TestNextTree: a UEFI boot's tree (no memory nodes, /chosen naming the
// UEFI memory map) keeps /chosen's UEFI properties and gains the RAM as
// memory nodes; after an ACPI boot the command line gets acpi=force. A
// tree with memory nodes (a boot without UEFI) is left as it is.
func TestNextTree(t *testing.T) {
	cells := func() []dt.Property {
		two := []byte{0, 0, 0, 2}
		return []dt.Property{{Name: "#address-cells", Value: two}, {Name: "#size-cells", Value: two}}
	}
	uefiTree := func() *dt.FDT {
		return &dt.FDT{RootNode: &dt.Node{Name: "/", Properties: cells(), Children: []*dt.Node{{Name: "chosen", Properties: []dt.Property{
			{Name: "bootargs", Value: []byte("console=ttyAMA0\x00")},
			{Name: "linux,uefi-system-table", Value: make([]byte, 8)},
			{Name: "linux,uefi-mmap-start", Value: make([]byte, 8)},
		}}}}}
	}
	iomem := func() (ukexec.MemoryMap, error) {
		return ukexec.MemoryMap{
			{Range: ukexec.Range{Start: 0x40000000, Size: 0x10000000}, Type: ukexec.RangeRAM},
			{Range: ukexec.Range{Start: 0x50000000, Size: 0x1000}, Type: ukexec.RangeReserved},
			{Range: ukexec.Range{Start: 0x50001000, Size: 0x2000000}, Type: ukexec.RangeRAM},
		}, nil
	}
	for _, acpi := range []bool{true, false} {
		fdt := uefiTree()
		cmdline, err := nextTree(fdt, iomem, acpi, "corral.mode=hypervisor")
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.HasSuffix(cmdline, " acpi=force"); got != acpi {
			t.Errorf("ACPI boot %v: command line %q", acpi, cmdline)
		}
		ch, _ := fdt.RootNode.LookupChildByName("chosen")
		for _, p := range []string{"linux,uefi-system-table", "linux,uefi-mmap-start"} {
			if _, ok := ch.LookProperty(p); !ok {
				t.Errorf("/chosen lost %s: the next kernel would have neither UEFI nor ACPI", p)
			}
		}
		var mem []string
		for _, n := range fdt.RootNode.Children {
			if strings.HasPrefix(n.Name, "memory@") {
				mem = append(mem, n.Name)
			}
		}
		if !slices.Equal(mem, []string{"memory@40000000", "memory@50001000"}) {
			t.Errorf("memory nodes %v, want the RAM without the reserved page", mem)
		}
	}
	// A tree with memory nodes is not touched.
	fdt := uefiTree()
	fdt.RootNode.Children = append(fdt.RootNode.Children, &dt.Node{Name: "memory@40000000"})
	if cmdline, err := nextTree(fdt, func() (ukexec.MemoryMap, error) { return nil, errAny }, true, "x"); err != nil || cmdline != "x" || len(fdt.RootNode.Children) != 2 {
		t.Errorf("tree with memory nodes: %q %v, %d nodes", cmdline, err, len(fdt.RootNode.Children))
	}
}
