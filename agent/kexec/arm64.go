package kexec

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	ukexec "github.com/u-root/u-root/pkg/boot/kexec"
	ulinux "github.com/u-root/u-root/pkg/boot/linux"
	"github.com/u-root/u-root/pkg/dt"
	"golang.org/x/sys/unix"
)

// arm64's kexec_file_load(2) (Linux 6.1's arch/arm64/kernel/kexec_image.c)
// takes only a plain Image: it checks the arm64 image header's magic
// "ARM\x64" at offset 56. Debian's arm64 vmlinuz is that Image gzip'd
// (the firmware's EFI stub is inside the Image, and GRUB's linux command
// unpacks the gzip), so the agent unpacks it before loading. Debian 12's
// arm64 kernel has no kexec_file_load at all (CONFIG_KEXEC_FILE is not
// set): there it loads with kexec_load (SegmentsLoadARM64), which a
// locked-down kernel refuses, so an arm64 machine under Secure Boot
// cannot kexec that kernel. x86's SegmentsLoad is not tried.

// MaxImageSize bounds an unpacked arm64 kernel Image (Debian's is about
// 32 MB): a gzip bomb of a kernel stops there.
const MaxImageSize = 256 << 20

// arm64Magic is the arm64 Image header's magic and its offset.
const (
	arm64MagicOff = 56
	arm64Magic    = "ARM\x64"
)

// ErrNotImage means a kernel is neither an arm64 Image nor a gzip'd one.
var ErrNotImage = errors.New("not an arm64 kernel Image")

// ARM64Image returns kernel as the plain arm64 Image kexec_file_load
// takes: kernel itself (rewound) when it is one, else the gzip it is
// unpacked into an in-memory file of at most MaxImageSize bytes, checked
// for the header's magic. The caller closes a returned file that is not
// kernel.
func ARM64Image(kernel *os.File) (*os.File, error) {
	return arm64Image(kernel, MaxImageSize)
}

func arm64Image(kernel *os.File, limit int64) (*os.File, error) {
	head := make([]byte, 64)
	n, err := kernel.ReadAt(head, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	head = head[:n]
	if len(head) >= arm64MagicOff+4 && string(head[arm64MagicOff:arm64MagicOff+4]) == arm64Magic {
		if _, err := kernel.Seek(0, io.SeekStart); err != nil {
			return nil, err
		}
		return kernel, nil
	}
	if len(head) < 2 || head[0] != 0x1f || head[1] != 0x8b {
		return nil, ErrNotImage
	}
	zr, err := gzip.NewReader(bufio.NewReader(io.NewSectionReader(kernel, 0, 1<<62)))
	if err != nil {
		return nil, fmt.Errorf("kernel: gzip: %w", err)
	}
	zr.Multistream(false) // Debian's Image.gz is padded after its one member
	out, err := memFile("image")
	if err != nil {
		return nil, err
	}
	w, err := io.Copy(out, io.LimitReader(zr, limit+1))
	if err == nil && w > limit {
		err = fmt.Errorf("unpacked kernel over %d bytes", limit)
	}
	if err == nil {
		_, err = out.ReadAt(head[:cap(head)][:64], 0)
		if err == nil && string(head[arm64MagicOff:arm64MagicOff+4]) != arm64Magic {
			err = ErrNotImage
		}
	}
	if err == nil {
		_, err = out.Seek(0, io.SeekStart)
	}
	if err != nil {
		out.Close()
		return nil, fmt.Errorf("kernel: %w", err)
	}
	return out, nil
}

// loadARM64 unpacks kernel (ARM64Image) and loads it with file
// (kexec_file_load); where the kernel lacks kexec_file_load (ENOSYS:
// Debian 12's arm64 kernel is built without CONFIG_KEXEC_FILE) and is not
// locked down, with segments (kexec_load). It returns which syscall
// loaded it.
func loadARM64(kernel, initrd *os.File, cmdline string, locked bool, file, segments loadFunc) (string, error) {
	img, err := ARM64Image(kernel)
	if err != nil {
		return "", err
	}
	if img != kernel {
		defer img.Close()
	}
	err = file(img, initrd, cmdline)
	if err == nil {
		return "kexec_file_load", nil
	}
	if !errors.Is(err, unix.ENOSYS) || locked {
		return "", fmt.Errorf("kexec_file_load: %w", err)
	}
	if _, err := img.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	if err := segments(img, initrd, cmdline); err != nil {
		return "", fmt.Errorf("kexec_file_load is not in this kernel; kexec_load: %w", err)
	}
	return "kexec_load", nil
}

// SegmentsLoadARM64 loads an arm64 Image with kexec_load(2) through
// u-root's arm64 loader (pkg/boot/linux: the Image at a 2 MiB-aligned
// base plus its text_offset, the initrd, the device tree with /chosen's
// bootargs and initrd range, and a trampoline that enters the kernel
// with x0 = the device tree). The device tree is this boot's
// (/sys/firmware/fdt). A machine booted by UEFI has no memory nodes in
// it (the EFI stub removes them and points /chosen at the UEFI memory
// map), so the RAM /proc/iomem lists, less its reserved parts, is added
// as memory nodes for u-root to place the segments in; /chosen's UEFI
// properties stay, and a machine that booted on ACPI gets acpi=force.
func SegmentsLoadARM64(kernel, initrd *os.File, cmdline string) error {
	fdt, err := dt.ReadFile("/sys/firmware/fdt")
	if err != nil {
		return fmt.Errorf("device tree: %w", err)
	}
	cmdline, err = nextTree(fdt, ukexec.MemoryMapFromIOMem, acpiInUse(), cmdline)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	if _, err := fdt.Write(&b); err != nil {
		return fmt.Errorf("device tree: %w", err)
	}
	return ulinux.KexecLoad(kernel, initrd, cmdline, bytes.NewReader(b.Bytes()), nil)
}

// nextTree makes this boot's device tree fdt the next kernel's, and
// returns the next kernel's command line. A tree without memory nodes (a
// UEFI boot's: the EFI stub removed them) gets iomem's RAM as memory
// nodes, for u-root to place the segments in. The UEFI properties of
// /chosen stay: the next kernel takes its memory from the same UEFI
// memory map (it discards memory nodes then) and keeps the EFI runtime
// and ACPI tables, as kexec-tools has it; the memory map and the
// runtime's regions are reserved in /proc/iomem, so no segment lands on
// them. Stripping those properties instead left a kernel with neither
// UEFI nor a tree describing CPUs and timer: it panicked before its
// console came up ("Unable to initialise architected timer", seen with
// earlycon). With acpi (the first kernel ran on ACPI) the command line
// gets acpi=force: with memory nodes the tree is no longer a stub, and
// arm64 takes a tree that is not one for the hardware description.
func nextTree(fdt *dt.FDT, iomem func() (ukexec.MemoryMap, error), acpi bool, cmdline string) (string, error) {
	if _, ok := fdt.RootNode.Find(func(n *dt.Node) bool { return strings.HasPrefix(n.Name, "memory@") || n.Name == "memory" }); ok {
		return cmdline, nil
	}
	mm, err := iomem()
	if err != nil {
		return "", fmt.Errorf("/proc/iomem: %w", err)
	}
	ram := mm.RAM()
	if len(ram) == 0 {
		return "", errors.New("/proc/iomem lists no System RAM")
	}
	for _, c := range []string{"#address-cells", "#size-cells"} {
		p, ok := fdt.RootNode.LookProperty(c)
		if !ok || len(p.Value) != 4 || binary.BigEndian.Uint32(p.Value) != 2 {
			return "", fmt.Errorf("device tree: root %s is not 2", c)
		}
	}
	if acpi {
		cmdline += " acpi=force"
	}
	for _, r := range ram {
		reg := make([]byte, 16)
		binary.BigEndian.PutUint64(reg, uint64(r.Start))
		binary.BigEndian.PutUint64(reg[8:], uint64(r.Size))
		fdt.RootNode.Children = append(fdt.RootNode.Children, &dt.Node{Name: fmt.Sprintf("memory@%x", r.Start),
			Properties: []dt.Property{{Name: "device_type", Value: []byte("memory\x00")}, {Name: "reg", Value: reg}}})
	}
	return cmdline, nil
}

// acpiInUse says whether this kernel took its hardware description from
// ACPI (it then publishes the tables).
func acpiInUse() bool {
	_, err := os.Stat("/sys/firmware/acpi/tables/DSDT")
	return err == nil
}
