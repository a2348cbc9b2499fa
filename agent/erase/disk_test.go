package erase

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralhq/corral/testsupport/require"
)

// blockDevice finds a block device node on this machine for fixtures to
// point at, and its major:minor.
func blockDevice(t *testing.T) (string, string) {
	t.Helper()
	for _, p := range []string{"/dev/loop0", "/dev/loop1", "/dev/sda", "/dev/vda", "/dev/nvme0n1"} {
		var st unixStat
		if statDev(p, &st) == nil && st.block {
			return p, st.devno
		}
	}
	require.Missing(t, "no block device node (/dev/loop0, /dev/sda, /dev/vda) for the sysfs fixtures to point at")
	return "", ""
}

func put(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fixture is a root with sys/, dev/ and proc/ for one disk, sda, with two
// partitions; change edits it before the check.
func fixture(t *testing.T, change func(root, devno string)) string {
	t.Helper()
	node, devno := blockDevice(t)
	root := t.TempDir()
	base := filepath.Join(root, "sys/block/sda")
	put(t, filepath.Join(base, "dev"), devno)
	put(t, filepath.Join(base, "size"), "131072") // 64 MiB
	put(t, filepath.Join(base, "ro"), "0")
	put(t, filepath.Join(base, "queue/discard_max_bytes"), "0")
	put(t, filepath.Join(base, "device/vendor"), "ATA     ")
	for i, p := range []struct{ start, size string }{{"2048", "65536"}, {"67584", "61440"}} {
		name := "sda" + string(rune('1'+i))
		put(t, filepath.Join(base, name, "partition"), string(rune('1'+i)))
		put(t, filepath.Join(base, name, "start"), p.start)
		put(t, filepath.Join(base, name, "size"), p.size)
		put(t, filepath.Join(base, name, "dev"), "8:"+string(rune('1'+i)))
		put(t, filepath.Join(root, "sys/class/block", name, "partition"), string(rune('1'+i)))
	}
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(node, filepath.Join(root, "dev/sda")); err != nil {
		t.Fatal(err)
	}
	put(t, filepath.Join(root, "proc/self/mountinfo"), "22 1 0:21 / /proc rw - proc proc rw\n23 1 0:5 / /dev rw - devtmpfs devtmpfs rw")
	put(t, filepath.Join(root, "proc/swaps"), "Filename\tType\tSize\tUsed\tPriority")
	if change != nil {
		change(root, devno)
	}
	return root
}

func TestKernelDisk(t *testing.T) {
	tests := map[string]struct {
		path   string
		change func(root, devno string)
		err    string
	}{
		"empty":            {path: "", err: `"" is not a disk's path (/dev/NAME)`},
		"dot dot":          {path: "/dev/../etc/passwd", err: `"/dev/../etc/passwd" is not a disk's path (/dev/NAME)`},
		"dot dot name":     {path: "/dev/..", err: `is not a disk's path`},
		"subdirectory":     {path: "/dev/disk/by-id/x", err: `is not a disk's path`},
		"partition":        {path: "/dev/sda1", err: "/dev/sda1 is a partition, not a whole disk"},
		"unknown":          {path: "/dev/sdz", err: "/dev/sdz is not a whole disk on this machine (no /sys/block/sdz)"},
		"md":               {path: "/dev/md0", change: func(root, _ string) { put(t, filepath.Join(root, "sys/block/md0/dev"), "9:0") }, err: "/dev/md0 is a software RAID volume (erase its member disks)"},
		"dm":               {path: "/dev/dm-0", change: func(root, _ string) { put(t, filepath.Join(root, "sys/block/dm-0/dev"), "253:0") }, err: "/dev/dm-0 is a device-mapper volume"},
		"regular file":     {path: "sda", change: func(root, _ string) { os.Remove(root + "/dev/sda"); put(t, root+"/dev/sda", "") }, err: "/dev/sda is not a block device"},
		"no node":          {path: "sda", change: func(root, _ string) { os.Remove(root + "/dev/sda") }, err: "/dev/sda: no such file or directory"},
		"other device":     {path: "/dev/sda", change: func(root, _ string) { put(t, root+"/sys/block/sda/dev", "259:99") }, err: "but sysfs names sda as 259:99"},
		"no medium":        {path: "/dev/sda", change: func(root, _ string) { put(t, root+"/sys/block/sda/size", "0") }, err: "/dev/sda has no medium (size 0)"},
		"read-only":        {path: "/dev/sda", change: func(root, _ string) { put(t, root+"/sys/block/sda/ro", "1") }, err: "/dev/sda is read-only"},
		"disk mounted":     {path: "/dev/sda", change: mount("7 1 %s / / rw - ext4 /dev/root rw", ""), err: "/dev/sda is in use: /dev/sda is mounted on / (the running system's boot media?)"},
		"partition by num": {path: "/dev/sda", change: mount("7 1 8:2 / /boot rw - ext4 /dev/root rw", ""), err: "/dev/sda2 is mounted on /boot"},
		"partition by src": {path: "/dev/sda", change: mount("7 1 0:33 / /mnt rw - btrfs /dev/sda1 rw", ""), err: "/dev/sda1 is mounted on /mnt"},
		"swap":             {path: "/dev/sda", change: mount("", "/dev/sda2 partition 1024 0 -2"), err: "/dev/sda2 is swapped on"},
		"under a volume": {path: "/dev/sda", change: func(root, devno string) {
			put(t, root+"/sys/block/sda/sda2/holders/dm-0", "")
			put(t, root+"/sys/block/dm-0/dev", "253:0")
			mount("7 1 253:0 / /srv rw - xfs /dev/mapper/vg-srv rw", "")(root, devno)
		}, err: "/dev/dm-0 is mounted on /srv"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			root := fixture(t, tc.change)
			_, err := kernel{root: root}.disk(tc.path)
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, ErrRefused) {
				t.Fatalf("err = %v, want a refusal with %q", err, tc.err)
			}
		})
	}

	t.Run("accepted", func(t *testing.T) {
		root := fixture(t, func(root, _ string) { put(t, root+"/sys/block/sda/queue/discard_max_bytes", "2147450880") })
		for _, p := range []string{"/dev/sda", "sda"} {
			d, err := kernel{root: root}.disk(p)
			if err != nil {
				t.Fatal(err)
			}
			want := disk{name: "sda", path: filepath.Join(root, "dev/sda"), size: 64 * mib, discard: true,
				parts: []extent{{mib, 32 * mib}, {33 * mib, 30 * mib}}, kind: kindATA}
			if diff := cmp.Diff(want, d, cmp.AllowUnexported(disk{}, extent{})); diff != "" {
				t.Errorf("disk (-want +got):\n%s", diff)
			}
		}
	})
	t.Run("nvme", func(t *testing.T) {
		root := fixture(t, func(root, devno string) {
			if err := os.Rename(root+"/sys/block/sda", root+"/sys/block/nvme0n1"); err != nil {
				t.Fatal(err)
			}
			os.Rename(root+"/dev/sda", root+"/dev/nvme0n1")
			// The namespace's device link is its controller, nvme0, a
			// character device (here /dev/null's 1:3).
			os.RemoveAll(root + "/sys/block/nvme0n1/device")
			put(t, root+"/sys/class/nvme/nvme0/dev", "1:3")
			if err := os.Symlink(root+"/sys/class/nvme/nvme0", root+"/sys/block/nvme0n1/device"); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("/dev/null", root+"/dev/nvme0"); err != nil {
				t.Fatal(err)
			}
		})
		d, err := kernel{root: root}.disk("/dev/nvme0n1")
		if err != nil || d.kind != kindNVMe || d.ctrl != root+"/dev/nvme0" {
			t.Errorf("disk = %+v, %v", d, err)
		}
		// A multipath namespace: the device link is the subsystem, which
		// lists its controllers.
		os.Remove(root + "/sys/block/nvme0n1/device")
		put(t, root+"/sys/class/nvme-subsystem/nvme-subsys0/subsysnqn", "nqn.test")
		os.Symlink(root+"/sys/class/nvme/nvme0", root+"/sys/class/nvme-subsystem/nvme-subsys0/nvme0")
		os.Symlink(root+"/sys/class/nvme-subsystem/nvme-subsys0", root+"/sys/block/nvme0n1/device")
		if d, err := (kernel{root: root}).disk("/dev/nvme0n1"); err != nil || d.ctrl != root+"/dev/nvme0" {
			t.Errorf("multipath: disk = %+v, %v", d, err)
		}
		// No controller node: none found.
		os.Remove(root + "/dev/nvme0")
		if d, err := (kernel{root: root}).disk("/dev/nvme0n1"); err != nil || d.ctrl != "" {
			t.Errorf("no node: disk = %+v, %v", d, err)
		}
	})
}

// mount returns a fixture change adding a mountinfo line (with %s the
// disk's major:minor) and a swaps line.
func mount(line, swap string) func(root, devno string) {
	return func(root, devno string) {
		if line != "" {
			b, _ := os.ReadFile(root + "/proc/self/mountinfo")
			os.WriteFile(root+"/proc/self/mountinfo", append(b, []byte(strings.Replace(line, "%s", devno, 1)+"\n")...), 0o644)
		}
		if swap != "" {
			b, _ := os.ReadFile(root + "/proc/swaps")
			os.WriteFile(root+"/proc/swaps", append(b, []byte(swap+"\n")...), 0o644)
		}
	}
}
