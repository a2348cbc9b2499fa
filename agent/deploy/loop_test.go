package deploy

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralhq/corral/testsupport/require"
)

// TestDeployLoopDevice deploys onto a real loop device: the kernel's
// re-read (BLKRRPART) must show the grown partition and the seed
// partition, whose FAT the kernel mounts with the seed's files. It needs
// root and losetup.
func TestDeployLoopDevice(t *testing.T) {
	require.Root(t, "loop devices, BLKRRPART, mount")
	require.Tool(t, "losetup")
	for _, kind := range []string{"mbr", "gpt"} {
		t.Run(kind, func(t *testing.T) {
			fx := newFixture(t, kind, 1, diskSize)
			out, err := exec.Command("losetup", "-P", "-f", "--show", fx.disk).CombinedOutput()
			if err != nil {
				require.Missing(t, "no loop device available: losetup: %v: %s", err, out)
			}
			dev := strings.TrimSpace(string(out))
			t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
			name := filepath.Base(dev)

			plan := fx.plan(t)
			plan.Layout.Disks[0].Device = dev
			var console bytes.Buffer
			d := New(Config{ProgressInterval: time.Hour, Console: &console})
			rec := &recorder{}
			if err := d.Deploy(context.Background(), plan, rec.add); err != nil {
				t.Fatalf("Deploy: %v (steps %s)", err, rec.steps())
			}
			if strings.Contains(console.String(), "re-read") {
				t.Errorf("BLKRRPART failed:\n%s", console.String())
			}
			checkImageBytes(t, dev, fx.image, 1<<20, imageSize-33*512)
			// The seed through the block device (sizes as in the tests on
			// files: an MBR uses the disk to its end, a GPT leaves its
			// backup's 33 sectors).
			seedAt := int64(diskSize - SeedSize)
			if kind == "gpt" {
				seedAt = alignDown(diskSize - 33*512 - SeedSize)
			}
			checkSeed(t, dev, seedAt, plan)

			option := map[string]string{"mbr": "CONFIG_MSDOS_PARTITION", "gpt": "CONFIG_EFI_PARTITION"}[kind]
			if kernelLacks(option) {
				require.KernelLacks(t, "%s partition tables (%s is not set): the kernel's view of the seed partition is not checked", kind, option)
			}

			// The kernel's view after the re-read.
			root, seed := 1, 2
			sector := func(part int, file string) int64 {
				b, err := os.ReadFile(fmt.Sprintf("/sys/block/%s/%sp%d/%s", name, name, part, file))
				if err != nil {
					t.Fatalf("partition %d of %s after BLKRRPART: %v", part, name, err)
				}
				n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				return n
			}
			seedStart := sector(seed, "start") * 512
			if seedStart%(1<<20) != 0 || sector(seed, "size")*512 != SeedSize || seedStart+SeedSize > diskSize {
				t.Errorf("seed partition at %d, %d sectors", seedStart, sector(seed, "size"))
			}
			if end := (sector(root, "start") + sector(root, "size")) * 512; end != seedStart {
				t.Errorf("root partition ends at %d, want the seed's start %d", end, seedStart)
			}
			part := fmt.Sprintf("/dev/%sp%d", name, seed)
			if out, err := exec.Command("blkid", "-p", "-o", "export", part).CombinedOutput(); err == nil {
				if !strings.Contains(string(out), "LABEL=CIDATA") || !strings.Contains(string(out), "TYPE=vfat") {
					t.Errorf("blkid %s:\n%s", part, out)
				}
			}
			mnt := t.TempDir()
			if err := unix.Mount(part, mnt, "vfat", unix.MS_RDONLY, ""); err != nil {
				if errors.Is(err, unix.ENODEV) {
					t.Logf("the kernel has no vfat: the seed's files not read through it")
					return
				}
				t.Fatalf("mount %s: %v", part, err)
			}
			defer unix.Unmount(mnt, 0)
			for name, want := range map[string][]byte{"meta-data": plan.SeedMetaData, "user-data": plan.SeedUserData, "network-config": plan.SeedNetworkConfig} {
				got, err := os.ReadFile(filepath.Join(mnt, name))
				if err != nil || !bytes.Equal(got, want) {
					t.Errorf("%s through the kernel = %q, %v", name, got, err)
				}
			}
		})
	}
}

// kernelLacks reports whether /proc/config.gz says the running kernel
// was built without option.
func kernelLacks(option string) bool {
	f, err := os.Open("/proc/config.gz")
	if err != nil {
		return false
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return false
	}
	b, _ := io.ReadAll(z)
	return bytes.Contains(b, []byte("# "+option+" is not set"))
}
