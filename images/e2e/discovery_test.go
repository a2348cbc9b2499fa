package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/ipmisim/simconf"
	"github.com/corralhq/corral/testsupport/require"
	"github.com/corralhq/corral/testsupport/swtpm"
)

// bootTimeout bounds one boot to registration: ~20-40 s under TCG on a
// quiet machine (PXE adds the iPXE download), more on a busy one.
const bootTimeout = 4 * time.Minute

const (
	serial   = "SN-E2E-1"
	uuid     = "5c1e2d3a-4b5c-4d6e-8f70-81929a0b1c2d"
	vendor   = "Corral Lab"
	product  = "PXE Box 1"
	memoryMB = 1024
	cpus     = 2
)

func smbios() []string {
	return []string{"-smbios", fmt.Sprintf("type=1,serial=%s,uuid=%s,manufacturer=%s,product=%s", serial, uuid, vendor, product)}
}

func qemuBase(memMB, smp int) []string {
	return []string{"qemu-system-x86_64", "-accel", "tcg,thread=multi", "-cpu", "max", "-m", strconv.Itoa(memMB),
		"-smp", strconv.Itoa(smp), "-nographic", "-no-reboot", "-serial", "stdio", "-monitor", "none"}
}

// TestPXEDiscovery: `corrald images build` registers the real discovery
// image; `corrald serve` on the same data directory PXE-boots an unknown
// QEMU machine into it (DHCP full mode, iPXE, HTTP); corral-node discover
// registers the machine with its SMBIOS identity, disks, NIC, CPUs and
// memory, and proves its swtpm TPM's endorsement key, which its record
// binds. The machine is then booted again with its e1000 swapped for a
// virtio NIC (new MAC) and the same TPM: the key is the evidence, so it
// stays one machine with no operator, and its fact history notes the NIC
// change. Last, another QEMU machine with the same SMBIOS serial and UUID
// but a TPM of its own boots: it is parked in CONFLICT and the first
// machine's record does not change (docs/security.md, "Claims").
func TestPXEDiscovery(t *testing.T) {
	need(t, "ip", "qemu-system-x86_64")
	image(t)
	l := newLab(t)
	data := filepath.Join(l.dir, "data")

	t0 := time.Now()
	out, err := exec.Command(filepath.Join(binDir, "corrald"), "images", "build", "--data-dir", data,
		"--image-cache", imageCache(), "--source", srcDir).CombinedOutput()
	if err != nil {
		t.Fatalf("corrald images build: %v\n%s", err, out)
	}
	t.Logf("corrald images build (%s):\n%s", time.Since(t0).Round(100*time.Millisecond), out)

	c := startCorrald(t, l.dir, l.ns, data, "--api-listen", l.subnet+".1:20180", "--boot-interface", l.bridge,
		"--dhcp-mode", "full", "--dhcp-range", l.subnet+".100-"+l.subnet+".150", "--dhcp-router", l.subnet+".1")
	disk := disks(t, l.dir, "DISK-A", "DISK-B")

	require.Tool(t, "swtpm")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	// tpm starts a swtpm on state dir (the same dir: the same TPM, once
	// the one before it on that dir is stopped).
	tpm := func(dir string) *swtpm.TPM {
		sw, err := swtpm.Start(ctx, filepath.Join(l.dir, dir), swtpm.QEMU)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sw.Stop)
		return sw
	}
	boot := func(nic, mac, tap string, tpmArgs []string) *proc {
		args := append(qemuBase(memoryMB, cpus), "-boot", "n",
			"-netdev", "tap,id=n0,ifname="+tap+",script=no,downscript=no", "-device", nic+",netdev=n0,mac="+mac)
		args = append(append(append(args, smbios()...), disk...), tpmArgs...)
		return start(t, l.dir, "console-"+strings.ReplaceAll(mac, ":", "")+".log", "ip", append([]string{"netns", "exec", l.ns}, args...)...)
	}

	// First boot: e1000.
	mac1 := fmt.Sprintf("52:54:00:%s:%s:01", l.id[:2], l.id[2:4])
	t0 = time.Now()
	tpmA := tpm("tpm-a")
	vm := boot("e1000", mac1, l.tap("t"+l.id[:4]+"a"), tpmA.QEMUArgs())
	m := c.waitMachine(vm, bootTimeout, "with serial "+serial+" INVENTORIED", func(m machine) bool {
		return m.Serial == serial && m.State == "INVENTORIED"
	})
	t.Logf("e1000 PXE boot to registration: %s", time.Since(t0).Round(time.Second))
	if !strings.EqualFold(m.SystemUUID, uuid) {
		t.Errorf("system_uuid = %q, want %s", m.SystemUUID, uuid)
	}
	if m.Facts.System.Vendor != vendor || m.Facts.System.Product != product {
		t.Errorf("system vendor/product = %q/%q, want %q/%q", m.Facts.System.Vendor, m.Facts.System.Product, vendor, product)
	}
	if m.BootMAC != mac1 {
		t.Errorf("boot_mac = %q, want %s", m.BootMAC, mac1)
	}
	checkFacts(t, m, mac1, "e1000")
	if len(m.EKIdentity) != 64 {
		t.Errorf("TPM key bound %q, want the 64-hex SHA-256 of its endorsement key", m.EKIdentity)
	}
	ek := m.EKIdentity
	vm.stop(t)
	tpmA.Stop()

	// Second boot: the NIC swapped for virtio-net (new MAC).
	mac2 := fmt.Sprintf("52:54:00:%s:%s:02", l.id[:2], l.id[2:4])
	t0 = time.Now()
	tpmA = tpm("tpm-a")
	vm = boot("virtio-net-pci", mac2, l.tap("t"+l.id[:4]+"b"), tpmA.QEMUArgs())
	m = c.waitMachine(vm, bootTimeout, "with serial "+serial+" registered from "+mac2, func(m machine) bool {
		return m.Serial == serial && m.BootMAC == mac2 && m.State == "INVENTORIED"
	})
	t.Logf("virtio-net PXE boot to registration: %s", time.Since(t0).Round(time.Second))
	checkFacts(t, m, mac2, "virtio_net")
	nicChange := false
	for _, h := range m.FactHistory {
		t.Logf("fact history: %s: %q → %q", h.Path, h.Before, h.After)
		// e.g. nic[52:54:00:..:01]: "eth0 e1000" → "" and nic[...:02]: "" → "eth0 virtio_net"
		if strings.HasPrefix(h.Path, "nic") && strings.Contains(h.Path+h.Before+h.After, mac1) {
			nicChange = true
		}
	}
	if !nicChange {
		t.Errorf("fact history notes no NIC change from %s to %s: %+v", mac1, mac2, m.FactHistory)
	}
	same := 0
	for _, x := range c.machines() {
		if x.Serial == serial || x.SystemUUID == uuid || contains(x.MACs, mac1) || contains(x.MACs, mac2) || x.BootMAC == mac2 {
			same++
		}
	}
	if same != 1 {
		out, _ := c.cli("get", "machines", "-o", "json")
		t.Errorf("%d machine records for one machine, want 1:\n%s", same, out)
	}
	vm.stop(t)

	// Another machine: the same SMBIOS serial and UUID, a TPM of its own.
	mac3 := fmt.Sprintf("52:54:00:%s:%s:03", l.id[:2], l.id[2:4])
	t0 = time.Now()
	vm = boot("virtio-net-pci", mac3, l.tap("t"+l.id[:4]+"c"), tpm("tpm-b").QEMUArgs())
	parked := "conflict-" + strings.ReplaceAll(mac3, ":", "")
	p := c.waitMachine(vm, bootTimeout, parked+" in CONFLICT", func(m machine) bool {
		return m.Name == parked && m.State == "CONFLICT"
	})
	t.Logf("impostor PXE boot to CONFLICT: %s; reason: %s", time.Since(t0).Round(time.Second), p.Conflict.Reason)
	if p.Conflict.Machine != m.Name || !strings.Contains(p.Conflict.Reason, "TPM endorsement key") {
		t.Errorf("parked record claims %q for %q; want %s and the TPM key named", p.Conflict.Machine, p.Conflict.Reason, m.Name)
	}
	for _, x := range c.machines() {
		if x.Name == m.Name && (x.BootMAC != mac2 || x.EKIdentity != ek || x.State != "INVENTORIED") {
			t.Errorf("the first machine changed: boot MAC %s, TPM key %s, state %s", x.BootMAC, x.EKIdentity, x.State)
		}
	}
	out, _ = c.cli("get", "machines")
	t.Logf("corral get machines:\n%s", out)
}

// checkFacts checks what QEMU was given: two virtio disks with serials,
// the NIC with its MAC and driver, the CPU count and the memory.
func checkFacts(t *testing.T, m machine, mac, driver string) {
	t.Helper()
	serials := map[string]bool{}
	for _, d := range m.Facts.Disks {
		serials[d.Serial] = true
	}
	if !serials["DISK-A"] || !serials["DISK-B"] {
		t.Errorf("disk serials = %v, want DISK-A and DISK-B (disks %+v)", serials, m.Facts.Disks)
	}
	found := false
	for _, n := range m.Facts.NICs {
		if n.MAC == mac {
			found = true
			if n.Driver != driver {
				t.Errorf("NIC %s driver = %q, want %s", mac, n.Driver, driver)
			}
		}
	}
	if !found {
		t.Errorf("NICs %+v lack %s", m.Facts.NICs, mac)
	}
	if !contains(m.MACs, mac) {
		t.Errorf("macs %v lack %s", m.MACs, mac)
	}
	if m.Facts.CPU.Threads != cpus {
		t.Errorf("cpu = %+v, want %d threads", m.Facts.CPU, cpus)
	}
	mem, _ := strconv.ParseUint(m.Facts.Memory.TotalBytes, 10, 64)
	if mem > memoryMB<<20 || mem < (memoryMB-128)<<20 {
		t.Errorf("memory total_bytes = %d, want about %d MiB", mem, memoryMB)
	}
	if len(m.Facts.MissingDrivers) != 0 {
		t.Logf("PCI devices without a driver: %s", m.Facts.MissingDrivers)
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// TestFastLoop is the development loop: the image booted straight from
// -kernel/-initrd with QEMU user networking, the agent reaching corrald on
// the host loopback through 10.0.2.2 with a token from `corrald token
// create`. An OpenIPMI ipmi_sim BMC is attached (ipmi-bmc-extern +
// isa-ipmi-bt) when installed: the agent loads ipmi_si and ipmi_devintf,
// reads the BMC's LAN configuration in-band through /dev/ipmi0, and the
// address ipmi_sim serves (from its lan_config_program) is the one
// reported.
func TestFastLoop(t *testing.T) {
	need(t, "qemu-system-x86_64")
	im := image(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	port := freePort(t, "tcp")
	api := "127.0.0.1:" + strconv.Itoa(port)
	// A fresh data dir gets admin.conf on first start; an agent token is
	// made offline while corrald is stopped.
	c := startCorrald(t, dir, "", data, "--api-listen", api, "--api-san", "10.0.2.2")
	c.proc.stop(t)
	out, err := exec.Command(filepath.Join(binDir, "corrald"), "token", "create", "--data-dir", data, "--role", "agent", "--ttl", "1h", "--description", "fast loop").Output()
	if err != nil {
		t.Fatalf("corrald token create: %v", err)
	}
	token := strings.TrimSpace(string(out))
	c = startCorrald(t, dir, "", data, "--api-listen", api, "--api-san", "10.0.2.2")
	fp := caFingerprint(t, filepath.Join(data, "pki", "ca.crt"))

	const mac = "52:54:00:fa:57:01"
	const loopSerial = "SN-LOOP-1"
	args := append(qemuBase(768, 1), "-kernel", im.Kernel, "-initrd", im.Initrd,
		"-append", fmt.Sprintf("console=ttyS0,115200n8 corral.endpoint=10.0.2.2:%d corral.token=%s corral.ca=%s corral.mac=%s", port, token, fp, mac),
		"-smbios", "type=1,serial="+loopSerial+",manufacturer=Corral Lab,product=Fast Loop",
		"-nic", "user,model=virtio-net-pci,mac="+mac)
	bmcAddr := ""
	if _, err := exec.LookPath("ipmi_sim"); err == nil {
		var vmPort int
		bmcAddr, vmPort = startSim(t, dir)
		args = append(args, "-chardev", fmt.Sprintf("socket,id=ipmi0,host=127.0.0.1,port=%d,reconnect=10", vmPort),
			"-device", "ipmi-bmc-extern,chardev=ipmi0,id=bmc0", "-device", "isa-ipmi-bt,bmc=bmc0")
	} else {
		require.Degraded(t, "ipmi_sim not installed (openipmi): booting without a BMC")
	}
	// A TPM 2.0 from swtpm: the Debian kernel's built-in tpm_tis finds it
	// and the agent proves its endorsement key at Register.
	require.Tool(t, "swtpm")
	ctx, cancel := context.WithCancel(context.Background())
	tpm, err := swtpm.Start(ctx, filepath.Join(dir, "tpm"), swtpm.QEMU)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); tpm.Stop() })
	args = append(args, tpm.QEMUArgs()...)
	t0 := time.Now()
	vm := start(t, dir, "console.log", args[0], args[1:]...)
	m := c.waitMachine(vm, bootTimeout, "with serial "+loopSerial+" INVENTORIED", func(m machine) bool {
		return m.Serial == loopSerial && m.State == "INVENTORIED"
	})
	t.Logf("-kernel/-initrd boot to registration: %s", time.Since(t0).Round(time.Second))
	if m.BootMAC != mac {
		t.Errorf("boot_mac = %q, want %s", m.BootMAC, mac)
	}
	if bmcAddr != "" {
		if m.Facts.BMC.IPv4Address != bmcAddr || m.Facts.BMC.MAC != simBMCMAC {
			t.Errorf("BMC facts = %+v, want address %s and MAC %s (ipmi_sim's LAN configuration)", m.Facts.BMC, bmcAddr, simBMCMAC)
		}
	}
	if out, err := c.cli("machine", "timeline", m.Name, "-o", "json"); err != nil || !strings.Contains(string(out), "tpm-proved") {
		t.Errorf("no tpm-proved entry on %s's timeline (err %v):\n%s\nconsole:\n%s", m.Name, err, tail(string(out), 4<<10), tail(vm.console.String(), 6<<10))
	}
}

func freePort(t *testing.T, network string) int {
	t.Helper()
	if network == "udp" {
		c, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.LocalAddr().(*net.UDPAddr).Port
	}
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func caFingerprint(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", path)
	}
	s := sha256.Sum256(blk.Bytes)
	return hex.EncodeToString(s[:])
}

// The LAN configuration the simulated BMC serves.
const (
	simBMCAddr = "10.99.0.42"
	simBMCMAC  = "52:54:00:be:ef:01"
)

// startSim runs OpenIPMI's ipmi_sim with a lan_config_program serving
// simBMCAddr/simBMCMAC and a VM serial interface for QEMU's
// ipmi-bmc-extern; it returns the served address and the VM port.
func startSim(t *testing.T, dir string) (string, int) {
	t.Helper()
	sim := filepath.Join(dir, "ipmisim")
	os.MkdirAll(filepath.Join(sim, "state"), 0o755)
	prog := filepath.Join(sim, "lanconfig")
	script := simconf.LANConfig{Addr: simBMCAddr, Netmask: "255.255.255.0", MAC: simBMCMAC, Gateway: "10.99.0.1", GatewayMAC: "52:54:00:00:00:01"}.Script()
	if err := os.WriteFile(prog, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sim, "sim.emu"), []byte(simconf.Emu), 0o644); err != nil {
		t.Fatal(err)
	}
	lanPort, vmPort := freePort(t, "udp"), freePort(t, "tcp")
	conf := simconf.LAN{Name: fmt.Sprintf("corraldisc%d", lanPort), Port: lanPort, GUID: "a123456789abcdefa123456789abcdef",
		LANConfigProgram: prog, VMPort: vmPort, User: "admin", Password: "secret"}.Conf()
	if err := os.WriteFile(filepath.Join(sim, "lan.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, sim, "ipmi_sim.log", "ipmi_sim", "-c", filepath.Join(sim, "lan.conf"), "-f", filepath.Join(sim, "sim.emu"), "-s", filepath.Join(sim, "state"), "-n")
	// Ready when it answers an RMCP presence ping on its LAN port.
	ping := []byte{0x06, 0x00, 0xff, 0x06, 0x00, 0x00, 0x11, 0xbe, 0x80, 0x00, 0x00, 0x00}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := net.Dial("udp4", "127.0.0.1:"+strconv.Itoa(lanPort)); err == nil {
			c.Write(ping)
			c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			n, err := c.Read(make([]byte, 64))
			c.Close()
			if err == nil && n > 0 {
				break
			}
		}
		select {
		case <-p.done:
			t.Fatalf("ipmi_sim exited:\n%s", p.console.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("ipmi_sim did not answer on udp/%d:\n%s", lanPort, p.console.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return simBMCAddr, vmPort
}
