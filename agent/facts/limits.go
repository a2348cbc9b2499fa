package facts

import (
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/termsafe"
)

// Limits on one report, so that an odd machine cannot produce an oversized
// Register. The appliance enforces its own limits as well.
const (
	MaxPCIDevices = 4096
	MaxDisks      = 1024
	MaxNICs       = 512
	MaxDIMMs      = 1024
	MaxString     = 256 // bytes, after trimming to a UTF-8 boundary
	// MaxLLDPNeighbors and MaxVLANNames bound a NIC's LLDP neighbours
	// and the VLAN names of each (agent/lldp keeps to them too).
	MaxLLDPNeighbors = 4
	MaxVLANNames     = 16
)

// Cap trims f in place to the limits above (lists truncated, LLDP
// neighbours included, strings cut
// to MaxString bytes on a rune boundary, invalid UTF-8 replaced, control
// characters escaped) and
// returns it. It accepts nil.
func Cap(f *inventoryv1.Facts) *inventoryv1.Facts {
	if f == nil {
		return nil
	}
	if len(f.PciDevices) > MaxPCIDevices {
		f.PciDevices = f.PciDevices[:MaxPCIDevices]
	}
	if len(f.MissingDrivers) > MaxPCIDevices {
		f.MissingDrivers = f.MissingDrivers[:MaxPCIDevices]
	}
	if len(f.Disks) > MaxDisks {
		f.Disks = f.Disks[:MaxDisks]
	}
	if len(f.Nics) > MaxNICs {
		f.Nics = f.Nics[:MaxNICs]
	}
	for _, n := range f.Nics {
		if len(n.LldpNeighbors) > MaxLLDPNeighbors {
			n.LldpNeighbors = n.LldpNeighbors[:MaxLLDPNeighbors]
		}
		for _, l := range n.LldpNeighbors {
			if len(l.VlanNames) > MaxVLANNames {
				l.VlanNames = l.VlanNames[:MaxVLANNames]
			}
		}
	}
	if f.Memory != nil && len(f.Memory.Dimms) > MaxDIMMs {
		f.Memory.Dimms = f.Memory.Dimms[:MaxDIMMs]
	}
	trimStrings(f)
	f.Lockdown = lockdownMode("[" + f.Lockdown + "]")
	if _, ok := inventoryv1.Facts_SecureBoot_name[int32(f.SecureBoot)]; !ok {
		f.SecureBoot = inventoryv1.Facts_SECURE_BOOT_UNSPECIFIED
	}
	return f
}

// trimStrings caps every string field of f.
func trimStrings(f *inventoryv1.Facts) {
	t := func(p *string) { *p = trimString(*p) }
	if s := f.System; s != nil {
		for _, p := range []*string{&s.Vendor, &s.Product, &s.Version, &s.Serial, &s.Uuid, &s.Sku, &s.Family} {
			t(p)
		}
	}
	for _, b := range []*inventoryv1.Facts_Board{f.Baseboard, f.Chassis} {
		if b != nil {
			for _, p := range []*string{&b.Vendor, &b.Product, &b.Version, &b.Serial, &b.AssetTag} {
				t(p)
			}
		}
	}
	if b := f.Bios; b != nil {
		t(&b.Vendor)
		t(&b.Version)
		t(&b.Date)
	}
	if c := f.Cpu; c != nil {
		t(&c.Model)
	}
	if m := f.Memory; m != nil {
		for _, d := range m.Dimms {
			for _, p := range []*string{&d.Locator, &d.Vendor, &d.Serial, &d.PartNumber} {
				t(p)
			}
		}
	}
	for _, d := range f.Disks {
		for _, p := range []*string{&d.Name, &d.Model, &d.Serial, &d.Wwn, &d.Bus} {
			t(p)
		}
	}
	for _, n := range f.Nics {
		for _, p := range []*string{&n.Name, &n.Mac, &n.Driver, &n.PciAddress} {
			t(p)
		}
		for _, l := range n.LldpNeighbors {
			for _, p := range []*string{&l.ChassisId, &l.PortId, &l.PortDescription, &l.SystemName, &l.ManagementAddress} {
				t(p)
			}
			for i := range l.VlanNames {
				t(&l.VlanNames[i])
			}
		}
	}
	for _, list := range [][]*inventoryv1.Facts_PciDevice{f.PciDevices, f.MissingDrivers} {
		for _, d := range list {
			for _, p := range []*string{&d.Address, &d.VendorId, &d.ProductId, &d.Vendor, &d.Product, &d.Class, &d.Driver} {
				t(p)
			}
		}
	}
	if b := f.Bmc; b != nil {
		t(&b.Ipv4Address)
		t(&b.Mac)
	}
	t(&f.Kernel)
	t(&f.Architecture)
}

// trimString makes s valid UTF-8 without control characters (escaped as
// internal/termsafe does: the appliance refuses a report holding one) and
// at most MaxString bytes.
func trimString(s string) string { return termsafe.Bounded(s, MaxString) }
