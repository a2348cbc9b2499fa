package facts

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/testsupport/fixture"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.json from the fixtures")

// unpack unpacks testdata/name.txtar into a temporary root.
func unpack(t *testing.T, name string) string {
	t.Helper()
	root := t.TempDir()
	if err := fixture.UnpackFile(filepath.Join("testdata", name+".txtar"), root); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestCollect checks the facts each fixture must yield. want lists the
// fields that matter for identity and operators; the golden file pins the
// rest (go test ./agent/facts -update rewrites it).
func TestCollect(t *testing.T) {
	for name, tc := range map[string]struct {
		want *inventoryv1.Facts // System, Memory.TotalBytes, Disks, Nics, MissingDrivers compared
	}{
		"firecracker-vm": {want: &inventoryv1.Facts{
			Memory: &inventoryv1.Facts_Memory{TotalBytes: 25769803776},
			Disks: []*inventoryv1.Facts_Disk{
				{Name: "vda", SizeBytes: 274877906944, Serial: "overlayblk", Rotational: true, Bus: "virtio"},
			},
			Nics: []*inventoryv1.Facts_Nic{{Name: "eth0", Mac: "02:fc:00:00:00:01", Driver: "virtio_net", Link: true}},
		}},
		"oem-placeholders": {want: &inventoryv1.Facts{
			// Placeholders are reported verbatim; the appliance decides they are no serial.
			System: &inventoryv1.Facts_System{
				Vendor: "To Be Filled By O.E.M.", Product: "To Be Filled By O.E.M.", Version: "To Be Filled By O.E.M.",
				Serial: "To Be Filled By O.E.M.", Uuid: "00020003-0004-0005-0006-000700080009", Sku: "Default string", Family: "Default string",
			},
			Memory: &inventoryv1.Facts_Memory{TotalBytes: 8 << 30},
			Nics: []*inventoryv1.Facts_Nic{
				{Name: "eno1", Mac: "70:85:c2:aa:bb:cc", Driver: "e1000e", Link: true, SpeedMbps: 1000, PciAddress: "0000:00:1f.6"},
			},
			MissingDrivers: []*inventoryv1.Facts_PciDevice{{
				Address: "0000:00:19.0", VendorId: "8086", ProductId: "1533", Vendor: "Intel Corporation",
				Product: "I210 Gigabit Network Connection", Class: "Ethernet controller",
			}},
		}},
		"nvme-sata": {want: &inventoryv1.Facts{
			System: &inventoryv1.Facts_System{
				Vendor: "Dell Inc.", Product: "PowerEdge R640", Serial: "7XK2QH3",
				Uuid: "4c4c4544-0058-4b10-8032-b7c04f514833", Sku: "SKU=NotProvided;ModelName=PowerEdge R640", Family: "PowerEdge",
			},
			Memory: &inventoryv1.Facts_Memory{TotalBytes: 32 << 30},
			Disks: []*inventoryv1.Facts_Disk{
				{Name: "nvme0n1", SizeBytes: 1875385008 * 512, Model: "SAMSUNG MZ1LB960HAJQ-00007", Serial: "S435NE0MA01234", Wwn: "eui.0025388b91b2c3d4", Bus: "nvme", Partitions: 2},
				{Name: "sda", SizeBytes: 7814037168 * 512, Model: "ST4000NM0035-1V4", Serial: "ZC1ABC23", Wwn: "0x5000c500a1b2c3d4", Rotational: true, Bus: "ata"},
				{Name: "sdb", SizeBytes: 60437492 * 512, Model: "DataTraveler 3.0", Serial: "60A44C3FACC3E3B1B9", Removable: true, Bus: "usb"},
			},
			Nics: []*inventoryv1.Facts_Nic{
				{Name: "ens2f0np0", Mac: "b8:ce:f6:01:02:03", Driver: "mlx5_core", PciAddress: "0000:5e:00.0"},
			},
		}},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := Collect(context.Background(), Options{Root: unpack(t, name)})
			if err != nil {
				t.Errorf("Collect: %v", err)
			}
			subset := &inventoryv1.Facts{System: got.System, Disks: got.Disks, Nics: got.Nics, MissingDrivers: got.MissingDrivers}
			if got.Memory != nil {
				subset.Memory = &inventoryv1.Facts_Memory{TotalBytes: got.Memory.TotalBytes}
			}
			if diff := cmp.Diff(tc.want, subset, protocmp.Transform()); diff != "" {
				t.Errorf("facts (-want +got):\n%s", diff)
			}

			golden := filepath.Join("testdata", name+".golden.json")
			if *update {
				b, _ := protojson.MarshalOptions{Multiline: true}.Marshal(got)
				if err := os.WriteFile(golden, append(b, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			raw, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update)", err)
			}
			want := &inventoryv1.Facts{}
			if err := protojson.Unmarshal(raw, want); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
				t.Errorf("facts differ from %s (-want +got):\n%s", golden, diff)
			}
		})
	}
}

func TestCollectMissingRoot(t *testing.T) {
	f, err := Collect(context.Background(), Options{Root: t.TempDir()})
	if f == nil {
		t.Fatal("Collect returned nil facts")
	}
	if err == nil {
		t.Error("Collect on an empty root reported no error")
	}
}

func TestCollectCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Collect(ctx, Options{Root: unpack(t, "nvme-sata")}); err != context.Canceled {
		t.Errorf("Collect(cancelled) = %v, want context.Canceled", err)
	}
}

func TestCap(t *testing.T) {
	long := strings.Repeat("é", 300) // 600 bytes
	f := &inventoryv1.Facts{
		System: &inventoryv1.Facts_System{Serial: long, Vendor: "bad\xffutf8"},
		Kernel: long,
	}
	for i := 0; i < MaxDisks+5; i++ {
		f.Disks = append(f.Disks, &inventoryv1.Facts_Disk{Name: "d"})
	}
	for i := 0; i < MaxNICs+1; i++ {
		f.Nics = append(f.Nics, &inventoryv1.Facts_Nic{Name: "n"})
	}
	lldp := f.Nics[0]
	for i := 0; i < MaxLLDPNeighbors+3; i++ {
		lldp.LldpNeighbors = append(lldp.LldpNeighbors, &inventoryv1.Facts_LldpNeighbor{SystemName: long, VlanNames: make([]string, MaxVLANNames+1)})
	}
	for i := 0; i < MaxPCIDevices+1; i++ {
		f.PciDevices = append(f.PciDevices, &inventoryv1.Facts_PciDevice{Address: "a"})
		f.MissingDrivers = append(f.MissingDrivers, &inventoryv1.Facts_PciDevice{Address: "a"})
	}
	Cap(f)
	for name, tc := range map[string]struct{ got, want int }{
		"disks":           {len(f.Disks), MaxDisks},
		"nics":            {len(f.Nics), MaxNICs},
		"pci":             {len(f.PciDevices), MaxPCIDevices},
		"missing drivers": {len(f.MissingDrivers), MaxPCIDevices},
		"serial bytes":    {len(f.System.Serial), MaxString},
		"kernel bytes":    {len(f.Kernel), MaxString},
		"lldp neighbours": {len(lldp.LldpNeighbors), MaxLLDPNeighbors},
		"vlan names":      {len(lldp.LldpNeighbors[0].VlanNames), MaxVLANNames},
		"lldp name bytes": {len(lldp.LldpNeighbors[3].SystemName), MaxString},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %d, want %d", name, tc.got, tc.want)
		}
	}
	if _, err := proto.Marshal(f); err != nil {
		t.Errorf("capped facts do not marshal: %v", err)
	}
	if Cap(nil) != nil {
		t.Error("Cap(nil) != nil")
	}
}

func TestCollectDump(t *testing.T) {
	name := os.Getenv("CORRAL_DUMP")
	if name == "" {
		t.Skip("set CORRAL_DUMP=fixture to print its facts")
	}
	f, err := Collect(context.Background(), Options{Root: unpack(t, name)})
	t.Logf("err=%v\n%s", err, protojson.Format(f))
}

// Cap escapes control characters: the appliance refuses a report holding
// one, and an odd firmware string must not keep a machine from registering.
func TestCapEscapesControlCharacters(t *testing.T) {
	f := &inventoryv1.Facts{
		System: &inventoryv1.Facts_System{Vendor: "QEMU\x1b]0;t\x07", Serial: "SN\u009b2J"},
		Disks:  []*inventoryv1.Facts_Disk{{Model: "disk\u202e"}},
		Nics: []*inventoryv1.Facts_Nic{{Name: "eth0", LldpNeighbors: []*inventoryv1.Facts_LldpNeighbor{
			{PortId: "Eth1\x1b[2J", VlanNames: []string{"7 v\u009b"}}}}},
	}
	Cap(f)
	l := f.Nics[0].LldpNeighbors[0]
	for _, s := range []string{f.System.Vendor, f.System.Serial, f.Disks[0].Model, l.PortId, l.VlanNames[0]} {
		if strings.ContainsAny(s, "\x1b\x07\u009b\u202e") {
			t.Errorf("Cap left %q", s)
		}
	}
	if f.System.Vendor != `QEMU\x1b]0;t\x07` {
		t.Errorf("vendor %q", f.System.Vendor)
	}
}

// TestLiveRoot: the architecture is reported for the running machine,
// whether its root is given as "" or as "/" (the discovery agent's), and
// not for a captured fixture root.
func TestLiveRoot(t *testing.T) {
	for root, want := range map[string]bool{"": true, "/": true, "//": true, "testdata/x": false, "/tmp/root": false} {
		if got := (Options{Root: root}).live(); got != want {
			t.Errorf("Options{Root: %q}.live() = %v, want %v", root, got, want)
		}
	}
}
