package machinefacts

import (
	"fmt"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// Server is the report of a rack server, numbered i, as realistic as a
// fleet's inventory is: 2 sockets, 16 DIMMs, 4 NVMe disks and 4 NICs
// with their PCI functions, every serial and MAC unique to i (MACs
// 02:cc:xx:xx:xx:0n). It weighs about 3.5 KB encoded, what the fleet
// simulator's machines weigh.
func Server(i int) *inventoryv1.Facts {
	serial := fmt.Sprintf("SRV-%07d", i)
	f := &inventoryv1.Facts{
		System:    &inventoryv1.Facts_System{Vendor: "Dell Inc.", Product: "PowerEdge R760", Serial: serial, Uuid: fmt.Sprintf("4c4c4544-0000-4000-8000-%012x", i), Sku: "SKU=0AFE", Family: "PowerEdge"},
		Baseboard: &inventoryv1.Facts_Board{Vendor: "Dell Inc.", Product: "0X1Y2Z", Version: "A02", Serial: "BB-" + serial},
		Chassis:   &inventoryv1.Facts_Board{Vendor: "Dell Inc.", Serial: "CH-" + serial, AssetTag: fmt.Sprintf("ASSET-%07d", i)},
		Bios:      &inventoryv1.Facts_Bios{Vendor: "Dell Inc.", Version: "2.19.1", Date: "03/14/2025"},
		Cpu:       &inventoryv1.Facts_Cpu{Model: "Intel(R) Xeon(R) Gold 6430", Sockets: 2, Cores: 64, Threads: 128},
		Memory:    &inventoryv1.Facts_Memory{TotalBytes: 16 * 32 << 30},
		Kernel:    "6.1.0-28-amd64",
		Bmc:       &inventoryv1.Facts_BmcLan{Channel: 1, Ipv4Address: fmt.Sprintf("10.%d.%d.%d", 100+i>>16&0x3f, i>>8&0xff, i&0xff), Mac: ServerMAC(i, 7)},
	}
	for d := range 16 {
		f.Memory.Dimms = append(f.Memory.Dimms, &inventoryv1.Facts_Dimm{
			Locator: fmt.Sprintf("DIMM_%c%d", 'A'+d/8, d%8+1), SizeBytes: 32 << 30, Vendor: "Samsung",
			Serial: fmt.Sprintf("%s-D%02d", serial, d), PartNumber: "M321R4GA3BB6-CQKET",
		})
	}
	for d := range 4 {
		f.Disks = append(f.Disks, &inventoryv1.Facts_Disk{
			Name: fmt.Sprintf("nvme%dn1", d), SizeBytes: 3840 << 30, Model: "SAMSUNG MZQL23T8HCLS",
			Serial: fmt.Sprintf("S6%s%02d", serial, d), Wwn: fmt.Sprintf("eui.%016x%02x", i, d), Bus: "nvme",
		})
	}
	for n := range 4 {
		pci := fmt.Sprintf("0000:%02x:00.%d", 0x31+n/2, n%2)
		f.Nics = append(f.Nics, &inventoryv1.Facts_Nic{Name: fmt.Sprintf("eno%d", n+1), Mac: ServerMAC(i, n), Driver: "ice", Link: n == 0, SpeedMbps: 25000, PciAddress: pci})
		f.PciDevices = append(f.PciDevices, &inventoryv1.Facts_PciDevice{
			Address: pci, VendorId: "8086", ProductId: "159b", Vendor: "Intel Corporation",
			Product: "Ethernet Controller E810-XXV", Class: "0200", Driver: "ice",
		})
	}
	return f
}

// ServerMAC is NIC n's MAC of Server(i) (n 7: its BMC's).
func ServerMAC(i, n int) string {
	return fmt.Sprintf("02:cc:%02x:%02x:%02x:%02x", i>>16&0xff, i>>8&0xff, i&0xff, n)
}
