// Package netguest builds a QEMU guest on Debian's cloud kernel (which has
// the 802.1Q, bonding, bridge and veth modules this project's lab kernel
// lacks) whose /init (./guestinit) runs the node's network code,
// hypervisor/netdev, for real: a bond over the guest's two NICs, and two
// node namespaces joined by a veth "wire" as their uplinks, each with
// VLAN networks. The VMs on those networks are QEMU guests the test runs
// on the host (the same kernel with a busybox /init, vminit.sh, that
// addresses its NIC and pings its peers); each VM's NIC is joined over
// loopback UDP to an extra NIC of the node guest, which the guest's init
// enslaves to the Manager's bridge where the VM's tap would be.
//
// The guest reports on its serial console in lines starting with
// "NETGUEST "; the test on the host drives the bond's failover through
// QEMU's set_link and ends each scenario with a line on that console.
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
var Tools = []string{"apt-get", "apt-cache", "dpkg-deb", "go", "qemu-system-x86_64", busybox}

const busybox = "/bin/busybox" // busybox-static

// NodeModules are loaded by the outer guest's init in this order
// (dependencies first).
var NodeModules = []string{
	"virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci",
	"failover", "net_failover", "virtio_net",
	"llc", "stp", "bridge", "mrp", "garp", "8021q", "tls", "bonding", "veth",
}

// vmModules are the VMs' (virtio NIC only).
var vmModules = []string{"virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci", "failover", "net_failover", "virtio_net"}

// VMAppend is a VM's kernel command line: its address (CIDR) and the
// peers it pings once a second, printing "VMPING <peer> ok|fail".
func VMAppend(cidr string, peers []string) string {
	return fmt.Sprintf("console=ttyS0,115200 loglevel=4 panic=-1 netguest.ip=%s netguest.peers=%s", cidr, strings.Join(peers, ","))
}

// Build returns the kernel both guests boot (guestimage's: Debian's cloud
// kernel, cached) and the gzip'd initramfs of the node guest and of the
// VMs.
func Build(ctx context.Context, cache string) (kernel string, node, vm []byte, err error) {
	if m := guestimage.Missing(Tools); m != "" {
		return "", nil, nil, fmt.Errorf("netguest: %s is not installed", m)
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", nil, nil, err
	}
	kernel, modRoot, err := guestimage.Kernel(ctx, cache)
	if err != nil {
		return "", nil, nil, err
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
		return "", nil, nil, err
	}
	defer os.RemoveAll(tmp)
	initBin := filepath.Join(tmp, "init")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", initBin, "github.com/corralhq/corral/testsupport/netguest/guestinit")
	if _, file, _, ok := runtime.Caller(0); ok {
		cmd.Dir = filepath.Dir(file)
	}
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", nil, nil, fmt.Errorf("netguest: build guestinit: %w: %s", err, out)
	}

	// The VMs' initramfs: busybox, the virtio NIC modules, vminit.sh.
	vm, err = archive(func(w *initramfs.Writer, add func(dst, src string, mode uint32) error) error {
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
		return "", nil, nil, err
	}
	node, err = archive(func(w *initramfs.Writer, add func(dst, src string, mode uint32) error) error {
		for _, d := range []string{"bin", "dev", "proc", "sys", "run", "tmp", "var", "modules"} {
			w.Dir(d)
		}
		w.CharDev("dev/console", 0o600, 5, 1)
		if err := add("init", initBin, 0o100755); err != nil {
			return err
		}
		if err := add("bin/busybox", busybox, 0o100755); err != nil {
			return err
		}
		return addModules(add, mods, NodeModules)
	})
	if err != nil {
		return "", nil, nil, err
	}
	return kernel, node, vm, nil
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
