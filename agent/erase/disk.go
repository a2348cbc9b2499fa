package erase

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// kind is what secure erase the device may have of its own.
type kind int

const (
	kindOther kind = iota
	kindNVMe
	kindATA
)

func (k kind) String() string {
	return [...]string{"other", "nvme", "ata"}[k]
}

// disk is a whole disk an erase may write, as sysfs describes it.
type disk struct {
	name string // kernel name: sda, nvme0n1
	path string // /dev/<name> under Config.Root
	size int64  // bytes
	// discard: the queue takes discards (queue/discard_max_bytes > 0).
	discard bool
	// parts are the partitions the kernel lists (start and size).
	parts []extent
	kind  kind
	// ctrl is an NVMe namespace's controller character device (dev/nvmeX):
	// the kernel takes admin commands that do not name the namespace
	// (Identify Controller, sanitize, log pages) only there.
	ctrl string
}

// show is the disk's name for people and the appliance: /dev/<name>
// (path differs under a test's root).
func (d disk) show() string { return "/dev/" + d.name }

// extent is a byte range of a disk.
type extent struct{ off, n int64 }

// system is what the eraser asks of the kernel.
type system interface {
	// disk checks that path names a whole disk that may be erased and
	// describes it; a refusal wraps ErrRefused.
	disk(path string) (disk, error)
	// open opens d for reading and writing, exclusively.
	open(d disk) (device, error)
}

// kernel is the real system under root.
type kernel struct{ root string }

// nameRe is what a kernel block device name may look like.
var nameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:+-]*$`)

// notDisks are whole block devices in sys/block that are not disks of
// their own: RAM and compressed-RAM disks, RAID and device-mapper volumes
// (erase their members), optical and floppy drives.
var notDisks = map[string]string{
	"ram":  "a RAM disk",
	"zram": "a compressed RAM disk",
	"md":   "a software RAID volume (erase its member disks)",
	"dm-":  "a device-mapper volume (erase the disks under it)",
	"sr":   "an optical drive",
	"fd":   "a floppy drive",
}

// disk checks path against sysfs, never trusting the name: it must be
// /dev/NAME (or NAME) where sys/block/NAME is a whole disk and dev/NAME
// the block device of the same major:minor; the disk must have a medium,
// be writable, and hold nothing mounted or swapped on, directly or
// through a RAID or device-mapper volume built on it.
func (k kernel) disk(path string) (disk, error) {
	name := strings.TrimPrefix(path, "/dev/")
	if path == "" || !nameRe.MatchString(name) || name == "." || name == ".." {
		return disk{}, refuse("%q is not a disk's path (/dev/NAME)", path)
	}
	show := "/dev/" + name
	base := filepath.Join(k.root, "sys/block", name)
	if _, err := os.Stat(base); err != nil {
		if _, err := os.Stat(filepath.Join(k.root, "sys/class/block", name, "partition")); err == nil {
			return disk{}, refuse("%s is a partition, not a whole disk", show)
		}
		return disk{}, refuse("%s is not a whole disk on this machine (no /sys/block/%s)", show, name)
	}
	for prefix, what := range notDisks {
		if strings.HasPrefix(name, prefix) && (prefix != "md" || isDigits(name[2:])) {
			return disk{}, refuse("%s is %s", show, what)
		}
	}
	devno := readString(filepath.Join(base, "dev"))
	d := disk{name: name, path: filepath.Join(k.root, "dev", name)}
	var st unixStat
	if err := statDev(d.path, &st); err != nil {
		return disk{}, refuse("%s: %v", show, err)
	}
	if !st.block {
		return disk{}, refuse("%s is not a block device", show)
	}
	if st.devno != devno {
		return disk{}, refuse("%s is device %s but sysfs names %s as %s", show, st.devno, name, devno)
	}
	sectors, _ := readInt(filepath.Join(base, "size"))
	d.size = sectors * 512 // sysfs counts 512-byte sectors whatever the device's
	if d.size == 0 {
		return disk{}, refuse("%s has no medium (size 0)", show)
	}
	if readString(filepath.Join(base, "ro")) == "1" {
		return disk{}, refuse("%s is read-only", show)
	}
	if n, _ := readInt(filepath.Join(base, "queue/discard_max_bytes")); n > 0 {
		d.discard = true
	}
	entries, _ := os.ReadDir(base)
	var partNames []string
	for _, e := range entries {
		p := filepath.Join(base, e.Name())
		if _, err := os.Stat(filepath.Join(p, "partition")); err != nil {
			continue
		}
		start, err1 := readInt(filepath.Join(p, "start"))
		size, err2 := readInt(filepath.Join(p, "size"))
		if err1 != nil || err2 != nil {
			continue
		}
		d.parts = append(d.parts, extent{start * 512, size * 512})
		partNames = append(partNames, e.Name())
	}
	if where := k.inUse(name, partNames); where != "" {
		return disk{}, refuse("%s is in use: %s (the running system's boot media?)", show, where)
	}
	switch {
	case strings.HasPrefix(name, "nvme"):
		d.kind = kindNVMe
		d.ctrl = k.nvmeController(base)
	case strings.TrimSpace(readString(filepath.Join(base, "device/vendor"))) == "ATA":
		d.kind = kindATA // libata's SCSI translation names every ATA disk's vendor "ATA"
	}
	return d, nil
}

// ctrlRe is an NVMe controller's name.
var ctrlRe = regexp.MustCompile(`^nvme[0-9]+$`)

// nvmeController finds the controller character device of the namespace
// at base (sys/block/nvmeXnY): its device link is the controller, or,
// for a multipath namespace, the subsystem listing its controllers. The
// node must be a character device of the controller's major:minor; ""
// when none is found.
func (k kernel) nvmeController(base string) string {
	dev := filepath.Join(base, "device")
	candidates := []string{dev}
	entries, _ := os.ReadDir(dev)
	for _, e := range entries {
		if ctrlRe.MatchString(e.Name()) {
			candidates = append(candidates, filepath.Join(dev, e.Name()))
		}
	}
	for _, c := range candidates {
		devno := readString(filepath.Join(c, "dev"))
		resolved, err := filepath.EvalSymlinks(c)
		if devno == "" || err != nil || !ctrlRe.MatchString(filepath.Base(resolved)) {
			continue
		}
		node := filepath.Join(k.root, "dev", filepath.Base(resolved))
		var st unixStat
		if statDev(node, &st) == nil && st.char && st.devno == devno {
			return node
		}
	}
	return ""
}

// inUse says what of disk (or its partitions, or the RAID and
// device-mapper volumes built on them, recursively) is mounted or swapped
// on, "" when nothing is. Mounts are matched by major:minor as well as by
// source name, so a bind or a renamed node does not hide one.
func (k kernel) inUse(name string, parts []string) string {
	mounted := map[string]string{} // major:minor or kernel name -> what
	if f, err := os.Open(filepath.Join(k.root, "proc/self/mountinfo")); err == nil {
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 5 {
				continue
			}
			what := "mounted on " + fields[4]
			mounted[fields[2]] = what
			if i := slices.Index(fields, "-"); i > 0 && i+2 < len(fields) {
				if src, ok := strings.CutPrefix(fields[i+2], "/dev/"); ok {
					mounted[filepath.Base(src)] = what
					if t, err := filepath.EvalSymlinks(filepath.Join(k.root, "dev", src)); err == nil {
						mounted[filepath.Base(t)] = what
					}
				}
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile(filepath.Join(k.root, "proc/swaps")); err == nil {
		for _, line := range strings.Split(string(b), "\n")[1:] {
			if src, ok := strings.CutPrefix(strings.Fields(line + " x")[0], "/dev/"); ok {
				mounted[filepath.Base(src)] = "swapped on"
			}
		}
	}
	seen := map[string]bool{}
	var check func(dev, dir string) string
	check = func(dev, dir string) string {
		if seen[dir] {
			return ""
		}
		seen[dir] = true
		for _, key := range []string{dev, readString(filepath.Join(dir, "dev"))} {
			if what, ok := mounted[key]; ok && key != "" {
				return "/dev/" + dev + " is " + what
			}
		}
		holders, _ := os.ReadDir(filepath.Join(dir, "holders"))
		for _, h := range holders {
			if w := check(h.Name(), filepath.Join(k.root, "sys/block", h.Name())); w != "" {
				return w
			}
		}
		return ""
	}
	base := filepath.Join(k.root, "sys/block", name)
	if w := check(name, base); w != "" {
		return w
	}
	for _, p := range parts {
		if w := check(p, filepath.Join(base, p)); w != "" {
			return w
		}
	}
	return ""
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
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
