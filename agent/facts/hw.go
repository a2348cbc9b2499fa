package facts

import (
	"cmp"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/jaypipes/ghw"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

func collectCPU(opts Options, f *inventoryv1.Facts) error {
	c, err := ghw.CPU(opts.ghwOpts()...)
	if err != nil {
		return err
	}
	cpu := &inventoryv1.Facts_Cpu{
		Sockets: uint32(len(c.Processors)),
		Cores:   c.TotalCores,
		Threads: c.TotalHardwareThreads,
	}
	if len(c.Processors) > 0 {
		cpu.Model = clean(c.Processors[0].Model)
	}
	f.Cpu = cpu
	return nil
}

// collectMemory reports the DIMMs from SMBIOS when present and the total
// as their sum; without DIMMs, ghw's physical (else usable) total.
func collectMemory(opts Options, f *inventoryv1.Facts) error {
	mem := &inventoryv1.Facts_Memory{}
	if info, err := readSMBIOS(opts); err == nil {
		mem.Dimms = dimms(info)
		for _, d := range mem.Dimms {
			mem.TotalBytes += d.SizeBytes
		}
	}
	var err error
	if mem.TotalBytes == 0 {
		var m *ghw.MemoryInfo
		m, err = ghw.Memory(opts.ghwOpts()...)
		if err == nil {
			switch {
			case m.TotalPhysicalBytes > 0:
				mem.TotalBytes = uint64(m.TotalPhysicalBytes)
			case m.TotalUsableBytes > 0:
				mem.TotalBytes = uint64(m.TotalUsableBytes)
			}
		}
	}
	if mem.TotalBytes > 0 || len(mem.Dimms) > 0 {
		f.Memory = mem
	}
	return err
}

// collectDisks reports block devices backed by a device (sys/block/X/device
// exists), which leaves out loop, zram, ram, dm and md devices. ghw reads
// model, serial and WWN from the udev database, which the discovery image
// lacks, so each falls back to sysfs attributes.
func collectDisks(opts Options, f *inventoryv1.Facts) error {
	b, err := ghw.Block(opts.ghwOpts()...)
	if err != nil {
		return err
	}
	for _, d := range b.Disks {
		dir := opts.path("sys/block", d.Name)
		if _, err := os.Stat(filepath.Join(dir, "device")); err != nil {
			continue
		}
		f.Disks = append(f.Disks, &inventoryv1.Facts_Disk{
			Name:       d.Name,
			SizeBytes:  d.SizeBytes,
			Model:      cmp.Or(clean(d.Model), readAttr(filepath.Join(dir, "device/model"))),
			Serial:     cmp.Or(clean(d.SerialNumber), diskSerial(dir)),
			Wwn:        cmp.Or(clean(d.WWN), diskWWN(dir)),
			Removable:  d.IsRemovable,
			Rotational: readAttr(filepath.Join(dir, "queue/rotational")) == "1",
			Bus:        diskBus(dir, d.StorageController.String()),
			Partitions: uint32(len(d.Partitions)),
		})
	}
	return nil
}

// diskSerial: virtio-blk has sys/block/X/serial, NVMe controllers
// device/serial, SCSI/SATA the unit serial VPD page 0x80.
func diskSerial(dir string) string {
	if s := readAttr(filepath.Join(dir, "serial")); s != "" {
		return s
	}
	if s := readAttr(filepath.Join(dir, "device/serial")); s != "" {
		return s
	}
	return vpdSerial(filepath.Join(dir, "device/vpd_pg80"))
}

// vpdSerial decodes a unit serial number VPD page (SPC: byte 1 = 0x80,
// bytes 2-3 = length, then ASCII).
func vpdSerial(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) < 4 || b[1] != 0x80 {
		return ""
	}
	n := int(b[2])<<8 | int(b[3])
	if n > len(b)-4 {
		n = len(b) - 4
	}
	return clean(string(b[4 : 4+n]))
}

// diskWWN: NVMe namespaces expose sys/block/X/wwid ("eui.…", "nvme.…"),
// SCSI/SATA disks device/wwid ("naa.5000…", "t10.…"). NAA names are
// rendered as udev's ID_WWN does ("0x5000…"); others are kept as is.
func diskWWN(dir string) string {
	w := cmp.Or(readAttr(filepath.Join(dir, "wwid")), readAttr(filepath.Join(dir, "device/wwid")))
	if rest, ok := strings.CutPrefix(w, "naa."); ok {
		return "0x" + strings.ToLower(rest)
	}
	return w
}

// diskBus names the transport from the device path (ata, usb) or ghw's
// controller guess (nvme, scsi, virtio, ide, mmc).
func diskBus(dir, controller string) string {
	if target, err := filepath.EvalSymlinks(dir); err == nil {
		switch {
		case strings.Contains(target, "/usb"):
			return "usb"
		case strings.Contains(target, "/ata"):
			return "ata"
		}
	}
	return clean(strings.ToLower(controller))
}

// collectNICs reports physical NICs (ghw skips none; virtual ones are
// dropped here) with driver, carrier and speed from sysfs.
func collectNICs(opts Options, f *inventoryv1.Facts) error {
	n, err := ghw.Network(opts.ghwOpts()...)
	if err != nil {
		return err
	}
	for _, nic := range n.NICs {
		if nic.IsVirtual {
			continue
		}
		dir := opts.path("sys/class/net", nic.Name)
		out := &inventoryv1.Facts_Nic{
			Name:   nic.Name,
			Mac:    strings.ToLower(cmp.Or(clean(nic.MACAddress), readAttr(filepath.Join(dir, "address")))),
			Driver: linkBase(filepath.Join(dir, "device/driver")),
			Link:   readAttr(filepath.Join(dir, "carrier")) == "1",
		}
		if s, err := strconv.ParseInt(readAttr(filepath.Join(dir, "speed")), 10, 64); err == nil && s > 0 {
			out.SpeedMbps = uint64(s)
		}
		if nic.PCIAddress != nil {
			out.PciAddress = *nic.PCIAddress
		}
		f.Nics = append(f.Nics, out)
	}
	return nil
}

// linkBase returns the base name of a symlink's target, "" if path is no
// symlink.
func linkBase(path string) string {
	dest, err := os.Readlink(path)
	if err != nil {
		return ""
	}
	return filepath.Base(dest)
}

var errNoPCI = errors.New("no sys/bus/pci/devices")
