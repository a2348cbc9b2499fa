package deploy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/diskfs/go-diskfs/partition/gpt"
	"github.com/diskfs/go-diskfs/partition/mbr"

	"github.com/corralhq/corral/agent/diskwrite"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/internal/diskmap"
)

// Writing a partitioned layout: the tables, the arrays, the volumes and
// the image's partitions (parted.go plans them).

// writeDisk clears the old signatures where dp's partitions go, makes
// the seed on the seed disk, and writes dp's table (and, on msdos, the
// image's MBR boot code).
func (d *Deployer) writeDisk(lp *layoutPlan, dp *diskPlan, files []seedFile) error {
	f, err := os.OpenFile(dp.t.path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// The old table at both ends, and the first and last MiB of every
	// partition: stale RAID superblocks (1.0 at the end, 1.2 near the
	// start), LVM labels and filesystems must not show through.
	if err := zero(f, 0, alignment); err != nil {
		return fmt.Errorf("clear the disk's start: %w", err)
	}
	if err := zero(f, dp.t.size-alignment, alignment); err != nil {
		return fmt.Errorf("clear the disk's end: %w", err)
	}
	for _, pp := range dp.parts {
		if err := zeroEnds(f, pp.start, pp.end); err != nil {
			return fmt.Errorf("clear partition %s: %w", pp.lp.GetName(), err)
		}
	}
	if dp.seed {
		if err := makeSeed(f, dp.seedStart, SeedSize, files); err != nil {
			return fmt.Errorf("make the CIDATA filesystem: %w", err)
		}
	}
	if dp.ld.GetTable() == "gpt" {
		return writeGPT(f, dp)
	}
	return writeMBR(f, dp, lp.it.bootCode)
}

// GPT and MBR partition types of the layout's types.
var (
	gptTypes = map[string]gpt.Type{"esp": gpt.EFISystemPartition, "bios_boot": gpt.BIOSBoot, "linux": gpt.LinuxFilesystem,
		"raid": gpt.Type(guidLinuxRAID), "lvm": gpt.LinuxLVM, "swap": gpt.LinuxSwap}
	mbrTypes = map[string]mbr.Type{"esp": mbr.EFISystem, "linux": mbr.Linux, "raid": mbr.Type(0xfd), "lvm": mbr.LinuxLVM, "swap": mbr.LinuxSwap}
)

func writeGPT(f *os.File, dp *diskPlan) error {
	t := &gpt.Table{LogicalSectorSize: 512, PhysicalSectorSize: 512, ProtectiveMBR: true}
	for _, pp := range dp.parts {
		t.Partitions = append(t.Partitions, &gpt.Partition{Index: pp.index, Start: uint64(pp.start / 512), End: uint64(pp.end/512 - 1),
			Size: uint64(pp.end - pp.start), Type: gptTypes[pp.lp.GetType()], Name: pp.lp.GetName()})
	}
	if dp.seed {
		s := uint64(dp.seedStart / 512)
		t.Partitions = append(t.Partitions, &gpt.Partition{Index: dp.seedIndex, Start: s, End: s + SeedSize/512 - 1, Size: SeedSize,
			Type: gpt.MicrosoftBasicData, Name: SeedLabel})
	}
	size := dp.t.size / 512 * 512
	if err := t.Write(f, size); err != nil {
		return fmt.Errorf("write the GPT: %w", err)
	}
	// The protective MBR's size reads 0xffffffff past 2 TiB (go-diskfs
	// would truncate it to 32 bits).
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(min(size/512-1, 0xffffffff)))
	if _, err := f.WriteAt(n[:], 446+12); err != nil {
		return fmt.Errorf("write the protective MBR: %w", err)
	}
	return f.Sync()
}

func writeMBR(f *os.File, dp *diskPlan, bootCode []byte) error {
	t := &mbr.Table{LogicalSectorSize: 512, PhysicalSectorSize: 512}
	for _, pp := range dp.parts {
		p := &mbr.Partition{Index: pp.index, Bootable: pp.bootable, Type: mbrTypes[pp.lp.GetType()],
			Start: uint32(pp.start / 512), Size: uint32((pp.end - pp.start) / 512)}
		lbaOnly(p)
		t.Partitions = append(t.Partitions, p)
	}
	if dp.seed {
		p := &mbr.Partition{Index: dp.seedIndex, Type: mbr.Fat16bLBA, Start: uint32(dp.seedStart / 512), Size: SeedSize / 512}
		lbaOnly(p)
		t.Partitions = append(t.Partitions, p)
	}
	if len(bootCode) > 0 {
		if _, err := f.WriteAt(bootCode, 0); err != nil {
			return fmt.Errorf("write the MBR boot code: %w", err)
		}
	}
	// A disk signature of its own (PARTUUID= on msdos disks uses it).
	var sig [4]byte
	rand.Read(sig[:])
	if _, err := f.WriteAt(sig[:], 440); err != nil {
		return fmt.Errorf("write the disk signature: %w", err)
	}
	if err := t.Write(f, dp.t.size); err != nil {
		return fmt.Errorf("write the MBR: %w", err)
	}
	return f.Sync()
}

// zeroEnds zeroes the first and last MiB of [start, end) (all of it when
// shorter than 2 MiB).
func zeroEnds(f *os.File, start, end int64) error {
	if end-start <= 2*alignment {
		return zero(f, start, end-start)
	}
	if err := zero(f, start, alignment); err != nil {
		return err
	}
	return zero(f, end-alignment, alignment)
}

func wipeEnds(path string, start, end int64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := zeroEnds(f, start, end); err != nil {
		return fmt.Errorf("clear %s: %w", path, err)
	}
	return f.Sync()
}

// rereadAndWait has the kernel re-read dp's table and waits for its
// partitions' device nodes.
func (d *Deployer) rereadAndWait(dp *diskPlan) error {
	var rerr error
	if dp.t.block || d.cfg.allowFiles {
		rerr = d.cfg.reread(dp.t.path)
	}
	for _, pp := range dp.parts {
		p := d.cfg.partPath(dp.t.path, pp.index)
		if err := waitFor(p, d.cfg.NodeTimeout); err != nil {
			if rerr != nil {
				return fmt.Errorf("partition %s: %w (the kernel's re-read of %s: %v)", pp.lp.GetName(), err, dp.t.path, rerr)
			}
			return fmt.Errorf("partition %s: %w", pp.lp.GetName(), err)
		}
	}
	return nil
}

// waitFor waits up to timeout for path to exist.
func waitFor(path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %s", path, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// createRaid makes r with mdadm. The metadata is 1.0 (superblock at the
// members' end) for a RAID1 the image's root or a boot loader reads: each
// member then starts with the plain filesystem, so firmware and boot
// loaders that know no md read it as they would a partition. Other
// arrays take mdadm's default 1.2 (at the start, so a member is never
// mistaken for a filesystem). --homehost=any: the installed system
// assembles the array whatever its host name.
func (d *Deployer) createRaid(ctx context.Context, lp *layoutPlan, r *inventoryv1.LayoutRaid) error {
	meta := "1.2"
	if r.GetLevel() == "raid1" && r.GetName() == lp.image {
		meta = "1.0"
	}
	level := strings.TrimPrefix(r.GetLevel(), "raid")
	args := []string{"--create", lp.md[r.GetName()], "--run", "--metadata=" + meta, "--level=" + level,
		fmt.Sprintf("--raid-devices=%d", len(r.GetDevices())), "--homehost=any", "--name=" + r.GetName()}
	for _, mem := range r.GetDevices() {
		args = append(args, d.dev(lp, mem))
	}
	if err := d.cfg.run(ctx, "mdadm", args...); err != nil {
		return fmt.Errorf("create raid %s: %w", r.GetName(), err)
	}
	return waitFor(lp.md[r.GetName()], d.cfg.NodeTimeout)
}

// createGroup makes g and its volumes with lvm, without udev.
func (d *Deployer) createGroup(ctx context.Context, lp *layoutPlan, g *inventoryv1.LayoutVolumeGroup) error {
	var devs []string
	for _, mem := range g.GetDevices() {
		devs = append(devs, d.dev(lp, mem))
	}
	if err := d.cfg.run(ctx, "lvm", append([]string{"pvcreate", "--config", lvmConfig, "-ff", "-y"}, devs...)...); err != nil {
		return fmt.Errorf("volume group %s: pvcreate: %w", g.GetName(), err)
	}
	if err := d.cfg.run(ctx, "lvm", append([]string{"vgcreate", "--config", lvmConfig, g.GetName()}, devs...)...); err != nil {
		return fmt.Errorf("volume group %s: vgcreate: %w", g.GetName(), err)
	}
	for _, v := range g.GetVolumes() {
		size := []string{"-l", "100%FREE"}
		if n := v.GetSizeBytes(); n > 0 {
			size = []string{"-L", fmt.Sprintf("%db", n)}
		}
		args := append([]string{"lvcreate", "--config", lvmConfig, "-y", "-W", "y", "-n", v.GetName()}, size...)
		if err := d.cfg.run(ctx, "lvm", append(args, g.GetName())...); err != nil {
			return fmt.Errorf("volume %s: lvcreate: %w", v.GetName(), err)
		}
		if err := waitFor(d.dev(lp, v.GetName()), d.cfg.NodeTimeout); err != nil {
			return fmt.Errorf("volume %s: %w", v.GetName(), err)
		}
	}
	return nil
}

// writePart writes the image's partition p onto dev: its extents shifted
// to dev's start through diskwrite (each extent's SHA-256 checked), the
// extents straddling its edges fetched whole and checked, their inside
// part written. progress, when set, gets "image" reports.
func (d *Deployer) writePart(ctx context.Context, plan *nodev1.DeployPlan, m *diskmap.Map, fetch diskwrite.Fetch, p imagePart, dev string, progress func(*nodev1.Progress)) error {
	sm, edges := subMap(m, p.start, p.end())
	if size, err := devSize(dev); err != nil {
		return err
	} else if size < sm.Size {
		return fmt.Errorf("%w: %s (%s) is smaller than the image's partition %d (%s)", ErrLayout, dev, mib(size), p.index, mib(sm.Size))
	}
	id := plan.GetDeploymentId()
	report := func(done, total int64) {
		if progress != nil {
			progress(&nodev1.Progress{Step: StepImage, InstallId: id, Detail: fmt.Sprintf("%d MiB of %d MiB written to %s", done>>20, total>>20, dev)})
		}
	}
	report(0, sm.Size)
	err := diskwrite.Write(ctx, diskwrite.Config{
		Device: dev, Map: sm, Fetch: shifted(fetch, p.start),
		Attempts: d.cfg.attempts, Backoff: d.cfg.backoff, Log: d.cfg.Logger,
		Progress: d.every(report),
	})
	if err != nil {
		return err
	}
	if err := writeEdges(ctx, fetch, dev, p.start, p.end(), edges, d.cfg.attempts); err != nil {
		return err
	}
	report(sm.Size, sm.Size)
	return nil
}

// devSize is the size of a block device or regular file.
func devSize(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n, err := f.Seek(0, 2)
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", path, err)
	}
	return n, nil
}

// withMounts adds the layout's mounts to the seed's vendor-data as a
// cloud-config part of its own: a MIME multipart of the appliance's
// vendor-data (text/plain: cloud-init types it by its first line) and
// {mounts: ...}. cloud-init merges the parts.
func withMounts(files []seedFile, mounts [][]string) []seedFile {
	var cfg bytes.Buffer
	cfg.WriteString("#cloud-config\nmounts:\n")
	for _, m := range mounts {
		q := make([]string, len(m))
		for i, s := range m {
			q[i] = fmt.Sprintf("%q", s)
		}
		fmt.Fprintf(&cfg, "  - [%s]\n", strings.Join(q, ", "))
	}
	out := slices.Clone(files)
	i := slices.IndexFunc(out, func(f seedFile) bool { return f.name == "vendor-data" })
	if i < 0 {
		// NoCloud's order: vendor-data before network-config.
		j := slices.IndexFunc(out, func(f seedFile) bool { return f.name == "network-config" })
		if j < 0 {
			j = len(out)
		}
		return slices.Insert(out, j, seedFile{"vendor-data", cfg.Bytes()})
	}
	const boundary = "corral-layout-mounts"
	var mp bytes.Buffer
	fmt.Fprintf(&mp, "Content-Type: multipart/mixed; boundary=%q\nMIME-Version: 1.0\n\n", boundary)
	fmt.Fprintf(&mp, "--%s\nContent-Type: text/plain; charset=\"utf-8\"\nMIME-Version: 1.0\n\n", boundary)
	mp.Write(out[i].data)
	if !bytes.HasSuffix(out[i].data, []byte("\n")) {
		mp.WriteString("\n")
	}
	fmt.Fprintf(&mp, "--%s\nContent-Type: text/cloud-config; charset=\"utf-8\"\nMIME-Version: 1.0\nContent-Disposition: attachment; filename=\"corral-layout.cfg\"\n\n", boundary)
	mp.Write(cfg.Bytes())
	fmt.Fprintf(&mp, "--%s--\n", boundary)
	out[i] = seedFile{"vendor-data", mp.Bytes()}
	return out
}

// newUUID is a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// runCommand runs a layout tool (mdadm, lvm, mke2fs, mkswap), its output
// in the error.
func runCommand(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "DM_DISABLE_UDEV=1", "LVM_SUPPRESS_FD_WARNINGS=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		o := strings.TrimSpace(string(out))
		if len(o) > 2000 {
			o = o[len(o)-2000:]
		}
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, o)
	}
	return nil
}
