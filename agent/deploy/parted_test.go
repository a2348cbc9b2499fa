package deploy

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/fat16"
	"github.com/diskfs/go-diskfs/partition/gpt"
	"github.com/diskfs/go-diskfs/partition/mbr"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/images/blockmap"
	"github.com/corralhq/corral/internal/diskmap"
)

// The partitioned image: an MBR with SYSLINUX-like boot code, partition
// 1 the active FAT boot partition (type 0xef, as testsupport/guestimage's
// cloud-init image has it) and partition 2 the Linux root, random data at
// both partitions' starts, inside the root and right at the root's end.
const (
	pImageSize = 40 << 20
	pBootStart = 1 << 20
	pBootSize  = 8 << 20
	pRootStart = pBootStart + pBootSize
	pRootSize  = pImageSize - pRootStart
)

func buildPartitionedImage(t *testing.T, path string, withBoot bool) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(pImageSize); err != nil {
		t.Fatal(err)
	}
	tbl := &mbr.Table{LogicalSectorSize: 512, PhysicalSectorSize: 512}
	bootType := mbr.EFISystem
	if !withBoot {
		bootType = mbr.Linux // a small second Linux partition: the root is the largest
	}
	tbl.Partitions = []*mbr.Partition{
		{Index: 1, Bootable: true, Type: bootType, Start: pBootStart / 512, Size: pBootSize / 512},
		{Index: 2, Type: mbr.Linux, Start: pRootStart / 512, Size: pRootSize / 512},
	}
	if err := tbl.Write(f, pImageSize); err != nil {
		t.Fatal(err)
	}
	code := make([]byte, 440)
	rand.Read(code)
	for _, r := range []struct {
		off int64
		b   []byte
	}{{0, code}, {pBootStart, rnd(64 << 10)}, {pRootStart, rnd(300 << 10)}, {pRootStart + 10<<20, rnd(100 << 10)}, {pImageSize - 4096, rnd(4096)}} {
		if _, err := f.WriteAt(r.b, r.off); err != nil {
			t.Fatal(err)
		}
	}
}

func rnd(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// pfixture is a partitioned image and a fake machine with two disks
// (vda, vdb), a fake kernel (the re-read makes a file per partition of
// the table written, named as the kernel names partitions) and fake
// tools (mdadm and lvm make their device nodes as files).
type pfixture struct {
	root, image string
	disks       []string
	plan        *nodev1.DeployPlan
	mu          sync.Mutex
	cmds        []string
	fail        string // a tool invocation containing it fails
}

func newPFixture(t *testing.T, withBoot bool, layout *inventoryv1.DiskLayout, diskBytes ...int64) *pfixture {
	t.Helper()
	dir := t.TempDir()
	fx := &pfixture{root: filepath.Join(dir, "root"), image: filepath.Join(dir, "image.raw")}
	buildPartitionedImage(t, fx.image, withBoot)
	for i, n := range diskBytes {
		name := fmt.Sprintf("vd%c", 'a'+i)
		write := func(rel, content string) {
			p := filepath.Join(fx.root, rel)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		write("sys/block/"+name+"/size", fmt.Sprint(n/512))
		write("sys/block/"+name+"/ro", "0")
		write("sys/block/"+name+"/removable", "0")
		write("sys/block/"+name+"/queue/logical_block_size", "512")
		write("dev/"+name, "")
		if err := os.Truncate(filepath.Join(fx.root, "dev", name), n); err != nil {
			t.Fatal(err)
		}
		fx.disks = append(fx.disks, filepath.Join(fx.root, "dev", name))
	}
	if err := os.WriteFile(filepath.Join(fx.root, "proc/mounts"), []byte("rootfs / rootfs rw 0 0\n"), 0o644); err != nil {
		if err := os.MkdirAll(filepath.Join(fx.root, "proc"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(fx.root, "proc/mounts"), []byte("rootfs / rootfs rw 0 0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fx.plan = imagePlan(t, fx.image, layout)
	return fx
}

// imagePlan is a deploy plan (deployment dep-2) of the raw image at
// path, served on loopback, onto layout.
func imagePlan(t *testing.T, path string, layout *inventoryv1.DiskLayout) *nodev1.DeployPlan {
	t.Helper()
	im, err := blockmap.Open(path, blockmap.Raw)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	m, err := im.Map(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	data, digest, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return &nodev1.DeployPlan{
		DeploymentId: "dep-2", ImageUrl: serve(t, path), ImageSize: m.Size, ImageSha256: fileSum(t, path),
		BlockMap: data, BlockMapSha256: digest, Layout: layout,
		SeedMetaData:      []byte("instance-id: dep-2\nlocal-hostname: db-1\n"),
		SeedUserData:      []byte("#cloud-config\n{}\n"),
		SeedVendorData:    []byte("#cloud-config\nphone_home: {url: 'http://10.0.0.1/x', tries: 10}\n"),
		SeedNetworkConfig: []byte("version: 2\n"),
	}
}

// kernel re-reads dev's table: a file per partition, of its size.
func (fx *pfixture) kernel(dev string) error {
	f, err := os.Open(dev)
	if err != nil {
		return err
	}
	defer f.Close()
	st, _ := f.Stat()
	var parts [][3]int64 // index, start, size
	if t, err := gpt.Read(f, 512, 512); err == nil {
		for _, p := range t.Partitions {
			parts = append(parts, [3]int64{int64(p.Index), int64(p.Start) * 512, int64(p.End-p.Start+1) * 512})
		}
	} else if t, err := mbr.Read(f, 512, 512); err == nil {
		for i, p := range t.Partitions {
			if p.Type != mbr.Empty {
				parts = append(parts, [3]int64{int64(i + 1), int64(p.Start) * 512, int64(p.Size) * 512})
			}
		}
	} else {
		return err
	}
	for _, p := range parts {
		if p[1]+p[2] > st.Size() {
			return fmt.Errorf("partition %d ends past the disk", p[0])
		}
		path := partPath(dev, int(p[0]))
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			return err
		}
		if err := os.Truncate(path, p[2]); err != nil {
			return err
		}
	}
	return nil
}

// tool is the fake mdadm, lvm, mke2fs and mkswap.
func (fx *pfixture) tool(_ context.Context, name string, args ...string) error {
	line := name + " " + strings.Join(args, " ")
	fx.mu.Lock()
	fx.cmds = append(fx.cmds, strings.ReplaceAll(line, fx.root, ""))
	fx.mu.Unlock()
	if fx.fail != "" && strings.Contains(line, fx.fail) {
		return errors.New("exit status 1: test failure")
	}
	mk := func(path string, size int64) error {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			return err
		}
		return os.Truncate(path, size)
	}
	switch {
	case name == "mdadm" && args[0] == "--create":
		lo := int64(-1)
		for _, a := range args {
			if strings.HasPrefix(a, fx.root) && a != args[1] {
				n, err := devSize(a)
				if err != nil {
					return err
				}
				if lo < 0 || n < lo {
					lo = n
				}
			}
		}
		return mk(args[1], lo-128<<10)
	case name == "lvm" && args[0] == "lvcreate":
		vg, lv := args[len(args)-1], args[slices.Index(args, "-n")+1]
		return mk(filepath.Join(fx.root, "dev", vg, lv), 64<<20)
	}
	return nil
}

func (fx *pfixture) deployer() *Deployer {
	return New(Config{
		Root: fx.root, ProgressInterval: time.Hour, NodeTimeout: 200 * time.Millisecond,
		attempts: 1, backoff: time.Millisecond, allowFiles: true,
		reread: fx.kernel, run: fx.tool, Modules: loader{},
	})
}

type loader struct{}

func (loader) Load(string) error { return nil }

// imageBytes is [off, off+n) of the image.
func (fx *pfixture) imageBytes(t *testing.T, off, n int64) []byte {
	t.Helper()
	b, err := os.ReadFile(fx.image)
	if err != nil {
		t.Fatal(err)
	}
	return b[off : off+n]
}

func fileBytes(t *testing.T, path string, off, n int64) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDeployRAID1: the NVMe machine's layout of the virtual rack: an ESP
// on each of two GPT disks and the root on a RAID1 of the rest. mdadm
// makes the array with metadata 1.0 (the members read as plain
// filesystems to boot loaders); the image's root partition lands on the
// array, its boot partition on both ESPs, the seed at the end of the
// first disk.
func TestDeployRAID1(t *testing.T) {
	layout := &inventoryv1.DiskLayout{Image: "md0",
		Disks: []*inventoryv1.LayoutDisk{
			{Name: "d0", Device: "/dev/vda", Table: "gpt", Partitions: []*inventoryv1.LayoutPartition{{Name: "esp0", SizeBytes: 16 << 20, Type: "esp"}, {Name: "r0", Type: "raid"}}},
			{Name: "d1", Device: "/dev/vdb", Table: "gpt", Partitions: []*inventoryv1.LayoutPartition{{Name: "esp1", SizeBytes: 16 << 20, Type: "esp"}, {Name: "r1", Type: "raid"}}},
		},
		Raids: []*inventoryv1.LayoutRaid{{Name: "md0", Level: "raid1", Devices: []string{"r0", "r1"}, Filesystem: "ext4", Mount: "/"}},
	}
	fx := newPFixture(t, true, layout, 96<<20, 128<<20)
	rec := &recorder{}
	if err := fx.deployer().Deploy(context.Background(), fx.plan, rec.add); err != nil {
		t.Fatal(err)
	}
	rec.checkIDs(t, "dep-2")
	if got, want := rec.steps(), "layout,partition,image,image,seed,written"; got != want {
		t.Errorf("steps %s, want %s", got, want)
	}
	wantCmds := []string{"mdadm --create /dev/md0 --run --metadata=1.0 --level=1 --raid-devices=2 --homehost=any --name=md0 /dev/vda2 /dev/vdb2"}
	if !slices.Equal(fx.cmds, wantCmds) {
		t.Errorf("commands:\n%s\nwant:\n%s", strings.Join(fx.cmds, "\n"), strings.Join(wantCmds, "\n"))
	}
	// The tables.
	for i, disk := range fx.disks {
		f, err := os.Open(disk)
		if err != nil {
			t.Fatal(err)
		}
		tbl, err := gpt.Read(f, 512, 512)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", disk, err)
		}
		var got []string
		for _, p := range tbl.Partitions {
			got = append(got, fmt.Sprintf("%d %s %s %d+%d", p.Index, p.Name, p.Type, p.Start*512>>20, (p.End-p.Start+1)*512>>20))
		}
		size := []int64{96, 128}[i]
		want := []string{
			fmt.Sprintf("1 esp0 %s 1+16", gpt.EFISystemPartition),
			fmt.Sprintf("2 r0 %s 17+%d", guidLinuxRAID, size-17-9),
			fmt.Sprintf("3 CIDATA %s %d+8", gpt.MicrosoftBasicData, size-9),
		}
		if i == 1 {
			want = []string{fmt.Sprintf("1 esp1 %s 1+16", gpt.EFISystemPartition), fmt.Sprintf("2 r1 %s 17+%d", guidLinuxRAID, size-17-1)}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: partitions\n%s\nwant\n%s", disk, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if st := sfdisk(t, disk); st != nil && st.PartitionTable.Label != "gpt" {
			t.Errorf("sfdisk: %s: label %q", disk, st.PartitionTable.Label)
		}
	}
	// The root filesystem on the array, the boot partition on both ESPs.
	if !bytes.Equal(fileBytes(t, filepath.Join(fx.root, "dev/md0"), 0, pRootSize), fx.imageBytes(t, pRootStart, pRootSize)) {
		t.Error("md0 does not hold the image's root partition")
	}
	for _, p := range []string{"dev/vda1", "dev/vdb1"} {
		if !bytes.Equal(fileBytes(t, filepath.Join(fx.root, p), 0, pBootSize), fx.imageBytes(t, pBootStart, pBootSize)) {
			t.Errorf("%s does not hold the image's boot partition", p)
		}
	}
	checkSeed(t, fx.disks[0], 96<<20-9<<20, fx.plan)
	if !strings.Contains(rec.last().GetDetail(), "on md0 (") {
		t.Errorf("written: %q", rec.last().GetDetail())
	}
}

// TestDeployLVMOnMBR: an msdos disk (the BIOS machine's kind) holding the
// boot partition, a swap partition and an LVM physical volume, with a
// second whole disk in the volume group; the root on a volume, /srv on
// another. The image's MBR boot code is on the disk, its boot partition
// active; lvm runs without udev; mke2fs and mkswap make the others by
// UUID, and their mounts reach cloud-init beside the appliance's
// vendor-data.
func TestDeployLVMOnMBR(t *testing.T) {
	layout := &inventoryv1.DiskLayout{Image: "root",
		Disks: []*inventoryv1.LayoutDisk{
			{Name: "d0", Device: "/dev/vda", Table: "msdos", Partitions: []*inventoryv1.LayoutPartition{
				{Name: "boot", SizeBytes: 16 << 20, Type: "esp"}, {Name: "sw", SizeBytes: 4 << 20, Type: "swap"}, {Name: "pv0", Type: "lvm"}}},
			{Name: "d1", Device: "/dev/vdb"},
		},
		VolumeGroups: []*inventoryv1.LayoutVolumeGroup{{Name: "vg0", Devices: []string{"pv0", "d1"}, Volumes: []*inventoryv1.LayoutLogicalVolume{
			{Name: "root", SizeBytes: 48 << 20, Filesystem: "ext4", Mount: "/"}, {Name: "data", Filesystem: "ext4", Mount: "/srv"}}}},
	}
	fx := newPFixture(t, true, layout, 96<<20, 64<<20)
	if err := os.WriteFile(fx.disks[1], bytes.Repeat([]byte{0xaa}, 2<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(fx.disks[1], 64<<20); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	if err := fx.deployer().Deploy(context.Background(), fx.plan, rec.add); err != nil {
		t.Fatal(err)
	}
	var got []string
	var uuids []string
	for _, c := range fx.cmds {
		if i := strings.Index(c, "-U "); i >= 0 {
			uuids = append(uuids, strings.Fields(c[i+3:])[0])
			c = c[:i+3] + "UUID" + c[i+3+36:]
		}
		got = append(got, strings.ReplaceAll(c, lvmConfig, "C"))
	}
	want := []string{
		"lvm pvcreate --config C -ff -y /dev/vda3 /dev/vdb",
		"lvm vgcreate --config C vg0 /dev/vda3 /dev/vdb",
		"lvm lvcreate --config C -y -W y -n root -L 50331648b vg0",
		"lvm lvcreate --config C -y -W y -n data -l 100%FREE vg0",
		"mkswap -U UUID /dev/vda2",
		"mke2fs -q -F -t ext4 -U UUID /dev/vg0/data",
	}
	if !slices.Equal(got, want) {
		t.Errorf("commands:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	f, err := os.Open(fx.disks[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tbl, err := mbr.Read(f, 512, 512)
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for _, p := range tbl.Partitions {
		if p.Type != mbr.Empty {
			parts = append(parts, fmt.Sprintf("%#x %t %d+%d", p.Type, p.Bootable, p.Start*512>>20, p.Size*512>>20))
		}
	}
	wantParts := []string{"0xef true 1+16", "0x82 false 17+4", "0x8e false 21+67", "0xe false 88+8"}
	if !slices.Equal(parts, wantParts) {
		t.Errorf("MBR: %v, want %v", parts, wantParts)
	}
	if !bytes.Equal(fileBytes(t, fx.disks[0], 0, 440), fx.imageBytes(t, 0, 440)) {
		t.Error("the image's MBR boot code is not on the disk")
	}
	if b := fileBytes(t, fx.disks[1], 0, 1<<20); !allZero(b) {
		t.Error("the whole-disk member's old signatures were not cleared")
	}
	if !bytes.Equal(fileBytes(t, filepath.Join(fx.root, "dev/vg0/root"), 0, pRootSize), fx.imageBytes(t, pRootStart, pRootSize)) {
		t.Error("the root volume does not hold the image's root partition")
	}
	// The seed's vendor-data: the appliance's, and the mounts.
	fs, err := fat16.Read(file.New(f, true), SeedSize, 88<<20, 512)
	if err != nil {
		t.Fatal(err)
	}
	vd, err := fs.ReadFile("/vendor-data")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"Content-Type: multipart/mixed", string(fx.plan.GetSeedVendorData()),
		fmt.Sprintf(`- ["UUID=%s", "none", "swap", "sw", "0", "0"]`, uuids[0]),
		fmt.Sprintf(`- ["UUID=%s", "/srv", "ext4", "defaults,nofail", "0", "2"]`, uuids[1])} {
		if !strings.Contains(string(vd), w) {
			t.Errorf("vendor-data lacks %q:\n%s", w, vd)
		}
	}
}

// TestDeployLayoutRefusals: what the agent cannot make, or what does not
// fit, is refused in the layout step with the reason, nothing written.
func TestDeployLayoutRefusals(t *testing.T) {
	gptDisk := func(name, dev string, parts ...*inventoryv1.LayoutPartition) *inventoryv1.LayoutDisk {
		return &inventoryv1.LayoutDisk{Name: name, Device: dev, Table: "gpt", Partitions: parts}
	}
	part := func(name, typ string, size int64) *inventoryv1.LayoutPartition {
		return &inventoryv1.LayoutPartition{Name: name, Type: typ, SizeBytes: uint64(size)}
	}
	tests := map[string]struct {
		noBoot bool
		layout *inventoryv1.DiskLayout
		want   string
	}{
		"xfs": {layout: &inventoryv1.DiskLayout{Image: "root", Disks: []*inventoryv1.LayoutDisk{gptDisk("d0", "/dev/vda", part("root", "linux", 40<<20),
			&inventoryv1.LayoutPartition{Name: "data", Type: "linux", Filesystem: "xfs"})}},
			want: "partition data: filesystem xfs (the agent makes ext4 and swap"},
		"an esp and no boot partition in the image": {noBoot: true, layout: &inventoryv1.DiskLayout{Image: "root", Disks: []*inventoryv1.LayoutDisk{
			gptDisk("d0", "/dev/vda", part("esp", "esp", 16<<20), part("root", "linux", 0))}},
			want: "partition esp is an esp and the image's MBR has no EFI system or boot partition"},
		"esp smaller than the image's": {layout: &inventoryv1.DiskLayout{Image: "root", Disks: []*inventoryv1.LayoutDisk{
			gptDisk("d0", "/dev/vda", part("esp", "esp", 4<<20), part("root", "linux", 0))}},
			want: "esp partition esp (4 MiB) is smaller than the image's boot partition (8 MiB)"},
		"root partition too small": {layout: &inventoryv1.DiskLayout{Image: "root", Disks: []*inventoryv1.LayoutDisk{
			gptDisk("d0", "/dev/vda", part("root", "linux", 8<<20), part("rest", "linux", 0))}},
			want: "partition root (8 MiB) is smaller than the image's root filesystem (31 MiB)"},
		"partitions past the seed": {layout: &inventoryv1.DiskLayout{Image: "root", Disks: []*inventoryv1.LayoutDisk{
			gptDisk("d0", "/dev/vda", part("root", "linux", 90<<20))}},
			want: "partition root does not fit before the 8 MiB seed partition at the disk's end"},
		"four msdos partitions and the seed": {layout: &inventoryv1.DiskLayout{Image: "a", Disks: []*inventoryv1.LayoutDisk{{Name: "d0", Device: "/dev/vda", Table: "msdos",
			Partitions: []*inventoryv1.LayoutPartition{part("a", "linux", 40<<20), part("b", "linux", 8<<20), part("c", "linux", 8<<20), part("d", "linux", 8<<20)}}}},
			want: "an msdos table with 4 partitions has no slot left for the seed partition"},
		"image on the whole disk beside an array": {layout: &inventoryv1.DiskLayout{Image: "d0", Disks: []*inventoryv1.LayoutDisk{{Name: "d0", Device: "/dev/vda"},
			gptDisk("d1", "/dev/vdb", part("r", "raid", 0))}, Raids: []*inventoryv1.LayoutRaid{{Name: "md0", Level: "raid1", Devices: []string{"r", "r"}}}},
			want: "the image goes onto the whole disk d0 and the layout also asks for partitions"},
		"a second disk missing": {layout: &inventoryv1.DiskLayout{Image: "root", Disks: []*inventoryv1.LayoutDisk{gptDisk("d0", "/dev/vda", part("root", "linux", 0)),
			gptDisk("d9", "/dev/vdz", part("x", "linux", 0))}},
			want: "disk d9: /dev/vdz is not a whole disk on this machine"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			fx := newPFixture(t, !tc.noBoot, tc.layout, 96<<20, 64<<20)
			before := []string{fileSum(t, fx.disks[0]), fileSum(t, fx.disks[1])}
			rec := &recorder{}
			err := fx.deployer().Deploy(context.Background(), fx.plan, rec.add)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Deploy = %v\nwant it to say %q", err, tc.want)
			}
			if got := rec.steps(); got != StepLayout || !strings.Contains(rec.last().GetError(), "nothing was written") {
				t.Errorf("steps %s, last %v", got, rec.last())
			}
			if fileSum(t, fx.disks[0]) != before[0] || fileSum(t, fx.disks[1]) != before[1] || len(fx.cmds) > 0 {
				t.Error("the disks were written or a tool ran")
			}
		})
	}
}

// TestDeployRaidFails: mdadm's failure ends the deploy in the partition
// step, naming what was already written and mdadm's words.
func TestDeployRaidFails(t *testing.T) {
	layout := &inventoryv1.DiskLayout{Image: "md0",
		Disks: []*inventoryv1.LayoutDisk{
			{Name: "d0", Device: "/dev/vda", Table: "gpt", Partitions: []*inventoryv1.LayoutPartition{{Name: "esp0", SizeBytes: 16 << 20, Type: "esp"}, {Name: "r0", Type: "raid"}}},
			{Name: "d1", Device: "/dev/vdb", Table: "gpt", Partitions: []*inventoryv1.LayoutPartition{{Name: "esp1", SizeBytes: 16 << 20, Type: "esp"}, {Name: "r1", Type: "raid"}}},
		},
		Raids: []*inventoryv1.LayoutRaid{{Name: "md0", Level: "raid1", Devices: []string{"r0", "r1"}}},
	}
	fx := newPFixture(t, true, layout, 96<<20, 128<<20)
	fx.fail = "mdadm"
	rec := &recorder{}
	err := fx.deployer().Deploy(context.Background(), fx.plan, rec.add)
	if err == nil || !strings.Contains(err.Error(), "create raid md0: exit status 1: test failure") {
		t.Fatalf("Deploy = %v", err)
	}
	if p := rec.last(); p.GetStep() != StepPartition || !strings.Contains(p.GetError(), "already written: GPT table with 2 partitions on ") {
		t.Errorf("last progress %v", p)
	}
}

func TestSubMap(t *testing.T) {
	fx := newPFixture(t, true, &inventoryv1.DiskLayout{}, 64<<20)
	m := plannedMap(t, fx.plan)
	sm, _ := subMap(m, pRootStart, pImageSize)
	if sm.Size != pRootSize || len(sm.Extents) == 0 || sm.Extents[0].Offset != 0 {
		t.Errorf("sub-map %+v", sm)
	}
	if err := sm.Validate(); err != nil {
		t.Error(err)
	}
	// A window cutting the root's first data in two: that extent is an edge.
	_, edges := subMap(m, pRootStart+4096, pImageSize)
	if len(edges) != 1 || edges[0].Offset != pRootStart {
		t.Errorf("edges %v", edges)
	}
}

func plannedMap(t *testing.T, plan *nodev1.DeployPlan) *diskmap.Map {
	t.Helper()
	d := New(Config{})
	m, err := d.checkMap(plan)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestSeedReadBack: seed files of every size read back (go-diskfs's FAT
// reader returns bytes past the end of a 513 to 2047-byte file read in
// pieces; the check reads each in one piece).
func TestSeedReadBack(t *testing.T) {
	for _, n := range []int{1, 511, 512, 513, 607, 1000, 2047, 2048, 2049, 5000, 70000} {
		f, err := os.Create(filepath.Join(t.TempDir(), "d"))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(16 << 20); err != nil {
			t.Fatal(err)
		}
		if err := makeSeed(f, 1<<20, SeedSize, []seedFile{{"meta-data", []byte("x")}, {"vendor-data", bytes.Repeat([]byte("y"), n)}}); err != nil {
			t.Errorf("%d bytes: %v", n, err)
		}
		f.Close()
	}
}

// TestDeployRAID10: a RAID10 of four partitions takes mdadm's default
// 1.2 metadata (no boot loader reads a RAID10 member as a filesystem);
// the root goes onto the array.
func TestDeployRAID10(t *testing.T) {
	var disks []*inventoryv1.LayoutDisk
	var members []string
	for i := range 4 {
		parts := []*inventoryv1.LayoutPartition{{Name: fmt.Sprintf("r%d", i), Type: "raid"}}
		if i == 0 {
			parts = append([]*inventoryv1.LayoutPartition{{Name: "esp", SizeBytes: 16 << 20, Type: "esp"}}, parts...)
		}
		disks = append(disks, &inventoryv1.LayoutDisk{Name: fmt.Sprintf("d%d", i), Device: fmt.Sprintf("/dev/vd%c", 'a'+i), Table: "gpt", Partitions: parts})
		members = append(members, fmt.Sprintf("r%d", i))
	}
	layout := &inventoryv1.DiskLayout{Image: "md0", Disks: disks, Raids: []*inventoryv1.LayoutRaid{{Name: "md0", Level: "raid10", Devices: members}}}
	fx := newPFixture(t, true, layout, 96<<20, 64<<20, 64<<20, 64<<20)
	if err := fx.deployer().Deploy(context.Background(), fx.plan, func(*nodev1.Progress) {}); err != nil {
		t.Fatal(err)
	}
	want := []string{"mdadm --create /dev/md0 --run --metadata=1.2 --level=10 --raid-devices=4 --homehost=any --name=md0 /dev/vda2 /dev/vdb1 /dev/vdc1 /dev/vdd1"}
	if !slices.Equal(fx.cmds, want) {
		t.Errorf("commands %q, want %q", fx.cmds, want)
	}
	if !bytes.Equal(fileBytes(t, filepath.Join(fx.root, "dev/md0"), 0, pRootSize), fx.imageBytes(t, pRootStart, pRootSize)) {
		t.Error("md0 does not hold the image's root partition")
	}
}
