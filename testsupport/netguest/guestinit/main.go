// Command guestinit is the /init of testsupport/netguest's guest: it loads
// the network modules and runs the scenarios named by netguest.run= on
// the kernel command line through hypervisor/netdev, reporting on the
// console in lines starting with "NETGUEST ", then powers off.
//
//   - bond: bond0, active-backup over eth0 and eth1 (miimon 100), address
//     10.51.0.2/24; the active slave and each slave's link are printed on
//     every change, for 10 minutes or until the vlan scenario ends.
//   - vlan: two node namespaces whose uplinks are the ends of one veth
//     pair; node A has network blue (VLAN 100), node B blue and red (VLAN
//     200, gateway 10.50.0.254/24). Endpoints (a namespace on a veth to
//     the bridge; with vlan-qemu nested QEMU VMs on the Manager's taps):
//     vm1 on A/blue 10.50.0.1, vm2 on B/blue 10.50.0.2, vm3 on B/red
//     10.50.0.3, each pinging the other two. vm1 must reach vm2 (tagged across the wire)
//     and neither may reach vm3, which answers its own gateway.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/corralhq/corral/hypervisor/netdev"
	"github.com/corralhq/corral/internal/apierr"
)

var out sync.Mutex

func say(format string, a ...any) {
	out.Lock()
	defer out.Unlock()
	fmt.Printf("NETGUEST "+format+"\n", a...)
}

func main() {
	start := time.Now()
	for _, m := range [][3]string{{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"}, {"tmpfs", "/run", "tmpfs"}, {"tmpfs", "/tmp", "tmpfs"}} {
		if err := unix.Mount(m[2], m[1], m[0], 0, ""); err != nil {
			say("FAIL mount %s: %v", m[1], err)
		}
	}
	_ = os.Symlink("/run", "/var/run")
	_ = os.MkdirAll("/run/netns", 0o755)
	for _, m := range moduleOrder() {
		params := ""
		if m == "bonding" {
			params = "max_bonds=0" // no default bond0: the Manager makes it
		}
		if err := insmod("/modules/"+m+".ko", params); err != nil {
			say("FAIL insmod %s: %v", m, err)
		}
	}
	say("modules loaded %s after init", time.Since(start).Round(time.Millisecond))
	cmdline, _ := os.ReadFile("/proc/cmdline")
	var run []string
	for _, f := range strings.Fields(string(cmdline)) {
		if v, ok := strings.CutPrefix(f, "netguest.run="); ok {
			run = strings.Split(v, ",")
		}
	}
	// The host ends the bond scenario with a line "bond-end" on the
	// console once it has failed a NIC over.
	stop := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "bond-end" {
				close(stop)
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for _, r := range run {
		switch r {
		case "bond":
			wg.Add(1)
			go func() { defer wg.Done(); bond(stop) }()
		case "vlan", "vlan-qemu":
			endpoints := "netns"
			if r == "vlan-qemu" {
				endpoints = "qemu"
			}
			if err := vlan(endpoints); err != nil {
				say("vlan FAIL %v", err)
			} else {
				say("vlan ok")
			}
		default:
			say("FAIL unknown scenario %q", r)
		}
	}
	wg.Wait()
	say("done after %s", time.Since(start).Round(time.Millisecond))
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}

// moduleOrder is netguest.NodeModules (the order the builder wrote).
func moduleOrder() []string {
	return []string{"virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci",
		"failover", "net_failover", "virtio_net",
		"llc", "stp", "bridge", "mrp", "garp", "8021q", "tls", "bonding", "tun", "veth"}
}

func insmod(path, params string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	err = unix.FinitModule(int(f.Fd()), params, 0)
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return err
}

// bond applies bond0 and reports its state until stop (after the host has
// had its time with it) or 10 minutes.
func bond(stop <-chan struct{}) {
	m, err := netdev.NewManager(netdev.Config{})
	if err != nil {
		say("bond FAIL %v", err)
		return
	}
	for _, n := range []string{"eth0", "eth1"} {
		if err := waitLink(n, 20*time.Second); err != nil {
			say("bond FAIL %v", err)
			return
		}
	}
	b := netdev.Bond{Name: "bond0", Slaves: []string{"eth0", "eth1"}, Mode: netdev.BondActiveBackup, MiimonMS: 100, Primary: "eth0"}
	if err := m.ApplyBond(b); err != nil {
		say("bond FAIL apply: %v", err)
		return
	}
	if err := m.ApplyBond(b); err != nil {
		say("bond FAIL second apply (idempotent): %v", err)
		return
	}
	l, err := netlink.LinkByName("bond0")
	if err == nil {
		var a *netlink.Addr
		a, err = netlink.ParseAddr("10.51.0.2/24")
		if err == nil {
			err = netlink.AddrReplace(l, a)
		}
	}
	if err != nil {
		say("bond FAIL address: %v", err)
		return
	}
	last := ""
	deadline := time.After(10 * time.Minute)
	for {
		st, err := m.BondStatus("bond0")
		line := ""
		if err != nil {
			line = "error " + err.Error()
		} else {
			var sl []string
			for _, n := range []string{"eth0", "eth1"} {
				state := "down"
				if st.Slaves[n] {
					state = "up"
				}
				sl = append(sl, n+":"+state)
			}
			mac := ""
			if st.Active != "" {
				if l, err := netlink.LinkByName(st.Active); err == nil {
					mac = l.Attrs().PermHWAddr.String()
					if mac == "" {
						mac = l.Attrs().HardwareAddr.String()
					}
				}
			}
			line = fmt.Sprintf("mode=%s up=%t active=%s mac=%s slaves=%s", st.Mode, st.Up, st.Active, mac, strings.Join(sl, ","))
		}
		if line != last {
			say("bond %s", line)
			last = line
		}
		select {
		case <-stop:
			return
		case <-deadline:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func waitLink(name string, d time.Duration) error {
	end := time.Now().Add(d)
	for {
		if _, err := netlink.LinkByName(name); err == nil {
			return nil
		} else if time.Now().After(end) {
			return fmt.Errorf("no %s after %s: %v", name, d, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// inNS runs fn on a thread in namespace name (created when create).
func inNS(name string, create bool, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if create {
			h, err := netns.NewNamed(name)
			if err != nil {
				errc <- err
				return
			}
			h.Close()
		} else {
			h, err := netns.GetFromName(name)
			if err != nil {
				errc <- err
				return
			}
			err = netns.Set(h)
			h.Close()
			if err != nil {
				errc <- err
				return
			}
		}
		errc <- fn()
	}()
	return <-errc
}

type vmDef struct {
	name, node, network, ip string
	peers                   []string
}

// vlan runs the VLAN scenario with endpoints "qemu" (nested VMs on the
// Manager's taps) or "netns" (a namespace per VM whose veth is enslaved
// to the Manager's bridge where the tap would be).
func vlan(endpoints string) error {
	t0 := time.Now()
	for _, n := range []string{"nodea", "nodeb"} {
		if err := inNS(n, true, func() error {
			lo, err := netlink.LinkByName("lo")
			if err == nil {
				err = netlink.LinkSetUp(lo)
			}
			return err
		}); err != nil {
			return fmt.Errorf("namespace %s: %w", n, err)
		}
	}
	// The wire between the nodes: a veth pair, one end in each namespace.
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "upa"}, PeerName: "upb"}); err != nil {
		return fmt.Errorf("veth: %w", err)
	}
	for end, ns := range map[string]string{"upa": "nodea", "upb": "nodeb"} {
		l, err := netlink.LinkByName(end)
		if err != nil {
			return err
		}
		h, err := netns.GetFromName(ns)
		if err != nil {
			return err
		}
		err = netlink.LinkSetNsFd(l, int(h))
		h.Close()
		if err != nil {
			return fmt.Errorf("move %s to %s: %w", end, ns, err)
		}
		if err := inNS(ns, false, func() error {
			l, err := netlink.LinkByName(end)
			if err == nil {
				err = netlink.LinkSetUp(l)
			}
			return err
		}); err != nil {
			return err
		}
	}
	mgr := map[string]*netdev.Manager{}
	for n, up := range map[string]string{"nodea": "upa", "nodeb": "upb"} {
		m, err := netdev.NewManager(netdev.Config{Uplink: up, NetNSPath: "/run/netns/" + n})
		if err != nil {
			return err
		}
		mgr[n] = m
	}
	nets := []struct {
		node string
		n    netdev.Network
	}{
		{"nodea", netdev.Network{Name: "blue", VLAN: 100}},
		{"nodeb", netdev.Network{Name: "blue", VLAN: 100}},
		{"nodeb", netdev.Network{Name: "red", VLAN: 200, GatewayCIDR: "10.50.0.254/24"}},
	}
	for _, n := range nets {
		p, err := mgr[n.node].ApplyNetwork(n.n)
		if err != nil {
			return fmt.Errorf("%s: apply %s: %w", n.node, n.n.Name, err)
		}
		say("vlan %s: network %s vlan %d: bridge %s, sub-interface %s of %s", n.node, n.n.Name, n.n.VLAN, p.Bridge, p.VLANLink, p.VLANParent)
	}
	// A second Network on a VLAN node B already serves is refused (and
	// leaves nothing): it would take the VLAN from blue.
	if _, err := mgr["nodeb"].ApplyNetwork(netdev.Network{Name: "green", VLAN: 100}); !errors.Is(err, apierr.ErrPrecondition) {
		return fmt.Errorf("network green on blue's VLAN 100: %v, want apierr.ErrPrecondition", err)
	}
	vms := []vmDef{
		{"vm1", "nodea", "blue", "10.50.0.1", []string{"10.50.0.2", "10.50.0.3"}},
		{"vm2", "nodeb", "blue", "10.50.0.2", []string{"10.50.0.1", "10.50.0.3"}},
		{"vm3", "nodeb", "red", "10.50.0.3", []string{"10.50.0.1", "10.50.0.2"}},
	}
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Kill()
			_, _ = p.Process.Wait()
		}
	}()
	stopPing := make(chan struct{})
	defer close(stopPing)
	if endpoints == "netns" {
		for _, v := range vms {
			if err := netnsEndpoint(v, stopPing); err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
		}
		say("vlan: 3 namespace endpoints on the bridges %s after the scenario began", time.Since(t0).Round(time.Millisecond))
	}
	for i, v := range vms {
		if endpoints == "netns" {
			break
		}
		tap := netdev.TapName(v.name, 0)
		if err := mgr[v.node].CreateTap(netdev.Tap{Name: tap, Network: v.network, Owner: v.name + "/0"}); err != nil {
			return fmt.Errorf("%s: tap: %w", v.name, err)
		}
		logf := "/tmp/" + v.name + ".log"
		args := []string{"-nodefaults", "-no-user-config", "-machine", "pc,accel=tcg", "-m", "128", "-smp", "1",
			"-display", "none", "-vga", "none", "-no-reboot",
			"-kernel", "/vm/vmlinuz", "-initrd", "/vm/initrd",
			"-append", fmt.Sprintf("console=ttyS0 loglevel=4 printk.time=1 panic=-1 mitigations=off tsc=reliable no_timer_check netguest.ip=%s/24 netguest.peers=%s", v.ip, strings.Join(v.peers, ",")),
			"-serial", "file:" + logf,
			"-netdev", "tap,id=n0,ifname=" + tap + ",script=no,downscript=no,vhost=off",
			"-device", fmt.Sprintf("virtio-net-pci,netdev=n0,mac=52:54:00:50:00:%02x,romfile=", i+1)}
		cmd := exec.Command("/usr/bin/qemu-system-x86_64", args...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		// QEMU opens the tap in its own namespace: start it from a thread
		// in the node's.
		if err := inNS(v.node, false, cmd.Start); err != nil {
			return fmt.Errorf("%s: qemu: %w", v.name, err)
		}
		procs = append(procs, cmd)
		go func(name string, c *exec.Cmd, se *strings.Builder) {
			err := c.Wait()
			say("vlan %s: qemu exited: %v %s", name, err, strings.TrimSpace(se.String()))
		}(v.name, cmd, &stderr)
	}
	if endpoints == "qemu" {
		say("vlan: 3 nested VMs started %s after the scenario began", time.Since(t0).Round(time.Millisecond))
	}

	// Positive control for vm3: node B reaches it on red from the gateway.
	wait := 3 * time.Minute
	if endpoints == "qemu" {
		wait = 20 * time.Minute
	}
	deadline := time.Now().Add(wait)
	var vm3Alive time.Time
	lastProgress := time.Now()
	for vm3Alive.IsZero() {
		if time.Since(lastProgress) > 30*time.Second {
			lastProgress = time.Now()
			for _, v := range vms {
				say("vlan %s at %s: %s", v.name, time.Since(t0).Round(time.Second), lastLine(v.name))
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("vm3 never answered its gateway; consoles:\n%s", tails(vms))
		}
		_ = inNS("nodeb", false, func() error {
			if exec.Command("/bin/busybox", "ping", "-c", "1", "-W", "1", "10.50.0.3").Run() == nil {
				vm3Alive = time.Now()
			}
			return nil
		})
		if vm3Alive.IsZero() {
			time.Sleep(time.Second)
		}
	}
	say("vlan: vm3 answers its gateway on node B %s after start", time.Since(t0).Round(time.Second))
	// Every VM's pings after vm3 was alive: vm1<->vm2 ok, nothing reaches vm3
	// or comes from it. Wait for 5 rounds of each after vm3Alive.
	mark := map[string]int{}
	for _, v := range vms {
		mark[v.name] = lines(v.name)
	}
	want := map[string]map[string]bool{
		"vm1": {"10.50.0.2": true, "10.50.0.3": false},
		"vm2": {"10.50.0.1": true, "10.50.0.3": false},
		"vm3": {"10.50.0.1": false, "10.50.0.2": false},
	}
	firstOK := map[string]time.Duration{}
	for {
		if time.Now().After(deadline) {
			return fmt.Errorf("VMs did not show the expected pings in time; consoles:\n%s", tails(vms))
		}
		done := true
		var problems []string
		for _, v := range vms {
			res := pings(v.name, mark[v.name])
			for peer, ok := range want[v.name] {
				r := res[peer]
				switch {
				case ok && r.ok > 0 && firstOK[v.name+"->"+peer] == 0:
					firstOK[v.name+"->"+peer] = time.Since(t0)
				case !ok && r.ok > 0:
					problems = append(problems, fmt.Sprintf("%s reached %s across VLANs", v.name, peer))
				}
				// Five pings each way after vm3 was alive; a wanted
				// path must end with three answered in a row.
				if r.ok+r.fail < 5 || (ok && r.tailOK < 3) {
					done = false
				}
			}
		}
		if len(problems) > 0 {
			return fmt.Errorf("isolation broken: %s; consoles:\n%s", strings.Join(problems, "; "), tails(vms))
		}
		if done {
			break
		}
		time.Sleep(time.Second)
	}
	say("vlan (%s endpoints): vm1<->vm2 on VLAN 100 across the wire (first answer %s after start); vm3 on VLAN 200 reached by neither, answering its gateway; scenario %s",
		endpoints, firstOK["vm1->10.50.0.2"].Round(time.Second), time.Since(t0).Round(time.Second))
	// The frames between the nodes carried 802.1Q tags: node B's VLAN 100
	// sub-interface received what vm1 sent.
	var rx uint64
	_ = inNS("nodeb", false, func() error {
		l, err := netlink.LinkByName(netdev.VLANName("upb", 100))
		if err == nil && l.Attrs().Statistics != nil {
			rx = l.Attrs().Statistics.RxPackets
		}
		return err
	})
	if rx == 0 {
		return fmt.Errorf("node B's VLAN 100 sub-interface received nothing")
	}
	say("vlan: node B's VLAN 100 sub-interface received %d packets", rx)
	// Cleanup through the same code: taps, then networks.
	for _, p := range procs {
		_ = p.Process.Kill()
	}
	time.Sleep(500 * time.Millisecond)
	for _, v := range vms {
		if endpoints == "netns" {
			if err := inNS(v.node, false, func() error {
				l, err := netlink.LinkByName(v.name + "p")
				if err == nil {
					err = netlink.LinkDel(l)
				}
				return err
			}); err != nil {
				return fmt.Errorf("delete the veth of %s: %w", v.name, err)
			}
			continue
		}
		if err := mgr[v.node].DeleteTap(netdev.TapName(v.name, 0)); err != nil {
			return fmt.Errorf("delete tap of %s: %w", v.name, err)
		}
	}
	for _, n := range nets {
		if err := mgr[n.node].DeleteNetwork(n.n.Name); err != nil {
			return fmt.Errorf("%s: delete %s: %w", n.node, n.n.Name, err)
		}
	}
	for n, m := range mgr {
		if ls, _ := m.Links(); len(ls) != 0 {
			return fmt.Errorf("%s: links left after delete: %v", n, ls)
		}
	}
	return nil
}

// lastLine is the last line of vm's console, without control characters.
func lastLine(vm string) string {
	b, _ := os.ReadFile(filepath.Join("/tmp", vm+".log"))
	ls := strings.Split(strings.TrimSpace(string(b)), "\n")
	l := ls[len(ls)-1]
	l = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return -1
		}
		return r
	}, l)
	if len(l) > 120 {
		l = l[:120]
	}
	return l
}

// netnsEndpoint gives v a namespace of its own holding one end of a veth
// pair (eth0, v.ip/24); the other end is enslaved to v.network's bridge
// on v.node. A goroutine pings v.peers from it once a second, writing
// the lines the nested VMs print to /tmp/<vm>.log, until stop.
func netnsEndpoint(v vmDef, stop <-chan struct{}) error {
	if err := inNS(v.name, true, func() error {
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		return err
	}); err != nil {
		return err
	}
	peer := v.name + "p"
	if err := inNS(v.node, false, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: peer}, PeerName: "eth0"}); err != nil {
			return err
		}
		br, err := netlink.LinkByName(netdev.BridgeName(v.network))
		if err != nil {
			return err
		}
		p, err := netlink.LinkByName(peer)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMaster(p, br); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(p); err != nil {
			return err
		}
		e, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		h, err := netns.GetFromName(v.name)
		if err != nil {
			return err
		}
		defer h.Close()
		return netlink.LinkSetNsFd(e, int(h))
	}); err != nil {
		return err
	}
	if err := inNS(v.name, false, func() error {
		e, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		a, _ := netlink.ParseAddr(v.ip + "/24")
		if err := netlink.AddrAdd(e, a); err != nil {
			return err
		}
		return netlink.LinkSetUp(e)
	}); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join("/tmp", v.name+".log"))
	if err != nil {
		return err
	}
	go func() {
		defer f.Close()
		for {
			for _, p := range v.peers {
				res := "fail"
				_ = inNS(v.name, false, func() error {
					if exec.Command("/bin/busybox", "ping", "-c", "1", "-W", "1", p).Run() == nil {
						res = "ok"
					}
					return nil
				})
				fmt.Fprintf(f, "VMPING %s %s\n", p, res)
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	return nil
}

type pingResult struct{ ok, fail, tailOK int }

func lines(vm string) int {
	b, _ := os.ReadFile(filepath.Join("/tmp", vm+".log"))
	return strings.Count(string(b), "\n")
}

// pings tallies the VMPING lines of vm's console after line skip.
func pings(vm string, skip int) map[string]pingResult {
	res := map[string]pingResult{}
	f, err := os.Open(filepath.Join("/tmp", vm+".log"))
	if err != nil {
		return res
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for i := 0; sc.Scan(); i++ {
		if i < skip {
			continue
		}
		fs := strings.Fields(strings.TrimSpace(sc.Text()))
		if len(fs) != 3 || fs[0] != "VMPING" || net.ParseIP(fs[1]) == nil {
			continue
		}
		r := res[fs[1]]
		if fs[2] == "ok" {
			r.ok++
			r.tailOK++
		} else {
			r.fail++
			r.tailOK = 0
		}
		res[fs[1]] = r
	}
	return res
}

func tails(vms []vmDef) string {
	var b strings.Builder
	for _, v := range vms {
		data, _ := os.ReadFile(filepath.Join("/tmp", v.name+".log"))
		s := string(data)
		if len(s) > 1500 {
			s = s[len(s)-1500:]
		}
		fmt.Fprintf(&b, "--- %s\n%s\n", v.name, s)
	}
	return b.String()
}
