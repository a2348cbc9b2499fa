package vm

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/corralhq/corral/hypervisor/cloudinit"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite golden files")

func goldenSpec() Spec {
	return Spec{
		Name: "vm1", UUID: "3f2a6c1e-0000-4000-8000-000000000001", VCPUs: 2, MemoryBytes: 1 << 30,
		Disks: []Disk{
			{Volume: "vm1-root", Path: "/var/lib/corral/volumes/vm1-root", BootIndex: 1},
			{Volume: "installer", Path: "/var/lib/corral/volumes/installer", BootIndex: 0, Format: "raw", CDROM: true},
			{Volume: "odd,name", Path: "/data/with,comma", BootIndex: 5},
		},
		NICs: []NIC{{Network: "lan", MAC: "52:54:00:12:34:56", Tap: "ctvm10a1b2c3d"}},
		Seed: &cloudinit.Seed{InstanceID: "vm1", Hostname: "vm1"},
	}
}

func TestArgsGolden(t *testing.T) {
	tests := map[string]struct {
		spec  Spec
		accel Accel
		vhost bool
	}{
		"tcg":    {goldenSpec(), TCG, false},
		"kvm":    {goldenSpec(), KVM, true},
		"kernel": {Spec{Name: "tiny", VCPUs: 1, MemoryBytes: 256 << 20, Kernel: "/k/vmlinuz", Initrd: "/k/initrd", Append: "console=ttyS0 quiet"}, TCG, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := strings.Join(Args(tc.spec, PathsFor("/var/lib/corral/vms/"+tc.spec.Name), tc.accel, tc.vhost), "\n") + "\n"
			path := filepath.Join("testdata", "args-"+name+".golden")
			if *update {
				os.MkdirAll("testdata", 0o755)
				os.WriteFile(path, []byte(got), 0o644)
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update)", err)
			}
			if d := cmp.Diff(string(want), got); d != "" {
				t.Errorf("args (-golden +got):\n%s", d)
			}
		})
	}
}

func TestSpecValidate(t *testing.T) {
	ok := goldenSpec()
	ok.Disks = ok.Disks[:2]
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid spec: %v", err)
	}
	bad := map[string]func(*Spec){
		"traversal name":   func(s *Spec) { s.Name = "../x" },
		"no vcpus":         func(s *Spec) { s.VCPUs = 0 },
		"odd memory":       func(s *Spec) { s.MemoryBytes = 1<<30 + 1 },
		"tiny memory":      func(s *Spec) { s.MemoryBytes = 1 << 20 },
		"bad uuid":         func(s *Spec) { s.UUID = "x" },
		"relative disk":    func(s *Spec) { s.Disks[0].Path = "vols/x" },
		"disk twice":       func(s *Spec) { s.Disks[1] = s.Disks[0] },
		"multicast mac":    func(s *Spec) { s.NICs[0].MAC = "01:00:5e:00:00:01" },
		"bad network":      func(s *Spec) { s.NICs[0].Network = "a/b" },
		"initrd no kernel": func(s *Spec) { s.Initrd = "/x" },
		"bad seed":         func(s *Spec) { s.Seed = &cloudinit.Seed{InstanceID: "x", Hostname: "bad host"} },
	}
	for name, mut := range bad {
		t.Run(name, func(t *testing.T) {
			s := ok
			s.Disks = append([]Disk(nil), ok.Disks...)
			s.NICs = append([]NIC(nil), ok.NICs...)
			mut(&s)
			if err := s.Validate(); !errors.Is(err, apierr.ErrInvalid) {
				t.Errorf("Validate: %v, want apierr.ErrInvalid", err)
			}
		})
	}
}

// TestArgsARM64: an arm64 node's QEMU gets the virt machine (under KVM
// with the host's GIC and CPU), a display without x86's VGA BIOS and an
// RTC without x86's driftfix; nothing else changes.
func TestArgsARM64(t *testing.T) {
	spec := Spec{Name: "a1", VCPUs: 1, MemoryBytes: 256 << 20, Kernel: "/k", Initrd: "/i", Append: "console=ttyAMA0"}
	p := PathsFor("/var/lib/corral/vms/a1")
	amd, arm := ArgsFor("amd64", spec, p, TCG, false), ArgsFor("arm64", spec, p, TCG, false)
	armKVM := ArgsFor("arm64", spec, p, KVM, false)
	// Without a kernel, through the node's UEFI firmware; with one, not.
	fw := p
	fw.Firmware = DefaultARM64Firmware
	disk := spec
	disk.Kernel, disk.Initrd, disk.Append = "", "", ""
	armDisk, armKernel := ArgsFor("arm64", disk, fw, TCG, false), ArgsFor("arm64", spec, fw, TCG, false)
	if slices.Contains(armKernel, "-bios") || slices.Contains(armDisk, "-kernel") {
		t.Errorf("firmware with a kernel, or a kernel without one: %q / %q", armKernel, armDisk)
	}
	has := func(a []string, flag, v string) bool {
		for i := 0; i+1 < len(a); i++ {
			if a[i] == flag && a[i+1] == v {
				return true
			}
		}
		return false
	}
	for _, c := range []struct {
		a         []string
		flag, val string
	}{
		{amd, "-machine", "q35"}, {amd, "-device", "VGA,id=video0"}, {amd, "-rtc", "base=utc,driftfix=slew"},
		{arm, "-machine", "virt"}, {arm, "-device", "virtio-gpu-pci,id=video0"}, {arm, "-rtc", "base=utc"},
		{arm, "-cpu", "max"}, {arm, "-kernel", "/k"},
		{armKVM, "-machine", "virt,gic-version=host"}, {armKVM, "-cpu", "host"},
		{armDisk, "-bios", DefaultARM64Firmware},
	} {
		if !has(c.a, c.flag, c.val) {
			t.Errorf("%s %s missing in %q", c.flag, c.val, c.a)
		}
	}
	if len(amd) != len(arm) {
		t.Errorf("amd64 has %d arguments, arm64 %d", len(amd), len(arm))
	}
	if DefaultQEMU("arm64") != "qemu-system-aarch64" || DefaultQEMU("amd64") != "qemu-system-x86_64" {
		t.Error("DefaultQEMU")
	}
}
