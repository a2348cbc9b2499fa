package facts

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/jaypipes/pcidb"

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
	db := loadPCIDB(opts)
	for _, e := range entries {
		if len(all) >= MaxPCIDevices {
			break
		}
		dir := filepath.Join(base, e.Name())
		d := &inventoryv1.Facts_PciDevice{
			Address:   e.Name(),
			VendorId:  hexID(readAttr(filepath.Join(dir, "vendor"))),
			ProductId: hexID(readAttr(filepath.Join(dir, "device"))),
			Driver:    linkBase(filepath.Join(dir, "driver")),
		}
		class := hexID(readAttr(filepath.Join(dir, "class"))) // "020000"
		code := class
		if len(class) >= 4 {
			code = class[:4]
		}
		d.Class = code
		if db != nil {
			if v := db.Vendors[d.VendorId]; v != nil {
				d.Vendor = v.Name
			}
			if p := db.Products[d.VendorId+d.ProductId]; p != nil {
				d.Product = p.Name
			}
			if len(class) >= 4 {
				if c := db.Classes[class[:2]]; c != nil {
					for _, sc := range c.Subclasses {
						if sc.ID == class[2:4] {
							d.Class = sc.Name
						}
					}
				}
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

// loadPCIDB opens pci.ids, or returns nil when there is none.
func loadPCIDB(opts Options) *pcidb.PCIDB {
	candidates := []string{opts.PCIIDs}
	if opts.PCIIDs == "" {
		candidates = []string{opts.path("usr/share/misc/pci.ids"), opts.path("usr/share/hwdata/pci.ids")}
	}
	for _, p := range candidates {
		if _, err := os.Stat(p); err != nil {
			continue
		}
		if db, err := pcidb.New(pcidb.WithPath(p)); err == nil {
			return db
		}
	}
	return nil
}
