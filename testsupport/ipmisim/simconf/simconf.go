// Package simconf writes the files OpenIPMI's ipmi_sim runs on: its LAN
// configuration (lan.conf), its emulator commands (sim.emu) and the
// chassis_control program that powers a (QEMU) machine on and off. The
// test peers of package ipmisim and the virtual rack of package lab both
// use it. It writes text only: it starts nothing and imports neither
// testing nor product code.
package simconf

import (
	"fmt"
	"strings"
)

// Emu is the ipmi_sim emulator file: one BMC at IPMB address 0x20.
const Emu = "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02\nmc_enable 0x20\n"

// Quote quotes s for a POSIX shell (unchanged when it needs no quoting).
func Quote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=,+@", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// LAN is one simulated BMC's lan.conf.
type LAN struct {
	Name string // the BMC's name
	Port int    // loopback UDP port of the RMCP/RMCP+ LAN channel
	GUID string // 32 hex digits
	// LANConfigProgram, when set, answers ipmi_sim's LAN configuration
	// queries (the address the BMC reports in-band).
	LANConfigProgram string
	// VMPort, when not 0, is the loopback TCP port QEMU's ipmi-bmc-extern
	// connects to.
	VMPort         int
	Chassis        string // path of the chassis_control program; "" for none
	User, Password string // the administrator (user 2)
	// SOL, when set, is the serial port ipmi_sim's Serial-over-LAN
	// carries: a device path, "tcp:HOST:PORT" or "telnet:HOST:PORT"
	// (ipmi_sim connects to it, and keeps trying until it answers).
	SOL string
}

// Conf returns the lan.conf text.
func (l LAN) Conf() string {
	var b strings.Builder
	fmt.Fprintf(&b, "name \"%s\"\nset_working_mc 0x20\n", l.Name)
	fmt.Fprintf(&b, "  startlan 1\n    addr 127.0.0.1 %d\n    priv_limit admin\n", l.Port)
	b.WriteString("    allowed_auths_callback none md2 md5 straight\n    allowed_auths_user none md2 md5 straight\n")
	b.WriteString("    allowed_auths_operator none md2 md5 straight\n    allowed_auths_admin none md2 md5 straight\n")
	b.WriteString("    guid " + l.GUID + "\n")
	if l.LANConfigProgram != "" {
		fmt.Fprintf(&b, "    lan_config_program \"%s\"\n", l.LANConfigProgram)
	}
	b.WriteString("  endlan\n")
	if l.VMPort != 0 {
		fmt.Fprintf(&b, "  serial 15 127.0.0.1 %d codec VM\n", l.VMPort)
	}
	if l.SOL != "" {
		fmt.Fprintf(&b, "  sol \"%s\" 115200\n", l.SOL)
	}
	if l.Chassis != "" {
		fmt.Fprintf(&b, "  chassis_control \"%s\"\n", l.Chassis)
	}
	fmt.Fprintf(&b, "  user 2 true \"%s\" \"%s\" admin 10 none md2 md5 straight\n", l.User, l.Password)
	return b.String()
}

// LANConfig is a lan_config_program: ipmi_sim runs it as "PROG get NAME"
// per LAN parameter and reads "NAME:VALUE"; what it answers is what the
// BMC reports, in-band too (the discovery agent reads it through QEMU's BT
// interface).
type LANConfig struct {
	Addr, Netmask string // the BMC's static IPv4 address and netmask
	MAC           string // the BMC's LAN MAC
	Gateway       string // default gateway IPv4 ("" = 0.0.0.0)
	GatewayMAC    string // its MAC ("" = 00:00:00:00:00:00)
}

// Script returns the program's text.
func (c LANConfig) Script() string {
	or := func(v, def string) string {
		if v == "" {
			return def
		}
		return v
	}
	return fmt.Sprintf(`#!/bin/sh
[ "$1" = get ] || exit 0
case "$2" in
ip_addr_src) echo ip_addr_src:static ;;
ip_addr) echo ip_addr:%s ;;
mac_addr) echo mac_addr:%s ;;
subnet_mask) echo subnet_mask:%s ;;
default_gw_ip_addr) echo default_gw_ip_addr:%s ;;
default_gw_mac_addr) echo default_gw_mac_addr:%s ;;
backup_gw_ip_addr) echo backup_gw_ip_addr:0.0.0.0 ;;
backup_gw_mac_addr) echo backup_gw_mac_addr:00:00:00:00:00:00 ;;
esac
`, c.Addr, c.MAC, c.Netmask, or(c.Gateway, "0.0.0.0"), or(c.GatewayMAC, "00:00:00:00:00:00"))
}

// Chassis is a chassis_control program. ipmi_sim runs it as "PROG get
// power|boot ..." (it answers "name:value" lines) and "PROG set power 0|1
// | reset 1 | shutdown 1 | boot DEV"; tests and the lab also run it
// directly. It returns at once, so QEMU is started with -daemonize. The
// boot device is one-shot: a start consumes it. Every event is appended to
// Dir/record as "<unix time> <event>".
type Chassis struct {
	Dir     string // state: boot, record, qemu.pid, qemu.log (and power without QEMU)
	Comment string // a comment line for the top of the program, or ""
	// DefaultBoot is the boot device of a start with no override pending.
	DefaultBoot string
	// BootCase holds the arms of a shell `case "$boot" in ... esac` run at
	// every start; they set the shell variables QEMU refers to.
	BootCase string
	// BeforeStart holds shell lines run just before QEMU starts.
	BeforeStart string
	// QEMU is the shell command that starts the machine, without
	// -daemonize and -pidfile. Empty: there is no machine and the power
	// state is only kept in Dir/power.
	QEMU string
}

// Script returns the program's text.
func (c Chassis) Script() string {
	var b strings.Builder
	b.WriteString("#!/bin/sh\n")
	if c.Comment != "" {
		b.WriteString("# " + c.Comment + "\n")
	}
	fmt.Fprintf(&b, "D=%s\n", Quote(c.Dir))
	b.WriteString(`rec() { echo "$(date +%s.%N) $*" >> $D/record; }` + "\n")
	startBoot := fmt.Sprintf(`  boot=$(cat $D/boot 2>/dev/null || echo %s)
  rm -f $D/boot
  case "$boot" in
%s
  esac
  rec "start boot=$boot"
`, c.DefaultBoot, strings.TrimRight(c.BootCase, "\n"))
	if c.QEMU == "" {
		b.WriteString(`power() { cat $D/power 2>/dev/null || echo 0; }
start() {
` + startBoot + `  echo 1 > $D/power
}
stop() {
  rec stop
  echo 0 > $D/power
}
`)
	} else {
		// running: the pid file names a live (not zombie) process whose
		// command line mentions D, so a reused pid does not count.
		b.WriteString(`running() {
  [ -f $D/qemu.pid ] || return 1
  pid=$(cat $D/qemu.pid)
  [ -n "$pid" ] && [ -d /proc/$pid ] || return 1
  st=$(sed 's/.*) //' /proc/$pid/stat | cut -c1)
  [ "$st" != Z ] && grep -q "$D" /proc/$pid/cmdline 2>/dev/null
}
power() { if running; then echo 1; else echo 0; fi; }
start() {
` + startBoot + `  running && return 0
`)
		if s := strings.TrimRight(c.BeforeStart, "\n"); s != "" {
			b.WriteString(s + "\n")
		}
		b.WriteString("  " + c.QEMU + ` -daemonize -pidfile $D/qemu.pid >> $D/qemu.log 2>&1
}
stop() {
  rec stop
  if running; then
    pid=$(cat $D/qemu.pid)
    kill $pid 2>/dev/null
    i=0; while running && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
    running && kill -9 $pid 2>/dev/null
  fi
  rm -f $D/qemu.pid
}
`)
	}
	b.WriteString(`op=$1; shift
case "$op" in
get)
  for p in "$@"; do
    case "$p" in
      power) echo "power:$(power)" ;;
      boot) echo "boot:$(cat $D/boot 2>/dev/null || echo default)" ;;
      *) echo "$p:0" ;;
    esac
  done ;;
set)
  while [ $# -gt 1 ]; do
    rec "$1 $2"
    case "$1" in
      power) if [ "$2" = 1 ]; then start; else stop; fi ;;
      reset) if [ "$2" = 1 ]; then stop; start; fi ;;
      shutdown) if [ "$2" = 1 ]; then stop; fi ;;
      boot) echo "$2" > $D/boot ;;
    esac
    shift 2
  done ;;
check) exit 0 ;;
esac
exit 0
`)
	return b.String()
}
