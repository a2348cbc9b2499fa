package deploy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/diskfs/go-diskfs/partition/mbr"

	"github.com/corralhq/corral/agent/coldplug"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/testsupport/require"
)

// The real tools' image: an MBR with 440 bytes of boot code, partition 1
// the active EFI system partition (FAT from mkfs.vfat, label EFI) and
// partition 2 an ext4 labelled root made by mke2fs -d from a directory
// holding realFiles.
const (
	rImageSize = 40 << 20
	rBootStart = 1 << 20
	rBootSize  = 8 << 20
	rRootStart = rBootStart + rBootSize
	rRootSize  = rImageSize - rRootStart
)

var realFiles = map[string]string{"/etc/hostname": "from-the-image\n", "/hello": "written by mke2fs -d\n"}

// TestDeployRealTools deploys partitioned layouts onto loop devices with
// the real mdadm, lvm, mke2fs and mkswap, and checks the result with the
// real tools: a RAID10 of four GPT disks holding the root, and an LVM
// volume group of an msdos partition and a whole disk holding the root
// and /srv. It needs root, the tools, and a kernel with md, raid10,
// device-mapper and msdos and GPT partition tables (loaded as modules
// where they are: the deployer loads them as on a machine).
func TestDeployRealTools(t *testing.T) {
	require.Root(t, "loop devices, mdadm, lvm")
	realKernel(t)
	require.Tool(t, realTools...)
	image := buildRealImage(t)

	t.Run("raid10", func(t *testing.T) {
		start := time.Now()
		var loops []string
		for range 4 {
			loops = append(loops, loopDisk(t, 64<<20))
		}
		n := freeMD(t)
		md := fmt.Sprintf("/dev/md%d", n)
		var disks []*inventoryv1.LayoutDisk
		var members []string
		for i, dev := range loops {
			parts := []*inventoryv1.LayoutPartition{{Name: fmt.Sprintf("r%d", i), Type: "raid"}}
			switch i {
			case 0:
				parts = append([]*inventoryv1.LayoutPartition{{Name: "esp", SizeBytes: 16 << 20, Type: "esp"}}, parts...)
			case 1:
				parts = append([]*inventoryv1.LayoutPartition{{Name: "sw", SizeBytes: 8 << 20, Type: "swap"}}, parts...)
			}
			disks = append(disks, &inventoryv1.LayoutDisk{Name: fmt.Sprintf("d%d", i), Device: dev, Table: "gpt", Partitions: parts})
			members = append(members, fmt.Sprintf("r%d", i))
		}
		layout := &inventoryv1.DiskLayout{Image: "md0", Disks: disks,
			Raids: []*inventoryv1.LayoutRaid{{Name: "md0", Level: "raid10", Devices: members, Filesystem: "ext4", Mount: "/"}}}
		t.Cleanup(func() { realRun(t, "mdadm", "--stop", md) })

		deployReal(t, image, layout, n)
		deployed := time.Since(start)

		detail := realOut(t, "mdadm", "--detail", md)
		for _, want := range []string{"Raid Level : raid10", "Raid Devices : 4", "Active Devices : 4", "Failed Devices : 0"} {
			if !strings.Contains(detail, want) {
				t.Errorf("mdadm --detail %s lacks %q:\n%s", md, want, detail)
			}
		}
		if !strings.Contains(detail, "State : clean") && !strings.Contains(detail, "State : active") {
			t.Errorf("mdadm --detail %s: the array is not active:\n%s", md, detail)
		}
		checkRealRoot(t, md)
		checkRealESP(t, image, partPath(loops[0], 1))
		checkSignature(t, partPath(loops[1], 1), "TYPE", "swap")
		checkSignature(t, partPath(loops[0], 3), "LABEL", SeedLabel)
		checked := time.Since(start)

		// Deployed again onto the same disks, the array stopped as a
		// reboot into the discovery image leaves it: the old superblocks
		// and filesystems are cleared, not met.
		realMust(t, "mdadm", "--stop", md)
		deployReal(t, image, layout, n)
		checkRealRoot(t, md)
		t.Logf("raid10 of 4 loop devices: deployed in %.1f s, checked in %.1f s, deployed again and checked in %.1f s",
			deployed.Seconds(), (checked - deployed).Seconds(), (time.Since(start) - checked).Seconds())
	})

	t.Run("lvm", func(t *testing.T) {
		start := time.Now()
		d0, d1 := loopDisk(t, 96<<20), loopDisk(t, 64<<20)
		vg := "corraltest" + randHex(4)
		layout := &inventoryv1.DiskLayout{Image: "root",
			Disks: []*inventoryv1.LayoutDisk{
				{Name: "d0", Device: d0, Table: "msdos", Partitions: []*inventoryv1.LayoutPartition{
					{Name: "boot", SizeBytes: 16 << 20, Type: "esp"}, {Name: "sw", SizeBytes: 4 << 20, Type: "swap"}, {Name: "pv0", Type: "lvm"}}},
				{Name: "d1", Device: d1},
			},
			VolumeGroups: []*inventoryv1.LayoutVolumeGroup{{Name: vg, Devices: []string{"pv0", "d1"}, Volumes: []*inventoryv1.LayoutLogicalVolume{
				{Name: "root", SizeBytes: 48 << 20, Filesystem: "ext4", Mount: "/"}, {Name: "data", Filesystem: "ext4", Mount: "/srv"}}}},
		}
		t.Cleanup(func() {
			realRun(t, "lvm", "vgchange", "--config", lvmConfig, "-an", vg)
			realRun(t, "lvm", "vgremove", "--config", lvmConfig, "-ff", "-y", vg)
		})

		deployReal(t, image, layout, -1)
		deployed := time.Since(start)

		lvs := realOut(t, "lvm", "lvs", "--config", lvmConfig, "--noheadings", "-o", "lv_name,lv_size", "--units", "m", vg)
		for _, lv := range []string{"root", "data"} {
			if !strings.Contains(" "+strings.Join(strings.Fields(lvs), " ")+" ", " "+lv+" ") {
				t.Errorf("lvs %s lacks %s:\n%s", vg, lv, lvs)
			}
		}
		checkRealRoot(t, filepath.Join("/dev", vg, "root"))
		data := filepath.Join("/dev", vg, "data")
		checkSignature(t, data, "TYPE", "ext4")
		if out, err := realCmd("e2fsck", "-fn", data).CombinedOutput(); err != nil {
			t.Errorf("e2fsck -fn %s: %v\n%s", data, err, out)
		}
		checkRealESP(t, image, partPath(d0, 1))
		checkSignature(t, partPath(d0, 2), "TYPE", "swap")
		checkSignature(t, partPath(d0, 4), "LABEL", SeedLabel)
		if !bytes.Equal(fileBytes(t, d0, 0, 440), fileBytes(t, image, 0, 440)) {
			t.Error("the image's MBR boot code is not on the disk")
		}
		checked := time.Since(start)

		// Deployed again, the volume group deactivated as a reboot leaves
		// it: the old physical volumes' labels are cleared, so the same
		// group name is free.
		realMust(t, "lvm", "vgchange", "--config", lvmConfig, "-an", vg)
		deployReal(t, image, layout, -1)
		checkRealRoot(t, filepath.Join("/dev", vg, "root"))
		t.Logf("lvm on an msdos partition and a whole loop device: deployed in %.1f s, checked in %.1f s, deployed again and checked in %.1f s",
			deployed.Seconds(), (checked - deployed).Seconds(), (time.Since(start) - checked).Seconds())
	})
}

// realKernel skips t where the running kernel cannot take the layouts
// (TestDeployRealToolsInVM then runs this test under one that can).
func realKernel(t *testing.T) {
	t.Helper()
	if gaps := kernelGaps(); len(gaps) > 0 {
		require.KernelLacks(t, "%s", strings.Join(gaps, "; "))
	}
}

// kernelGaps names what the running kernel lacks for TestDeployRealTools
// (md with raid10, device-mapper, msdos and GPT partition tables) once
// the modules are loaded, as the deployer loads them on a machine.
func kernelGaps() []string {
	for _, m := range []string{"loop", "md_mod", "raid10", "dm_mod"} {
		coldplug.KernelLoader{}.Load(m) // built in, or missing: checked below
	}
	var gaps []string
	for _, option := range []string{"CONFIG_MSDOS_PARTITION", "CONFIG_EFI_PARTITION"} {
		if kernelLacks(option) {
			gaps = append(gaps, option+" is not set: the layouts' partitions")
		}
	}
	if mdstat, err := os.ReadFile("/proc/mdstat"); err != nil {
		gaps = append(gaps, fmt.Sprintf("md (software RAID): %v", err))
	} else if !bytes.Contains(mdstat, []byte("[raid10]")) {
		gaps = append(gaps, fmt.Sprintf("the raid10 personality (/proc/mdstat: %q)", bytes.SplitN(mdstat, []byte("\n"), 2)[0]))
	}
	if misc, _ := os.ReadFile("/proc/misc"); !bytes.Contains(misc, []byte("device-mapper")) {
		gaps = append(gaps, "device-mapper (LVM): no device-mapper in /proc/misc")
	}
	return gaps
}

// buildRealImage makes the real tools' image in a temporary directory.
func buildRealImage(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	tree := filepath.Join(dir, "tree")
	for name, content := range realFiles {
		p := filepath.Join(tree, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	esp, root := filepath.Join(dir, "esp.img"), filepath.Join(dir, "root.img")
	for _, f := range []struct {
		path string
		size int64
	}{{esp, rBootSize}, {root, rRootSize}} {
		if err := os.WriteFile(f.path, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(f.path, f.size); err != nil {
			t.Fatal(err)
		}
	}
	realMust(t, "mkfs.vfat", "-n", "EFI", esp)
	realMust(t, "mke2fs", "-q", "-F", "-t", "ext4", "-L", "root", "-d", tree, root)

	image := filepath.Join(dir, "image.raw")
	f, err := os.Create(image)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(rImageSize); err != nil {
		t.Fatal(err)
	}
	tbl := &mbr.Table{LogicalSectorSize: 512, PhysicalSectorSize: 512, Partitions: []*mbr.Partition{
		{Index: 1, Bootable: true, Type: mbr.EFISystem, Start: rBootStart / 512, Size: rBootSize / 512},
		{Index: 2, Type: mbr.Linux, Start: rRootStart / 512, Size: rRootSize / 512},
	}}
	if err := tbl.Write(f, rImageSize); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(rnd(440), 0); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		path string
		off  int64
	}{{esp, rBootStart}, {root, rRootStart}} {
		b, err := os.ReadFile(p.path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(b, p.off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	return image
}

// loopDisk attaches a sparse file of size bytes as a loop device with
// partition scanning and detaches it when t ends.
func loopDisk(t *testing.T, size int64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "disk")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "-P", "-f", "--show", path).CombinedOutput()
	if err != nil {
		require.Missing(t, "no loop device available: losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { realRun(t, "losetup", "-d", dev) })
	return dev
}

// freeMD is the number of an md device no array of this host uses
// (from md100 up).
func freeMD(t *testing.T) int {
	t.Helper()
	for i := 100; i < 1000; i++ {
		name := fmt.Sprintf("md%d", i)
		if _, err := os.Stat("/sys/block/" + name); err != nil {
			if _, err := os.Stat("/dev/" + name); err != nil {
				return i
			}
		}
	}
	t.Fatal("no free md device from md100 to md999")
	return 0
}

// deployReal deploys image onto layout with the real tools and kernel
// (its arrays numbered from md, when not negative).
func deployReal(t *testing.T, image string, layout *inventoryv1.DiskLayout, md int) {
	t.Helper()
	var console bytes.Buffer
	cfg := Config{ProgressInterval: time.Hour, Console: &console}
	if md >= 0 {
		cfg.mdPath = func(i int) string { return fmt.Sprintf("/dev/md%d", md+i) }
	}
	rec := &recorder{}
	if err := New(cfg).Deploy(context.Background(), imagePlan(t, image, layout), rec.add); err != nil {
		t.Fatalf("Deploy: %v (steps %s)\n%s", err, rec.steps(), console.String())
	}
	if got, want := rec.last().GetStep(), StepWritten; got != want {
		t.Fatalf("last step %s, want %s", got, want)
	}
	for _, p := range rec.ps {
		t.Logf("%s: %s", p.GetStep(), p.GetDetail())
	}
}

// checkRealRoot checks that dev holds the image's root filesystem:
// ext4 labelled root, clean to e2fsck, with the image's files.
func checkRealRoot(t *testing.T, dev string) {
	t.Helper()
	checkSignature(t, dev, "LABEL", "root")
	checkSignature(t, dev, "TYPE", "ext4")
	if out, err := realCmd("e2fsck", "-fn", dev).CombinedOutput(); err != nil {
		t.Errorf("e2fsck -fn %s: %v\n%s", dev, err, out)
	}
	for name, want := range realFiles {
		if got := realOut(t, "debugfs", "-R", "cat "+name, dev); got != want {
			t.Errorf("%s on %s = %q, want %q", name, dev, got, want)
		}
	}
}

// checkRealESP checks that dev holds the image's EFI system partition.
func checkRealESP(t *testing.T, image, dev string) {
	t.Helper()
	checkSignature(t, dev, "TYPE", "vfat")
	checkSignature(t, dev, "LABEL", "EFI")
	if !bytes.Equal(fileBytes(t, dev, 0, rBootSize), fileBytes(t, image, rBootStart, rBootSize)) {
		t.Errorf("%s does not hold the image's EFI system partition", dev)
	}
}

// checkSignature checks blkid's probe of dev says key=want.
func checkSignature(t *testing.T, dev, key, want string) {
	t.Helper()
	out, err := realCmd("blkid", "-p", "-o", "export", dev).CombinedOutput()
	if err != nil {
		t.Errorf("blkid -p %s: %v\n%s", dev, err, out)
		return
	}
	if !strings.Contains("\n"+string(out), "\n"+key+"="+want+"\n") {
		t.Errorf("blkid -p %s: want %s=%s:\n%s", dev, key, want, out)
	}
}

// realCmd is a tool run as the deployer runs it (no udev).
func realCmd(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "DM_DISABLE_UDEV=1", "LVM_SUPPRESS_FD_WARNINGS=1")
	return cmd
}

func realOut(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := realCmd(name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

func realMust(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := realCmd(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// realRun runs a cleanup step, logging its failure.
func realRun(t *testing.T, name string, args ...string) {
	if out, err := realCmd(name, args...).CombinedOutput(); err != nil {
		t.Logf("cleanup: %s %s: %v: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
