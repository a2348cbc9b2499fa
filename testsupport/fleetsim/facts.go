package fleetsim

import (
	"fmt"
	"net"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// machineID is what makes a simulated machine unique.
type machineID struct {
	index  int
	serial string
	uuid   [16]byte
	macs   [4]net.HardwareAddr // boot NIC first
	large  bool
}

func newMachineID(run uint16, i int, large bool) machineID {
	id := machineID{index: i, serial: fmt.Sprintf("SIM%04X-%06d", run, i), large: large}
	for n := range id.macs {
		// Locally administered, unicast; run and index make it unique.
		id.macs[n] = net.HardwareAddr{0x02, byte(run), byte(run >> 8), byte(i >> 16), byte(i >> 8), byte(i)}
		id.macs[n][0] |= byte(n) << 4
	}
	id.uuid = [16]byte{0x5c, 0x1a, byte(run >> 8), byte(run), 0, 0, 0x40, 0, 0x80, 0, 0, byte(i >> 24), byte(i >> 16), byte(i >> 8), byte(i), 1}
	return id
}

func (id machineID) uuidString() string {
	u := id.uuid
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// facts is what the machine's agent reports: a large machine has 2
// sockets, 24 DIMMs, 12 disks with serial and WWN, 4 NICs; the others 1
// socket, 8 DIMMs, 2 disks and 2 NICs. Every serial is unique.
func (id machineID) facts() *inventoryv1.Facts {
	sockets, dimms, disks, nics := uint32(1), 8, 2, 2
	if id.large {
		sockets, dimms, disks, nics = 2, 24, 12, 4
	}
	const dimmBytes = 32 << 30
	f := &inventoryv1.Facts{
		System:    &inventoryv1.Facts_System{Vendor: "Corral Sim", Product: "R760-sim", Serial: id.serial, Uuid: id.uuidString(), Sku: "SKU-SIM", Family: "sim"},
		Baseboard: &inventoryv1.Facts_Board{Vendor: "Corral Sim", Product: "0X1Y2Z", Serial: "BB-" + id.serial},
		Chassis:   &inventoryv1.Facts_Board{Vendor: "Corral Sim", Serial: "CH-" + id.serial, AssetTag: fmt.Sprintf("ASSET-%06d", id.index)},
		Bios:      &inventoryv1.Facts_Bios{Vendor: "Corral Sim", Version: "2.19.1", Date: "03/14/2025"},
		Cpu:       &inventoryv1.Facts_Cpu{Model: "Intel(R) Xeon(R) Gold 6430", Sockets: sockets, Cores: 32 * sockets, Threads: 64 * sockets},
		Memory:    &inventoryv1.Facts_Memory{TotalBytes: uint64(dimms) * dimmBytes},
		Kernel:    "6.1.0-sim",
		Bmc:       &inventoryv1.Facts_BmcLan{Channel: 1, Ipv4Address: fmt.Sprintf("10.99.%d.%d", id.index/250, id.index%250+1), Mac: id.macs[0].String()},
	}
	for d := range dimms {
		f.Memory.Dimms = append(f.Memory.Dimms, &inventoryv1.Facts_Dimm{
			Locator: fmt.Sprintf("DIMM_%c%d", 'A'+d/12, d%12+1), SizeBytes: dimmBytes, Vendor: "Samsung",
			Serial: fmt.Sprintf("%s-D%02d", id.serial, d), PartNumber: "M321R4GA3BB6-CQKET",
		})
	}
	for d := range disks {
		f.Disks = append(f.Disks, &inventoryv1.Facts_Disk{
			Name: fmt.Sprintf("nvme%dn1", d), SizeBytes: 3840 << 30, Model: "SAMSUNG MZQL23T8HCLS",
			Serial: fmt.Sprintf("S6%s%02d", id.serial, d), Wwn: fmt.Sprintf("eui.%016x%02x", id.index, d), Bus: "nvme",
		})
	}
	for n := range nics {
		f.Nics = append(f.Nics, &inventoryv1.Facts_Nic{
			Name: fmt.Sprintf("eno%d", n+1), Mac: id.macs[n].String(), Driver: "ice", Link: n == 0, SpeedMbps: 25000,
			PciAddress: fmt.Sprintf("0000:%02x:00.%d", 0x31+n/2, n%2),
		})
		f.PciDevices = append(f.PciDevices, &inventoryv1.Facts_PciDevice{
			Address: fmt.Sprintf("0000:%02x:00.%d", 0x31+n/2, n%2), VendorId: "8086", ProductId: "159b",
			Vendor: "Intel Corporation", Product: "Ethernet Controller E810-XXV", Class: "0200", Driver: "ice",
		})
	}
	return f
}
