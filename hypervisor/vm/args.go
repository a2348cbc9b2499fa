package vm

import (
	"encoding/json"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
)

// Accel is the accelerator QEMU runs with.
type Accel string

// Accelerators.
const (
	KVM Accel = "kvm"
	TCG Accel = "tcg"
)

// Paths are the per-VM files QEMU is pointed at (all absolute).
type Paths struct {
	Dir     string
	PIDFile string
	QMP     string
	Serial  string
	Console string // serial console log
	VNC     string
	Seed    string // "" without a seed
	// Firmware is the UEFI firmware a guest without a kernel boots
	// through (-bios; an arm64 node's: DefaultARM64Firmware); "" leaves
	// the machine's own (SeaBIOS on amd64).
	Firmware string
}

// PathsFor returns the file layout of a VM directory.
func PathsFor(dir string) Paths {
	return Paths{
		Dir:     dir,
		PIDFile: dir + "/qemu.pid",
		QMP:     dir + "/qmp.sock",
		Serial:  dir + "/serial.sock",
		Console: dir + "/console.log",
		VNC:     dir + "/vnc.sock",
		Seed:    dir + "/seed.iso",
	}
}

// guestMarker is the -name guest= value; it identifies the process of a VM
// when its pid file is read back.
func guestMarker(name string) string { return "corral:" + name }

// Args returns the QEMU arguments (without the binary) for spec. It is a
// pure function; spec must be valid and NIC taps filled in. The VM starts
// stopped (-S) and daemonized; guest power-off leaves QEMU in the
// "shutdown" state (-no-shutdown) instead of exiting.
func Args(spec Spec, p Paths, accel Accel, vhost bool) []string {
	return ArgsFor(runtime.GOARCH, spec, p, accel, vhost)
}

// DefaultARM64Firmware is the UEFI firmware an arm64 node's guests boot
// from their disks through: EDK2 for QEMU's virt machine as one 2 MiB
// image (Debian's qemu-efi-aarch64; its UEFI variables live in RAM, so a
// guest boots its disk's removable-media loader, \EFI\BOOT\BOOTAA64.EFI,
// as Debian's and most cloud images install it). The arm64 hypervisor
// image carries it (images/discovery ARM64UEFIFirmware).
const DefaultARM64Firmware = "/usr/share/qemu-efi-aarch64/QEMU_EFI.fd"

// DefaultQEMU is the emulator of the node's own architecture (GOARCH):
// qemu-system-aarch64 on arm64, else qemu-system-x86_64.
func DefaultQEMU(goarch string) string {
	if goarch == "arm64" {
		return "qemu-system-aarch64"
	}
	return "qemu-system-x86_64"
}

// ArgsFor is Args for a node of architecture goarch. On arm64 the
// machine is virt (q35 is x86's), the display is virtio-gpu-pci (the std
// VGA needs x86's VGA BIOS) and the RTC has no driftfix (an x86 RTC
// option); the rest is the same. virt has no firmware of its own: an
// arm64 guest boots with Spec.Kernel, or from its disks through
// p.Firmware (UEFI). Under
// KVM an arm64 guest gets the host's interrupt controller version
// (virt's default, GICv2, fails on the many GICv3 hosts without v2
// emulation).
func ArgsFor(goarch string, spec Spec, p Paths, accel Accel, vhost bool) []string {
	machine, video, rtc := "q35", "VGA,id=video0", "base=utc,driftfix=slew"
	if goarch == "arm64" {
		machine, video, rtc = "virt", "virtio-gpu-pci,id=video0", "base=utc"
		if accel == KVM {
			machine += ",gic-version=host"
		}
	}
	a := []string{
		"-name", "guest=" + guestMarker(spec.Name) + ",debug-threads=on",
		"-msg", "timestamp=on",
		"-nodefaults", "-no-user-config",
		"-S", "-no-shutdown", "-daemonize",
		"-pidfile", p.PIDFile,
		"-machine", machine,
	}
	if spec.UUID != "" {
		a = append(a, "-uuid", spec.UUID)
	}
	switch accel {
	case KVM:
		a = append(a, "-accel", "kvm", "-cpu", "host")
	default:
		a = append(a, "-accel", "tcg,thread=multi", "-cpu", "max")
	}
	a = append(a,
		"-smp", fmt.Sprintf("%d,sockets=1,cores=%d,threads=1", spec.VCPUs, spec.VCPUs),
		"-m", strconv.FormatUint(spec.MemoryBytes>>20, 10)+"M",
		"-rtc", rtc,
		"-boot", "strict=on",
		"-chardev", "socket,id=qmp,path="+optEscape(p.QMP)+",server=on,wait=off",
		"-mon", "chardev=qmp,mode=control",
		"-chardev", "socket,id=serial0,path="+optEscape(p.Serial)+",server=on,wait=off,logfile="+optEscape(p.Console)+",logappend=on",
		"-serial", "chardev:serial0",
		"-vnc", "unix:"+optEscape(p.VNC),
		"-device", video,
		"-object", "rng-random,id=rng0,filename=/dev/urandom",
		"-device", "virtio-rng-pci,rng=rng0,id=rng0dev",
		"-device", "virtio-scsi-pci,id=scsi0",
	)
	for i, d := range spec.Disks {
		node := fmt.Sprintf("disk%d", i)
		a = append(a, "-blockdev", blockdev(node, d.Format, d.Path, d.CDROM))
		if d.CDROM {
			a = append(a, "-device", fmt.Sprintf("scsi-cd,bus=scsi0.0,drive=%s,id=cd%d,bootindex=%d", node, i, d.BootIndex))
		} else {
			a = append(a, "-device", fmt.Sprintf("virtio-blk-pci,drive=%s,id=vd%d,bootindex=%d", node, i, d.BootIndex))
		}
	}
	if spec.Seed != nil {
		a = append(a,
			"-blockdev", rawBlockdev("seed", p.Seed),
			"-device", "scsi-cd,bus=scsi0.0,drive=seed,id=seedcd")
	}
	for i, n := range spec.NICs {
		hw, _ := net.ParseMAC(n.MAC)
		vh := "off"
		if vhost {
			vh = "on"
		}
		a = append(a,
			"-netdev", fmt.Sprintf("tap,id=net%d,ifname=%s,script=no,downscript=no,vhost=%s", i, n.Tap, vh),
			"-device", fmt.Sprintf("virtio-net-pci,netdev=net%d,id=nic%d,mac=%s", i, i, hw))
	}
	if spec.Kernel == "" && p.Firmware != "" {
		a = append(a, "-bios", p.Firmware)
	}
	if spec.Kernel != "" {
		a = append(a, "-kernel", spec.Kernel)
		if spec.Initrd != "" {
			a = append(a, "-initrd", spec.Initrd)
		}
		if spec.Append != "" {
			a = append(a, "-append", spec.Append)
		}
	}
	return a
}

// blockdev is a format node (qcow2 unless format says raw) over a file,
// in JSON syntax so paths need no escaping. The format is always given:
// QEMU never probes.
func blockdev(node, format, path string, readOnly bool) string {
	if format == "" {
		format = "qcow2"
	}
	b, _ := json.Marshal(map[string]any{
		"driver":    format,
		"node-name": node,
		"read-only": readOnly,
		"file":      map[string]any{"driver": "file", "filename": path, "read-only": readOnly},
	})
	return string(b)
}

func rawBlockdev(node, path string) string { return blockdev(node, "raw", path, true) }

// optEscape doubles commas, QEMU's escape inside key=value options.
func optEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }
