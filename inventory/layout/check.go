package layout

import (
	"regexp"
	"slices"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
)

// graph is a checked layout's names: what each is, what holds it and what
// uses it.
type graph struct {
	kind   map[string]string // "disk", "partition", "raid", "volume group", "volume"
	disk   map[string]*inventoryv1.LayoutDisk
	part   map[string]*inventoryv1.LayoutPartition
	partOf map[string]string // partition → disk
	raid   map[string]*inventoryv1.LayoutRaid
	group  map[string]*inventoryv1.LayoutVolumeGroup
	volOf  map[string]string // volume → group
	usedBy map[string]string // member → the raid or group using it
	size   map[string]uint64 // filled by Resolve
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

// limits refuses a layout over Parse's limits (a layout may come from
// somewhere other than Parse).
func limits(l *inventoryv1.DiskLayout) error {
	switch {
	case len(l.GetDisks()) > MaxDisks:
		return apierr.Invalidf("layout: %d disks, at most %d", len(l.GetDisks()), MaxDisks)
	case len(l.GetRaids()) > MaxRaids:
		return apierr.Invalidf("layout: %d raids, at most %d", len(l.GetRaids()), MaxRaids)
	case len(l.GetVolumeGroups()) > MaxVolumeGroups:
		return apierr.Invalidf("layout: %d volume groups, at most %d", len(l.GetVolumeGroups()), MaxVolumeGroups)
	}
	for _, d := range l.GetDisks() {
		if len(d.GetPartitions()) > MaxPartitions {
			return apierr.Invalidf("layout: disk %q: %d partitions, at most %d", d.GetName(), len(d.GetPartitions()), MaxPartitions)
		}
	}
	for _, r := range l.GetRaids() {
		if len(r.GetDevices()) > MaxRaidDevices {
			return apierr.Invalidf("layout: raid %q: %d devices, at most %d", r.GetName(), len(r.GetDevices()), MaxRaidDevices)
		}
	}
	for _, g := range l.GetVolumeGroups() {
		if len(g.GetDevices()) > MaxGroupDevices {
			return apierr.Invalidf("layout: volume group %q: %d devices, at most %d", g.GetName(), len(g.GetDevices()), MaxGroupDevices)
		}
		if len(g.GetVolumes()) > MaxVolumes {
			return apierr.Invalidf("layout: volume group %q: %d volumes, at most %d", g.GetName(), len(g.GetVolumes()), MaxVolumes)
		}
	}
	return nil
}

// check validates everything about l that does not depend on a machine,
// filling in defaults (device "auto", partition type "linux"), and returns
// its graph.
func check(l *inventoryv1.DiskLayout) (*graph, error) {
	if err := limits(l); err != nil {
		return nil, err
	}
	g := &graph{
		kind: map[string]string{}, disk: map[string]*inventoryv1.LayoutDisk{}, part: map[string]*inventoryv1.LayoutPartition{},
		partOf: map[string]string{}, raid: map[string]*inventoryv1.LayoutRaid{}, group: map[string]*inventoryv1.LayoutVolumeGroup{},
		volOf: map[string]string{}, usedBy: map[string]string{}, size: map[string]uint64{},
	}
	if len(l.Disks) == 0 {
		return nil, apierr.Invalidf("layout: the layout names no disks")
	}
	name := func(kind, n string) error {
		if n == "" {
			return apierr.Invalidf("layout: a %s has no name", kind)
		}
		if len(n) > maxNameLen || !nameRE.MatchString(n) {
			return apierr.Invalidf("layout: %s %q: a name is letters, digits, '.', '_' and '-', at most %d", kind, n, maxNameLen)
		}
		if k := g.kind[n]; k != "" {
			return apierr.Invalidf("layout: %s %q: the name is used by a %s already (names are unique across the layout)", kind, n, k)
		}
		g.kind[n] = kind
		return nil
	}
	mounts := map[string]string{}
	mount := func(kind, n, fs, m string) error {
		if fs != "" && !slices.Contains(filesystems, fs) {
			return apierr.Invalidf("layout: %s %q: unknown filesystem %q (want one of %s)", kind, n, fs, strings.Join(filesystems, ", "))
		}
		if m == "" {
			return nil
		}
		if fs == "swap" {
			return apierr.Invalidf("layout: %s %q: swap has no mount point", kind, n)
		}
		if len(m) > maxMountLen || !strings.HasPrefix(m, "/") || strings.ContainsFunc(m, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return apierr.Invalidf("layout: %s %q: mount %q: want an absolute path without spaces", kind, n, m)
		}
		if other := mounts[m]; other != "" {
			return apierr.Invalidf("layout: %s %q: mount %s is %q's already", kind, n, m, other)
		}
		mounts[m] = n
		return nil
	}

	for _, d := range l.Disks {
		if err := name("disk", d.Name); err != nil {
			return nil, err
		}
		d.Device = cmpOr(d.Device, "auto")
		g.disk[d.Name] = d
		if d.Table != "" && !slices.Contains(tables, d.Table) {
			return nil, apierr.Invalidf("layout: disk %q: unknown table %q (want gpt or msdos, or none to use the disk whole)", d.Name, d.Table)
		}
		if d.Table == "" && len(d.Partitions) > 0 {
			return nil, apierr.Invalidf("layout: disk %q has partitions and no table (want table: gpt or msdos)", d.Name)
		}
		if d.Table != "" && len(d.Partitions) == 0 {
			return nil, apierr.Invalidf("layout: disk %q has table %s and no partitions (leave the table out to use the disk whole)", d.Name, d.Table)
		}
		if d.Table == "msdos" && len(d.Partitions) > maxMsdosPrimary {
			return nil, apierr.Invalidf("layout: disk %q: %d partitions on an msdos table, at most %d (use gpt)", d.Name, len(d.Partitions), maxMsdosPrimary)
		}
		for i, p := range d.Partitions {
			if err := name("partition", p.Name); err != nil {
				return nil, err
			}
			p.Type = cmpOr(p.Type, "linux")
			g.part[p.Name], g.partOf[p.Name] = p, d.Name
			if !slices.Contains(partitionTypes, p.Type) {
				return nil, apierr.Invalidf("layout: partition %q: unknown type %q (want one of %s)", p.Name, p.Type, strings.Join(partitionTypes, ", "))
			}
			if p.SizeBytes == 0 && i != len(d.Partitions)-1 {
				return nil, apierr.Invalidf("layout: partition %q has no size (the rest of disk %q) and is not the disk's last", p.Name, d.Name)
			}
			switch p.Type {
			case "esp":
				if p.Filesystem != "" && p.Filesystem != "vfat" {
					return nil, apierr.Invalidf("layout: partition %q: an esp is vfat, not %s", p.Name, p.Filesystem)
				}
			case "bios_boot", "raid", "lvm":
				if p.Filesystem != "" || p.Mount != "" {
					return nil, apierr.Invalidf("layout: partition %q: a %s partition has no filesystem or mount of its own", p.Name, p.Type)
				}
				if p.Type == "bios_boot" && d.Table != "gpt" {
					return nil, apierr.Invalidf("layout: partition %q: bios_boot is a GPT partition type (disk %q is %s)", p.Name, d.Name, d.Table)
				}
			case "swap":
				if p.Filesystem != "" && p.Filesystem != "swap" {
					return nil, apierr.Invalidf("layout: partition %q: a swap partition has no %s filesystem", p.Name, p.Filesystem)
				}
			}
			if p.Filesystem == "swap" && p.Type != "swap" {
				return nil, apierr.Invalidf("layout: partition %q: filesystem swap on a %s partition (use type: swap)", p.Name, p.Type)
			}
			if err := mount("partition", p.Name, p.Filesystem, p.Mount); err != nil {
				return nil, err
			}
		}
	}

	use := func(kind, user, member string) error {
		k := g.kind[member]
		if k == "" {
			return apierr.Invalidf("layout: %s %q: device %q is not in the layout", kind, user, member)
		}
		if other := g.usedBy[member]; other != "" {
			return apierr.Invalidf("layout: %s %q: %s %q is used by %q already", kind, user, k, member, other)
		}
		g.usedBy[member] = user
		return nil
	}
	for _, r := range l.Raids {
		if err := name("raid", r.Name); err != nil {
			return nil, err
		}
		g.raid[r.Name] = r
	}
	for _, r := range l.Raids {
		switch r.Level {
		case "raid1":
			if len(r.Devices) < 2 {
				return nil, apierr.Invalidf("layout: raid %q: raid1 needs at least 2 devices, it has %d", r.Name, len(r.Devices))
			}
		case "raid10":
			if len(r.Devices) < 4 || len(r.Devices)%2 != 0 {
				return nil, apierr.Invalidf("layout: raid %q: raid10 needs an even number of devices, at least 4; it has %d", r.Name, len(r.Devices))
			}
		default:
			return nil, apierr.Invalidf("layout: raid %q: unknown level %q (want one of %s)", r.Name, r.Level, strings.Join(levels, ", "))
		}
		disks := map[string]string{}
		for _, m := range r.Devices {
			if err := use("raid", r.Name, m); err != nil {
				return nil, err
			}
			switch g.kind[m] {
			case "disk":
				if g.disk[m].Table != "" {
					return nil, apierr.Invalidf("layout: raid %q: disk %q is partitioned; name one of its partitions of type raid, or drop its table", r.Name, m)
				}
			case "partition":
				if t := g.part[m].Type; t != "raid" {
					return nil, apierr.Invalidf("layout: raid %q: partition %q is of type %s, want raid", r.Name, m, t)
				}
			default:
				return nil, apierr.Invalidf("layout: raid %q: device %q is a %s; a raid is made of disks or partitions", r.Name, m, g.kind[m])
			}
			d := cmpOr(g.partOf[m], m)
			if other := disks[d]; other != "" {
				return nil, apierr.Invalidf("layout: raid %q: %q and %q are both on disk %q (raid members must be on different disks)", r.Name, other, m, d)
			}
			disks[d] = m
		}
	}
	for _, vg := range l.VolumeGroups {
		if err := name("volume group", vg.Name); err != nil {
			return nil, err
		}
		g.group[vg.Name] = vg
		if len(vg.Devices) == 0 {
			return nil, apierr.Invalidf("layout: volume group %q has no devices", vg.Name)
		}
		if len(vg.Volumes) == 0 {
			return nil, apierr.Invalidf("layout: volume group %q has no volumes", vg.Name)
		}
		for _, m := range vg.Devices {
			if err := use("volume group", vg.Name, m); err != nil {
				return nil, err
			}
			switch g.kind[m] {
			case "disk":
				if g.disk[m].Table != "" {
					return nil, apierr.Invalidf("layout: volume group %q: disk %q is partitioned; name one of its partitions of type lvm, or drop its table", vg.Name, m)
				}
			case "partition":
				if t := g.part[m].Type; t != "lvm" {
					return nil, apierr.Invalidf("layout: volume group %q: partition %q is of type %s, want lvm", vg.Name, m, t)
				}
			case "raid":
				if r := g.raid[m]; r.Filesystem != "" || r.Mount != "" {
					return nil, apierr.Invalidf("layout: volume group %q: raid %q has a filesystem or mount of its own", vg.Name, m)
				}
			default:
				return nil, apierr.Invalidf("layout: volume group %q: device %q is a %s; a volume group is made of disks, partitions or raids", vg.Name, m, g.kind[m])
			}
		}
		for i, v := range vg.Volumes {
			if err := name("volume", v.Name); err != nil {
				return nil, err
			}
			g.volOf[v.Name] = vg.Name
			if v.SizeBytes == 0 && i != len(vg.Volumes)-1 {
				return nil, apierr.Invalidf("layout: volume %q has no size (the rest of volume group %q) and is not the group's last", v.Name, vg.Name)
			}
			if err := mount("volume", v.Name, v.Filesystem, v.Mount); err != nil {
				return nil, err
			}
		}
	}
	for _, r := range l.Raids {
		if err := mount("raid", r.Name, r.Filesystem, r.Mount); err != nil {
			return nil, err
		}
	}

	// Everything is used by something, and the image goes somewhere that
	// can hold it.
	for _, d := range l.Disks {
		if d.Table == "" && g.usedBy[d.Name] == "" && l.Image != d.Name {
			return nil, apierr.Invalidf("layout: disk %q is used by nothing (give it partitions, or name it in a raid, a volume group or image)", d.Name)
		}
		for _, p := range d.Partitions {
			if (p.Type == "raid" || p.Type == "lvm") && g.usedBy[p.Name] == "" {
				return nil, apierr.Invalidf("layout: partition %q is of type %s and no %s uses it", p.Name, p.Type, map[string]string{"raid": "raid", "lvm": "volume group"}[p.Type])
			}
		}
	}
	if l.Image == "" {
		return nil, apierr.Invalidf("layout: image names nothing (want the disk, partition, raid or volume the OS image is written to)")
	}
	switch k := g.kind[l.Image]; k {
	case "":
		return nil, apierr.Invalidf("layout: image %q is not in the layout", l.Image)
	case "volume group":
		return nil, apierr.Invalidf("layout: image %q is a volume group; name one of its volumes", l.Image)
	case "disk":
		if d := g.disk[l.Image]; d.Table != "" {
			return nil, apierr.Invalidf("layout: image %q is a disk the layout partitions; name one of its partitions, or drop its table for a whole-disk image", l.Image)
		}
	case "partition":
		if t := g.part[l.Image].Type; t != "linux" {
			return nil, apierr.Invalidf("layout: image %q is a partition of type %s; the image goes onto a linux partition, a raid, a volume or a whole disk", l.Image, t)
		}
	}
	if u := g.usedBy[l.Image]; u != "" {
		return nil, apierr.Invalidf("layout: image %q is a member of %q; name %q or one of its volumes", l.Image, u, u)
	}
	return g, nil
}

// disksUnder names the layout disks that hold name (in layout order).
func (g *graph) disksUnder(name string) []string {
	seen := map[string]bool{}
	var walk func(string, int)
	walk = func(n string, depth int) {
		if depth > 4 {
			return
		}
		switch g.kind[n] {
		case "disk":
			seen[n] = true
		case "partition":
			seen[g.partOf[n]] = true
		case "raid":
			for _, m := range g.raid[n].Devices {
				walk(m, depth+1)
			}
		case "volume group":
			for _, m := range g.group[n].Devices {
				walk(m, depth+1)
			}
		case "volume":
			walk(g.volOf[n], depth+1)
		}
	}
	walk(name, 0)
	var out []string
	for n := range g.disk {
		if seen[n] {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}
