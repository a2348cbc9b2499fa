package facts

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralhq/corral/testsupport/fixture"
)

// TestGenerateHandmade rewrites the hand-made fixtures
// (testdata/oem-placeholders.txtar, testdata/nvme-sata.txtar) from the
// descriptions below, SMBIOS tables included:
//
//	CORRAL_GENERATE=1 go test ./agent/facts -run TestGenerateHandmade
func TestGenerateHandmade(t *testing.T) {
	if os.Getenv("CORRAL_GENERATE") == "" {
		t.Skip("set CORRAL_GENERATE=1 to rewrite the hand-made fixtures")
	}
	for name, m := range handmade {
		out := filepath.Join("testdata", name+".txtar")
		if err := os.WriteFile(out, m.archive(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

type dimm struct {
	locator, vendor, serial, part string
	sizeMB                        uint16
}

type smbiosDesc struct {
	biosVendor, biosVersion, biosDate                    string
	sysVendor, sysProduct, sysVersion, sysSerial         string
	sysSKU, sysFamily                                    string
	uuid                                                 [16]byte
	boardVendor, boardProduct, boardVersion, boardSerial string
	boardAsset                                           string
	chassisVendor, chassisVersion, chassisSerial         string
	chassisAsset                                         string
	dimms                                                []dimm
}

type machine struct {
	comment string
	smbios  smbiosDesc
	files   map[string]string // extra text files
	links   map[string]string
	bin     map[string][]byte
	dirs    []string
}

// table encodes one SMBIOS structure: formatted area then strings.
func table(typ byte, handle uint16, formatted []byte, strs ...string) []byte {
	b := []byte{typ, byte(4 + len(formatted)), byte(handle), byte(handle >> 8)}
	b = append(b, formatted...)
	if len(strs) == 0 {
		return append(b, 0, 0)
	}
	for _, s := range strs {
		b = append(append(b, s...), 0)
	}
	return append(b, 0)
}

// strIdx numbers the non-empty strings of a structure (0 = none).
type strIdx struct{ strs []string }

func (s *strIdx) add(v string) byte {
	if v == "" {
		return 0
	}
	s.strs = append(s.strs, v)
	return byte(len(s.strs))
}

func (d smbiosDesc) tables() (entry, data []byte) {
	var s strIdx
	// Type 0, BIOS (SMBIOS 2.4 layout, 0x18 bytes).
	f0 := make([]byte, 0x14)
	f0[0] = s.add(d.biosVendor)
	f0[1] = s.add(d.biosVersion)
	f0[4] = s.add(d.biosDate)
	data = append(data, table(0, 0, f0, s.strs...)...)
	// Type 1, system (0x1B bytes).
	s = strIdx{}
	f1 := make([]byte, 0x17)
	f1[0], f1[1], f1[2], f1[3] = s.add(d.sysVendor), s.add(d.sysProduct), s.add(d.sysVersion), s.add(d.sysSerial)
	copy(f1[4:20], d.uuid[:])
	f1[20] = 6 // wake-up: power switch
	f1[21], f1[22] = s.add(d.sysSKU), s.add(d.sysFamily)
	data = append(data, table(1, 1, f1, s.strs...)...)
	// Type 2, baseboard (0x0F bytes).
	s = strIdx{}
	f2 := make([]byte, 0x0B)
	f2[0], f2[1], f2[2], f2[3], f2[4] = s.add(d.boardVendor), s.add(d.boardProduct), s.add(d.boardVersion), s.add(d.boardSerial), s.add(d.boardAsset)
	f2[5] = 1
	binary.LittleEndian.PutUint16(f2[7:], 3)
	f2[9] = 0x0a // motherboard
	data = append(data, table(2, 2, f2, s.strs...)...)
	// Type 3, chassis (0x15 bytes, no contained elements).
	s = strIdx{}
	f3 := make([]byte, 0x11)
	f3[0] = s.add(d.chassisVendor)
	f3[1] = 0x17 // rack mount chassis
	f3[2], f3[3], f3[4] = s.add(d.chassisVersion), s.add(d.chassisSerial), s.add(d.chassisAsset)
	f3[5], f3[6], f3[7], f3[8] = 3, 3, 3, 3
	data = append(data, table(3, 3, f3, s.strs...)...)
	// Type 17, memory devices (SMBIOS 2.8 layout, 0x28 bytes).
	for i, m := range d.dimms {
		s = strIdx{}
		f := make([]byte, 0x24)
		binary.LittleEndian.PutUint16(f[0:], 0x1000) // physical memory array
		binary.LittleEndian.PutUint16(f[2:], 0xfffe)
		binary.LittleEndian.PutUint16(f[4:], 72)
		binary.LittleEndian.PutUint16(f[6:], 64)
		binary.LittleEndian.PutUint16(f[8:], m.sizeMB)
		f[10] = 0x09 // DIMM
		f[12] = s.add(m.locator)
		f[13] = s.add("BANK " + fmt.Sprint(i))
		f[14] = 0x1a // DDR4
		if m.sizeMB != 0 {
			binary.LittleEndian.PutUint16(f[17:], 3200)
		}
		f[19], f[20], f[21], f[22] = s.add(m.vendor), s.add(m.serial), s.add(""), s.add(m.part)
		data = append(data, table(17, uint16(0x1100+i), f, s.strs...)...)
	}
	data = append(data, table(127, 0xfeff, nil)...)
	// SMBIOS 3.0 64-bit entry point.
	entry = make([]byte, 0x18)
	copy(entry, "_SM3_")
	entry[6], entry[7], entry[8], entry[9], entry[10] = 0x18, 3, 2, 0, 1
	binary.LittleEndian.PutUint32(entry[12:], uint32(len(data)))
	binary.LittleEndian.PutUint64(entry[16:], 0x000e0000)
	var sum byte
	for _, c := range entry {
		sum += c
	}
	entry[5] = -sum
	return entry, data
}

// uuidString renders the SMBIOS byte order the way Linux does in
// product_uuid (first three fields little-endian).
func uuidString(u [16]byte) string {
	return fmt.Sprintf("%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		u[3], u[2], u[1], u[0], u[5], u[4], u[7], u[6], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15])
}

func (m machine) archive() []byte {
	var w fixture.Writer
	w.Comment(m.comment)
	d := m.smbios
	dmi := map[string]string{
		"bios_vendor": d.biosVendor, "bios_version": d.biosVersion, "bios_date": d.biosDate,
		"sys_vendor": d.sysVendor, "product_name": d.sysProduct, "product_version": d.sysVersion,
		"product_serial": d.sysSerial, "product_uuid": uuidString(d.uuid), "product_sku": d.sysSKU, "product_family": d.sysFamily,
		"board_vendor": d.boardVendor, "board_name": d.boardProduct, "board_version": d.boardVersion,
		"board_serial": d.boardSerial, "board_asset_tag": d.boardAsset,
		"chassis_vendor": d.chassisVendor, "chassis_version": d.chassisVersion, "chassis_serial": d.chassisSerial,
		"chassis_asset_tag": d.chassisAsset, "chassis_type": "23",
	}
	for _, k := range sortedKeys(dmi) {
		w.File("sys/devices/virtual/dmi/id/"+k, []byte(dmi[k]+"\n"))
	}
	w.Symlink("sys/class/dmi/id", "../../devices/virtual/dmi/id")
	entry, data := d.tables()
	w.File("sys/firmware/dmi/tables/smbios_entry_point", entry)
	w.File("sys/firmware/dmi/tables/DMI", data)
	for _, k := range sortedKeys(m.files) {
		w.File(k, []byte(m.files[k]))
	}
	for _, k := range sortedKeys(m.bin) {
		w.File(k, m.bin[k])
	}
	for _, k := range sortedKeys(m.links) {
		w.Symlink(k, m.links[k])
	}
	for _, dir := range m.dirs {
		w.Dir(dir)
	}
	return w.Bytes()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	for i := range keys {
		for j := i + 1; j < len(keys); j++ {
			if keys[j] < keys[i] {
				keys[i], keys[j] = keys[j], keys[i]
			}
		}
	}
	return keys
}

// cpuinfo renders n logical CPUs of one socket with the given cores.
func cpuinfo(model string, threads, cores int) (string, map[string]string) {
	var b strings.Builder
	topo := map[string]string{}
	for i := 0; i < threads; i++ {
		fmt.Fprintf(&b, "processor\t: %d\nvendor_id\t: GenuineIntel\nmodel name\t: %s\nphysical id\t: 0\ncore id\t\t: %d\ncpu cores\t: %d\nsiblings\t: %d\nflags\t\t: fpu vme sse sse2 lm\n\n", i, model, i%cores, cores, threads)
		p := fmt.Sprintf("sys/devices/system/cpu/cpu%d/", i)
		topo[p+"online"] = "1\n"
		topo[p+"topology/core_id"] = fmt.Sprintf("%d\n", i%cores)
		topo[p+"topology/physical_package_id"] = "0\n"
	}
	topo["proc/cpuinfo"] = b.String()
	return b.String(), topo
}

func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// vpd80 encodes a unit serial number VPD page.
func vpd80(serial string) []byte {
	return append([]byte{0, 0x80, 0, byte(len(serial))}, serial...)
}

const pciIDs = `# trimmed pci.ids for tests
8086  Intel Corporation
	1533  I210 Gigabit Network Connection
	2922  82801IR/IO/IH (ICH9R/DO/DH) 6 port SATA Controller [AHCI mode]
	29c0  82G33/G31/P35/P31 Express DRAM Controller
144d  Samsung Electronics Co Ltd
	a808  NVMe SSD Controller SM981/PM981/PM983
15b3  Mellanox Technologies
	1017  MT27800 Family [ConnectX-5]

C 01  Mass storage controller
	06  SATA controller
	08  Non-Volatile memory controller
C 02  Network controller
	00  Ethernet controller
C 06  Bridge
	00  Host bridge
`

func pciDev(addr, vendor, device, class, driver string) (map[string]string, map[string]string) {
	dir := "sys/devices/pci0000:00/" + addr + "/"
	files := map[string]string{dir + "vendor": "0x" + vendor + "\n", dir + "device": "0x" + device + "\n", dir + "class": "0x" + class + "\n"}
	links := map[string]string{"sys/bus/pci/devices/" + addr: "../../../devices/pci0000:00/" + addr}
	if driver != "" {
		links[dir+"driver"] = "../../../bus/pci/drivers/" + driver
	}
	return files, links
}

func mergeLinks(pairs ...[2]map[string]string) (map[string]string, map[string]string) {
	f, l := map[string]string{}, map[string]string{}
	for _, p := range pairs {
		f, l = merge(f, p[0]), merge(l, p[1])
	}
	return f, l
}

func pair(a, b map[string]string) [2]map[string]string { return [2]map[string]string{a, b} }

var handmade = map[string]machine{
	"oem-placeholders": func() machine {
		_, cpu := cpuinfo("Intel(R) Core(TM) i5-8400 CPU @ 2.80GHz", 6, 6)
		pf, pl := mergeLinks(
			pair(pciDev("0000:00:00.0", "8086", "29c0", "060000", "")),
			pair(pciDev("0000:00:19.0", "8086", "1533", "020000", "")), // NIC without a driver
		)
		return machine{
			comment: "Hand-made: a white-box board whose firmware ships vendor placeholder serials\n" +
				"(\"To Be Filled By O.E.M.\", \"Default string\", \"0123456789\"), an all-zero-ish UUID\n" +
				"and an Intel NIC nobody has a driver for yet (missing_drivers).",
			smbios: smbiosDesc{
				biosVendor: "American Megatrends Inc.", biosVersion: "P1.20", biosDate: "04/11/2019",
				sysVendor: "To Be Filled By O.E.M.", sysProduct: "To Be Filled By O.E.M.", sysVersion: "To Be Filled By O.E.M.",
				sysSerial: "To Be Filled By O.E.M.", sysSKU: "Default string", sysFamily: "Default string",
				uuid:        [16]byte{0x03, 0x00, 0x02, 0x00, 0x04, 0x00, 0x05, 0x00, 0x00, 0x06, 0x00, 0x07, 0x00, 0x08, 0x00, 0x09},
				boardVendor: "ASRock", boardProduct: "B365M Pro4", boardSerial: "Default string", boardAsset: "Default string",
				chassisVendor: "Default string", chassisVersion: "Default string", chassisSerial: "0123456789", chassisAsset: "Default string",
				dimms: []dimm{
					{locator: "DIMM 0", vendor: "Kingston", serial: "Unknown", part: "KHX2666C16/8G", sizeMB: 8192},
					{locator: "DIMM 1", sizeMB: 0}, // empty slot
				},
			},
			files: merge(cpu, pf, map[string]string{
				"proc/meminfo":              "MemTotal:        8048968 kB\nMemFree:         7000000 kB\n",
				"proc/sys/kernel/osrelease": "6.1.0-26-amd64\n",
				"usr/share/misc/pci.ids":    pciIDs,
				// NIC with a link at 1 Gb/s
				"sys/devices/pci0000:00/0000:00:1f.6/net/eno1/address":   "70:85:c2:aa:bb:cc\n",
				"sys/devices/pci0000:00/0000:00:1f.6/net/eno1/carrier":   "1\n",
				"sys/devices/pci0000:00/0000:00:1f.6/net/eno1/speed":     "1000\n",
				"sys/devices/pci0000:00/0000:00:1f.6/net/eno1/operstate": "up\n",
				"sys/devices/pci0000:00/0000:00:1f.6/vendor":             "0x8086\n",
				"sys/devices/pci0000:00/0000:00:1f.6/device":             "0x15bb\n",
				"sys/devices/pci0000:00/0000:00:1f.6/class":              "0x020000\n",
				"sys/devices/virtual/net/lo/address":                     "00:00:00:00:00:00\n",
			}),
			links: merge(pl, map[string]string{
				"sys/class/net/eno1": "../../devices/pci0000:00/0000:00:1f.6/net/eno1",
				"sys/class/net/lo":   "../../devices/virtual/net/lo",
				"sys/devices/pci0000:00/0000:00:1f.6/net/eno1/device": "../../../0000:00:1f.6",
				"sys/devices/pci0000:00/0000:00:1f.6/driver":          "../../../bus/pci/drivers/e1000e",
				"sys/devices/pci0000:00/0000:00:1f.6/subsystem":       "../../../bus/pci",
				"sys/bus/pci/devices/0000:00:1f.6":                    "../../../devices/pci0000:00/0000:00:1f.6",
			}),
			dirs: []string{"sys/bus/pci/drivers/e1000e"},
		}
	}(),
	"nvme-sata": func() machine {
		_, cpu := cpuinfo("Intel(R) Xeon(R) Silver 4214 CPU @ 2.20GHz", 8, 4)
		pf, pl := mergeLinks(
			pair(pciDev("0000:00:00.0", "8086", "29c0", "060000", "")),
			pair(pciDev("0000:00:1f.2", "8086", "2922", "010601", "ahci")),
			pair(pciDev("0000:3b:00.0", "144d", "a808", "010802", "nvme")),
			pair(pciDev("0000:5e:00.0", "15b3", "1017", "020000", "mlx5_core")),
		)
		nvme := "sys/devices/pci0000:00/0000:3b:00.0/nvme/nvme0/"
		sda := "sys/devices/pci0000:00/0000:00:1f.2/ata1/host0/target0:0:0/0:0:0:0/"
		usb := "sys/devices/pci0000:00/0000:00:14.0/usb1/1-1/1-1:1.0/host6/target6:0:0/6:0:0:0/"
		nic := "sys/devices/pci0000:00/0000:5e:00.0/"
		return machine{
			comment: "Hand-made: a 1U server with an NVMe SSD (serial on the controller, EUI-64\n" +
				"on the namespace), a SATA HDD behind AHCI (serial in VPD page 0x80, NAA WWN),\n" +
				"a USB stick (removable), two DIMMs and a ConnectX-5 NIC without link.",
			smbios: smbiosDesc{
				biosVendor: "Dell Inc.", biosVersion: "2.12.2", biosDate: "07/09/2021",
				sysVendor: "Dell Inc.", sysProduct: "PowerEdge R640", sysSerial: "7XK2QH3", sysSKU: "SKU=NotProvided;ModelName=PowerEdge R640", sysFamily: "PowerEdge",
				uuid:        [16]byte{0x44, 0x45, 0x4c, 0x4c, 0x58, 0x00, 0x10, 0x4b, 0x80, 0x32, 0xb7, 0xc0, 0x4f, 0x51, 0x48, 0x33},
				boardVendor: "Dell Inc.", boardProduct: "0H28RR", boardVersion: "A05", boardSerial: ".7XK2QH3.CNIVC0013B0123.",
				chassisVendor: "Dell Inc.", chassisSerial: "7XK2QH3", chassisAsset: "RACK-12-U07",
				dimms: []dimm{
					{locator: "A1", vendor: "00AD063200AD", serial: "83A1B2C3", part: "HMA82GR7CJR8N-XN", sizeMB: 16384},
					{locator: "B1", vendor: "00AD063200AD", serial: "83A1B2C4", part: "HMA82GR7CJR8N-XN", sizeMB: 16384},
				},
			},
			files: merge(cpu, pf, map[string]string{
				"proc/meminfo":              "MemTotal:       32658000 kB\n",
				"proc/sys/kernel/osrelease": "6.1.0-26-amd64\n",
				"usr/share/misc/pci.ids":    pciIDs,
				// NVMe namespace: size in 512-byte sectors, wwid on the namespace, serial/model on the controller.
				nvme + "nvme0n1/size":                "1875385008\n",
				nvme + "nvme0n1/removable":           "0\n",
				nvme + "nvme0n1/dev":                 "259:0\n",
				nvme + "nvme0n1/wwid":                "eui.0025388b91b2c3d4\n",
				nvme + "nvme0n1/queue/rotational":    "0\n",
				nvme + "nvme0n1/nvme0n1p1/partition": "1\n",
				nvme + "nvme0n1/nvme0n1p1/size":      "1048576\n",
				nvme + "nvme0n1/nvme0n1p1/dev":       "259:1\n",
				nvme + "nvme0n1/nvme0n1p2/partition": "2\n",
				nvme + "nvme0n1/nvme0n1p2/size":      "1874334720\n",
				nvme + "nvme0n1/nvme0n1p2/dev":       "259:2\n",
				nvme + "model":                       "SAMSUNG MZ1LB960HAJQ-00007             \n",
				nvme + "serial":                      "S435NE0MA01234      \n",
				// SATA disk: model on the SCSI device, serial in VPD 0x80, NAA in wwid.
				sda + "block/sda/size":             "7814037168\n",
				sda + "block/sda/removable":        "0\n",
				sda + "block/sda/dev":              "8:0\n",
				sda + "block/sda/queue/rotational": "1\n",
				sda + "model":                      "ST4000NM0035-1V4\n",
				sda + "vendor":                     "ATA     \n",
				sda + "wwid":                       "naa.5000C500A1B2C3D4\n",
				// USB stick: removable, serial from VPD.
				usb + "block/sdb/size":             "60437492\n",
				usb + "block/sdb/removable":        "1\n",
				usb + "block/sdb/dev":              "8:16\n",
				usb + "block/sdb/queue/rotational": "0\n",
				usb + "model":                      "DataTraveler 3.0\n",
				// NIC without carrier and with unknown speed.
				nic + "net/ens2f0np0/address": "b8:ce:f6:01:02:03\n",
				nic + "net/ens2f0np0/carrier": "0\n",
				nic + "net/ens2f0np0/speed":   "-1\n",
			}),
			bin: map[string][]byte{
				sda + "vpd_pg80": vpd80("ZC1ABC23"),
				usb + "vpd_pg80": vpd80("60A44C3FACC3E3B1B9"),
			},
			links: merge(pl, map[string]string{
				"sys/block/nvme0n1":          "../devices/pci0000:00/0000:3b:00.0/nvme/nvme0/nvme0n1",
				nvme + "nvme0n1/device":      "../../nvme0",
				"sys/block/sda":              "../devices/pci0000:00/0000:00:1f.2/ata1/host0/target0:0:0/0:0:0:0/block/sda",
				sda + "block/sda/device":     "../../../0:0:0:0",
				"sys/block/sdb":              "../devices/pci0000:00/0000:00:14.0/usb1/1-1/1-1:1.0/host6/target6:0:0/6:0:0:0/block/sdb",
				usb + "block/sdb/device":     "../../../6:0:0:0",
				"sys/block/loop0":            "../devices/virtual/block/loop0",
				"sys/class/net/ens2f0np0":    "../../devices/pci0000:00/0000:5e:00.0/net/ens2f0np0",
				nic + "net/ens2f0np0/device": "../../../0000:5e:00.0",
				nic + "subsystem":            "../../../bus/pci",
			}),
			dirs: []string{"sys/bus/pci/drivers/ahci", "sys/bus/pci/drivers/nvme", "sys/bus/pci/drivers/mlx5_core", "sys/devices/virtual/block/loop0"},
		}
	}(),
}
