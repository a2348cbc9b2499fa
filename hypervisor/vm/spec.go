// Package vm owns the QEMU processes of one node: it starts each VM as a
// daemonized qemu-system-x86_64 stopped with -S, with its QMP monitor,
// serial console (also logged to a file) and VNC display on unix sockets in
// a per-VM directory (mode 0700), then resumes it over QMP
// (github.com/digitalocean/go-qemu/qmp); it reboots (Ctrl-Alt-Del, or a
// hard reset), shuts down (ACPI power button, then a hard stop after a
// deadline), and deletes VMs. Disks are qcow2 volumes on virtio-blk with a
// boot order, ISO volumes and the cloud-init NoCloud seed are CD-ROMs on
// virtio-scsi (Debian's cloud kernel has no AHCI), NICs are virtio-net on
// taps created through a small interface the caller provides.
//
// The manager keeps no state of its own: everything is read back from the
// VM directories (spec.json, qemu.pid, qmp.sock, desired), so a new Manager
// over the same directory rediscovers running VMs and a VM whose QEMU
// died is reported FAILED. The accelerator is KVM when a probe guest runs
// under it, else TCG, with a log line saying why.
//
// The QEMU command line is a pure function (Args) with golden tests. It
// imports the standard library, go-qemu's qmp package, internal/apierr,
// hypervisor/cloudinit and hypervisor/internal.
package vm

import (
	"fmt"
	"net"
	"regexp"
	"strings"

	"github.com/corralhq/corral/hypervisor/cloudinit"
	"github.com/corralhq/corral/hypervisor/internal/safename"
	"github.com/corralhq/corral/internal/apierr"
)

// Spec is everything needed to (re)start one VM.
type Spec struct {
	Name        string
	UUID        string
	VCPUs       uint32
	MemoryBytes uint64
	Disks       []Disk
	NICs        []NIC
	// Seed, when set, is written as a NoCloud ISO and attached as a CD-ROM.
	Seed *cloudinit.Seed `json:",omitempty"`
	// Kernel, Initrd and Append boot a kernel directly (tests, rescue).
	Kernel string `json:",omitempty"`
	Initrd string `json:",omitempty"`
	Append string `json:",omitempty"`
	// Meta is kept with the spec for the caller (the HypervisorService
	// stores the VM message it was given) and returned by Get.
	Meta []byte `json:",omitempty"`
}

// Disk is one volume attached to the VM.
type Disk struct {
	Volume string
	// Path is the absolute path of the qcow2 file.
	Path string
	// BootIndex orders boot devices (lower first).
	BootIndex uint32
	// Format is the image format, "qcow2" (default) or "raw".
	Format string `json:",omitempty"`
	// CDROM attaches the volume read-only as a SCSI CD-ROM (ISO images).
	CDROM bool `json:",omitempty"`
}

// NIC is one virtio-net interface on a tap.
type NIC struct {
	Network string
	MAC     string
	// Tap is filled in by the Manager (netdev.TapName).
	Tap string `json:",omitempty"`
}

var uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// Validate reports the first problem with s (apierr.ErrInvalid).
func (s Spec) Validate() error {
	if err := safename.Check("vm", s.Name); err != nil {
		return err
	}
	if s.UUID != "" && !uuidRE.MatchString(s.UUID) {
		return apierr.Invalidf("vm %q: uuid %q", s.Name, s.UUID)
	}
	if s.VCPUs == 0 || s.VCPUs > 255 {
		return apierr.Invalidf("vm %q: vcpus %d: want 1-255", s.Name, s.VCPUs)
	}
	if s.MemoryBytes < 16<<20 || s.MemoryBytes%(1<<20) != 0 {
		return apierr.Invalidf("vm %q: memory %d bytes: want a multiple of 1 MiB, at least 16 MiB", s.Name, s.MemoryBytes)
	}
	seen := map[string]bool{}
	for i, d := range s.Disks {
		if err := safename.Check("volume", d.Volume); err != nil {
			return fmt.Errorf("vm %q: disk %d: %w", s.Name, i, err)
		}
		if !strings.HasPrefix(d.Path, "/") {
			return apierr.Invalidf("vm %q: disk %d: path %q is not absolute", s.Name, i, d.Path)
		}
		if d.Format != "" && d.Format != "qcow2" && d.Format != "raw" {
			return apierr.Invalidf("vm %q: disk %d: format %q: want qcow2 or raw", s.Name, i, d.Format)
		}
		if seen[d.Volume] {
			return apierr.Invalidf("vm %q: volume %q attached twice", s.Name, d.Volume)
		}
		seen[d.Volume] = true
	}
	macs := map[string]bool{}
	for i, n := range s.NICs {
		if err := safename.Check("network", n.Network); err != nil {
			return fmt.Errorf("vm %q: nic %d: %w", s.Name, i, err)
		}
		hw, err := net.ParseMAC(n.MAC)
		if err != nil || len(hw) != 6 || hw[0]&1 == 1 {
			return apierr.Invalidf("vm %q: nic %d: MAC %q is not a unicast EUI-48", s.Name, i, n.MAC)
		}
		if macs[hw.String()] {
			return apierr.Invalidf("vm %q: MAC %s used twice", s.Name, hw)
		}
		macs[hw.String()] = true
	}
	if s.Seed != nil {
		if err := s.Seed.Validate(); err != nil {
			return err
		}
	}
	for _, p := range []string{s.Kernel, s.Initrd} {
		if p != "" && !strings.HasPrefix(p, "/") {
			return apierr.Invalidf("vm %q: kernel/initrd path %q is not absolute", s.Name, p)
		}
	}
	if s.Initrd != "" && s.Kernel == "" {
		return apierr.Invalidf("vm %q: initrd without kernel", s.Name)
	}
	return nil
}
