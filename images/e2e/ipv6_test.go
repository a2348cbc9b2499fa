package e2e

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPXEv6Discovery: the real discovery image on an IPv6-only segment.
// OVMF (its IPv4 PXE switched off) PXE-boots over DHCPv6 and TFTP on
// IPv6, iPXE asks DHCPv6 again and fetches the script, kernel and
// initramfs from [addr]:8080; the kernel command line names the API as an
// IPv6 literal, so the agent runs DHCPv6 itself (agent/netup), registers
// over IPv6 and the machine is INVENTORIED with its boot MAC. The
// appliance's boot interface has no IPv4 address at all.
func TestPXEv6Discovery(t *testing.T) {
	const ovmfCode, ovmfVars = "/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"
	need(t, "ip", "qemu-system-x86_64", ovmfCode, ovmfVars)
	image(t)
	l := newLab(t)
	// No IPv4 on the segment: the bridge keeps its link-local address
	// (DHCPv6 answers from it) and a unique-local one (no DAD, so it is
	// usable at once).
	prefix := fmt.Sprintf("fd79:%s::", l.id[:4])
	l.ipn("addr", "del", l.subnet+".1/24", "dev", l.bridge)
	l.ipn("addr", "add", prefix+"1/64", "dev", l.bridge, "nodad")
	data := filepath.Join(l.dir, "data")
	if out, err := exec.Command(filepath.Join(binDir, "corrald"), "images", "build", "--data-dir", data,
		"--image-cache", imageCache(), "--source", srcDir).CombinedOutput(); err != nil {
		t.Fatalf("corrald images build: %v\n%s", err, out)
	}
	c := startCorrald(t, l.dir, l.ns, data, "--api-listen", ":20180", "--boot-interface", l.bridge,
		"--dhcp-mode", "off", "--dhcp6-range", prefix+"100-"+prefix+"1ff", "--ra-router-lifetime", "30m")

	vars := l.varsCopy(ovmfVars, "OVMF_VARS.fd")
	mac := fmt.Sprintf("52:54:00:%s:%s:06", l.id[:2], l.id[2:4])
	args := append(qemuBase(memoryMB, cpus), "-machine", "q35",
		"-drive", "if=pflash,format=raw,readonly=on,file="+ovmfCode, "-drive", "if=pflash,format=raw,file="+vars,
		"-fw_cfg", "name=opt/org.tianocore/IPv4PXESupport,string=n",
		"-netdev", "tap,id=n0,ifname="+l.tap("v"+l.id[:4])+",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,romfile=,mac="+mac)
	args = append(append(args, smbios()...), disks(t, l.dir, "DISK-V6")...)
	t0 := time.Now()
	vm := start(t, l.dir, "console-v6.log", "ip", append([]string{"netns", "exec", l.ns}, args...)...)
	m := c.waitMachine(vm, bootTimeout, "with serial "+serial+" INVENTORIED over IPv6", func(m machine) bool {
		return m.Serial == serial && m.State == "INVENTORIED"
	})
	t.Logf("OVMF PXEv6 boot to INVENTORIED on an IPv6-only segment: %s", time.Since(t0).Round(time.Second))
	if m.BootMAC != mac {
		t.Errorf("boot_mac = %q, want %s", m.BootMAC, mac)
	}
	if con := vm.console.String(); !strings.Contains(con, "DHCPv6 on") || !strings.Contains(con, prefix) {
		t.Errorf("the agent's console shows no DHCPv6 lease in %s:\n%s", prefix, tail(con, 3000))
	}
	vm.stop(t)
}
