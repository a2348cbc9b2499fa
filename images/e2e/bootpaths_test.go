package e2e

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/ovmfvars"
)

// bootPaths are the ways a machine reaches the discovery image that the
// boot-path benchmark compares (bench/README.md, "Boot paths to
// INVENTORIED").
var bootPaths = []string{"PXEv4", "HTTPv4", "PXEv6", "HTTPv6", "SecureBoot", "arm64"}

// nicSlot is the PCI slot of the x86 machines' NIC: the HTTP boot entry's
// device path names it.
const nicSlot = 3

// TestBootPathsToInventoried is a benchmark (bench/README.md, "Boot paths
// to INVENTORIED"): it prints, and asserts nothing about, power-on →
// INVENTORIED of a new machine booting the real discovery image by each
// path: OVMF's PXEv4 (TFTP iPXE) and HTTPv4 (UEFI HTTP boot of iPXE) on an
// IPv4 segment, PXEv6 and HTTPv6 on an IPv6-only one, OVMF's Secure Boot
// firmware with Microsoft's keys (shim → signed GRUB → signed kernel, over
// TFTP), and an arm64 machine on AAVMF (firmware PXE → GRUB → HTTP).
// CORRAL_BENCH_BOOTPATHS=ROUNDS runs it; each round boots every path once,
// one machine at a time, in the same order (A, B, C, … A, B, C, …), so
// the machine's load falls on every path alike; medians are printed with
// every run and the load average after it. CORRAL_BENCH_BOOTPATHS_ONLY
// (comma-separated) narrows the paths; CORRAL_BENCH_BOOTPATHS_TIMELINE=1
// prints each boot's whole timeline instead of its first entries.
func TestBootPathsToInventoried(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("CORRAL_BENCH_BOOTPATHS"))
	if rounds <= 0 {
		t.Skip("benchmark: set CORRAL_BENCH_BOOTPATHS=ROUNDS to run it")
	}
	paths := bootPaths
	if only := os.Getenv("CORRAL_BENCH_BOOTPATHS_ONLY"); only != "" {
		paths = strings.Split(only, ",")
	}
	const ovmfCode, ovmfVars = "/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"
	need(t, "ip", "qemu-system-x86_64", ovmfCode, ovmfVars)
	image(t)

	type bench struct {
		l *lab
		c *corrald
	}
	labs := map[string]*bench{}
	// build registers the discovery image (and arm64's when asked) in a
	// data directory of l's.
	build := func(l *lab, arm64 bool) string {
		data := filepath.Join(l.dir, "data")
		argv := [][]string{{"images", "build"}}
		if arm64 {
			argv = append(argv, []string{"images", "build", "--arch", "arm64", "--no-hypervisor"})
		}
		for _, a := range argv {
			a = append(a, "--data-dir", data, "--image-cache", imageCache(), "--source", srcDir)
			if out, err := exec.Command(filepath.Join(binDir, "corrald"), a...).CombinedOutput(); err != nil {
				t.Fatalf("corrald %s: %v\n%s", strings.Join(a, " "), err, out)
			}
		}
		return data
	}
	labFor := func(path string) *bench {
		kind := map[string]string{"PXEv4": "v4", "HTTPv4": "v4", "arm64": "v4", "PXEv6": "v6", "HTTPv6": "v6", "SecureBoot": "sb"}[path]
		if kind == "" {
			t.Fatalf("unknown boot path %q (know %s)", path, strings.Join(bootPaths, ", "))
		}
		if b := labs[kind]; b != nil {
			return b
		}
		l := newLab(t)
		var c *corrald
		v4 := []string{"--api-listen", l.subnet + ".1:20180", "--boot-interface", l.bridge,
			"--dhcp-mode", "full", "--dhcp-range", l.subnet + ".100-" + l.subnet + ".150", "--dhcp-router", l.subnet + ".1"}
		switch kind {
		case "v4":
			c = startCorrald(t, l.dir, l.ns, build(l, slices.Contains(paths, "arm64")), v4...)
		case "sb":
			c = startCorrald(t, l.dir, l.ns, build(l, false), append([]string{"--secure-boot"}, v4...)...)
		case "v6":
			prefix := fmt.Sprintf("fd79:%s::", l.id[:4])
			l.ipn("addr", "del", l.subnet+".1/24", "dev", l.bridge)
			l.ipn("addr", "add", prefix+"1/64", "dev", l.bridge, "nodad")
			// The appliance as the IPv6-only segment's router (a real
			// router lifetime), unless CORRAL_BENCH_BOOTPATHS_RA_LIFETIME
			// says otherwise ("0": advertisements that name no router).
			ra := cmp.Or(os.Getenv("CORRAL_BENCH_BOOTPATHS_RA_LIFETIME"), "30m")
			c = startCorrald(t, l.dir, l.ns, build(l, false), "--api-listen", ":20180", "--boot-interface", l.bridge,
				"--dhcp-mode", "off", "--dhcp6-range", prefix+"100-"+prefix+"1ff", "--ra-router-lifetime", ra)
		}
		labs[kind] = &bench{l: l, c: c}
		return labs[kind]
	}
	for _, p := range paths {
		labFor(p)
	}

	got := map[string][]time.Duration{}
	afterLoader := map[string][]time.Duration{} // the first DHCP answer naming a loader → registered
	var loads []string
	for r := 0; r < rounds; r++ {
		for i, path := range paths {
			b := labFor(path)
			l := b.l
			sn := fmt.Sprintf("SN-BP-%d-%d", r, i)
			mac := fmt.Sprintf("52:54:00:%s:%02x:%02x", l.id[:2], r, i)
			dir := filepath.Join(l.dir, fmt.Sprintf("vm-%d-%d", r, i))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			tap := l.tap(fmt.Sprintf("p%s%02d%d", l.id[:4], r, i))
			args := bootPathArgs(t, path, dir, mac, tap, sn)
			t0 := time.Now()
			vm := start(t, dir, "console.log", "ip", append([]string{"netns", "exec", l.ns}, args...)...)
			timeout := bootTimeout
			if path == "arm64" {
				timeout *= 2
			}
			var stamped func() string
			if os.Getenv("CORRAL_BENCH_BOOTPATHS_TIMELINE") != "" {
				stamped = stampConsole(vm, t0)
			}
			m := b.c.waitMachine(vm, timeout, "with serial "+sn+" INVENTORIED ("+path+")", func(m machine) bool {
				return m.Serial == sn && m.State == "INVENTORIED"
			})
			d := time.Since(t0)
			vm.stop(t)
			got[path] = append(got[path], d)
			if stamped != nil {
				t.Logf("%s console until the kernel, with seconds after power-on:\n%s", path, stamped())
			}
			ld, _ := os.ReadFile("/proc/loadavg")
			loads = append(loads, strings.Fields(string(ld))[0])
			ms, fromLoader := milestones(b.c, m.Name, t0)
			if fromLoader > 0 {
				afterLoader[path] = append(afterLoader[path], fromLoader)
			}
			t.Logf("round %d %-10s power-on → INVENTORIED %s, first loader answer → registered %s (load %s)\n    %s", r, path,
				d.Round(100*time.Millisecond), fromLoader.Round(100*time.Millisecond), loads[len(loads)-1], ms)
		}
	}
	t.Logf("power-on → INVENTORIED, %d interleaved rounds, %s:", rounds, time.Now().UTC().Format(time.RFC3339))
	for _, path := range paths {
		ds := slices.Clone(got[path])
		if len(ds) == 0 {
			continue
		}
		slices.Sort(ds)
		var all []string
		for _, d := range got[path] {
			all = append(all, d.Round(100*time.Millisecond).String())
		}
		t.Logf("  %-10s median %6s  (%s)", path, ds[len(ds)/2].Round(100*time.Millisecond), strings.Join(all, " "))
	}
	t.Logf("first DHCP answer naming a loader → registered (the firmware's own attempts and timeouts before it left out):")
	for _, path := range paths {
		ds := slices.Clone(afterLoader[path])
		if len(ds) == 0 {
			continue
		}
		slices.Sort(ds)
		var all []string
		for _, d := range afterLoader[path] {
			all = append(all, d.Round(100*time.Millisecond).String())
		}
		t.Logf("  %-10s median %6s  (%s)", path, ds[len(ds)/2].Round(100*time.Millisecond), strings.Join(all, " "))
	}
	t.Logf("load average after each boot: %s", strings.Join(loads, " "))
}

// bootPathArgs is the QEMU command line of a new machine (serial sn, one
// NIC mac on tap, one 1 GiB disk in dir) that boots by path.
func bootPathArgs(t *testing.T, path, dir, mac, tap, sn string) []string {
	t.Helper()
	const ovmfCode, ovmfVars = "/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"
	nic := []string{"-netdev", "tap,id=n0,ifname=" + tap + ",script=no,downscript=no",
		"-device", fmt.Sprintf("virtio-net-pci,netdev=n0,romfile=,mac=%s,addr=%#x", mac, nicSlot)}
	smb := []string{"-smbios", fmt.Sprintf("type=1,serial=%s,manufacturer=%s,product=Boot Path Box", sn, vendor)}
	if path == "arm64" {
		need(t, "qemu-system-aarch64")
		vars := copyVars(t, aavmfVars, dir)
		return append(append([]string{"qemu-system-aarch64", "-M", "virt", "-accel", "tcg,thread=multi", "-cpu", "max",
			"-m", "768", "-smp", "2", "-nographic", "-no-reboot", "-serial", "stdio", "-monitor", "none",
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file=" + aavmfCode,
			"-drive", "if=pflash,format=raw,unit=1,file=" + vars}, smb...), nic...)
	}
	code, vars := ovmfCode, ""
	machine := "q35"
	var extra []string
	switch path {
	case "PXEv4":
		vars = copyVars(t, ovmfVars, dir)
	case "PXEv6":
		vars = copyVars(t, ovmfVars, dir)
		extra = []string{"-fw_cfg", "name=opt/org.tianocore/IPv4PXESupport,string=n"}
	case "HTTPv4", "HTTPv6":
		v6 := path == "HTTPv6"
		base, err := os.ReadFile(ovmfVars)
		if err != nil {
			t.Fatal(err)
		}
		hw, _ := net.ParseMAC(mac)
		b, err := ovmfvars.HTTPBootVars(base, hw, nicSlot, v6)
		if err != nil {
			t.Fatalf("%s: %v", ovmfVars, err)
		}
		vars = filepath.Join(dir, "OVMF_VARS.fd")
		if err := os.WriteFile(vars, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if v6 {
			extra = []string{"-fw_cfg", "name=opt/org.tianocore/IPv4PXESupport,string=n", "-fw_cfg", "name=opt/org.tianocore/IPv6PXESupport,string=n"}
		}
	case "SecureBoot":
		need(t, ovmfSecbootCode, ovmfMSVars, shimSigned, grubNetSigned)
		code, vars, machine = ovmfSecbootCode, copyVars(t, ovmfMSVars, dir), "q35,smm=on"
		extra = []string{"-global", "driver=cfi.pflash01,property=secure,value=on"}
	default:
		t.Fatalf("unknown boot path %q", path)
	}
	args := append(qemuBase(memoryMB, cpus), "-machine", machine,
		"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+code, "-drive", "if=pflash,format=raw,unit=1,file="+vars)
	args = append(append(append(args, extra...), nic...), smb...)
	return append(args, disks(t, dir, "DISK-"+sn)...)
}

// copyVars copies a firmware variable store template into dir (the
// firmware writes to its store) and returns the copy.
func copyVars(t *testing.T, template, dir string) string {
	t.Helper()
	b, err := os.ReadFile(template)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, filepath.Base(template))
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// milestones is where a boot's time went: the first timeline entry of
// each kind (source, event, file) as seconds after power-on, and the time
// from the first DHCP or DHCPv6 answer naming a boot file (the firmware's
// loader) to the registration.
func milestones(c *corrald, name string, t0 time.Time) (string, time.Duration) {
	out, err := c.cli("machine", "timeline", name, "-o", "json", "--limit", "500")
	if err != nil {
		return fmt.Sprintf("(timeline: %v)", err), 0
	}
	var es []timelineEntry
	if err := json.Unmarshal(out, &es); err != nil {
		return fmt.Sprintf("(timeline: %v)", err), 0
	}
	slices.SortStableFunc(es, func(a, b timelineEntry) int { return a.At.Compare(b.At) })
	seen := map[string]bool{}
	var parts []string
	var loader, registered time.Time
	for _, e := range es {
		if loader.IsZero() && strings.HasPrefix(e.Source, "dhcp") && e.Attributes["file"] != "" {
			loader = e.At
		}
		if registered.IsZero() && e.Source == "inventory" && e.Event == "registered" {
			registered = e.At
		}
		k := e.Source + " " + e.Event
		if f := e.Attributes["file"]; f != "" {
			k += " " + filepath.Base(strings.SplitN(f, "?", 2)[0])
		}
		if os.Getenv("CORRAL_BENCH_BOOTPATHS_TIMELINE") != "" {
			parts = append(parts, fmt.Sprintf("\n      +%.1fs %s %s %v", e.At.Sub(t0).Seconds(), k, e.Detail, e.Attributes))
			continue
		}
		if seen[k] {
			continue
		}
		seen[k] = true
		parts = append(parts, fmt.Sprintf("%s +%.1fs", k, e.At.Sub(t0).Seconds()))
	}
	var d time.Duration
	if !loader.IsZero() && registered.After(loader) {
		d = registered.Sub(loader)
	}
	return strings.Join(parts, ", "), d
}

// stampConsole notes, once a second, the console lines vm printed since,
// with the seconds after t0, until the kernel starts; the function it
// returns gives them.
func stampConsole(vm *proc, t0 time.Time) func() string {
	var (
		mu    sync.Mutex
		lines []string
		seen  int
	)
	go func() {
		for {
			select {
			case <-vm.done:
				return
			case <-time.After(time.Second):
			}
			con := vm.console.String()
			mu.Lock()
			if i := strings.LastIndexByte(con, '\n'); i+1 > seen && len(lines) < 200 {
				for _, l := range strings.Split(strings.TrimSpace(con[seen:i]), "\n") {
					if l = strings.TrimSpace(strings.ReplaceAll(l, "\r", "")); l != "" {
						lines = append(lines, fmt.Sprintf("  +%5.1fs %.120s", time.Since(t0).Seconds(), l))
					}
				}
				seen = i + 1
				if strings.Contains(con, "Linux version") {
					mu.Unlock()
					return
				}
			}
			mu.Unlock()
		}
	}()
	return func() string { mu.Lock(); defer mu.Unlock(); return strings.Join(lines, "\n") }
}
