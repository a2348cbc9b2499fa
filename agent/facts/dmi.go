package facts

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/jaypipes/ghw"
	"github.com/u-root/u-root/pkg/smbios"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// collectDMI fills system, baseboard, chassis and BIOS from
// /sys/class/dmi/id (through ghw) and fills gaps from the raw SMBIOS
// tables under /sys/firmware/dmi/tables (u-root's parser), which a
// non-root reader or an old kernel may expose when dmi/id is unreadable.
// Values are reported as the firmware gives them, placeholders included:
// deciding what counts as a serial is the appliance's job.
func collectDMI(opts Options, f *inventoryv1.Facts) error {
	var errs []error
	sys := &inventoryv1.Facts_System{}
	if p, err := ghw.Product(opts.ghwOpts()...); err == nil {
		sys.Vendor, sys.Product, sys.Version = clean(p.Vendor), clean(p.Name), clean(p.Version)
		sys.Serial, sys.Uuid, sys.Sku, sys.Family = clean(p.SerialNumber), strings.ToLower(clean(p.UUID)), clean(p.SKU), clean(p.Family)
	} else {
		errs = append(errs, err)
	}
	board := &inventoryv1.Facts_Board{}
	if b, err := ghw.Baseboard(opts.ghwOpts()...); err == nil {
		board.Vendor, board.Product, board.Version = clean(b.Vendor), clean(b.Product), clean(b.Version)
		board.Serial, board.AssetTag = clean(b.SerialNumber), clean(b.AssetTag)
	} else {
		errs = append(errs, err)
	}
	chassis := &inventoryv1.Facts_Board{}
	if c, err := ghw.Chassis(opts.ghwOpts()...); err == nil {
		chassis.Vendor, chassis.Version = clean(c.Vendor), clean(c.Version)
		chassis.Serial, chassis.AssetTag = clean(c.SerialNumber), clean(c.AssetTag)
	} else {
		errs = append(errs, err)
	}
	bios := &inventoryv1.Facts_Bios{}
	if b, err := ghw.BIOS(opts.ghwOpts()...); err == nil {
		bios.Vendor, bios.Version, bios.Date = clean(b.Vendor), clean(b.Version), clean(b.Date)
	} else {
		errs = append(errs, err)
	}

	if info, err := readSMBIOS(opts); err == nil {
		fillFromSMBIOS(info, sys, board, chassis, bios)
	} else if !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}

	f.System, f.Baseboard, f.Chassis, f.Bios = nilIfEmptySystem(sys), nilIfEmptyBoard(board), nilIfEmptyBoard(chassis), nilIfEmptyBios(bios)
	return errors.Join(errs...)
}

// readSMBIOS parses sys/firmware/dmi/tables under the root. The error
// wraps os.ErrNotExist when the tables are absent.
func readSMBIOS(opts Options) (*smbios.Info, error) {
	entry, err := os.ReadFile(opts.path("sys/firmware/dmi/tables/smbios_entry_point"))
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(opts.path("sys/firmware/dmi/tables/DMI"))
	if err != nil {
		return nil, err
	}
	info, err := smbios.ParseInfo(entry, data)
	if err != nil {
		return nil, fmt.Errorf("parse SMBIOS tables: %w", err)
	}
	return info, nil
}

func fillFromSMBIOS(info *smbios.Info, sys *inventoryv1.Facts_System, board, chassis *inventoryv1.Facts_Board, bios *inventoryv1.Facts_Bios) {
	if s, err := info.GetSystemInfo(); err == nil {
		fill(&sys.Vendor, s.Manufacturer)
		fill(&sys.Product, s.ProductName)
		fill(&sys.Version, s.Version)
		fill(&sys.Serial, s.SerialNumber)
		fill(&sys.Sku, s.SKUNumber)
		fill(&sys.Family, s.Family)
		if u := strings.ToLower(s.UUID.String()); strings.Count(u, "-") == 4 {
			fill(&sys.Uuid, u)
		}
	}
	if bs, err := info.GetBaseboardInfo(); err == nil && len(bs) > 0 {
		b := bs[0]
		fill(&board.Vendor, b.Manufacturer)
		fill(&board.Product, b.Product)
		fill(&board.Version, b.Version)
		fill(&board.Serial, b.SerialNumber)
		fill(&board.AssetTag, b.AssetTag)
	}
	if cs, err := info.GetChassisInfo(); err == nil && len(cs) > 0 {
		c := cs[0]
		fill(&chassis.Vendor, c.Manufacturer)
		fill(&chassis.Version, c.Version)
		fill(&chassis.Serial, c.SerialNumber)
		fill(&chassis.AssetTag, c.AssetTagNumber)
	}
	if b, err := info.GetBIOSInfo(); err == nil {
		fill(&bios.Vendor, b.Vendor)
		fill(&bios.Version, b.Version)
		fill(&bios.Date, b.ReleaseDate)
	}
}

// dimms lists the populated memory devices (SMBIOS type 17 with a size).
func dimms(info *smbios.Info) []*inventoryv1.Facts_Dimm {
	mds, err := info.GetMemoryDevices()
	if err != nil {
		return nil
	}
	var out []*inventoryv1.Facts_Dimm
	for _, md := range mds {
		size := md.GetSizeBytes()
		if size == 0 {
			continue
		}
		out = append(out, &inventoryv1.Facts_Dimm{
			Locator:    clean(md.DeviceLocator),
			SizeBytes:  size,
			Vendor:     clean(md.Manufacturer),
			Serial:     clean(md.SerialNumber),
			PartNumber: clean(md.PartNumber),
		})
	}
	return out
}

// fill sets *dst to v when *dst is empty. u-root renders an absent
// string (index 0) as "Not Specified", which the kernel shows as "".
func fill(dst *string, v string) {
	if *dst == "" && v != "Not Specified" {
		*dst = clean(v)
	}
}

func nilIfEmptySystem(s *inventoryv1.Facts_System) *inventoryv1.Facts_System {
	if (s.Vendor + s.Product + s.Version + s.Serial + s.Uuid + s.Sku + s.Family) == "" {
		return nil
	}
	return s
}

func nilIfEmptyBoard(b *inventoryv1.Facts_Board) *inventoryv1.Facts_Board {
	if (b.Vendor + b.Product + b.Version + b.Serial + b.AssetTag) == "" {
		return nil
	}
	return b
}

func nilIfEmptyBios(b *inventoryv1.Facts_Bios) *inventoryv1.Facts_Bios {
	if (b.Vendor + b.Version + b.Date) == "" {
		return nil
	}
	return b
}
