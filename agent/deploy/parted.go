package deploy

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/corralhq/corral/agent/diskwrite"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/internal/diskmap"
)

// A partitioned layout (docs/architecture.md, "The agent's deploy"): the
// agent makes the partition tables, the arrays and the volumes, writes
// the image's root filesystem onto what the layout's image names, copies
// the image's boot partition onto every esp partition, and makes the
// other filesystems.

// lvmConfig runs lvm without udev (the discovery image has none): device
// nodes are made by libdevmapper itself (DM_DISABLE_UDEV), nothing waits
// for udev, and no backup or archive is written to the RAM disk.
const lvmConfig = "devices { obtain_device_list_from_udev = 0 } activation { udev_sync = 0 udev_rules = 0 monitoring = 0 } backup { backup = 0 archive = 0 }"

// partPlan is a partition the agent makes.
type partPlan struct {
	lp         *inventoryv1.LayoutPartition
	index      int   // entry number (1-based)
	start, end int64 // bytes
	bootable   bool  // MBR active flag
}

// diskPlan is a partitioned disk of the layout.
type diskPlan struct {
	ld        *inventoryv1.LayoutDisk
	t         *target
	parts     []*partPlan
	seed      bool // the CIDATA seed partition is at its end
	seedStart int64
	seedIndex int
}

// volume is something the layout makes a filesystem on (or copies the
// image's root or boot partition onto).
type volume struct {
	name  string
	kind  string // "disk", "partition", "raid", "volume"
	fs    string
	mount string
	uuid  string // the filesystem's, chosen here (mounts go by it)
	esp   bool
}

// layoutPlan is a partitioned layout checked against the machine.
type layoutPlan struct {
	disks   []*diskPlan
	byDisk  map[string]*diskPlan // layout disk name
	whole   map[string]*target   // unpartitioned disks (raid or LVM members)
	parts   map[string]*partPlan // partition name
	partOf  map[string]*diskPlan // partition name → disk
	raids   []*inventoryv1.LayoutRaid
	groups  []*inventoryv1.LayoutVolumeGroup
	vols    []*volume // in layout order: partitions, raids, volumes
	image   string    // the layout name the root filesystem goes onto
	it      *imageTable
	m       *diskmap.Map
	md      map[string]string // raid name → /dev/mdN
	seed    *diskPlan
	mounts  [][]string // cloud-init mounts entries
	modules []string
}

// partitioned reports whether layout asks for more than a whole-disk image.
func partitioned(layout *inventoryv1.DiskLayout) bool {
	if len(layout.GetRaids()) > 0 || len(layout.GetVolumeGroups()) > 0 {
		return true
	}
	return slices.ContainsFunc(layout.GetDisks(), func(d *inventoryv1.LayoutDisk) bool {
		return d.GetTable() != "" || len(d.GetPartitions()) > 0
	})
}

// checkLayout plans a partitioned layout against the real disks and the
// image's own partition table (read over HTTP, each extent's hash
// checked), refusing before anything is written what does not fit or what
// this agent cannot make.
func (d *Deployer) checkLayout(ctx context.Context, plan *nodev1.DeployPlan, m *diskmap.Map) (*layoutPlan, error) {
	layout := plan.GetLayout()
	lp := &layoutPlan{byDisk: map[string]*diskPlan{}, whole: map[string]*target{}, parts: map[string]*partPlan{},
		partOf: map[string]*diskPlan{}, md: map[string]string{}, image: layout.GetImage(), m: m}
	disks, err := d.cfg.Disks()
	if err != nil {
		return nil, fmt.Errorf("list disks: %w", err)
	}
	kind := map[string]string{}
	for _, ld := range layout.GetDisks() {
		t, err := d.checkDisk(ld, disks)
		if err != nil {
			return nil, err
		}
		kind[ld.GetName()] = "disk"
		if ld.GetTable() == "" {
			lp.whole[ld.GetName()] = t
			continue
		}
		if t.sector != 512 {
			return nil, fmt.Errorf("%w: disk %s has %d-byte sectors; a partitioned deploy onto a disk with sectors other than 512 bytes", ErrUnsupported, t.path, t.sector)
		}
		dp := &diskPlan{ld: ld, t: t}
		lp.disks = append(lp.disks, dp)
		lp.byDisk[ld.GetName()] = dp
		for _, p := range ld.GetPartitions() {
			kind[p.GetName()] = "partition"
		}
	}
	for _, r := range layout.GetRaids() {
		kind[r.GetName()] = "raid"
	}
	for _, g := range layout.GetVolumeGroups() {
		kind[g.GetName()] = "volume group"
		for _, v := range g.GetVolumes() {
			kind[v.GetName()] = "volume"
		}
	}
	switch k := kind[lp.image]; k {
	case "disk":
		return nil, fmt.Errorf("%w: the image goes onto the whole disk %s and the layout also asks for partitions, arrays or volume groups; put the image on a partition, an array or a volume", ErrUnsupported, lp.image)
	case "partition", "raid", "volume":
	default:
		return nil, fmt.Errorf("%w: the image goes onto %q, which is no partition, array or volume of the layout", ErrLayout, lp.image)
	}
	if len(lp.disks) == 0 {
		return nil, fmt.Errorf("%w: the layout partitions no disk: the seed partition needs one", ErrUnsupported)
	}
	lp.seed = lp.disks[0]
	lp.seed.seed = true

	// The image's own table: where its root filesystem and boot partition are.
	head, err := readImageHead(ctx, stallGuard(diskwrite.HTTPFetch(d.cfg.HTTP, plan.GetImageUrl()), d.cfg.StallTimeout), m, imageHeadSize)
	if err != nil {
		return nil, fmt.Errorf("read the image's partition table: %w", err)
	}
	if lp.it, err = parseImageTable(head, m.Size); err != nil {
		return nil, err
	}

	// Geometry.
	for _, dp := range lp.disks {
		if err := lp.planDisk(dp); err != nil {
			return nil, err
		}
	}

	// What each partition, array and volume becomes.
	rootSize := lp.it.root.size
	add := func(name, k, fs, mount string, esp bool) error {
		v := &volume{name: name, kind: k, fs: fs, mount: mount, esp: esp}
		switch {
		case name == lp.image:
		case esp:
			if lp.it.boot == nil {
				return fmt.Errorf("%w: partition %s is an esp and the image's %s has no EFI system or boot partition to copy onto it", ErrUnsupported, name, lp.it.scheme)
			}
		case fs == "" || fs == "ext4" || fs == "swap":
		default:
			return fmt.Errorf("%w: %s %s: filesystem %s (the agent makes ext4 and swap; leave the filesystem out and make it from user data)", ErrUnsupported, k, name, fs)
		}
		if fs != "" || esp {
			v.uuid = newUUID()
		}
		lp.vols = append(lp.vols, v)
		return nil
	}
	for _, dp := range lp.disks {
		for _, pp := range dp.parts {
			p := pp.lp
			fs := p.GetFilesystem()
			if p.GetType() == "swap" {
				fs = "swap"
			}
			if p.GetType() == "esp" {
				if lp.it.boot != nil && pp.end-pp.start < lp.it.boot.size {
					return nil, fmt.Errorf("%w: esp partition %s (%s) is smaller than the image's boot partition (%s)", ErrLayout, p.GetName(), mib(pp.end-pp.start), mib(lp.it.boot.size))
				}
			}
			if p.GetName() == lp.image && pp.end-pp.start < rootSize {
				return nil, fmt.Errorf("%w: partition %s (%s) is smaller than the image's root filesystem (%s)", ErrLayout, p.GetName(), mib(pp.end-pp.start), mib(rootSize))
			}
			if p.GetType() == "raid" || p.GetType() == "lvm" || p.GetType() == "bios_boot" {
				continue
			}
			if err := add(p.GetName(), "partition", fs, p.GetMount(), p.GetType() == "esp"); err != nil {
				return nil, err
			}
		}
	}
	for i, r := range layout.GetRaids() {
		lp.raids = append(lp.raids, r)
		lp.md[r.GetName()] = d.cfg.mdPath(i)
		switch r.GetLevel() {
		case "raid1", "raid10":
		default:
			return nil, fmt.Errorf("%w: raid %s: level %q (the agent makes raid1 and raid10)", ErrUnsupported, r.GetName(), r.GetLevel())
		}
		for _, mem := range r.GetDevices() {
			if kind[mem] != "disk" && kind[mem] != "partition" {
				return nil, fmt.Errorf("%w: raid %s: member %q is no disk or partition of the layout", ErrLayout, r.GetName(), mem)
			}
		}
		if r.GetName() == lp.image {
			if lo := lp.smallest(r.GetDevices()); lo-(1<<20) < rootSize {
				return nil, fmt.Errorf("%w: raid %s (members of %s) is smaller than the image's root filesystem (%s)", ErrLayout, r.GetName(), mib(lo), mib(rootSize))
			}
		}
		lp.modules = append(lp.modules, "md_mod", r.GetLevel())
		if err := add(r.GetName(), "raid", r.GetFilesystem(), r.GetMount(), false); err != nil {
			return nil, err
		}
	}
	for _, g := range layout.GetVolumeGroups() {
		lp.groups = append(lp.groups, g)
		for _, mem := range g.GetDevices() {
			if k := kind[mem]; k != "disk" && k != "partition" && k != "raid" {
				return nil, fmt.Errorf("%w: volume group %s: member %q is no disk, partition or raid of the layout", ErrLayout, g.GetName(), mem)
			}
		}
		for _, v := range g.GetVolumes() {
			if v.GetName() == lp.image && v.GetSizeBytes() != 0 && int64(v.GetSizeBytes()) < rootSize {
				return nil, fmt.Errorf("%w: volume %s (%s) is smaller than the image's root filesystem (%s)", ErrLayout, v.GetName(), mib(int64(v.GetSizeBytes())), mib(rootSize))
			}
			if err := add(v.GetName(), "volume", v.GetFilesystem(), v.GetMount(), false); err != nil {
				return nil, err
			}
		}
		lp.modules = append(lp.modules, "dm_mod")
	}
	slices.Sort(lp.modules)
	lp.modules = slices.Compact(lp.modules)
	for _, v := range lp.vols {
		switch {
		case v.name == lp.image || v.esp || v.fs == "":
		case v.fs == "swap":
			lp.mounts = append(lp.mounts, []string{"UUID=" + v.uuid, "none", "swap", "sw", "0", "0"})
		case v.mount != "":
			lp.mounts = append(lp.mounts, []string{"UUID=" + v.uuid, v.mount, v.fs, "defaults,nofail", "0", "2"})
		}
	}
	return lp, nil
}

// planDisk places dp's partitions: 1 MiB aligned from the first MiB, the
// last one without a size taking the rest up to the table's end (the
// seed's start on the seed disk), and the seed's slot.
func (lp *layoutPlan) planDisk(dp *diskPlan) error {
	ld := dp.ld
	end := usableEnd(dp.t.size, dp.t.sector)
	if ld.GetTable() == "msdos" {
		end = min(dp.t.size, int64(1)<<32*512)
	}
	end = alignDown(end)
	if dp.seed {
		dp.seedStart = seedStart(usableEnd(dp.t.size, dp.t.sector))
		if ld.GetTable() == "msdos" {
			dp.seedStart = alignDown(min(dp.t.size, int64(1)<<32*512) - SeedSize)
		}
		end = dp.seedStart
	}
	pos := int64(alignment)
	for i, p := range ld.GetPartitions() {
		pp := &partPlan{lp: p, index: i + 1, start: pos}
		if n := int64(p.GetSizeBytes()); n > 0 {
			pp.end = pos + (n+alignment-1)/alignment*alignment
		} else {
			pp.end = end
		}
		if pp.end > end || pp.end-pp.start < alignment {
			what := "the partition table's end"
			if dp.seed {
				what = fmt.Sprintf("the %s seed partition at the disk's end", mib(SeedSize))
			}
			return fmt.Errorf("%w: disk %s (%s): partition %s does not fit before %s", ErrLayout, ld.GetName(), mib(dp.t.size), p.GetName(), what)
		}
		pos = pp.end
		dp.parts = append(dp.parts, pp)
		lp.parts[p.GetName()] = pp
		lp.partOf[p.GetName()] = dp
	}
	if dp.seed {
		dp.seedIndex = len(dp.parts) + 1
		if ld.GetTable() == "msdos" && dp.seedIndex > 4 {
			return fmt.Errorf("%w: disk %s: an msdos table with 4 partitions has no slot left for the seed partition (use 3, or gpt)", ErrLayout, ld.GetName())
		}
	}
	// MBR boot code boots the active partition: the esp (the image's
	// SYSLINUX boot partition is copied there), else the partition holding
	// the root filesystem.
	if ld.GetTable() == "msdos" {
		i := slices.IndexFunc(dp.parts, func(pp *partPlan) bool { return pp.lp.GetType() == "esp" })
		if i < 0 {
			i = slices.IndexFunc(dp.parts, func(pp *partPlan) bool { return pp.lp.GetType() == "linux" || pp.lp.GetType() == "raid" })
		}
		if i >= 0 {
			dp.parts[i].bootable = true
		}
	}
	return nil
}

// smallest is the size of the smallest of the named disks or partitions.
func (lp *layoutPlan) smallest(names []string) int64 {
	var lo int64 = -1
	for _, n := range names {
		var s int64
		if pp := lp.parts[n]; pp != nil {
			s = pp.end - pp.start
		} else if t := lp.whole[n]; t != nil {
			s = t.size
		}
		if lo < 0 || s < lo {
			lo = s
		}
	}
	return max(lo, 0)
}

// partPath is the kernel's name for partition n of disk: nvme0n1p2, vda2.
func partPath(disk string, n int) string {
	if c := disk[len(disk)-1]; c >= '0' && c <= '9' {
		return fmt.Sprintf("%sp%d", disk, n)
	}
	return fmt.Sprintf("%s%d", disk, n)
}

// dev is the device path of a layout name once it exists.
func (d *Deployer) dev(lp *layoutPlan, name string) string {
	if pp := lp.parts[name]; pp != nil {
		return d.cfg.partPath(lp.partOf[name].t.path, pp.index)
	}
	if t := lp.whole[name]; t != nil {
		return t.path
	}
	if p := lp.md[name]; p != "" {
		return p
	}
	for _, g := range lp.groups {
		for _, v := range g.GetVolumes() {
			if v.GetName() == name {
				return filepath.Join(d.cfg.Root, "dev", g.GetName(), name)
			}
		}
	}
	return ""
}

// deployLayout carries out a partitioned layout (see the package comment).
func (d *Deployer) deployLayout(ctx context.Context, plan *nodev1.DeployPlan, lp *layoutPlan, progress func(*nodev1.Progress), written *[]string, fail func(string, error) error) error {
	id := plan.GetDeploymentId()
	log := d.cfg.Logger.With("deployment", id)
	start := time.Now()
	report := func(step, detail string) {
		progress(&nodev1.Progress{Step: step, InstallId: id, Detail: detail})
	}

	// Tables, with the seed made first on its disk (the table naming it
	// is written after it), then the kernel's re-read.
	files := seedFiles(plan)
	if len(lp.mounts) > 0 {
		files = withMounts(files, lp.mounts)
	}
	var did []string
	for _, dp := range lp.disks {
		if err := d.writeDisk(lp, dp, files); err != nil {
			return fail(StepPartition, fmt.Errorf("disk %s: %w", dp.ld.GetName(), err))
		}
		what := fmt.Sprintf("%s table with %d partitions on %s", strings.ToUpper(dp.ld.GetTable()), len(dp.parts), dp.t.path)
		if dp.seed {
			what += fmt.Sprintf(" and the seed partition %d (CIDATA)", dp.seedIndex)
		}
		*written = append(*written, what)
		did = append(did, what)
	}
	for _, dp := range lp.disks {
		if err := d.rereadAndWait(dp); err != nil {
			return fail(StepPartition, err)
		}
	}
	for name, t := range lp.whole {
		// A whole-disk member: its old signatures go.
		if err := wipeEnds(t.path, 0, t.size); err != nil {
			return fail(StepPartition, fmt.Errorf("disk %s: %w", name, err))
		}
	}
	for _, mod := range lp.modules {
		if d.cfg.Modules == nil {
			break
		}
		if err := d.cfg.Modules.Load(mod); err != nil {
			// It may be built in; mdadm or lvm says so if not.
			log.Warn("module not loaded", "module", mod, "err", err)
		}
	}
	for _, r := range lp.raids {
		if err := d.createRaid(ctx, lp, r); err != nil {
			return fail(StepPartition, err)
		}
		what := fmt.Sprintf("%s array %s (%s) of %s", r.GetLevel(), r.GetName(), lp.md[r.GetName()], strings.Join(r.GetDevices(), ", "))
		*written = append(*written, what)
		did = append(did, what)
	}
	for _, g := range lp.groups {
		if err := d.createGroup(ctx, lp, g); err != nil {
			return fail(StepPartition, err)
		}
		what := fmt.Sprintf("volume group %s with %d volumes", g.GetName(), len(g.GetVolumes()))
		*written = append(*written, what)
		did = append(did, what)
	}
	report(StepPartition, strings.Join(did, "; "))

	// The image's root filesystem, then its boot partition onto every esp.
	fetch := stallGuard(diskwrite.HTTPFetch(d.cfg.HTTP, plan.GetImageUrl()), d.cfg.StallTimeout)
	target := d.dev(lp, lp.image)
	root := lp.it.root
	if err := d.writePart(ctx, plan, lp.m, fetch, *root, target, progress); err != nil {
		*written = append(*written, "part of the image's root filesystem on "+target)
		return fail(StepImage, err)
	}
	*written = append(*written, fmt.Sprintf("the image's root filesystem (its partition %d) on %s", root.index, target))
	for _, v := range lp.vols {
		if !v.esp {
			continue
		}
		dev := d.dev(lp, v.name)
		if err := d.writePart(ctx, plan, lp.m, fetch, *lp.it.boot, dev, nil); err != nil {
			return fail(StepImage, fmt.Errorf("copy the image's boot partition to %s: %w", v.name, err))
		}
		*written = append(*written, fmt.Sprintf("the image's boot partition on %s", dev))
	}
	log.Info("image written", "device", target, "seconds", time.Since(start).Seconds())

	// The other filesystems.
	var made []string
	for _, v := range lp.vols {
		if v.name == lp.image || v.esp || v.fs == "" {
			continue
		}
		dev := d.dev(lp, v.name)
		var err error
		if v.fs == "swap" {
			err = d.cfg.run(ctx, "mkswap", "-U", v.uuid, dev)
		} else {
			err = d.cfg.run(ctx, "mke2fs", "-q", "-F", "-t", v.fs, "-U", v.uuid, dev)
		}
		if err != nil {
			return fail(StepSeed, fmt.Errorf("make %s on %s %s: %w", v.fs, v.kind, v.name, err))
		}
		made = append(made, v.fs+" on "+v.name)
		*written = append(*written, v.fs+" on "+dev)
	}
	names := make([]string, 0, len(files))
	for _, sf := range files {
		names = append(names, sf.name)
	}
	detail := fmt.Sprintf("CIDATA on %s partition %d: %s", lp.seed.ld.GetName(), lp.seed.seedIndex, strings.Join(names, ", "))
	if len(made) > 0 {
		detail += "; " + strings.Join(made, ", ")
	}
	report(StepSeed, detail)
	progress(&nodev1.Progress{Step: StepWritten, Done: true, InstallId: id, Detail: fmt.Sprintf("%s on %s (%s) in %.1f s", short(plan.GetImageSha256()), lp.image, target, time.Since(start).Seconds())})
	log.Info("deploy written", "image_on", target, "seconds", time.Since(start).Seconds())
	return nil
}
