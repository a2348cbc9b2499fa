// Package netguest builds a QEMU guest on Debian's cloud kernel (which has
// the 802.1Q, bonding, bridge, tun and veth modules this project's lab
// kernel lacks) whose /init (./guestinit) runs the node's network code,
// hypervisor/netdev, for real: a bond over the guest's two NICs, and two
// node namespaces joined by a veth "wire" as their uplinks, each with
// VLAN networks carrying endpoint namespaces, or (scenario vlan-qemu)
// nested QEMU VMs on the Manager's taps (the same cloud kernel with a
// busybox /init that addresses its NIC and pings its peers).
//
// The guest reports on its serial console in lines starting with
// "NETGUEST "; the test on the host drives the bond's failover through
// QEMU's set_link.
package netguest

import (
	"bytes"
	"compress/gzip"
	"context"
	_ "embed"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/corralhq/corral/internal/initramfs"
	"github.com/corralhq/corral/testsupport/guestimage"
)

//go:embed vminit.sh
var vmInit []byte

// Append is the outer guest's kernel command line (the scenarios to run
// follow as netguest.run=...).
const Append = "console=ttyS0,115200 loglevel=3 panic=-1"

// Tools are the host programs and files Build needs.
var Tools = []string{"apt-get", "apt-cache", "dpkg-deb", "go", "ldd", "qemu-system-x86_64", busybox, qemuBin}

const (
	busybox = "/bin/busybox" // busybox-static
	qemuBin = "/usr/bin/qemu-system-x86_64"
)

// NodeModules are loaded by the outer guest's init in this order
// (dependencies first).
var NodeModules = []string{
	"virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci",
	"failover", "net_failover", "virtio_net",
	"llc", "stp", "bridge", "mrp", "garp", "8021q", "tls", "bonding", "tun", "veth",
}

// vmModules are the nested VMs' (virtio NIC only).
var vmModules = []string{"virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci", "failover", "net_failover", "virtio_net"}

// QEMU data files the nested VMs need (pc machine, -nodefaults, direct
// kernel boot, no VGA, virtio-net with romfile=).
// Debian's QEMU looks for firmware in /usr/share/qemu and
// /usr/share/seabios.
var qemuData = []string{"/usr/share/seabios/bios-256k.bin", "/usr/share/qemu/linuxboot_dma.bin", "/usr/share/qemu/kvmvapic.bin"}

// Build returns the kernel and the gzip'd initramfs of the outer guest.
// The kernel is guestimage's (Debian's cloud kernel, cached).
func Build(ctx context.Context, cache string) (kernel string, initrd []byte, err error) {
	if m := guestimage.Missing(Tools); m != "" {
		return "", nil, fmt.Errorf("netguest: %s is not installed", m)
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", nil, err
	}
	kernel, modRoot, err := guestimage.Kernel(ctx, cache)
	if err != nil {
		return "", nil, err
	}
	mods := map[string]string{}
	_ = filepath.WalkDir(modRoot, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".ko") {
			mods[strings.TrimSuffix(d.Name(), ".ko")] = p
		}
		return nil
	})
	tmp, err := os.MkdirTemp("", "corral-netguest-")
	if err != nil {
		return "", nil, err
	}
	defer os.RemoveAll(tmp)
	initBin := filepath.Join(tmp, "init")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", initBin, "github.com/corralhq/corral/testsupport/netguest/guestinit")
	if _, file, _, ok := runtime.Caller(0); ok {
		cmd.Dir = filepath.Dir(file)
	}
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", nil, fmt.Errorf("netguest: build guestinit: %w: %s", err, out)
	}

	// The nested VMs' initramfs: busybox, the virtio NIC modules, vminit.sh.
	vm, err := archive(func(w *initramfs.Writer, add func(dst, src string, mode uint32) error) error {
		for _, d := range []string{"bin", "dev", "proc", "sys", "modules"} {
			w.Dir(d)
		}
		w.CharDev("dev/console", 0o600, 5, 1)
		w.File("init", 0o100755, vmInit)
		if err := add("bin/busybox", busybox, 0o100755); err != nil {
			return err
		}
		return addModules(add, mods, vmModules)
	})
	if err != nil {
		return "", nil, err
	}
	kb, err := os.ReadFile(kernel)
	if err != nil {
		return "", nil, err
	}
	libs, err := guestimage.SharedLibs(qemuBin, "/usr/lib/x86_64-linux-gnu/qemu/accel-tcg-x86_64.so")
	if err != nil {
		return "", nil, err
	}
	outer, err := archive(func(w *initramfs.Writer, add func(dst, src string, mode uint32) error) error {
		for _, d := range []string{"bin", "usr", "usr/bin", "usr/share", "usr/share/qemu", "usr/share/seabios", "usr/lib", "usr/lib/x86_64-linux-gnu",
			"usr/lib/x86_64-linux-gnu/qemu", "lib", "lib64", "lib/x86_64-linux-gnu", "dev", "proc", "sys", "run", "tmp", "var", "modules", "vm"} {
			w.Dir(d)
		}
		w.CharDev("dev/console", 0o600, 5, 1)
		if err := add("init", initBin, 0o100755); err != nil {
			return err
		}
		if err := add("bin/busybox", busybox, 0o100755); err != nil {
			return err
		}
		if err := add("usr/bin/qemu-system-x86_64", qemuBin, 0o100755); err != nil {
			return err
		}
		if err := add("usr/lib/x86_64-linux-gnu/qemu/accel-tcg-x86_64.so", "/usr/lib/x86_64-linux-gnu/qemu/accel-tcg-x86_64.so", 0o100644); err != nil {
			return err
		}
		for _, l := range libs {
			if err := add(strings.TrimPrefix(l, "/"), l, 0o100755); err != nil {
				return err
			}
		}
		for _, f := range qemuData {
			if err := add(strings.TrimPrefix(f, "/"), f, 0o100644); err != nil {
				return err
			}
		}
		w.File("vm/vmlinuz", 0o100644, kb)
		w.File("vm/initrd", 0o100644, vm)
		return addModules(add, mods, NodeModules)
	})
	return kernel, outer, err
}

func addModules(add func(dst, src string, mode uint32) error, found map[string]string, want []string) error {
	for _, m := range want {
		p, ok := found[m]
		if !ok {
			return fmt.Errorf("netguest: module %s not in the kernel package", m)
		}
		if err := add("modules/"+m+".ko", p, 0o100644); err != nil {
			return err
		}
	}
	return nil
}

// archive writes a gzip'd newc archive; add copies a host file (symlinks
// resolved).
func archive(fill func(w *initramfs.Writer, add func(dst, src string, mode uint32) error) error) ([]byte, error) {
	var raw bytes.Buffer
	w := initramfs.NewWriter(&raw)
	add := func(dst, src string, mode uint32) error {
		b, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("netguest: %w", err)
		}
		w.File(dst, mode, b)
		return nil
	}
	if err := fill(w, add); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	if _, err := zw.Write(raw.Bytes()); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return gz.Bytes(), nil
}
