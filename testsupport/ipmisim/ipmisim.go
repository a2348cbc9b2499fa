// Package ipmisim starts real IPMI peers for tests: OpenIPMI's ipmi_sim on a
// loopback UDP port with a chassis_control program, optionally driving a
// QEMU machine (TCG) connected over ipmi-bmc-extern. Everything it starts
// is stopped in t.Cleanup. A missing ipmi_sim or QEMU skips the test, or
// fails it under CI (package require). It is test support only: nothing in
// corrald imports it.
package ipmisim

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/ipmisim/simconf"
	"github.com/corralhq/corral/testsupport/require"
)

// Options configure one simulated BMC.
type Options struct {
	User, Password string
	// VM starts a QEMU machine on power on when true; otherwise the
	// chassis program only keeps the power state in a file.
	VM bool
	// MAC is the VM's NIC MAC (default 52:54:00:12:34:56).
	MAC string
	// NetDev is the QEMU -netdev value for the VM's NIC (default: user
	// networking with restrict=on, which never leaves QEMU).
	NetDev string
	// SOL, when set, is the serial port the BMC's Serial-over-LAN
	// carries ("tcp:127.0.0.1:PORT": ipmi_sim connects to a listener
	// there).
	SOL string
	// SerialSOL, with VM, gives the VM's first serial port (with
	// SeaBIOS's serial console on it) to SOL, through a relay this
	// package runs: ipmi_sim connects to it once at start, and each QEMU
	// the chassis starts connects to its other side.
	SerialSOL bool
}

// BMC is a running ipmi_sim.
type BMC struct {
	Port int
	Dir  string
	User string
	Pass string
	cmd  *exec.Cmd
}

// FreeUDPPort returns a loopback UDP port that was free a moment ago.
func FreeUDPPort(t testing.TB) int {
	t.Helper()
	c, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// FreeTCPPort returns a loopback TCP port that was free a moment ago.
func FreeTCPPort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start runs ipmi_sim and waits until it answers on its UDP port.
func Start(t testing.TB, o Options) *BMC {
	t.Helper()
	require.Tool(t, "ipmi_sim")
	if o.VM {
		require.Tool(t, "qemu-system-x86_64")
	}
	if o.User == "" {
		o.User = "admin"
	}
	if o.Password == "" {
		o.Password = "secret"
	}
	if o.MAC == "" {
		o.MAC = "52:54:00:12:34:56"
	}
	if o.NetDev == "" {
		o.NetDev = "user,id=n0,restrict=on"
	}
	dir, err := os.MkdirTemp("", "ipmisim-")
	if err != nil {
		t.Fatal(err)
	}
	b := &BMC{Dir: dir, User: o.User, Pass: o.Password}
	vmPort := 0
	if o.VM {
		vmPort = FreeTCPPort(t)
	}
	if err := os.WriteFile(filepath.Join(dir, "sim.emu"), []byte(simconf.Emu), 0o644); err != nil {
		t.Fatal(err)
	}
	serialPort := 0
	if o.VM && o.SerialSOL {
		// etc/sercon-port: COM1's I/O port, a little-endian integer.
		if err := os.WriteFile(filepath.Join(dir, "sercon-port"), []byte{0xf8, 0x03, 0, 0, 0, 0, 0, 0}, 0o644); err != nil {
			t.Fatal(err)
		}
		var bmcSide int
		bmcSide, serialPort = startSerialRelay(t)
		o.SOL = fmt.Sprintf("tcp:127.0.0.1:%d", bmcSide)
	}
	if err := os.WriteFile(filepath.Join(dir, "chassis"), []byte(chassisScript(dir, o, vmPort, serialPort)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "state"), 0o755); err != nil {
		t.Fatal(err)
	}
	b.launch(t, dir, func(port int) string { return lanConf(dir, port, vmPort, o) })
	t.Cleanup(b.stop)
	return b
}

// launch starts ipmi_sim in dir on a free UDP port with the lan.conf
// conf makes for that port (sim.emu and state/ are already there), and
// waits until it answers; a port taken meanwhile is tried again, up to
// five times.
func (b *BMC) launch(t testing.TB, dir string, conf func(port int) string) {
	t.Helper()
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		b.Port = FreeUDPPort(t)
		if err := os.WriteFile(filepath.Join(dir, "lan.conf"), []byte(conf(b.Port)), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("ipmi_sim", "-c", filepath.Join(dir, "lan.conf"), "-f", filepath.Join(dir, "sim.emu"),
			"-s", filepath.Join(dir, "state"), "-n")
		logf, err := os.Create(filepath.Join(dir, "ipmi_sim.log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			logf.Close()
			t.Fatalf("ipmi_sim: %v", err)
		}
		logf.Close()
		if waitUDP(b.Port, 5*time.Second) {
			b.cmd = cmd
			return
		}
		lastErr = fmt.Errorf("ipmi_sim did not answer on udp/%d: %s", b.Port, readFile(filepath.Join(dir, "ipmi_sim.log")))
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	t.Fatal(lastErr)
}

// waitUDP sends an RMCP ASF presence ping until something answers.
func waitUDP(port int, d time.Duration) bool {
	ping := []byte{0x06, 0x00, 0xff, 0x06, 0x00, 0x00, 0x11, 0xbe, 0x80, 0x00, 0x00, 0x00}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		c, err := net.Dial("udp4", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			_, _ = c.Write(ping)
			_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			buf := make([]byte, 64)
			n, err := c.Read(buf)
			c.Close()
			if err == nil && n > 0 {
				return true
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

func (b *BMC) stop() {
	// Power the VM off first so no QEMU outlives the test.
	_ = exec.Command(filepath.Join(b.Dir, "chassis"), "set", "power", "0").Run()
	if b.cmd != nil && b.cmd.Process != nil {
		_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
		_ = b.cmd.Wait()
	}
	if os.Getenv("CORRAL_KEEP_SIM") == "" {
		_ = os.RemoveAll(b.Dir)
	}
}

// Addr is the BMC's host:port.
func (b *BMC) Addr() string { return "127.0.0.1:" + strconv.Itoa(b.Port) }

// Record returns the chassis program's record, one event a line:
// "power 1", "boot pxe", "start boot=pxe", "stop", ...
func (b *BMC) Record() []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader([]byte(readFile(filepath.Join(b.Dir, "record")))))
	for sc.Scan() {
		if f := strings.SplitN(sc.Text(), " ", 2); len(f) == 2 {
			out = append(out, f[1])
		}
	}
	return out
}

// Running reports whether the VM's QEMU process is alive (VM mode).
func (b *BMC) Running() bool {
	pid, err := strconv.Atoi(strings.TrimSpace(readFile(filepath.Join(b.Dir, "qemu.pid"))))
	if err != nil || pid <= 0 {
		return false
	}
	// A zombie still answers kill -0; look at its state.
	st := readFile(fmt.Sprintf("/proc/%d/stat", pid))
	if st == "" {
		return false
	}
	if i := strings.LastIndexByte(st, ')'); i > 0 && i+2 < len(st) && st[i+2] == 'Z' {
		return false
	}
	return true
}

// QEMUArgs returns the command line of the VM's current (or last) QEMU.
func (b *BMC) QEMUArgs() string { return readFile(filepath.Join(b.Dir, "qemu.args")) }

// Firmware returns SeaBIOS's debug log of the current (or last) boot.
func (b *BMC) Firmware() string { return readFile(filepath.Join(b.Dir, "bios.log")) }

// DHCPDiscovers counts DHCP DISCOVER packets the VM's NIC sent during its
// current (or last) boot, read from QEMU's filter-dump capture: proof that
// the machine PXE-booted, whoever answers.
func (b *BMC) DHCPDiscovers() int {
	pcap := []byte(readFile(filepath.Join(b.Dir, "net.pcap")))
	n := 0
	cookie := []byte{0x63, 0x82, 0x53, 0x63}
	for {
		i := bytes.Index(pcap, cookie)
		if i < 0 {
			return n
		}
		opts := pcap[i+4:]
		// Walk the options for 53 (message type) = 1 (DISCOVER).
		for j := 0; j+2 < len(opts); {
			code := opts[j]
			if code == 0 {
				j++
				continue
			}
			if code == 255 {
				break
			}
			l := int(opts[j+1])
			if code == 53 && l == 1 && j+2 < len(opts) && opts[j+2] == 1 {
				n++
				break
			}
			j += 2 + l
		}
		pcap = opts
	}
}

// ChassisProgram is the path of the chassis_control program, which the
// Redfish test server can drive too ("set power 1", "get power", ...).
func (b *BMC) ChassisProgram() string { return filepath.Join(b.Dir, "chassis") }

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

func lanConf(dir string, port, vmPort int, o Options) string {
	return simconf.LAN{Name: fmt.Sprintf("corral%d", port), Port: port, GUID: "a123456789abcdefa123456789abcdef",
		VMPort: vmPort, Chassis: filepath.Join(dir, "chassis"), User: o.User, Password: o.Password, SOL: solDevice(o)}.Conf()
}

// solDevice is the serial port ipmi_sim's SOL carries, or "".
func solDevice(o Options) string { return o.SOL }

// startSerialRelay joins two loopback TCP listeners: ipmi_sim's SOL
// connects to the first (bmcSide), each QEMU's serial port to the second
// (machineSide); bytes go across while both are connected and are dropped
// otherwise, as on a serial line with nothing at its end. A new
// connection on a side replaces the old one. It stops in t.Cleanup.
func startSerialRelay(t testing.TB) (bmcSide, machineSide int) {
	t.Helper()
	var mu sync.Mutex
	conns := [2]net.Conn{}
	for side := range 2 {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			l.Close()
			mu.Lock()
			if c := conns[side]; c != nil {
				c.Close()
			}
			mu.Unlock()
		})
		if side == 0 {
			bmcSide = l.Addr().(*net.TCPAddr).Port
		} else {
			machineSide = l.Addr().(*net.TCPAddr).Port
		}
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				if old := conns[side]; old != nil {
					old.Close()
				}
				conns[side] = c
				mu.Unlock()
				go func() {
					buf := make([]byte, 4096)
					for {
						n, err := c.Read(buf)
						if err != nil {
							return
						}
						mu.Lock()
						other := conns[1-side]
						mu.Unlock()
						if other != nil {
							_, _ = other.Write(buf[:n])
						}
					}
				}()
			}
		}()
	}
	return bmcSide, machineSide
}

// chassisScript is the chassis_control program (see simconf.Chassis). With
// a VM the boot device maps onto QEMU's -boot option; the program keeps
// SeaBIOS's debug log of the current boot and the QEMU command line.
func chassisScript(dir string, o Options, vmPort, serialPort int) string {
	c := simconf.Chassis{Dir: dir, DefaultBoot: "default", BootCase: `    pxe) order="-boot order=n" ;;
    bios) order="-boot menu=on" ;;
    *) order="-boot order=c" ;;`}
	if o.VM {
		serial := "-serial file:$D/console.log"
		if serialPort != 0 {
			// SeaBIOS's serial console (sercon) on COM1, so the
			// firmware's text (not only iPXE's) reaches the port; QEMU
			// warns that the name lacks "opt/", which SeaBIOS needs.
			serial = fmt.Sprintf("-chardev socket,id=ser0,host=127.0.0.1,port=%d,reconnect=1 -serial chardev:ser0 -fw_cfg name=etc/sercon-port,file=$D/sercon-port", serialPort)
		}
		qemu := fmt.Sprintf(`qemu-system-x86_64 -name corral-sim -accel tcg,thread=multi -cpu max -m 128 -display none -no-user-config -nodefaults -chardev socket,id=ipmi0,host=127.0.0.1,port=%d,reconnect=10 -device ipmi-bmc-extern,chardev=ipmi0,id=bmc0 -device isa-ipmi-bt,bmc=bmc0 -netdev %s -device e1000,netdev=n0,mac=%s -object filter-dump,id=dump0,netdev=n0,file=$D/net.pcap -chardev file,id=dbg,path=$D/bios.log -device isa-debugcon,iobase=0x402,chardev=dbg %s $order`, vmPort, o.NetDev, o.MAC, serial)
		c.QEMU = qemu
		c.BeforeStart = "  : > $D/bios.log\n  echo \"" + qemu + "\" > $D/qemu.args"
	}
	return c.Script()
}

// ChassisMachine drives a BMC's chassis program directly, so the Redfish
// test server controls the same machine (and VM) ipmi_sim does. It
// implements redfishtest.Machine.
type ChassisMachine struct{ Prog string }

// Machine returns the chassis program of b as a Redfish test machine.
func (b *BMC) Machine() ChassisMachine { return ChassisMachine{Prog: b.ChassisProgram()} }

func (c ChassisMachine) run(args ...string) (string, error) {
	out, err := exec.Command(c.Prog, args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s %v: %v: %s", c.Prog, args, err, out)
	}
	return string(out), nil
}

// Power reports whether the machine is on.
func (c ChassisMachine) Power() (bool, error) {
	out, err := c.run("get", "power")
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(out) == "power:1", nil
}

// Reset maps Redfish reset types onto the chassis program.
func (c ChassisMachine) Reset(rt string) error {
	var err error
	switch rt {
	case "On":
		_, err = c.run("set", "power", "1")
	case "ForceOff":
		_, err = c.run("set", "power", "0")
	case "GracefulShutdown":
		_, err = c.run("set", "shutdown", "1")
	case "ForceRestart", "GracefulRestart", "PowerCycle":
		_, err = c.run("set", "reset", "1")
	default:
		err = fmt.Errorf("reset type %q", rt)
	}
	return err
}

// SetBoot maps a Redfish boot override onto the chassis program's boot
// device (the program makes every override one-shot).
func (c ChassisMachine) SetBoot(target, enabled, mode string) error {
	dev := map[string]string{"Pxe": "pxe", "Hdd": "default", "BiosSetup": "bios", "None": "default"}[target]
	if enabled == "Disabled" {
		dev = "default"
	}
	if dev == "" {
		return fmt.Errorf("boot target %q", target)
	}
	_, err := c.run("set", "boot", dev)
	return err
}
