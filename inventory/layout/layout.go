// Package layout owns disk layouts as data: the YAML people write (Parse),
// the flat layout a deploy without one gets (Default), and the check of a
// layout against one machine's disks that resolves each disk to a device
// (Resolve). A refusal is an apierr.ErrInvalid (the layout is wrong
// whatever the machine) or apierr.ErrPrecondition (it does not fit this
// machine), its text naming the layout entry and the reason.
//
// The YAML form (docs/operator-guide.md, "Disk layouts"):
//
//	disks:
//	  - {name: d0, device: nvme0n1, table: gpt, partitions: [{name: esp0, size: 512M, type: esp}, {name: r0, type: raid}]}
//	  - {name: d1, device: nvme1n1, table: gpt, partitions: [{name: esp1, size: 512M, type: esp}, {name: r1, type: raid}]}
//	raids: [{name: md0, level: raid1, devices: [r0, r1], filesystem: ext4, mount: /}]
//	volume_groups: [{name: vg0, devices: [...], volumes: [{name: root, size: 20G, filesystem: ext4, mount: /}]}]
//	image: md0
//
// Sizes are binary ("512M" is 512 MiB; K, M, G, T, with or without "iB")
// or plain bytes; an omitted size takes the rest (last partition or volume
// only). It is a pure library: it imports the generated API and
// internal/apierr, nothing else of Corral's, and does no I/O.
package layout

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"regexp"
	"strconv"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"
)

// Limits on what Parse accepts.
const (
	MaxBytes         = 64 << 10
	MaxDisks         = 16
	MaxPartitions    = 32 // a disk
	MaxRaids         = 16
	MaxVolumeGroups  = 16
	MaxVolumes       = 32 // a volume group
	MaxRaidDevices   = 16
	MaxGroupDevices  = 16
	maxMsdosPrimary  = 4
	maxNameLen       = 32
	maxMountLen      = 256
	maxDeviceNameLen = 64
)

// TableOverhead is what Resolve keeps free on a partitioned disk besides
// the partitions: the first MiB (the table and the alignment of the first
// partition) and the last (GPT's backup table, and rounding).
const TableOverhead = 2 << 20

// SeedOverhead is what the first partitioned disk keeps besides: the
// agent puts the 8 MiB cloud-init seed partition at its end (in a table
// slot of its own: an msdos first disk takes 3 partitions at most).
const SeedOverhead = 8 << 20

// Partition types, tables, filesystems and RAID levels a layout may name.
var (
	partitionTypes = []string{"esp", "bios_boot", "linux", "raid", "lvm", "swap"}
	tables         = []string{"gpt", "msdos"}
	filesystems    = []string{"ext4", "xfs", "vfat", "swap"}
	levels         = []string{"raid1", "raid10"}
)

type yamlLayout struct {
	Disks        []yamlDisk  `json:"disks"`
	Raids        []yamlRaid  `json:"raids"`
	VolumeGroups []yamlGroup `json:"volume_groups"`
	Image        string      `json:"image"`
}

type yamlDisk struct {
	Name       string          `json:"name"`
	Device     string          `json:"device"`
	Table      string          `json:"table"`
	Partitions []yamlPartition `json:"partitions"`
}

type yamlPartition struct {
	Name       string `json:"name"`
	Size       size   `json:"size"`
	Type       string `json:"type"`
	Filesystem string `json:"filesystem"`
	Mount      string `json:"mount"`
}

type yamlRaid struct {
	Name       string   `json:"name"`
	Level      string   `json:"level"`
	Devices    []string `json:"devices"`
	Filesystem string   `json:"filesystem"`
	Mount      string   `json:"mount"`
}

type yamlGroup struct {
	Name    string       `json:"name"`
	Devices []string     `json:"devices"`
	Volumes []yamlVolume `json:"volumes"`
}

type yamlVolume struct {
	Name       string `json:"name"`
	Size       size   `json:"size"`
	Filesystem string `json:"filesystem"`
	Mount      string `json:"mount"`
}

// size is a byte count written as a number or a string with a binary unit.
type size uint64

var sizeRE = regexp.MustCompile(`^([0-9]+)\s*(?:([KMGT])(iB)?)?$`)

func (s *size) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*s = 0
		return nil
	}
	var text string
	if len(b) > 0 && b[0] == '"' {
		if err := json.Unmarshal(b, &text); err != nil {
			return err
		}
	} else {
		text = string(b)
	}
	n, err := ParseSize(text)
	if err != nil {
		return err
	}
	*s = size(n)
	return nil
}

// ParseSize reads "512M", "20G", "1T", "512MiB" or a plain byte count
// (binary units: M is 2^20). "" is 0, which in a layout means the rest.
func ParseSize(text string) (uint64, error) {
	text = strings.TrimSpace(text)
	if text == "" {
		return 0, nil
	}
	m := sizeRE.FindStringSubmatch(text)
	if m == nil {
		return 0, fmt.Errorf("size %q: want bytes or a number with K, M, G or T (binary units)", text)
	}
	n, err := strconv.ParseUint(m[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: %w", text, err)
	}
	shift := map[string]uint{"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m[2]]
	if n != 0 && bits.LeadingZeros64(n) < int(shift) {
		return 0, fmt.Errorf("size %q is too large", text)
	}
	return n << shift, nil
}

// Parse reads a layout written in YAML. Unknown keys, bad sizes and more
// than the limits are refused (apierr.ErrInvalid); so is anything Check
// refuses. Parse does not look at any machine: Resolve does.
func Parse(data []byte) (*inventoryv1.DiskLayout, error) {
	if len(data) > MaxBytes {
		return nil, apierr.Invalidf("layout: %d bytes of YAML, at most %d", len(data), MaxBytes)
	}
	var y yamlLayout
	if err := yaml.UnmarshalStrict(data, &y); err != nil {
		return nil, apierr.Invalidf("layout: %v", err)
	}
	l := &inventoryv1.DiskLayout{Image: y.Image}
	for _, d := range y.Disks {
		ld := &inventoryv1.LayoutDisk{Name: d.Name, Device: cmpOr(d.Device, "auto"), Table: d.Table}
		for _, p := range d.Partitions {
			ld.Partitions = append(ld.Partitions, &inventoryv1.LayoutPartition{
				Name: p.Name, SizeBytes: uint64(p.Size), Type: cmpOr(p.Type, "linux"),
				Filesystem: p.Filesystem, Mount: p.Mount,
			})
		}
		l.Disks = append(l.Disks, ld)
	}
	for _, r := range y.Raids {
		l.Raids = append(l.Raids, &inventoryv1.LayoutRaid{
			Name: r.Name, Level: r.Level, Devices: r.Devices, Filesystem: r.Filesystem, Mount: r.Mount,
		})
	}
	for _, g := range y.VolumeGroups {
		vg := &inventoryv1.LayoutVolumeGroup{Name: g.Name, Devices: g.Devices}
		for _, v := range g.Volumes {
			vg.Volumes = append(vg.Volumes, &inventoryv1.LayoutLogicalVolume{
				Name: v.Name, SizeBytes: uint64(v.Size), Filesystem: v.Filesystem, Mount: v.Mount,
			})
		}
		l.VolumeGroups = append(l.VolumeGroups, vg)
	}
	if _, err := check(l); err != nil {
		return nil, err
	}
	return l, nil
}

func cmpOr(a, b string) string {
	if a == "" {
		return b
	}
	return a
}

// Default is the flat layout on the machine's first non-removable disk:
// the whole-disk image written onto it. Precondition when there is none.
func Default(facts *inventoryv1.Facts) (*inventoryv1.DiskLayout, error) {
	d := first(facts.GetDisks())
	if d == nil {
		return nil, apierr.Preconditionf("layout: the machine has no non-removable disk (%s)", describe(facts.GetDisks()))
	}
	return &inventoryv1.DiskLayout{
		Disks: []*inventoryv1.LayoutDisk{{Name: "root", Device: "/dev/" + d.GetName(), SizeBytes: d.GetSizeBytes()}},
		Image: "root",
	}, nil
}

// first is the first non-removable disk in facts order (the kernel's:
// sda before sdb, nvme0n1 before nvme1n1), the one firmware boots first
// on most machines: a BIOS boots only its first hard disk, so the flat
// default does not pick the biggest.
func first(disks []*inventoryv1.Facts_Disk) *inventoryv1.Facts_Disk {
	for _, d := range disks {
		if !d.GetRemovable() && d.GetName() != "" {
			return d
		}
	}
	return nil
}

// largest is the biggest non-removable disk not in used (the first of
// equals, in facts order).
func largest(disks []*inventoryv1.Facts_Disk, used map[string]string) *inventoryv1.Facts_Disk {
	var best *inventoryv1.Facts_Disk
	for _, d := range disks {
		if d.GetRemovable() || used[d.GetName()] != "" || d.GetName() == "" {
			continue
		}
		if best == nil || d.GetSizeBytes() > best.GetSizeBytes() {
			best = d
		}
	}
	return best
}

func describe(disks []*inventoryv1.Facts_Disk) string {
	if len(disks) == 0 {
		return "no disks"
	}
	var names []string
	for _, d := range disks {
		n := d.GetName()
		if d.GetRemovable() {
			n += " (removable)"
		}
		names = append(names, n)
	}
	return strings.Join(names, ", ")
}

var deviceNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]*$`)

// Resolve checks l against one machine's disks and returns a resolved
// copy: each disk's device matched to a disk of facts ("auto" takes the
// largest non-removable disk no other entry uses; a kernel name
// "nvme0n1" or a path "/dev/nvme0n1" names one), device set to its path
// and size_bytes to its size. It refuses (apierr.ErrInvalid or
// apierr.ErrPrecondition, naming the entry) everything Check does, a disk
// the machine lacks, a disk used twice, and partitions or volumes that do
// not fit; with uefi a partitioned GPT layout needs an ESP, without it
// (a BIOS machine) a disk holding the image's root is not GPT. l is not
// modified.
func Resolve(l *inventoryv1.DiskLayout, facts *inventoryv1.Facts, uefi bool) (*inventoryv1.DiskLayout, error) {
	if err := limits(l); err != nil {
		return nil, err
	}
	out := proto.Clone(l).(*inventoryv1.DiskLayout)
	if out == nil {
		out = &inventoryv1.DiskLayout{}
	}
	g, err := check(out)
	if err != nil {
		return nil, err
	}
	have := facts.GetDisks()
	if len(out.Disks) > len(have) {
		return nil, apierr.Preconditionf("layout: the layout names %d disks, the machine has %d: %s", len(out.Disks), len(have), describe(have))
	}
	byName := map[string]*inventoryv1.Facts_Disk{}
	for _, d := range have {
		if d.GetName() != "" {
			byName[d.GetName()] = d
		}
	}
	used := map[string]string{} // fact disk name → layout disk name
	match := make([]*inventoryv1.Facts_Disk, len(out.Disks))
	// Named devices first, so that "auto" never takes a disk another
	// entry names.
	for i, d := range out.Disks {
		if d.Device == "auto" {
			continue
		}
		name := strings.TrimPrefix(d.Device, "/dev/")
		if len(name) > maxDeviceNameLen || !deviceNameRE.MatchString(name) {
			return nil, apierr.Invalidf("layout: disk %q: device %q: want auto, a kernel name (nvme0n1) or /dev/<name>", d.Name, d.Device)
		}
		fd := byName[name]
		if fd == nil {
			return nil, apierr.Preconditionf("layout: disk %q: the machine has no disk %s (it has: %s)", d.Name, name, describe(have))
		}
		if other := used[name]; other != "" {
			return nil, apierr.Invalidf("layout: disks %q and %q both name %s", other, d.Name, name)
		}
		used[name] = d.Name
		match[i] = fd
	}
	for i, d := range out.Disks {
		if d.Device != "auto" {
			continue
		}
		fd := largest(have, used)
		if fd == nil {
			return nil, apierr.Preconditionf("layout: disk %q: device auto: no unused non-removable disk left (the machine has: %s)", d.Name, describe(have))
		}
		used[fd.GetName()] = d.Name
		match[i] = fd
	}
	for i, d := range out.Disks {
		fd := match[i]
		if fd.GetSizeBytes() == 0 {
			return nil, apierr.Preconditionf("layout: disk %q: the machine's facts give %s no size", d.Name, fd.GetName())
		}
		d.Device = "/dev/" + fd.GetName()
		d.SizeBytes = fd.GetSizeBytes()
		g.size[d.Name] = d.SizeBytes
	}
	if err := fit(out, g); err != nil {
		return nil, err
	}
	if err := boot(out, g, uefi); err != nil {
		return nil, err
	}
	return out, nil
}

// fit checks partitions against their disks and volumes against their
// groups, and computes every block device's size in g.size on the way.
func fit(l *inventoryv1.DiskLayout, g *graph) error {
	seed := true
	for _, d := range l.Disks {
		if d.Table == "" {
			continue
		}
		avail := sub(d.SizeBytes, TableOverhead)
		seedNote := ""
		if seed {
			seed = false
			seedNote = " and the seed partition"
			avail = sub(avail, SeedOverhead)
			if d.Table == "msdos" && len(d.Partitions) >= maxMsdosPrimary {
				return apierr.Invalidf("layout: disk %q: %d partitions on the first partitioned disk's msdos table, at most %d (the cloud-init seed partition takes the fourth entry; use gpt)", d.Name, len(d.Partitions), maxMsdosPrimary-1)
			}
		}
		var sum uint64
		for _, p := range d.Partitions {
			sum = addSat(sum, p.SizeBytes)
		}
		if sum > avail {
			return apierr.Preconditionf("layout: disk %q: partitions of %s do not fit %s (%s, %s usable after the partition table%s)",
				d.Name, human(sum), d.Device, human(d.SizeBytes), human(avail), seedNote)
		}
		for _, p := range d.Partitions {
			if p.SizeBytes == 0 {
				g.size[p.Name] = avail - sum
				if avail-sum < 1<<20 {
					return apierr.Preconditionf("layout: partition %q: no room left on disk %q for the rest (%s left)", p.Name, d.Name, human(avail-sum))
				}
			} else {
				g.size[p.Name] = p.SizeBytes
			}
		}
	}
	for _, r := range l.Raids {
		lo := uint64(math.MaxUint64)
		for _, m := range r.Devices {
			lo = min(lo, g.size[m])
		}
		n := uint64(len(r.Devices))
		switch r.Level {
		case "raid1":
			g.size[r.Name] = lo
		case "raid10":
			g.size[r.Name] = lo * (n / 2)
		}
	}
	for _, vg := range l.VolumeGroups {
		var total uint64
		for _, m := range vg.Devices {
			total = addSat(total, sub(g.size[m], 4<<20)) // LVM metadata and extent rounding
		}
		var sum uint64
		for _, v := range vg.Volumes {
			sum = addSat(sum, v.SizeBytes)
		}
		if sum > total {
			return apierr.Preconditionf("layout: volume group %q: volumes of %s do not fit its %s", vg.Name, human(sum), human(total))
		}
		for _, v := range vg.Volumes {
			if v.SizeBytes == 0 && total-sum < 4<<20 {
				return apierr.Preconditionf("layout: volume %q: no room left in volume group %q for the rest (%s left)", v.Name, vg.Name, human(total-sum))
			}
		}
	}
	return nil
}

// boot checks what the firmware needs to boot the layout.
func boot(l *inventoryv1.DiskLayout, g *graph, uefi bool) error {
	gpt := false
	for _, d := range l.Disks {
		gpt = gpt || d.Table == "gpt"
	}
	if uefi {
		if !gpt {
			return nil
		}
		for _, d := range l.Disks {
			for _, p := range d.Partitions {
				if p.Type == "esp" {
					return nil
				}
			}
		}
		return apierr.Invalidf("layout: the machine boots UEFI and the GPT layout has no partition of type esp")
	}
	// A BIOS boots the first sector of its boot disk: the agent puts the
	// image's MBR boot code there, which finds the active partition of an
	// msdos table. Under a GPT that code finds no active partition, and
	// nothing is installed into a bios_boot partition (the agent copies
	// the image's partitions; it installs no boot loader), so the machine
	// would not boot.
	for _, name := range g.disksUnder(l.Image) {
		if d := g.disk[name]; d.Table == "gpt" {
			return apierr.Invalidf("layout: the machine boots BIOS and boot disk %q has a GPT table: a BIOS machine boots the image's MBR boot code, which needs an msdos table; Corral does not install a boot loader into bios_boot (use table: msdos)", d.Name)
		}
	}
	return nil
}

func sub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

func addSat(a, b uint64) uint64 {
	if s, c := bits.Add64(a, b, 0); c == 0 {
		return s
	}
	return math.MaxUint64
}

// human writes n bytes the way a person reads them, exact when it can.
func human(n uint64) string {
	for _, u := range []struct {
		shift uint
		name  string
	}{{40, "T"}, {30, "G"}, {20, "M"}, {10, "K"}} {
		if n >= 1<<u.shift {
			if n%(1<<u.shift) == 0 {
				return fmt.Sprintf("%d%siB", n>>u.shift, u.name)
			}
			return fmt.Sprintf("%.1f%siB (%d bytes)", float64(n)/float64(uint64(1)<<u.shift), u.name, n)
		}
	}
	return fmt.Sprintf("%d bytes", n)
}
