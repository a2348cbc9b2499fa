package hvboot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/corralhq/corral/agent/install"
)

// ErrNoDataPartition means no block device carries the data partition's name
// or label.
var ErrNoDataPartition = errors.New("no data partition")

// FindDataPartition returns the /dev path (under root) of the partition
// agent/install made: the block device whose root/sys/class/block/*/uevent
// says PARTNAME=corral-data, else the one whose ext4 label is corral-data.
// None, or more than one, is an error naming what was seen.
func FindDataPartition(root string) (string, error) {
	dir := filepath.Join(root, "sys/class/block")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("list block devices: %w", err)
	}
	var byName, byLabel, seen []string
	for _, e := range entries {
		ev := uevent(filepath.Join(dir, e.Name(), "uevent"))
		name := ev["DEVNAME"]
		if name == "" {
			name = e.Name()
		}
		seen = append(seen, name)
		if ev["DEVTYPE"] == "partition" && ev["PARTNAME"] == install.PartitionName {
			byName = append(byName, name)
			continue
		}
		if label, ok := ext4Label(filepath.Join(root, "dev", name)); ok && label == install.PartitionName {
			byLabel = append(byLabel, name)
		}
	}
	found := byName
	if len(found) == 0 {
		found = byLabel
	}
	slices.Sort(found)
	switch len(found) {
	case 0:
		slices.Sort(seen)
		return "", fmt.Errorf("%w: no block device has GPT partition name or ext4 label %q (was this machine installed? block devices: %s)",
			ErrNoDataPartition, install.PartitionName, strings.Join(seen, ", "))
	case 1:
		path := filepath.Join(root, "dev", found[0])
		if _, err := os.Stat(path); err != nil {
			return "", fmt.Errorf("data partition %s: %w", found[0], err)
		}
		return path, nil
	}
	return "", fmt.Errorf("several data partitions named %q: %s; wipe all but one", install.PartitionName, strings.Join(found, ", "))
}

// uevent parses a sysfs uevent file (KEY=VALUE lines).
func uevent(path string) map[string]string {
	out := map[string]string{}
	b, err := os.ReadFile(path)
	if err != nil {
		return out
	}
	for line := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
			out[k] = v
		}
	}
	return out
}

// ext4Label reads the volume label of an ext2/3/4 superblock.
func ext4Label(dev string) (string, bool) {
	f, err := os.Open(dev)
	if err != nil {
		return "", false
	}
	defer f.Close()
	sb := make([]byte, 1024)
	if _, err := f.ReadAt(sb, 1024); err != nil {
		return "", false
	}
	if binary.LittleEndian.Uint16(sb[0x38:]) != 0xEF53 {
		return "", false
	}
	label := sb[0x78 : 0x78+16]
	if i := slices.Index(label, 0); i >= 0 {
		label = label[:i]
	}
	return string(label), true
}
