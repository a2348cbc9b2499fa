package lab

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/corralhq/corral/testsupport/ipmisim/simconf"
)

// OVMF firmware (Debian's ovmf package).
const (
	ovmfCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	ovmfVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// qemuArgs is the machine's QEMU command line without the boot order
// (the chassis program adds bootindex per boot device) and without
// -daemonize. nicBoot and diskBoot are the bootindex values.
func (m Machine) qemuArgs(withBMC bool) []string {
	a := []string{"qemu-system-x86_64", "-name", m.Name + ",debug-threads=on",
		"-accel", "tcg,thread=multi", "-cpu", "max", "-smp", fmt.Sprint(m.CPUs), "-m", fmt.Sprint(m.MemoryMiB),
		"-display", "none", "-no-user-config", "-nodefaults", "-vga", "none",
		"-smbios", fmt.Sprintf("type=1,manufacturer=Corral Lab,product=Virtual Rack %s,serial=%s,uuid=%s", strings.ToUpper(m.Firmware), m.Serial, m.UUID),
		"-smbios", fmt.Sprintf("type=2,manufacturer=Corral Lab,product=Lab Board,serial=%s", m.Board),
		"-chardev", "file,id=con0,path=" + m.Console() + ",append=on", "-serial", "chardev:con0",
		"-qmp", "unix:" + filepath.Join(m.Dir, "qmp.sock") + ",server=on,wait=off",
		"-netdev", "tap,id=n0,ifname=" + m.Tap + ",script=no,downscript=no,vhost=off",
	}
	if m.Firmware == "uefi" {
		a = append(a, "-machine", "q35",
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+ovmfCode,
			"-drive", "if=pflash,format=raw,unit=1,file="+filepath.Join(m.Dir, "OVMF_VARS.fd"))
	} else {
		a = append(a, "-machine", "pc")
	}
	if withBMC {
		a = append(a, "-chardev", fmt.Sprintf("socket,id=ipmi0,host=127.0.0.1,port=%d,reconnect=10", m.VMPort),
			"-device", "ipmi-bmc-extern,chardev=ipmi0,id=bmc0", "-device", "isa-ipmi-bt,bmc=bmc0")
	}
	for i, d := range m.Disks {
		// discard=unmap: a discard (an erase, a deploy's gaps) punches holes
		// in the raw file, as a thin-provisioned or SSD disk forgets blocks.
		a = append(a, "-drive", fmt.Sprintf("if=none,id=d%d,format=raw,discard=unmap,detect-zeroes=unmap,file=%s", i, d.Path))
	}
	if m.TPM {
		a = append(a, "-chardev", "socket,id=chrtpm,path="+m.tpmSocket(),
			"-tpmdev", "emulator,id=tpm0,chardev=chrtpm", "-device", "tpm-tis,tpmdev=tpm0")
	}
	return a
}

// tpmDir holds the machine's swtpm state, socket, pid and log.
func (m Machine) tpmDir() string { return filepath.Join(m.Dir, "tpm") }

// tpmSocket is the swtpm control socket QEMU's emulator backend uses.
func (m Machine) tpmSocket() string { return filepath.Join(m.tpmDir(), "ctrl.sock") }

// tpmStart is the shell the chassis program runs before QEMU starts: the
// machine's swtpm, one process per machine, started with it. --terminate
// ends it when QEMU's connection closes (the machine powered off or
// killed), so it stops with the machine; its state stays in tpmDir.
func (m Machine) tpmStart() string {
	dir := simconf.Quote(m.tpmDir())
	sock := simconf.Quote(m.tpmSocket())
	return fmt.Sprintf(`  mkdir -p %[1]s
  if [ -f %[1]s/swtpm.pid ] && kill -0 "$(cat %[1]s/swtpm.pid)" 2>/dev/null; then :; else
    rm -f %[2]s
    swtpm socket --tpm2 --tpmstate dir=%[1]s --ctrl type=unixio,path=%[2]s --terminate \
      --pid file=%[1]s/swtpm.pid --log file=%[1]s/swtpm.log --daemon || rec "swtpm failed"
  fi`, dir, sock)
}

// chassisScript is the chassis_control program of m: ipmi_sim runs it as
// "PROG get power|boot" (answering "name:value" lines) and "PROG set power
// 0|1 | reset 1 | shutdown 1 | boot DEV"; the lab runs it directly without a
// BMC. It returns at once: QEMU is started with -daemonize. Lab machines
// boot from the network first (as a rack configured for PXE); a one-shot
// "disk" override puts the disks first for the next start.
func (m Machine) chassisScript(withBMC bool) string {
	var q strings.Builder
	for i, a := range m.qemuArgs(withBMC) {
		if i > 0 {
			q.WriteByte(' ')
		}
		q.WriteString(simconf.Quote(a))
	}
	nic := "virtio-net-pci,netdev=n0,mac=" + m.MAC
	if m.Firmware == "uefi" {
		// No iPXE option ROM: EDK2's own PXE client, then TFTP → iPXE.
		nic += ",romfile="
	}
	fmt.Fprintf(&q, " -device %s,bootindex=$NIC", nic)
	for i, d := range m.Disks {
		dev := "virtio-blk-pci"
		if d.Bus == "nvme" {
			dev = "nvme"
		}
		fmt.Fprintf(&q, " -device %s,drive=d%d,serial=%s,bootindex=$((DISK+%d))", dev, i, d.Serial, i)
	}
	before := ""
	if m.TPM {
		before = m.tpmStart()
	}
	return simconf.Chassis{
		Dir:         m.Dir,
		Comment:     fmt.Sprintf("chassis_control for lab machine %s (written by corral-lab)", m.Name),
		DefaultBoot: "pxe",
		// ipmi_sim names IPMI's "force boot from the default hard drive"
		// "default".
		BootCase: `    disk|hdd|default) NIC=9; DISK=1 ;;
    *) NIC=1; DISK=2 ;;`,
		BeforeStart: before,
		QEMU:        q.String(),
	}.Script()
}

// lanConfig serves the BMC's LAN configuration to ipmi_sim (and so,
// in-band, to the discovery agent): the loopback address corrald reaches
// the simulator on.
func (m Machine) lanConfig() string {
	return simconf.LANConfig{Addr: "127.0.0.1", Netmask: "255.0.0.0", MAC: m.bmcMAC()}.Script()
}

// lanConf is ipmi_sim's configuration for m.
func (m Machine) lanConf(password string) string {
	return simconf.LAN{Name: m.Name, Port: m.BMCPort, GUID: strings.ReplaceAll(m.UUID, "-", ""),
		LANConfigProgram: filepath.Join(m.Dir, "lanconfig"), VMPort: m.VMPort, Chassis: m.Chassis(),
		User: m.BMCUser, Password: password}.Conf()
}

// bmcMAC is the LAN MAC the simulated BMC reports: the machine's MAC
// with the locally administered 0x02 bit and last byte flipped.
func (m Machine) bmcMAC() string {
	p := strings.Split(m.MAC, ":")
	if len(p) != 6 {
		return "02:00:00:00:00:01"
	}
	p[0] = "02"
	return strings.Join(p, ":")
}

// prepare writes m's disks, firmware variables, chassis program and (with
// a BMC) ipmi_sim's files.
func (m Machine) prepare(withBMC bool, password string) error {
	if err := os.MkdirAll(m.Dir, 0o755); err != nil {
		return err
	}
	for _, d := range m.Disks {
		if _, err := os.Stat(d.Path); err == nil {
			continue
		}
		f, err := os.Create(d.Path)
		if err != nil {
			return err
		}
		err = f.Truncate(int64(d.GiB) << 30)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	if m.Firmware == "uefi" {
		b, err := os.ReadFile(ovmfVars)
		if err != nil {
			return fmt.Errorf("UEFI firmware variables: %w (apt-get install ovmf)", err)
		}
		if err := os.WriteFile(filepath.Join(m.Dir, "OVMF_VARS.fd"), b, 0o644); err != nil {
			return err
		}
	}
	if err := os.WriteFile(m.Chassis(), []byte(m.chassisScript(withBMC)), 0o755); err != nil {
		return err
	}
	if !withBMC {
		return nil
	}
	if err := os.WriteFile(filepath.Join(m.Dir, "lanconfig"), []byte(m.lanConfig()), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(m.Dir, "sim.emu"), []byte(simconf.Emu), 0o644); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(m.Dir, "sim-state"), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(m.Dir, "lan.conf"), []byte(m.lanConf(password)), 0o600); err != nil {
		return err
	}
	return os.WriteFile(m.BMCPwFile, []byte(password+"\n"), 0o600)
}
