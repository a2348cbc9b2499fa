package facts

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jaypipes/pcidb"
)

func TestReadPCINames(t *testing.T) {
	const ids = "# comment\n" +
		"1af4  Red Hat, Inc.\n" +
		"\t1000  Virtio network device\n" +
		"\t\t1af4 0001  Virtio network device (subsystem)\n" +
		"\t1001  Virtio block device\n" +
		"8086  Intel Corporation\n" +
		"\t1000  82542 Gigabit Ethernet Controller (Fiber)\n" +
		"C 01  Mass storage controller\n" +
		"\t06  SATA controller\n" +
		"\t\t01  AHCI 1.0\n" +
		"C 06  Bridge\n" +
		"\t00  Host bridge" // no final newline
	path := filepath.Join(t.TempDir(), "pci.ids")
	if err := os.WriteFile(path, []byte(ids), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		vendors, products, subclasses map[string]bool
		want                          *pciNames
	}{
		"only what is wanted": {
			vendors: map[string]bool{"1af4": true}, products: map[string]bool{"1af41000": true, "80861000": true}, subclasses: map[string]bool{"0106": true, "0600": true},
			want: &pciNames{
				vendors:    map[string]string{"1af4": "Red Hat, Inc."},
				products:   map[string]string{"1af41000": "Virtio network device", "80861000": "82542 Gigabit Ethernet Controller (Fiber)"},
				subclasses: map[string]string{"0106": "SATA controller", "0600": "Host bridge"},
			},
		},
		"unknown IDs": {
			vendors: map[string]bool{"dead": true}, products: map[string]bool{"1af49999": true}, subclasses: map[string]bool{"0199": true},
			want: &pciNames{vendors: map[string]string{}, products: map[string]string{}, subclasses: map[string]string{}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := readPCINames(path, tc.vendors, tc.products, tc.subclasses)
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(pciNames{})); diff != "" {
				t.Errorf("readPCINames (-want +got):\n%s", diff)
			}
		})
	}
	if readPCINames(filepath.Join(t.TempDir(), "none"), nil, nil, nil) != nil {
		t.Error("a missing pci.ids gave names")
	}
}

// BenchmarkPCINames compares the one-pass lookup with parsing the whole
// database (jaypipes/pcidb, what facts used before) on the system's
// pci.ids, for the devices of a lab machine.
func BenchmarkPCINames(b *testing.B) {
	path := "/usr/share/misc/pci.ids"
	if _, err := os.Stat(path); err != nil {
		b.Skip("no pci.ids")
	}
	vendors := map[string]bool{"1af4": true, "8086": true, "1234": true}
	products := map[string]bool{"1af41000": true, "1af41001": true, "80862922": true, "808629c0": true, "12341111": true}
	subclasses := map[string]bool{"0200": true, "0100": true, "0106": true, "0600": true, "0300": true}
	b.Run("one-pass", func(b *testing.B) {
		for b.Loop() {
			if readPCINames(path, vendors, products, subclasses) == nil {
				b.Fatal("nil")
			}
		}
	})
	b.Run("pcidb", func(b *testing.B) {
		for b.Loop() {
			if _, err := pcidb.New(pcidb.WithPath(path)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
