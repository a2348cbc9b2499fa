package deploy

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
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

const (
	imageSize = 24 << 20
	diskSize  = 64 << 20
	// dataAt is a second data region inside the last partition.
	dataAt = 12 << 20
)

// fixture is an image served over HTTP and a fake machine (sys/block,
// dev, proc/mounts under a temporary root) whose disk vda is a regular
// file pre-filled with 0xaa where the image goes.
type fixture struct {
	root  string
	disk  string // root/dev/vda
	image string
	sum   string // the image file's SHA-256
	m     *diskmap.Map
	url   string
}

func newFixture(t *testing.T, kind string, partitions int, diskBytes int64) *fixture {
	t.Helper()
	dir := t.TempDir()
	fx := &fixture{root: filepath.Join(dir, "root"), image: filepath.Join(dir, "image.raw")}
	buildImage(t, fx.image, kind, partitions)
	fx.disk = fakeMachine(t, fx.root, diskBytes)
	im, err := blockmap.Open(fx.image, blockmap.Raw)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if fx.m, err = im.Map(context.Background()); err != nil {
		t.Fatal(err)
	}
	fx.sum = fileSum(t, fx.image)
	fx.url = serve(t, fx.image)
	return fx
}

// buildImage writes a 64 MiB whole-disk image: a table (MBR with
// partitions primary partitions, or a GPT whose entry 14 is a BIOS boot
// partition first on the disk and entry 1 the root partition after it, as
// cloud images have them) and random data at the root partition's start
// and at dataAt, zeros elsewhere.
func buildImage(t *testing.T, path, kind string, partitions int) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(imageSize); err != nil {
		t.Fatal(err)
	}
	const sectors = imageSize / 512
	rootStart := int64(2048)
	switch kind {
	case "mbr":
		tbl := &mbr.Table{LogicalSectorSize: 512, PhysicalSectorSize: 512}
		// The last partition (root) is entry 1; small ones before it fill
		// the other entries when asked.
		start := uint32(2048)
		for i := 1; i < partitions; i++ {
			tbl.Partitions = append(tbl.Partitions, &mbr.Partition{Index: i + 1, Type: mbr.Linux, Start: start, Size: 2048})
			start += 2048
		}
		rootStart = int64(start)
		root := &mbr.Partition{Index: 1, Bootable: true, Type: mbr.Linux, Start: start, Size: uint32(sectors) - start}
		tbl.Partitions = append([]*mbr.Partition{root}, tbl.Partitions...)
		if err := tbl.Write(f, imageSize); err != nil {
			t.Fatal(err)
		}
	case "gpt":
		rootStart = 4096
		tbl := &gpt.Table{LogicalSectorSize: 512, PhysicalSectorSize: 512, ProtectiveMBR: true, Partitions: []*gpt.Partition{
			{Index: 14, Start: 2048, End: 4095, Type: gpt.BIOSBoot, Name: "bios"},
			{Index: 1, Start: 4096, End: sectors - 34, Type: gpt.LinuxFilesystem, Name: "root"},
		}}
		if err := tbl.Write(f, imageSize); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("kind %q", kind)
	}
	for _, r := range []struct{ off, n int64 }{{rootStart * 512, 300 << 10}, {dataAt, 100 << 10}} {
		b := make([]byte, r.n)
		rand.Read(b)
		if _, err := f.WriteAt(b, r.off); err != nil {
			t.Fatal(err)
		}
	}
}

// fakeMachine lays out sys/block/vda, dev/vda (diskBytes, 0xaa over the
// image's span) and proc/mounts under root and returns dev/vda's path.
func fakeMachine(t *testing.T, root string, diskBytes int64) string {
	t.Helper()
	write := func(rel, content string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("sys/block/vda/size", fmt.Sprint(diskBytes/512))
	write("sys/block/vda/ro", "0")
	write("sys/block/vda/removable", "0")
	write("sys/block/vda/queue/logical_block_size", "512")
	write("sys/block/sr0/size", "0")
	write("proc/mounts", "rootfs / rootfs rw 0 0\n")
	disk := filepath.Join(root, "dev/vda")
	if err := os.MkdirAll(filepath.Dir(disk), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(diskBytes); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{0xaa}, int(min(diskBytes, imageSize))), 0); err != nil {
		t.Fatal(err)
	}
	return disk
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// serve serves path with ranges (http.ServeContent) on loopback.
func serve(t *testing.T, path string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, err := os.Open(path)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer f.Close()
		http.ServeContent(w, r, "", time.Time{}, f)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/os-images/x/raw"
}

func (fx *fixture) plan(t *testing.T) *nodev1.DeployPlan {
	t.Helper()
	data, digest, err := fx.m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return &nodev1.DeployPlan{
		DeploymentId: "dep-1", ImageUrl: fx.url, ImageSize: fx.m.Size, ImageSha256: fx.sum,
		BlockMap: data, BlockMapSha256: digest,
		Layout: &inventoryv1.DiskLayout{Image: "root", Disks: []*inventoryv1.LayoutDisk{
			{Name: "root", Device: "/dev/vda", SizeBytes: 32 << 20},
		}},
		SeedMetaData:      []byte("instance-id: dep-1\nlocal-hostname: web-1\n"),
		SeedUserData:      []byte("#cloud-config\nssh_authorized_keys:\n  - ssh-ed25519 AAAA test\n"),
		SeedNetworkConfig: []byte("version: 2\nethernets:\n  id0:\n    match: {macaddress: '52:54:00:00:00:01'}\n    addresses: [10.0.0.5/24]\n"),
	}
}

func (fx *fixture) deployer() *Deployer {
	return New(Config{
		Root: fx.root, ProgressInterval: time.Hour,
		attempts: 1, backoff: time.Millisecond, allowFiles: true,
		reread: func(string) error { return errors.New("test: no kernel") },
	})
}

// recorder keeps the progress of a deploy.
type recorder struct {
	mu sync.Mutex
	ps []*nodev1.Progress
}

func (r *recorder) add(p *nodev1.Progress) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ps = append(r.ps, p)
}

func (r *recorder) steps() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s []string
	for _, p := range r.ps {
		s = append(s, p.GetStep())
	}
	return strings.Join(s, ",")
}

func (r *recorder) last() *nodev1.Progress {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ps[len(r.ps)-1]
}

func (r *recorder) checkIDs(t *testing.T, id string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, p := range r.ps {
		if p.GetInstallId() != id {
			t.Errorf("progress %d %q carries install_id %q, want %q", i, p.GetStep(), p.GetInstallId(), id)
		}
		if p.GetDone() != (i == len(r.ps)-1) {
			t.Errorf("progress %d %q: done = %v", i, p.GetStep(), p.GetDone())
		}
	}
}

// sfdiskTable is what `sfdisk --json` says of a disk.
type sfdiskTable struct {
	PartitionTable struct {
		Label      string `json:"label"`
		LastLBA    int64  `json:"lastlba"`
		Partitions []struct {
			Node  string `json:"node"`
			Start int64  `json:"start"`
			Size  int64  `json:"size"`
			Type  string `json:"type"`
			Name  string `json:"name"`
		} `json:"partitions"`
	} `json:"partitiontable"`
}

func sfdisk(t *testing.T, disk string) *sfdiskTable {
	t.Helper()
	if _, err := exec.LookPath("sfdisk"); err != nil {
		t.Log("sfdisk not installed: the table is checked with go-diskfs only")
		return nil
	}
	out, err := exec.Command("sfdisk", "--json", disk).Output()
	if err != nil {
		t.Fatalf("sfdisk --json %s: %v", disk, err)
	}
	var st sfdiskTable
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("sfdisk --json: %v\n%s", err, out)
	}
	return &st
}

// checkImageBytes: where the image lies (past its table's first MiB), the
// disk holds exactly the image's bytes: its data, and zeros where the
// disk held 0xaa before.
func checkImageBytes(t *testing.T, disk, image string, from, to int64) {
	t.Helper()
	d, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	im, err := os.ReadFile(image)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(d[from:to], im[from:to]) {
		for i := from; i < to; i++ {
			if d[i] != im[i] {
				t.Fatalf("disk byte %d = %#x, image %#x", i, d[i], im[i])
			}
		}
	}
	if bytes.Count(im[from:to], []byte{0}) == int(to-from) {
		t.Fatal("the image is all zeros there: the check proves nothing")
	}
}

// checkSeed reads the CIDATA filesystem at off back with go-diskfs, and
// with blkid and mtools when they are installed.
func checkSeed(t *testing.T, disk string, off int64, plan *nodev1.DeployPlan) {
	t.Helper()
	f, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fs, err := fat16.Read(file.New(f, true), SeedSize, off, 512)
	if err != nil {
		t.Fatalf("read the seed's FAT at %d: %v", off, err)
	}
	if got := strings.TrimSpace(fs.Label()); got != "CIDATA" {
		t.Errorf("seed label %q", got)
	}
	want := map[string][]byte{"meta-data": plan.GetSeedMetaData(), "user-data": plan.GetSeedUserData(), "network-config": plan.GetSeedNetworkConfig()}
	for name, data := range want {
		got, err := fs.ReadFile("/" + name)
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("seed %s = %q, %v; want %q", name, got, err, data)
		}
	}
	if _, err := fs.ReadFile("/vendor-data"); err == nil && len(plan.GetSeedVendorData()) == 0 {
		t.Error("an empty vendor-data was written")
	}
	if _, err := exec.LookPath("blkid"); err == nil {
		out, err := exec.Command("blkid", "-p", "-O", fmt.Sprint(off), "-o", "export", disk).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "LABEL=CIDATA") || !strings.Contains(string(out), "TYPE=vfat") {
			t.Errorf("blkid at %d: %v\n%s", off, err, out)
		}
	}
	if _, err := exec.LookPath("mtype"); err == nil {
		img := fmt.Sprintf("%s@@%d", disk, off)
		cmd := exec.Command("mtype", "-i", img, "::network-config")
		cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr // a block device draws a geometry warning
		out, err := cmd.Output()
		if err != nil || !bytes.Equal(out, plan.GetSeedNetworkConfig()) {
			t.Errorf("mtype ::network-config: %v\n%s%s", err, out, stderr.String())
		}
	}
}

func TestDeployMBR(t *testing.T) {
	fx := newFixture(t, "mbr", 1, diskSize)
	plan := fx.plan(t)
	// An earlier OS's GPT backup header and old bytes where the seed goes.
	stale, err := os.OpenFile(fx.disk, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	stale.WriteAt(bytes.Repeat([]byte{0x55}, 4<<20), diskSize-6<<20)
	stale.WriteAt([]byte("EFI PART"), diskSize-512)
	stale.Close()
	rec := &recorder{}
	if err := fx.deployer().Deploy(context.Background(), plan, rec.add); err != nil {
		t.Fatal(err)
	}
	if got, want := rec.steps(), "layout,image,image,partition,seed,written"; got != want {
		t.Errorf("steps %s, want %s", got, want)
	}
	rec.checkIDs(t, "dep-1")
	if p := rec.last(); p.GetError() != "" || p.GetStep() != StepWritten {
		t.Errorf("last progress %v", p)
	}
	checkImageBytes(t, fx.disk, fx.image, 1<<20, imageSize)

	// The seed: 8 MiB, 1 MiB aligned, at the end; the root partition
	// grown to it.
	seed := int64(diskSize - SeedSize) // an MBR may use the disk to its end
	f, err := os.Open(fx.disk)
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := mbr.Read(f, 512, 512)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	root, sp := tbl.Partitions[0], tbl.Partitions[1]
	if root.Type != mbr.Linux || !root.Bootable || root.Start != 2048 || int64(root.Start+root.Size)*512 != seed {
		t.Errorf("root partition %+v, want it to end at %d", root, seed)
	}
	if sp.Type != mbr.Fat16bLBA || int64(sp.Start)*512 != seed || int64(sp.Size)*512 != SeedSize {
		t.Errorf("seed partition %+v, want type 0x0e at %d", sp, seed)
	}
	if st := sfdisk(t, fx.disk); st != nil {
		ps := st.PartitionTable.Partitions
		if st.PartitionTable.Label != "dos" || len(ps) != 2 || ps[1].Type != "e" || ps[1].Start*512 != seed || ps[0].Start+ps[0].Size != ps[1].Start {
			t.Errorf("sfdisk sees %+v", st.PartitionTable)
		}
	}
	checkSeed(t, fx.disk, seed, plan)
	d, err := os.ReadFile(fx.disk)
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(d[seed:], []byte{0x55}); n > 64 {
		t.Errorf("%d bytes of the old content show through the seed", n)
	}
	if !bytes.Equal(d[diskSize-33*512:], make([]byte, 33*512)) {
		t.Error("the stale GPT backup at the disk's end was left")
	}
}

func TestDeployGPT(t *testing.T) {
	fx := newFixture(t, "gpt", 2, diskSize)
	plan := fx.plan(t)
	plan.SeedVendorData = []byte("#cloud-config\nphone_home: {url: 'http://10.0.0.1/phone-home/dep-1/x'}\n")
	rec := &recorder{}
	if err := fx.deployer().Deploy(context.Background(), plan, rec.add); err != nil {
		t.Fatal(err)
	}
	rec.checkIDs(t, "dep-1")
	// The image's backup GPT (its last 33 sectors) is left where it was,
	// inside the grown partition; everything else matches.
	checkImageBytes(t, fx.disk, fx.image, 1<<20, imageSize-33*512)

	f, err := os.Open(fx.disk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tbl, err := gpt.Read(f, 512, 512)
	if err != nil {
		t.Fatal(err)
	}
	if tbl.RecoveredFromBackup {
		t.Error("the primary GPT is invalid")
	}
	if err := tbl.Verify(f, diskSize); err != nil {
		t.Errorf("the backup GPT is not at the disk's end: %v", err)
	}
	// The backup read on its own (primary ignored) says the same.
	lastLBA := uint64(diskSize/512 - 1)
	if tbl.LastDataSector() != lastLBA-33 {
		t.Errorf("last usable sector %d, want %d", tbl.LastDataSector(), lastLBA-33)
	}
	seed := int64(((lastLBA-33+1)*512 - SeedSize) / (1 << 20) * (1 << 20))
	byIndex := map[int]*gpt.Partition{}
	for _, p := range tbl.Partitions {
		byIndex[p.Index] = p
	}
	if len(byIndex) != 3 || byIndex[14] == nil || byIndex[14].End != 4095 {
		t.Errorf("partitions %v", tbl.Partitions)
	}
	if r := byIndex[1]; r == nil || r.Name != "root" || r.Start != 4096 || int64(r.End+1)*512 != seed {
		t.Errorf("root %+v, want it to end at %d", r, seed)
	}
	if s := byIndex[2]; s == nil || s.Type != gpt.MicrosoftBasicData || int64(s.Start)*512 != seed || int64(s.End-s.Start+1)*512 != SeedSize {
		t.Errorf("seed %+v, want a Microsoft basic data partition 2 at %d", s, seed)
	}
	// The protective MBR covers the disk, not the image.
	pm := make([]byte, 16)
	if _, err := f.ReadAt(pm, 446); err != nil {
		t.Fatal(err)
	}
	if pm[4] != 0xee || uint64(pm[12])|uint64(pm[13])<<8|uint64(pm[14])<<16|uint64(pm[15])<<24 != lastLBA {
		t.Errorf("protective MBR entry %x", pm)
	}
	if st := sfdisk(t, fx.disk); st != nil {
		if st.PartitionTable.Label != "gpt" || st.PartitionTable.LastLBA != int64(lastLBA-33) || len(st.PartitionTable.Partitions) != 3 {
			t.Errorf("sfdisk sees %+v", st.PartitionTable)
		}
		out, err := exec.Command("sfdisk", "--verify", fx.disk).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "No errors detected") {
			t.Errorf("sfdisk --verify: %v\n%s", err, out)
		}
	}
	checkSeed(t, fx.disk, seed, plan)
	fs, err := fat16.Read(file.New(f, true), SeedSize, seed, 512)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := fs.ReadFile("/vendor-data"); !bytes.Equal(got, plan.SeedVendorData) {
		t.Errorf("vendor-data %q", got)
	}
}

// TestDeployProgress: "image" progress comes at most every
// ProgressInterval, in MiB, and once at the end.
func TestDeployProgress(t *testing.T) {
	fx := newFixture(t, "mbr", 1, diskSize)
	rec := &recorder{}
	if err := fx.deployer().Deploy(context.Background(), fx.plan(t), rec.add); err != nil {
		t.Fatal(err)
	}
	var details []string
	for _, p := range rec.ps {
		if p.GetStep() == StepImage {
			details = append(details, p.GetDetail())
		}
	}
	if want := []string{"0 MiB of 24 MiB written", "24 MiB of 24 MiB written"}; strings.Join(details, "|") != strings.Join(want, "|") {
		t.Errorf("image progress %q, want %q", details, want)
	}
}

// TestDeployRefusesTamperedExtent: an extent whose bytes do not hash to
// the map's value fails the deploy at "image"; the table is never
// touched (not grown, no seed).
func TestDeployRefusesTamperedExtent(t *testing.T) {
	fx := newFixture(t, "mbr", 1, diskSize)
	plan := fx.plan(t)
	b, err := os.ReadFile(fx.image)
	if err != nil {
		t.Fatal(err)
	}
	b[dataAt+10] ^= 0xff
	bad := filepath.Join(t.TempDir(), "tampered.raw")
	if err := os.WriteFile(bad, b, 0o644); err != nil {
		t.Fatal(err)
	}
	plan.ImageUrl = serve(t, bad)
	rec := &recorder{}
	err = fx.deployer().Deploy(context.Background(), plan, rec.add)
	if err == nil || !strings.Contains(err.Error(), "extent hash mismatch") {
		t.Fatalf("Deploy = %v, want a hash mismatch", err)
	}
	last := rec.last()
	if last.GetStep() != StepImage || !last.GetDone() || !strings.Contains(last.GetError(), "hash mismatch") || !strings.Contains(last.GetError(), "up to the failing extent (no partition grown, no seed)") {
		t.Errorf("last progress %v", last)
	}
	if strings.Contains(rec.steps(), StepPartition) {
		t.Errorf("steps %s went past the image", rec.steps())
	}
	f, err := os.Open(fx.disk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tbl, err := mbr.Read(f, 512, 512)
	if err != nil {
		t.Fatal(err)
	}
	if tbl.Partitions[0].Size != imageSize/512-2048 || tbl.Partitions[1].Type != mbr.Empty {
		t.Errorf("the table was touched: %+v %+v", tbl.Partitions[0], tbl.Partitions[1])
	}
}

// TestDeployRefusesBeforeWriting: plans this agent cannot apply or that do
// not fit the disks fail at "layout" with the reason, the disk untouched.
func TestDeployRefusesBeforeWriting(t *testing.T) {
	tests := map[string]struct {
		disk  int64
		spoil func(*nodev1.DeployPlan)
		want  string
	}{
		"image bigger than the disk": {disk: 16 << 20, spoil: func(p *nodev1.DeployPlan) { p.Layout.Disks[0].SizeBytes = 0 },
			want: "the image (25165824 bytes, 24 MiB) is larger than disk"},
		"no room for the seed": {disk: imageSize + 4<<20, spoil: func(p *nodev1.DeployPlan) { p.Layout.Disks[0].SizeBytes = 0 },
			want: "has no room for the image (24 MiB) and the 8 MiB seed partition"},
		"raids beside a whole-disk image": {spoil: func(p *nodev1.DeployPlan) {
			p.Layout.Raids = []*inventoryv1.LayoutRaid{{Name: "md0", Level: "raid1", Devices: []string{"a", "b"}}}
		}, want: "not supported by this agent yet: the image goes onto the whole disk root and the layout also asks for partitions, arrays or volume groups"},
		"partitions past the seed": {spoil: func(p *nodev1.DeployPlan) {
			p.Layout.Disks[0].Table = "gpt"
			p.Layout.Disks[0].Partitions = []*inventoryv1.LayoutPartition{{Name: "esp", Type: "esp", SizeBytes: 8 << 20}, {Name: "root", SizeBytes: 60 << 20}}
			p.Layout.Image = "root"
		}, want: "disk root (64 MiB): partition root does not fit before the 8 MiB seed partition at the disk's end"},
		"image onto a partition of no disk": {spoil: func(p *nodev1.DeployPlan) { p.Layout.Image = "root-part" },
			want: `the image goes onto "root-part", which is no disk of the layout`},
		"no such disk": {spoil: func(p *nodev1.DeployPlan) { p.Layout.Disks[0].Device = "/dev/vdz" },
			want: "/dev/vdz is not a whole disk on this machine (disks: /dev/sr0 (0 B), /dev/vda (64.0 MiB))"},
		"disk smaller than the facts said": {spoil: func(p *nodev1.DeployPlan) { p.Layout.Disks[0].SizeBytes = 1 << 40 },
			want: "is 67108864 bytes, the layout expects at least 1099511627776"},
		"a second disk missing": {spoil: func(p *nodev1.DeployPlan) {
			p.Layout.Disks = append(p.Layout.Disks, &inventoryv1.LayoutDisk{Name: "data", Device: "/dev/vdb"})
		}, want: "disk data: /dev/vdb is not a whole disk"},
		"no layout": {spoil: func(p *nodev1.DeployPlan) { p.Layout = nil }, want: "the plan has no disk layout"},
		"map digest": {spoil: func(p *nodev1.DeployPlan) { p.BlockMapSha256 = strings.Repeat("0", 64) },
			want: "block map: malformed block map: digest"},
		"image size": {spoil: func(p *nodev1.DeployPlan) { p.ImageSize++ }, want: "the plan says the image is 25165825 bytes"},
	}
	base := newFixture(t, "mbr", 1, diskSize)
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			fx := *base
			fx.root = filepath.Join(t.TempDir(), "root")
			fx.disk = fakeMachine(t, fx.root, cmp.Or(tc.disk, diskSize))
			before := fileSum(t, fx.disk)
			plan := fx.plan(t)
			tc.spoil(plan)
			rec := &recorder{}
			err := fx.deployer().Deploy(context.Background(), plan, rec.add)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Deploy = %v\nwant it to say %q", err, tc.want)
			}
			if got := rec.steps(); got != StepLayout {
				t.Errorf("steps %s, want only the layout's failure", got)
			}
			if p := rec.last(); !p.GetDone() || !strings.Contains(p.GetError(), "nothing was written") || p.GetInstallId() != "dep-1" {
				t.Errorf("progress %v", p)
			}
			if fileSum(t, fx.disk) != before {
				t.Error("the disk was written")
			}
		})
	}
}

// TestDeployRefusesMountedDisk: the disk holding a mounted filesystem (the
// boot media) is never written.
func TestDeployRefusesMountedDisk(t *testing.T) {
	fx := newFixture(t, "mbr", 1, diskSize)
	if err := os.WriteFile(filepath.Join(fx.root, "proc/mounts"), []byte("/dev/vda1 /media vfat ro 0 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(fx.root, "sys/block/vda/vda1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fx.root, "sys/block/vda/vda1/partition"), []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := fx.deployer().Deploy(context.Background(), fx.plan(t), func(*nodev1.Progress) {})
	if err == nil || !strings.Contains(err.Error(), "/dev/vda is in use (/dev/vda1 is mounted: the boot media?)") {
		t.Fatalf("Deploy = %v", err)
	}
}

// TestDeployNoFreeSlot: an MBR whose four entries are used cannot take
// the seed: refused at "partition" before the table is written.
func TestDeployNoFreeSlot(t *testing.T) {
	fx := newFixture(t, "mbr", 4, diskSize)
	rec := &recorder{}
	err := fx.deployer().Deploy(context.Background(), fx.plan(t), rec.add)
	if err == nil || !strings.Contains(err.Error(), "the four primary entries of the image's MBR are all used: no free slot for the seed partition") {
		t.Fatalf("Deploy = %v", err)
	}
	if p := rec.last(); p.GetStep() != StepPartition || !strings.Contains(p.GetError(), "already written: the image on") {
		t.Errorf("progress %v", p)
	}
	checkImageBytes(t, fx.disk, fx.image, 0, imageSize)
}

// TestDeployStalledFetch: a server that stops sending in the middle of an
// extent fails the deploy at "image" after StallTimeout, not never.
func TestDeployStalledFetch(t *testing.T) {
	fx := newFixture(t, "mbr", 1, diskSize)
	release := make(chan struct{})
	defer close(release)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Range", strings.Replace(r.Header.Get("Range"), "=", " ", 1)+"/*")
		w.WriteHeader(http.StatusPartialContent)
		w.Write(make([]byte, 1000))
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	plan := fx.plan(t)
	plan.ImageUrl = srv.URL
	d := fx.deployer()
	d.cfg.StallTimeout = 200 * time.Millisecond
	rec := &recorder{}
	start := time.Now()
	err := d.Deploy(context.Background(), plan, rec.add)
	if !errors.Is(err, ErrStalled) {
		t.Fatalf("Deploy = %v, want ErrStalled", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("the stall took %v to notice", el)
	}
	if p := rec.last(); p.GetStep() != StepImage || !strings.Contains(p.GetError(), "no byte for 200ms") {
		t.Errorf("progress %v", p)
	}
}
