// Package machinefacts builds discovery reports for tests: what a small
// QEMU machine's agent would send to Register. Test support only; it
// imports the generated API and nothing else of Corral's.
package machinefacts

import inventoryv1 "github.com/corralhq/corral/api/inventory/v1"

// QEMU is the report of a QEMU machine with the given system serial and
// UUID: 1 socket, 2 cores, 2 GiB in one DIMM, disks vda (10 GiB) and vdb
// (20 GiB) with serials, and one e1000 NIC with link per MAC in nics.
func QEMU(serial, uuid string, nics ...string) *inventoryv1.Facts {
	f := &inventoryv1.Facts{
		System: &inventoryv1.Facts_System{Vendor: "QEMU", Product: "Standard PC", Serial: serial, Uuid: uuid},
		Cpu:    &inventoryv1.Facts_Cpu{Model: "QEMU Virtual CPU", Sockets: 1, Cores: 2, Threads: 2},
		Memory: &inventoryv1.Facts_Memory{TotalBytes: 2 << 30, Dimms: []*inventoryv1.Facts_Dimm{{Locator: "DIMM 0", SizeBytes: 2 << 30, Serial: "D0"}}},
		Disks: []*inventoryv1.Facts_Disk{
			{Name: "vda", SizeBytes: 10 << 30, Serial: "DISK-A"},
			{Name: "vdb", SizeBytes: 20 << 30, Serial: "DISK-B"},
		},
	}
	for _, n := range nics {
		f.Nics = append(f.Nics, &inventoryv1.Facts_Nic{Name: "eth", Mac: n, Driver: "e1000", Link: true})
	}
	return f
}
