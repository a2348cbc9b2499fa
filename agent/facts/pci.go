package facts

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// collectPCI lists sys/bus/pci/devices and the devices no driver claimed.
func collectPCI(opts Options, f *inventoryv1.Facts) error {
	var err error
	f.PciDevices, f.MissingDrivers, err = PCIDevices(opts)
	return err
}

// PCIDevices lists the PCI devices under opts.Root, sorted by address,
// named from pci.ids when one is found (see Options.PCIIDs). Class is the
// pci.ids subclass name when known, else the 4-hex-digit class code.
// missing holds the devices no driver claimed, leaving out host, ISA and
// "other" bridges, which normally have none.
// It returns an error wrapping errNoPCI when the bus directory is absent.
func PCIDevices(opts Options) (all, missing []*inventoryv1.Facts_PciDevice, err error) {
	base := opts.path("sys/bus/pci/devices")
	entries, err := os.ReadDir(base)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil, fmt.Errorf("%w: %v", errNoPCI, err)
		}
		return nil, nil, err
	}
	type dev struct {
		d     *inventoryv1.Facts_PciDevice
		class string // "020000"
	}
	var devs []dev
	vendors, products, subclasses := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, e := range entries {
		if len(devs) >= MaxPCIDevices {
			break
		}
		dir := filepath.Join(base, e.Name())
		d := &inventoryv1.Facts_PciDevice{
			Address:   e.Name(),
			VendorId:  hexID(readAttr(filepath.Join(dir, "vendor"))),
			ProductId: hexID(readAttr(filepath.Join(dir, "device"))),
			Driver:    linkBase(filepath.Join(dir, "driver")),
		}
		class := hexID(readAttr(filepath.Join(dir, "class")))
		d.Class = class
		if len(class) >= 4 {
			d.Class = class[:4]
			subclasses[class[:4]] = true
		}
		vendors[d.VendorId] = true
		products[d.VendorId+d.ProductId] = true
		devs = append(devs, dev{d, class})
	}
	names := loadPCINames(opts, vendors, products, subclasses)
	for _, v := range devs {
		d := v.d
		code := d.Class
		if names != nil {
			if s, ok := names.vendors[d.VendorId]; ok {
				d.Vendor = s
			}
			if s, ok := names.products[d.VendorId+d.ProductId]; ok {
				d.Product = s
			}
			if s, ok := names.subclasses[code]; ok && len(v.class) >= 4 {
				d.Class = s
			}
		}
		all = append(all, d)
		if d.Driver == "" && !driverlessOK[code] {
			missing = append(missing, d)
		}
	}
	return all, missing, nil
}

// driverlessOK are class codes of devices that normally have no driver:
// host, ISA and "other" bridges.
var driverlessOK = map[string]bool{"0600": true, "0601": true, "0680": true}

// hexID turns sysfs "0x8086" into "8086".
func hexID(s string) string {
	return strings.ToLower(strings.TrimPrefix(s, "0x"))
}

// loadPCINames reads the wanted names from pci.ids (Options.PCIIDs, else
// the first of usr/share/misc/pci.ids and usr/share/hwdata/pci.ids under
// Root), or returns nil when there is none.
func loadPCINames(opts Options, vendors, products, subclasses map[string]bool) *pciNames {
	candidates := []string{opts.PCIIDs}
	if opts.PCIIDs == "" {
		candidates = []string{opts.path("usr/share/misc/pci.ids"), opts.path("usr/share/hwdata/pci.ids")}
	}
	for _, p := range candidates {
		if n := readPCINames(p, vendors, products, subclasses); n != nil {
			return n
		}
	}
	return nil
}
