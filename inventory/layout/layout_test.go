package layout

import (
	"errors"
	"strings"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
)

const gib = 1 << 30

func facts(disks ...*inventoryv1.Facts_Disk) *inventoryv1.Facts {
	return &inventoryv1.Facts{Disks: disks}
}

func disk(name string, size uint64) *inventoryv1.Facts_Disk {
	return &inventoryv1.Facts_Disk{Name: name, SizeBytes: size}
}

var (
	oneDisk  = facts(disk("vda", 10*gib))
	twoNVMe  = facts(disk("nvme0n1", 100*gib), disk("nvme1n1", 100*gib))
	fourDisk = facts(disk("sda", 50*gib), disk("sdb", 50*gib), disk("sdc", 50*gib), disk("sdd", 50*gib))
	withUSB  = facts(&inventoryv1.Facts_Disk{Name: "sdz", SizeBytes: 500 * gib, Removable: true}, disk("sda", 20*gib), disk("sdb", 40*gib))
)

const raid1YAML = `
disks:
  - {name: d0, device: nvme0n1, table: gpt, partitions: [{name: esp0, size: 512M, type: esp}, {name: r0, type: raid}]}
  - {name: d1, device: nvme1n1, table: gpt, partitions: [{name: esp1, size: 512M, type: esp}, {name: r1, type: raid}]}
raids: [{name: md0, level: raid1, devices: [r0, r1], filesystem: ext4, mount: /}]
image: md0
`

func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{
		"": 0, "0": 0, "512": 512, "512M": 512 << 20, "20G": 20 << 30, "1T": 1 << 40, "4K": 4096,
		"512MiB": 512 << 20, "1 G": 1 << 30, "16777215T": 16777215 << 40,
	} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"1GB", "1g", "-1", "1.5G", "G", "16777216T", "99999999999999999999", "1iB", "1 PB"} {
		if got, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", in, got)
		}
	}
}

func TestParseAndResolve(t *testing.T) {
	tests := map[string]struct {
		yaml  string
		facts *inventoryv1.Facts
		uefi  bool
		want  *inventoryv1.DiskLayout
	}{
		"flat auto": {
			yaml: "disks: [{name: root, device: auto}]\nimage: root\n", facts: withUSB,
			want: &inventoryv1.DiskLayout{Disks: []*inventoryv1.LayoutDisk{{Name: "root", Device: "/dev/sdb", SizeBytes: 40 * gib}}, Image: "root"},
		},
		"flat device omitted is auto": {
			yaml: "disks: [{name: root}]\nimage: root\n", facts: oneDisk,
			want: &inventoryv1.DiskLayout{Disks: []*inventoryv1.LayoutDisk{{Name: "root", Device: "/dev/vda", SizeBytes: 10 * gib}}, Image: "root"},
		},
		"path and auto avoid each other": {
			yaml:  "disks: [{name: a, device: auto}, {name: b, device: /dev/sdb}]\nraids: [{name: m, level: raid1, devices: [a, b]}]\nimage: m\n",
			facts: withUSB,
			want: &inventoryv1.DiskLayout{Disks: []*inventoryv1.LayoutDisk{
				{Name: "a", Device: "/dev/sda", SizeBytes: 20 * gib},
				{Name: "b", Device: "/dev/sdb", SizeBytes: 40 * gib},
			}, Raids: []*inventoryv1.LayoutRaid{{Name: "m", Level: "raid1", Devices: []string{"a", "b"}}}, Image: "m"},
		},
		"raid1 uefi": {
			yaml: raid1YAML, facts: twoNVMe, uefi: true,
			want: &inventoryv1.DiskLayout{
				Disks: []*inventoryv1.LayoutDisk{
					{Name: "d0", Device: "/dev/nvme0n1", Table: "gpt", SizeBytes: 100 * gib, Partitions: []*inventoryv1.LayoutPartition{
						{Name: "esp0", SizeBytes: 512 << 20, Type: "esp"}, {Name: "r0", Type: "raid"}}},
					{Name: "d1", Device: "/dev/nvme1n1", Table: "gpt", SizeBytes: 100 * gib, Partitions: []*inventoryv1.LayoutPartition{
						{Name: "esp1", SizeBytes: 512 << 20, Type: "esp"}, {Name: "r1", Type: "raid"}}},
				},
				Raids: []*inventoryv1.LayoutRaid{{Name: "md0", Level: "raid1", Devices: []string{"r0", "r1"}, Filesystem: "ext4", Mount: "/"}},
				Image: "md0",
			},
		},
		"raid10 lvm bios (the operator guide's)": {
			yaml: `
disks:
  - {name: a, device: sda, table: msdos, partitions: [{name: boot, size: 512M, type: esp}, {name: ra, type: raid}]}
  - {name: b, device: sdb, table: msdos, partitions: [{name: rb, type: raid}]}
  - {name: c, device: sdc}
  - {name: d, device: sdd}
raids: [{name: md0, level: raid10, devices: [ra, rb, c, d]}]
volume_groups: [{name: vg0, devices: [md0], volumes: [{name: root, size: 20G, filesystem: ext4, mount: /}, {name: data, filesystem: ext4, mount: /srv}]}]
image: root
`, facts: fourDisk,
		},
		"bios msdos boot disk, gpt data disk": {
			yaml:  "disks: [{name: a, device: sda, table: msdos, partitions: [{name: root}]}, {name: b, device: sdb, table: gpt, partitions: [{name: data, filesystem: ext4, mount: /srv}]}]\nimage: root\n",
			facts: fourDisk,
		},
		"msdos bios flat partition": {
			yaml:  "disks: [{name: d, device: vda, table: msdos, partitions: [{name: swap, size: 1G, type: swap}, {name: root, mount: /}]}]\nimage: root\n",
			facts: oneDisk,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			l, err := Parse([]byte(tc.yaml))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			before := strings.Clone(l.String())
			got, err := Resolve(l, tc.facts, tc.uefi)
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			if l.String() != before {
				t.Errorf("Resolve changed its argument")
			}
			if tc.want != nil {
				if d := cmp.Diff(tc.want, got, protocmp.Transform()); d != "" {
					t.Errorf("(-want +got):\n%s", d)
				}
			}
			// A resolved layout resolves to itself.
			again, err := Resolve(got, tc.facts, tc.uefi)
			if err != nil {
				t.Fatalf("Resolve(resolved): %v", err)
			}
			if d := cmp.Diff(got, again, protocmp.Transform()); d != "" {
				t.Errorf("not idempotent (-first +second):\n%s", d)
			}
		})
	}
}

func TestRefusals(t *testing.T) {
	tests := map[string]struct {
		yaml  string
		facts *inventoryv1.Facts // nil: Parse must refuse
		uefi  bool
		class error
		want  string // a part of the message
	}{
		"unknown key":      {yaml: "disks: [{name: a, devize: auto}]\nimage: a\n", class: apierr.ErrInvalid, want: `unknown field "devize"`},
		"unknown top key":  {yaml: "disk: []\n", class: apierr.ErrInvalid, want: `unknown field "disk"`},
		"not yaml":         {yaml: "disks: [", class: apierr.ErrInvalid, want: "layout:"},
		"too big":          {yaml: "image: a\n" + strings.Repeat("#", MaxBytes), class: apierr.ErrInvalid, want: "bytes of YAML, at most 65536"},
		"too many disks":   {yaml: "disks: [" + strings.Repeat("{name: x},", 17) + "]", class: apierr.ErrInvalid, want: "17 disks, at most 16"},
		"too many parts":   {yaml: "disks: [{name: x, table: gpt, partitions: [" + strings.Repeat("{size: 1M},", 33) + "]}]", class: apierr.ErrInvalid, want: "33 partitions, at most 32"},
		"too many raids":   {yaml: "disks: [{name: x}]\nraids: [" + strings.Repeat("{name: r},", 17) + "]", class: apierr.ErrInvalid, want: "17 raids, at most 16"},
		"too many groups":  {yaml: "disks: [{name: x}]\nvolume_groups: [" + strings.Repeat("{name: g},", 17) + "]", class: apierr.ErrInvalid, want: "17 volume groups, at most 16"},
		"bad size":         {yaml: "disks: [{name: d, table: gpt, partitions: [{name: p, size: 1GB}]}]\nimage: p\n", class: apierr.ErrInvalid, want: `size "1GB"`},
		"negative size":    {yaml: "disks: [{name: d, table: gpt, partitions: [{name: p, size: -5}]}]\nimage: p\n", class: apierr.ErrInvalid, want: `size "-5"`},
		"no disks":         {yaml: "image: a\n", class: apierr.ErrInvalid, want: "names no disks"},
		"no name":          {yaml: "disks: [{device: auto}]\nimage: a\n", class: apierr.ErrInvalid, want: "a disk has no name"},
		"bad name":         {yaml: "disks: [{name: 'a b'}]\nimage: a\n", class: apierr.ErrInvalid, want: `disk "a b": a name is`},
		"names not unique": {yaml: "disks: [{name: a, table: gpt, partitions: [{name: a}]}]\nimage: a\n", class: apierr.ErrInvalid, want: `partition "a": the name is used by a disk already`},
		"unknown table":    {yaml: "disks: [{name: a, table: apm, partitions: [{name: p}]}]\nimage: p\n", class: apierr.ErrInvalid, want: `unknown table "apm"`},
		"parts no table":   {yaml: "disks: [{name: a, partitions: [{name: p}]}]\nimage: p\n", class: apierr.ErrInvalid, want: "has partitions and no table"},
		"table no parts":   {yaml: "disks: [{name: a, table: gpt}]\nimage: a\n", class: apierr.ErrInvalid, want: "has table gpt and no partitions"},
		"msdos four on the seed's disk": {yaml: "disks: [{name: a, table: msdos, partitions: [{name: p1, size: 1M}, {name: p2, size: 1M}, {name: p3, size: 1M}, {name: p4}]}]\nimage: p4\n", facts: oneDisk, class: apierr.ErrInvalid,
			want: "4 partitions on the first partitioned disk's msdos table, at most 3 (the cloud-init seed partition takes the fourth entry"},
		"msdos five":         {yaml: "disks: [{name: a, table: msdos, partitions: [{name: p1, size: 1M}, {name: p2, size: 1M}, {name: p3, size: 1M}, {name: p4, size: 1M}, {name: p5}]}]\nimage: p5\n", class: apierr.ErrInvalid, want: "5 partitions on an msdos table"},
		"unknown type":       {yaml: "disks: [{name: a, table: gpt, partitions: [{name: p, type: ntfs}]}]\nimage: p\n", class: apierr.ErrInvalid, want: `unknown type "ntfs"`},
		"unknown fs":         {yaml: "disks: [{name: a, table: gpt, partitions: [{name: p, filesystem: zfs}]}]\nimage: p\n", class: apierr.ErrInvalid, want: `unknown filesystem "zfs"`},
		"rest not last":      {yaml: "disks: [{name: a, table: gpt, partitions: [{name: p}, {name: q, size: 1G}]}]\nimage: p\n", class: apierr.ErrInvalid, want: `partition "p" has no size (the rest of disk "a") and is not the disk's last`},
		"volume rest":        {yaml: "disks: [{name: a}]\nvolume_groups: [{name: g, devices: [a], volumes: [{name: v}, {name: w, size: 1G}]}]\nimage: v\n", class: apierr.ErrInvalid, want: `volume "v" has no size`},
		"esp not vfat":       {yaml: "disks: [{name: a, table: gpt, partitions: [{name: e, size: 512M, type: esp, filesystem: ext4}, {name: p}]}]\nimage: p\n", class: apierr.ErrInvalid, want: "an esp is vfat"},
		"bios_boot on msdos": {yaml: "disks: [{name: a, table: msdos, partitions: [{name: b, size: 1M, type: bios_boot}, {name: p}]}]\nimage: p\n", class: apierr.ErrInvalid, want: "bios_boot is a GPT partition type"},
		"raid part with fs":  {yaml: "disks: [{name: a, table: gpt, partitions: [{name: r, type: raid, filesystem: ext4}]}]\nimage: r\n", class: apierr.ErrInvalid, want: "has no filesystem or mount of its own"},
		"swap mounted":       {yaml: "disks: [{name: a, table: gpt, partitions: [{name: s, size: 1G, type: swap, filesystem: swap, mount: /swap}, {name: p}]}]\nimage: p\n", class: apierr.ErrInvalid, want: "swap has no mount point"},
		"relative mount":     {yaml: "disks: [{name: a, table: gpt, partitions: [{name: p, mount: srv}]}]\nimage: p\n", class: apierr.ErrInvalid, want: `mount "srv"`},
		"mount twice":        {yaml: "disks: [{name: a, table: gpt, partitions: [{name: p, size: 1G, mount: /}, {name: q, mount: /}]}]\nimage: p\n", class: apierr.ErrInvalid, want: `mount / is "p"'s already`},
		"unknown level":      {yaml: "disks: [{name: a}, {name: b}]\nraids: [{name: m, level: raid5, devices: [a, b]}]\nimage: m\n", class: apierr.ErrInvalid, want: `unknown level "raid5"`},
		"raid1 one device":   {yaml: "disks: [{name: a}]\nraids: [{name: m, level: raid1, devices: [a]}]\nimage: m\n", class: apierr.ErrInvalid, want: "raid1 needs at least 2 devices, it has 1"},
		"raid10 three":       {yaml: "disks: [{name: a}, {name: b}, {name: c}]\nraids: [{name: m, level: raid10, devices: [a, b, c]}]\nimage: m\n", class: apierr.ErrInvalid, want: "raid10 needs an even number of devices, at least 4; it has 3"},
		"raid10 five":        {yaml: "disks: [{name: a}, {name: b}, {name: c}, {name: d}, {name: e}]\nraids: [{name: m, level: raid10, devices: [a, b, c, d, e]}]\nimage: m\n", class: apierr.ErrInvalid, want: "it has 5"},
		"raid same disk":     {yaml: "disks: [{name: a, table: gpt, partitions: [{name: r0, size: 1G, type: raid}, {name: r1, type: raid}]}]\nraids: [{name: m, level: raid1, devices: [r0, r1]}]\nimage: m\n", class: apierr.ErrInvalid, want: `"r0" and "r1" are both on disk "a"`},
		"dangling raid ref":  {yaml: "disks: [{name: a}]\nraids: [{name: m, level: raid1, devices: [a, b]}]\nimage: m\n", class: apierr.ErrInvalid, want: `raid "m": device "b" is not in the layout`},
		"dangling vg ref":    {yaml: "disks: [{name: a}]\nvolume_groups: [{name: g, devices: [x], volumes: [{name: v}]}]\nimage: v\n", class: apierr.ErrInvalid, want: `volume group "g": device "x" is not in the layout`},
		"member twice":       {yaml: "disks: [{name: a}, {name: b}]\nraids: [{name: m, level: raid1, devices: [a, b]}]\nvolume_groups: [{name: g, devices: [a], volumes: [{name: v}]}]\nimage: m\n", class: apierr.ErrInvalid, want: `disk "a" is used by "m" already`},
		"raid of linux part": {yaml: "disks: [{name: a, table: gpt, partitions: [{name: p}]}, {name: b}]\nraids: [{name: m, level: raid1, devices: [p, b]}]\nimage: m\n", class: apierr.ErrInvalid, want: `partition "p" is of type linux, want raid`},
		"raid of part disk":  {yaml: "disks: [{name: a, table: gpt, partitions: [{name: p}]}, {name: b}]\nraids: [{name: m, level: raid1, devices: [a, b]}]\nimage: m\n", class: apierr.ErrInvalid, want: `disk "a" is partitioned`},
		"raid of raid":       {yaml: "disks: [{name: a}, {name: b}, {name: c}]\nraids: [{name: m, level: raid1, devices: [a, b]}, {name: n, level: raid1, devices: [m, c]}]\nimage: n\n", class: apierr.ErrInvalid, want: `device "m" is a raid`},
		"vg no volumes":      {yaml: "disks: [{name: a}]\nvolume_groups: [{name: g, devices: [a]}]\nimage: a\n", class: apierr.ErrInvalid, want: `volume group "g" has no volumes`},
		"vg no devices":      {yaml: "disks: [{name: a}]\nvolume_groups: [{name: g, volumes: [{name: v}]}]\nimage: a\n", class: apierr.ErrInvalid, want: `volume group "g" has no devices`},
		"vg on raid with fs": {yaml: "disks: [{name: a}, {name: b}]\nraids: [{name: m, level: raid1, devices: [a, b], filesystem: ext4}]\nvolume_groups: [{name: g, devices: [m], volumes: [{name: v}]}]\nimage: v\n", class: apierr.ErrInvalid, want: `raid "m" has a filesystem or mount of its own`},
		"unused disk":        {yaml: "disks: [{name: a}, {name: b}]\nimage: a\n", class: apierr.ErrInvalid, want: `disk "b" is used by nothing`},
		"unused raid part":   {yaml: "disks: [{name: a, table: gpt, partitions: [{name: p, size: 1G}, {name: r, type: raid}]}]\nimage: p\n", class: apierr.ErrInvalid, want: `partition "r" is of type raid and no raid uses it`},
		"no image":           {yaml: "disks: [{name: a}]\n", class: apierr.ErrInvalid, want: `disk "a" is used by nothing`},
		"image empty":        {yaml: "disks: [{name: a, table: gpt, partitions: [{name: p}]}]\n", class: apierr.ErrInvalid, want: "image names nothing"},
		"image dangling":     {yaml: "disks: [{name: a, table: gpt, partitions: [{name: p}]}]\nimage: root\n", class: apierr.ErrInvalid, want: `image "root" is not in the layout`},
		"image on esp":       {yaml: "disks: [{name: a, table: gpt, partitions: [{name: e, size: 512M, type: esp}, {name: p}]}]\nimage: e\n", class: apierr.ErrInvalid, want: `image "e" is a partition of type esp`},
		"image on bios_boot": {yaml: "disks: [{name: a, table: gpt, partitions: [{name: b, size: 1M, type: bios_boot}, {name: p}]}]\nimage: b\n", class: apierr.ErrInvalid, want: "partition of type bios_boot"},
		"image on swap":      {yaml: "disks: [{name: a, table: gpt, partitions: [{name: p, size: 1G}, {name: s, type: swap}]}]\nimage: s\n", class: apierr.ErrInvalid, want: "partition of type swap"},
		"image on vg":        {yaml: "disks: [{name: a}]\nvolume_groups: [{name: g, devices: [a], volumes: [{name: v}]}]\nimage: g\n", class: apierr.ErrInvalid, want: `image "g" is a volume group`},
		"image on member":    {yaml: "disks: [{name: a}, {name: b}]\nraids: [{name: m, level: raid1, devices: [a, b]}]\nimage: a\n", class: apierr.ErrInvalid, want: `image "a" is a member of "m"`},
		"image partitioned":  {yaml: "disks: [{name: a, table: gpt, partitions: [{name: p}]}]\nimage: a\n", class: apierr.ErrInvalid, want: `image "a" is a disk the layout partitions`},

		// Against a machine.
		"more disks than machine": {yaml: "disks: [{name: a}, {name: b}]\nraids: [{name: m, level: raid1, devices: [a, b]}]\nimage: m\n", facts: oneDisk, class: apierr.ErrPrecondition,
			want: "the layout names 2 disks, the machine has 1: vda"},
		"no such disk": {yaml: "disks: [{name: a, device: nvme0n1}]\nimage: a\n", facts: oneDisk, class: apierr.ErrPrecondition, want: `disk "a": the machine has no disk nvme0n1 (it has: vda)`},
		"bad device":   {yaml: "disks: [{name: a, device: '/dev/disk/by-id/x'}]\nimage: a\n", facts: oneDisk, class: apierr.ErrInvalid, want: `device "/dev/disk/by-id/x"`},
		"disk used twice": {yaml: "disks: [{name: a, device: sda}, {name: b, device: /dev/sda}]\nraids: [{name: m, level: raid1, devices: [a, b]}]\nimage: m\n", facts: fourDisk, class: apierr.ErrInvalid,
			want: `disks "a" and "b" both name sda`},
		"auto only removable left": {yaml: "disks: [{name: a, device: sda}, {name: b, device: sdb}, {name: c}]\nraids: [{name: m, level: raid1, devices: [a, b]}]\nvolume_groups: [{name: g, devices: [c], volumes: [{name: v}]}]\nimage: m\n", facts: withUSB, class: apierr.ErrPrecondition,
			want: `disk "c": device auto: no unused non-removable disk left (the machine has: sdz (removable), sda, sdb)`},
		"does not fit": {yaml: "disks: [{name: a, table: gpt, partitions: [{name: p, size: 8G}, {name: q, size: 2G}]}]\nimage: p\n", facts: oneDisk, class: apierr.ErrPrecondition,
			want: `disk "a": partitions of 10GiB do not fit /dev/vda (10GiB, 10.0GiB (10726932480 bytes) usable after the partition table and the seed partition)`},
		"rest leaves nothing": {yaml: "disks: [{name: a, table: gpt, partitions: [{name: p, size: 10230M}, {name: q}]}]\nimage: p\n", facts: oneDisk, class: apierr.ErrPrecondition,
			want: `partition "q": no room left on disk "a"`},
		"volumes do not fit": {yaml: "disks: [{name: a}]\nvolume_groups: [{name: g, devices: [a], volumes: [{name: v, size: 11G}]}]\nimage: v\n", facts: oneDisk, class: apierr.ErrPrecondition,
			want: `volume group "g": volumes of 11GiB do not fit`},
		"no size in facts": {yaml: "disks: [{name: a}]\nimage: a\n", facts: facts(disk("vda", 0)), class: apierr.ErrPrecondition, want: "give vda no size"},
		"uefi no esp": {yaml: "disks: [{name: a, table: gpt, partitions: [{name: b, size: 1M, type: bios_boot}, {name: p}]}]\nimage: p\n", facts: oneDisk, uefi: true, class: apierr.ErrInvalid,
			want: "boots UEFI and the GPT layout has no partition of type esp"},
		"bios gpt boot disk": {yaml: raid1YAML, facts: twoNVMe, class: apierr.ErrInvalid,
			want: `boots BIOS and boot disk "d0" has a GPT table: a BIOS machine boots the image's MBR boot code, which needs an msdos table; Corral does not install a boot loader into bios_boot`},
		"bios gpt boot disk with bios_boot": {yaml: "disks: [{name: a, table: gpt, partitions: [{name: b, size: 1M, type: bios_boot}, {name: p}]}]\nimage: p\n", facts: oneDisk, class: apierr.ErrInvalid,
			want: `boots BIOS and boot disk "a" has a GPT table`},
		"bios gpt under a volume": {yaml: "disks: [{name: a, table: msdos, partitions: [{name: p, size: 1G}, {name: pv, type: lvm}]}, {name: b, device: sdb, table: gpt, partitions: [{name: pv2, type: lvm}]}]\nvolume_groups: [{name: g, devices: [pv, pv2], volumes: [{name: root, size: 4G}]}]\nimage: root\n", facts: fourDisk, class: apierr.ErrInvalid,
			want: `boots BIOS and boot disk "b" has a GPT table`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			l, err := Parse([]byte(tc.yaml))
			if tc.facts != nil {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				_, err = Resolve(l, tc.facts, tc.uefi)
			}
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			if !errors.Is(err, tc.class) {
				t.Errorf("error %q is not of class %v", err, tc.class)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q\nwant it to contain %q", err, tc.want)
			}
		})
	}
}

// TestResolveProtoInput checks a layout that did not come from Parse
// (an API caller's) is held to the same rules.
func TestResolveProtoInput(t *testing.T) {
	if _, err := Resolve(nil, oneDisk, false); !errors.Is(err, apierr.ErrInvalid) {
		t.Errorf("nil layout: %v", err)
	}
	big := &inventoryv1.DiskLayout{Image: "d"}
	for range MaxDisks + 1 {
		big.Disks = append(big.Disks, &inventoryv1.LayoutDisk{Name: "d"})
	}
	if _, err := Resolve(big, oneDisk, false); !errors.Is(err, apierr.ErrInvalid) {
		t.Errorf("17 disks: %v", err)
	}
	l := &inventoryv1.DiskLayout{Disks: []*inventoryv1.LayoutDisk{{Name: "a", Table: "msdos", Partitions: []*inventoryv1.LayoutPartition{{Name: "p"}}}}, Image: "p"}
	got, err := Resolve(l, oneDisk, false)
	if err != nil {
		t.Fatal(err)
	}
	if got.Disks[0].Device != "/dev/vda" || got.Disks[0].Partitions[0].Type != "linux" {
		t.Errorf("defaults not filled: %v", got)
	}
	if l.Disks[0].Device != "" {
		t.Errorf("argument modified")
	}
}

func TestDefault(t *testing.T) {
	got, err := Default(withUSB)
	if err != nil {
		t.Fatal(err)
	}
	// The first non-removable disk, not the biggest (a BIOS boots its first).
	want := &inventoryv1.DiskLayout{Disks: []*inventoryv1.LayoutDisk{{Name: "root", Device: "/dev/sda", SizeBytes: 20 * gib}}, Image: "root"}
	if d := cmp.Diff(want, got, protocmp.Transform()); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	if _, err := Resolve(got, withUSB, true); err != nil {
		t.Errorf("the default does not resolve: %v", err)
	}
	_, err = Default(facts(&inventoryv1.Facts_Disk{Name: "sr0", Removable: true}))
	if !errors.Is(err, apierr.ErrPrecondition) || !strings.Contains(err.Error(), "no non-removable disk (sr0 (removable))") {
		t.Errorf("only removable: %v", err)
	}
	if _, err := Default(nil); !errors.Is(err, apierr.ErrPrecondition) {
		t.Errorf("no facts: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		raid1YAML,
		"disks: [{name: root, device: auto}]\nimage: root\n",
		"disks: [{name: a}]\nvolume_groups: [{name: g, devices: [a], volumes: [{name: v, size: 1G}, {name: w}]}]\nimage: v\n",
		"disks: [{name: a, table: msdos, partitions: [{name: p, size: 18446744073709551615}]}]\nimage: p\n",
		"disks: [{name: a}, {name: b}, {name: c}, {name: d}]\nraids: [{name: m, level: raid10, devices: [a, b, c, d]}]\nimage: m\n",
		"{}", "", "- 1", "disks: {}", "disks: [{partitions: [{size: [1]}]}]",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := Parse(data)
		if err != nil {
			if !errors.Is(err, apierr.ErrInvalid) {
				t.Fatalf("Parse error not ErrInvalid: %v", err)
			}
			return
		}
		for _, fs := range []*inventoryv1.Facts{oneDisk, twoNVMe, fourDisk, withUSB, nil} {
			for _, uefi := range []bool{false, true} {
				if r, err := Resolve(l, fs, uefi); err == nil && len(r.Disks) != len(l.Disks) {
					t.Fatalf("resolved %d disks of %d", len(r.Disks), len(l.Disks))
				}
			}
		}
	})
}
