package deploy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/corralhq/corral/agent/install"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/internal/diskmap"
)

// target is the disk the image goes onto, as checked.
type target struct {
	path   string // device path under Root (symlinks resolved)
	size   int64
	sector int
	block  bool // a block device (false: a regular file, tests)
	m      *diskmap.Map
}

// check refuses, before anything is written, a plan this agent cannot
// apply or whose layout does not fit the real disks, and returns the
// image's disk (a whole-disk layout) or the planned layout (a
// partitioned one).
func (d *Deployer) check(ctx context.Context, plan *nodev1.DeployPlan) (*target, *layoutPlan, error) {
	layout := plan.GetLayout()
	if layout == nil || len(layout.GetDisks()) == 0 {
		return nil, nil, fmt.Errorf("%w: the plan has no disk layout", ErrLayout)
	}
	if partitioned(layout) {
		m, err := d.checkMap(plan)
		if err != nil {
			return nil, nil, err
		}
		lp, err := d.checkLayout(ctx, plan, m)
		return nil, lp, err
	}
	t, err := d.checkWhole(plan)
	return t, nil, err
}

// checkMap parses the plan's block map against its digest and size.
func (d *Deployer) checkMap(plan *nodev1.DeployPlan) (*diskmap.Map, error) {
	m, err := diskmap.Parse(plan.GetBlockMap(), plan.GetBlockMapSha256())
	if err != nil {
		return nil, fmt.Errorf("block map: %w", err)
	}
	if n := plan.GetImageSize(); n != 0 && n != m.Size {
		return nil, fmt.Errorf("%w: the plan says the image is %d bytes, its block map %d", diskmap.ErrMalformed, n, m.Size)
	}
	return m, nil
}

// checkWhole checks a whole-disk layout: the image onto one disk, grown,
// with the seed after it.
func (d *Deployer) checkWhole(plan *nodev1.DeployPlan) (*target, error) {
	layout := plan.GetLayout()
	var image *inventoryv1.LayoutDisk
	for _, ld := range layout.GetDisks() {
		if ld.GetName() == layout.GetImage() || layout.GetImage() == "" && len(layout.GetDisks()) == 1 {
			image = ld
		}
	}
	if image == nil {
		return nil, fmt.Errorf("%w: the image goes onto %q, which is no disk of the layout", ErrLayout, layout.GetImage())
	}
	m, err := d.checkMap(plan)
	if err != nil {
		return nil, err
	}
	disks, err := d.cfg.Disks()
	if err != nil {
		return nil, fmt.Errorf("list disks: %w", err)
	}
	var t *target
	for _, ld := range layout.GetDisks() {
		c, err := d.checkDisk(ld, disks)
		if err != nil {
			return nil, err
		}
		if ld == image {
			t = c
		}
	}
	t.m = m
	if t.sector != 512 {
		// go-diskfs makes FAT16 with 512-byte sectors only, which Linux
		// does not mount from a device with larger ones; and the
		// appliance's images are laid out for 512-byte sectors.
		return nil, fmt.Errorf("%w: disk %s has %d-byte sectors; a deploy onto a disk with sectors other than 512 bytes", ErrUnsupported, t.path, t.sector)
	}
	if m.Size > t.size {
		return nil, fmt.Errorf("%w: the image (%d bytes, %s) is larger than disk %s (%d bytes, %s)", ErrLayout, m.Size, mib(m.Size), t.path, t.size, mib(t.size))
	}
	// The conservative bound (a GPT's tail, MBR's 2 TiB): the table's own
	// is checked again once it is read.
	if room := seedStart(usableEnd(t.size, t.sector)); m.Size > room {
		return nil, fmt.Errorf("%w: disk %s (%s) has no room for the image (%s) and the %s seed partition after it", ErrLayout, t.path, mib(t.size), mib(m.Size), mib(SeedSize))
	}
	return t, nil
}

// checkDisk finds ld's device among disks and checks it can be written.
func (d *Deployer) checkDisk(ld *inventoryv1.LayoutDisk, disks []install.Disk) (*target, error) {
	dev := ld.GetDevice()
	if !strings.HasPrefix(dev, "/dev/") {
		return nil, fmt.Errorf("%w: disk %s: device %q is not a /dev path", ErrLayout, ld.GetName(), dev)
	}
	path := filepath.Join(d.cfg.Root, dev)
	if resolved, err := filepath.EvalSymlinks(path); err == nil {
		path = resolved
	}
	name := filepath.Base(path)
	i := slices.IndexFunc(disks, func(k install.Disk) bool { return k.Name == name })
	if i < 0 {
		return nil, fmt.Errorf("%w: disk %s: %s is not a whole disk on this machine (disks: %s)", ErrLayout, ld.GetName(), dev, diskNames(disks))
	}
	k := disks[i]
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%w: disk %s: %v", ErrLayout, ld.GetName(), err)
	}
	block := st.Mode()&os.ModeDevice != 0 && st.Mode()&os.ModeCharDevice == 0
	switch {
	case !block && !(d.cfg.allowFiles && st.Mode().IsRegular()):
		return nil, fmt.Errorf("%w: disk %s: %s is not a block device", ErrLayout, ld.GetName(), dev)
	case k.Mounted != "":
		return nil, fmt.Errorf("%w: disk %s: %s is in use (/dev/%s is mounted: the boot media?)", ErrLayout, ld.GetName(), dev, k.Mounted)
	case k.ReadOnly:
		return nil, fmt.Errorf("%w: disk %s: %s is read-only", ErrLayout, ld.GetName(), dev)
	case k.Size <= 0:
		return nil, fmt.Errorf("%w: disk %s: %s has no medium", ErrLayout, ld.GetName(), dev)
	case uint64(k.Size) < ld.GetSizeBytes():
		return nil, fmt.Errorf("%w: disk %s: %s is %d bytes, the layout expects at least %d", ErrLayout, ld.GetName(), dev, k.Size, ld.GetSizeBytes())
	}
	return &target{path: path, size: k.Size, sector: max(k.SectorSize, 512), block: block}, nil
}

func diskNames(disks []install.Disk) string {
	if len(disks) == 0 {
		return "none"
	}
	names := make([]string, 0, len(disks))
	for _, k := range disks {
		names = append(names, "/dev/"+k.String())
	}
	return strings.Join(names, ", ")
}

// usableEnd is the conservative end of the space partitions may use on a
// disk of size bytes: before a GPT's backup (header and a 128-entry
// array) and within MBR's 2^32 sectors.
func usableEnd(size int64, sector int) int64 {
	return min(size-int64(sector)-128*128, int64(1)<<32*int64(sector))
}

// seedStart is where the seed partition starts when partitions may use
// the space before end: SeedSize before it, aligned down.
func seedStart(end int64) int64 {
	return (end - SeedSize) / alignment * alignment
}
