package install

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Disk is a whole block device as sysfs describes it.
type Disk struct {
	Name       string // kernel name: vda, sdb, nvme0n1
	Size       int64  // bytes
	SectorSize int    // logical block size in bytes
	Model      string
	Removable  bool
	ReadOnly   bool
	// Mounted names a mounted device on this disk (the disk itself or one
	// of its partitions), "" when none.
	Mounted string
	// Partitions are the kernel names of the disk's partitions, in order.
	Partitions []string
}

// String is "vdb (100.0 GiB, QEMU HARDDISK)".
func (d Disk) String() string {
	s := fmt.Sprintf("%s (%s", d.Name, humanSize(d.Size))
	if d.Model != "" {
		s += ", " + d.Model
	}
	return s + ")"
}

func humanSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}

// virtualPrefixes are block devices that are never install targets chosen
// automatically: loop, RAM and compressed-RAM disks, optical and floppy
// drives, software RAID and device-mapper, network block devices.
var virtualPrefixes = []string{"loop", "ram", "zram", "sr", "fd", "md", "dm-", "nbd"}

// ListDisks reads the whole disks under root/sys/block, with the mounts of
// root/proc/mounts, sorted by name. A missing sys/block is an error.
func ListDisks(root string) ([]Disk, error) {
	dir := filepath.Join(root, "sys/block")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("install: list disks: %w", err)
	}
	mounted := mountedDevices(root)
	var disks []Disk
	for _, e := range entries {
		name := e.Name()
		if strings.Contains(name, "boot") && strings.HasPrefix(name, "mmcblk") || strings.HasSuffix(name, "rpmb") {
			continue // eMMC boot and RPMB areas
		}
		base := filepath.Join(dir, name)
		d := Disk{Name: name, SectorSize: 512}
		if n, err := readInt(filepath.Join(base, "size")); err == nil {
			d.Size = n * 512 // sysfs counts 512-byte sectors whatever the device's
		}
		if n, err := readInt(filepath.Join(base, "queue/logical_block_size")); err == nil && n > 0 {
			d.SectorSize = int(n)
		}
		d.Removable = readString(filepath.Join(base, "removable")) == "1"
		d.ReadOnly = readString(filepath.Join(base, "ro")) == "1"
		d.Model = readString(filepath.Join(base, "device/model"))
		if mounted[name] {
			d.Mounted = name
		}
		parts, _ := os.ReadDir(base)
		for _, p := range parts {
			if _, err := os.Stat(filepath.Join(base, p.Name(), "partition")); err != nil {
				continue
			}
			d.Partitions = append(d.Partitions, p.Name())
			if mounted[p.Name()] && d.Mounted == "" {
				d.Mounted = p.Name()
			}
		}
		disks = append(disks, d)
	}
	slices.SortFunc(disks, func(a, b Disk) int { return strings.Compare(a.Name, b.Name) })
	return disks, nil
}

// mountedDevices are the kernel names of the /dev block devices mounted
// per root/proc/mounts.
func mountedDevices(root string) map[string]bool {
	out := map[string]bool{}
	f, err := os.Open(filepath.Join(root, "proc/mounts"))
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		src, _, _ := strings.Cut(sc.Text(), " ")
		if name, ok := strings.CutPrefix(src, "/dev/"); ok {
			out[name] = true
			// /dev/mapper/x and /dev/disk/by-*/... are resolved by the kernel
			// name when the link exists.
			if target, err := filepath.EvalSymlinks(filepath.Join(root, src)); err == nil {
				out[filepath.Base(target)] = true
			}
		}
	}
	return out
}

// eligible says why d cannot be chosen automatically ("" when it can).
func (d Disk) ineligible() string {
	switch {
	case slices.ContainsFunc(virtualPrefixes, func(p string) bool { return strings.HasPrefix(d.Name, p) }):
		return "virtual device"
	case d.Size == 0:
		return "no medium"
	case d.Removable:
		return "removable"
	case d.ReadOnly:
		return "read-only"
	case d.Mounted != "":
		return "/dev/" + d.Mounted + " is mounted (boot media?)"
	}
	return ""
}

// ErrNoDisk means no disk fits the plan.
var ErrNoDisk = errors.New("no suitable disk")

// ChooseDisk picks the plan's target among disks. want "" or "auto" is the
// largest disk that is not virtual, removable, read-only, empty or mounted
// (ties: the first by name); "/dev/NAME" or "NAME" must be one of disks,
// neither empty, read-only nor mounted. Errors wrap ErrNoDisk and list the
// disks present.
func ChooseDisk(disks []Disk, want string) (Disk, error) {
	want = strings.TrimSpace(want)
	if want == "" || want == "auto" {
		var best *Disk
		for i := range disks {
			if disks[i].ineligible() != "" {
				continue
			}
			if best == nil || disks[i].Size > best.Size {
				best = &disks[i]
			}
		}
		if best == nil {
			return Disk{}, fmt.Errorf("%w: no non-removable, writable, unmounted disk found; disks present: %s", ErrNoDisk, listing(disks))
		}
		return *best, nil
	}
	name := strings.TrimPrefix(want, "/dev/")
	for _, d := range disks {
		if d.Name != name {
			continue
		}
		switch {
		case d.Size == 0:
			return Disk{}, fmt.Errorf("%w: /dev/%s has no medium (size 0)", ErrNoDisk, name)
		case d.ReadOnly:
			return Disk{}, fmt.Errorf("%w: /dev/%s is read-only", ErrNoDisk, name)
		case d.Mounted != "":
			return Disk{}, fmt.Errorf("%w: /dev/%s is in use: /dev/%s is mounted", ErrNoDisk, name, d.Mounted)
		}
		return d, nil
	}
	return Disk{}, fmt.Errorf("%w: %s is not a whole disk on this machine; disks present: %s", ErrNoDisk, want, listing(disks))
}

func listing(disks []Disk) string {
	if len(disks) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(disks))
	for _, d := range disks {
		s := "/dev/" + d.String()
		if why := d.ineligible(); why != "" {
			s += " [" + why + "]"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

func readString(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func readInt(path string) (int64, error) {
	return strconv.ParseInt(readString(path), 10, 64)
}
